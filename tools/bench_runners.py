"""Ways to run one benchmark kernel: natively, on wasmtime, on qemu-user, on unicorn, on Berm's engines.

Each runner has a ``name`` and ``call(kernel, n) -> int`` (the kernel's checksum as an unsigned 64-bit value), and
may have a ``clock``: the one that measures its work when that does not happen in the calling thread.
``available_runners`` builds every runner that can run here and says why the others cannot; ``UNMEASURED`` names
the peers with no runner at all.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

import cffi

from berm_abi.errors import BermError
from berm_aot.elf import read_elf
from berm_aot.image import ElfImage
from berm_host.backend import RunRequest
from bench_build import KERNELS, NO_SIMD, build_guest, build_linux_guest, build_native, build_wasm, symbol

MASK64 = (1 << 64) - 1

#: Peers the performance targets name that nothing here can run, and why (the benchmark prints this). libriscv:
#: no PyPI or npm package and no Debian package (apt-cache search libriscv finds none, bookworm; checked 2026-12).
UNMEASURED = {"libriscv": "not packaged for this machine: PyPI/apt/npm have none"}


class RunnerUnavailable(Exception):
    """A peer that cannot run on this machine (a program it needs is not installed)."""


def guest_symbols(image: ElfImage) -> dict[str, int]:
    """Global function addresses of a guest image, by name."""
    return {s.name: s.value for s in image.symbols if s.kind == "func"}


class NativeRunner:
    """The kernels built with ``gcc -O2 -shared -fPIC`` (``bench_build.build_native``), called through cffi's ABI
    mode."""

    name = "native"

    def __init__(self, path: Path, functions: tuple[str, ...] = ()):
        self.ffi = cffi.FFI()
        self.ffi.cdef("".join(f"uint64_t {f}(uint64_t);" for f in (*map(symbol, KERNELS), *functions)))
        self.lib = self.ffi.dlopen(str(path))

    def function(self, name: str):
        return getattr(self.lib, name)

    def call(self, kernel: str, n: int) -> int:
        return getattr(self.lib, symbol(kernel))(n)


class WasmRunner:
    """The kernels built for wasm32, run by wasmtime-py in one long-lived store and instance. ``epoch``: with epoch
    interruption, how wasmtime enforces a deadline (compiled code checks an epoch counter at every function entry and
    loop back-edge, as Berm's translated code polls its interrupt flag); the deadline is never reached here."""

    def __init__(self, path: Path, *, epoch: bool = False):
        import wasmtime

        config = wasmtime.Config()
        config.epoch_interruption = epoch
        self.name = "wasmtime_epoch" if epoch else "wasmtime"
        self.engine = wasmtime.Engine(config)
        self.module = wasmtime.Module.from_file(self.engine, str(path))
        self.store = wasmtime.Store(self.engine)
        if epoch:
            self.store.set_epoch_deadline(1 << 62)  # ticks; nothing increments the epoch
        exports = wasmtime.Instance(self.store, self.module, []).exports(self.store)
        self._fns = {k: exports[symbol(k)] for k in KERNELS}

    def call(self, kernel: str, n: int) -> int:
        return self._fns[kernel](self.store, n) & MASK64


def children_cpu_time() -> float:
    """CPU seconds (user and system) of this process's children that have ended and been waited for, to the
    microsecond (``os.times`` counts clock ticks: 10 ms, more than a qemu-user call's work at small n)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class QemuRunner:
    """The kernels' guest code as a static RV64 Linux program (``bench_build.build_linux_guest``) on Debian's
    ``qemu-riscv64`` (qemu-user), one process per call; its clock is the children's CPU time, so a process's start
    is in every call's time and the n = 0 run takes it out."""

    name = "qemu"
    clock = staticmethod(children_cpu_time)

    def __init__(self, path: Path):
        self.qemu = shutil.which("qemu-riscv64")
        if self.qemu is None:
            raise RunnerUnavailable("qemu-riscv64 is not installed (Debian: apt-get install qemu-user)")
        self.path = path

    def call(self, kernel: str, n: int) -> int:
        proc = subprocess.run([self.qemu, str(self.path), str(KERNELS.index(kernel)), str(n)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"qemu-riscv64 {kernel} {n}: exit status {proc.returncode}: {proc.stderr.strip()}")
        return int(proc.stdout, 16)


class UnicornRunner:
    """The guest ELF on PyPI unicorn's RV64 emulator: segments mapped once, writable ones reloaded before every
    call (rewriting code would throw away unicorn's translations), a stack, ``a0 = n``, ``ra = 0``, run until the
    kernel returns to address 0."""

    name = "unicorn"
    STACK_TOP = 0x8000_0000
    STACK_SIZE = 1 << 20

    def __init__(self, image: ElfImage):
        from unicorn import UC_ARCH_RISCV, UC_MODE_RISCV64, Uc
        from unicorn import riscv_const as rc

        self._rc = rc
        self.uc = Uc(UC_ARCH_RISCV, UC_MODE_RISCV64)
        segs = [s for s in image.segments if s.memsz]
        lo = min(s.vaddr for s in segs) & ~0xFFF
        hi = (max(s.end for s in segs) + 0xFFF) & ~0xFFF
        self.uc.mem_map(lo, hi - lo)
        self.uc.mem_map(self.STACK_TOP - self.STACK_SIZE, self.STACK_SIZE)
        # unicorn fetches at the stop address before it notices it is there: give the return to 0 a page.
        self.uc.mem_map(0, 0x1000)
        for s in segs:
            self.uc.mem_write(s.vaddr, s.data)
        self._initial = [(s.vaddr, s.data + bytes(s.memsz - len(s.data))) for s in segs if s.writable]
        self._entries = guest_symbols(image)

    def call(self, kernel: str, n: int) -> int:
        rc, uc = self._rc, self.uc
        for addr, data in self._initial:
            uc.mem_write(addr, data)
        uc.reg_write(rc.UC_RISCV_REG_A0, n)
        uc.reg_write(rc.UC_RISCV_REG_SP, self.STACK_TOP - 16)
        uc.reg_write(rc.UC_RISCV_REG_RA, 0)
        uc.emu_start(self._entries[symbol(kernel)], 0)
        return uc.reg_read(rc.UC_RISCV_REG_A0)


class BermRunner:
    """The guest ELF on one of Berm's engines (``aot`` or ``interp``) through its backend, fresh memory per call."""

    def __init__(self, kind: str, elf: bytes):
        from berm_host.engine import Engine

        self.name = f"berm-{kind}"
        self.image = Engine(kind=kind).load(elf)
        self.backend = self.image.backend
        self._entries = guest_symbols(read_elf(elf))

    def run(self, entry: str, **fields):
        """Run the guest function ``entry``; raise RuntimeError on a trap or failure, else return the RunResult."""
        result = self.backend.run(RunRequest(entry=self._entries[entry], **fields))
        if result.trap is not None or result.failure is not None:
            raise RuntimeError(f"{self.name} {entry}: {result.trap or result.failure!r}")
        return result

    def call(self, kernel: str, n: int) -> int:
        return self.run(symbol(kernel), int_args=(n,)).a0


def available_runners(kinds: tuple[str, ...] = ("native", "native_no_simd", "wasmtime", "wasmtime_epoch", "qemu",
                                                "unicorn", "aot", "interp")) -> tuple[dict[str, object], dict[str, str]]:
    """``(runners by kind, reasons by kind for those that could not be built)``, in the order of ``kinds``."""
    elf = build_guest().read_bytes()
    makers = {
        "native": lambda: NativeRunner(build_native()),
        "native_no_simd": lambda: NativeRunner(build_native(NO_SIMD)),
        "wasmtime": lambda: WasmRunner(build_wasm()),
        "wasmtime_epoch": lambda: WasmRunner(build_wasm(), epoch=True),
        "qemu": lambda: QemuRunner(build_linux_guest()),
        "unicorn": lambda: UnicornRunner(read_elf(elf)),
        "aot": lambda: BermRunner("aot", elf),
        "interp": lambda: BermRunner("interp", elf),
    }
    runners, missing = {}, {}
    for kind in kinds:
        try:
            runner = makers[kind]()
        except ImportError as exc:
            missing[kind] = f"not available yet ({exc})"
            continue
        except RunnerUnavailable as exc:
            missing[kind] = f"not available ({exc})"
            continue
        except BermError as exc:
            missing[kind] = f"could not load the kernels: {exc}"
            continue
        runners[kind] = runner
    return runners, missing
