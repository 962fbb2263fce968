"""Build the benchmark kernels (tools/kernels/*.c): natively with gcc, as an RV64 guest ELF (and the same code as an
RV64 Linux program, for qemu-user), as wasm32.

Every product is cached by a digest of its sources and build command under ``$BERM_BENCH_CACHE`` (default: a
``berm-bench`` directory in the system temp dir), so tests and repeated benchmark runs compile each once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from berm_sdk.header import HEADER_NAME, calls_header
from berm_sdk.toolchain import ToolchainError, build_program, guest_toolchain

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
SDK_DIR = Path(__file__).resolve().parent.parent / "harnesses" / "sdk"
#: Every kernel, by name: the C symbol is ``kernel_<name>`` in ``tools/kernels/<name>.c``.
KERNELS = ("sha256", "crc32", "sort", "fib", "tokenize")
OPT = "-O2"


def kernel_sources() -> list[Path]:
    return [KERNEL_DIR / f"{name}.c" for name in KERNELS]


def symbol(name: str) -> str:
    return f"kernel_{name}"


def cache_dir() -> Path:
    default = Path(tempfile.gettempdir()) / f"berm-bench-{os.getuid()}"
    d = Path(os.environ.get("BERM_BENCH_CACHE", default))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cached(kind: str, sources: list[Path], recipe: tuple[str, ...], suffix: str,
            build: Callable[[Path], None], headers: tuple[Path, ...] = (KERNEL_DIR / "kernel.h",)) -> Path:
    """The cached product of ``build(out)``; rebuilt when any source, header or the recipe changes."""
    h = hashlib.sha256("\0".join((kind, *recipe)).encode())
    for src in [*sources, *headers]:
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    out = cache_dir() / f"{kind}-{h.hexdigest()[:20]}{suffix}"
    if not out.exists():
        work = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=cache_dir()))
        tmp = work / f"product{suffix}"
        try:
            build(tmp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed:\n{proc.stderr.strip() or proc.stdout.strip()}")


#: Flags of a second native build without SIMD: gcc -O2 vectorises loops (sha256: 226 SSE instructions), which no
#: RV64IMAC or wasm32 peer can, so the benchmark shows how much of native's lead that is.
NO_SIMD = ("-fno-tree-vectorize",)


def build_native(extra: tuple[str, ...] = ()) -> Path:
    """``gcc -O2 -shared -fPIC`` (and ``extra`` flags) of every kernel into one shared object."""
    sources = kernel_sources()
    cmd = ["gcc", OPT, *extra, "-shared", "-fPIC", f"-I{KERNEL_DIR}"]
    return _cached("native", sources, tuple(cmd), ".so",
                   lambda out: _run([*cmd, *map(str, sources), "-o", str(out)], "gcc (native kernels)"))


def build_guest() -> Path:
    """The RV64IMAC guest ELF of every kernel plus ``tools/kernels/start.c``, via berm_sdk."""
    return build_guest_program("guest", [*kernel_sources(), KERNEL_DIR / "start.c"], tuple(symbol(k) for k in KERNELS))


def build_linux_guest() -> Path:
    """The same kernels as ``build_guest`` (same compiler, flags and link) as a static RV64 Linux program, with
    ``tools/kernels/linux_start.c`` as its entry: what the qemu-user peer runs."""
    return build_guest_program("linux", [*kernel_sources(), KERNEL_DIR / "linux_start.c"], ())


def build_boundary_guest() -> Path:
    """The guest ELF of ``tools/kernels/boundary.c``: a one-tool harness plus host-call loops, built against the
    SDK header (harnesses/sdk/berm.h) and a freshly generated berm_calls.h."""
    calls = _calls_header()
    return build_guest_program("boundary", [KERNEL_DIR / "boundary.c"], (), include=(SDK_DIR, calls.parent),
                  headers=(SDK_DIR / "berm.h", calls))


def _calls_header() -> Path:
    """berm_calls.h in the cache, rewritten atomically when berm_abi's names change (several test workers may
    be compiling against it at once)."""
    path, text = cache_dir() / HEADER_NAME, calls_header()
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(f"{HEADER_NAME}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def build_guest_program(kind: str, sources: list[Path], keep: tuple[str, ...], include: tuple[Path, ...] = (),
                        headers: tuple[Path, ...] = (KERNEL_DIR / "kernel.h",)) -> Path:
    """An RV64 guest ELF of ``sources`` (``keep`` symbols kept alive), cached under the name ``kind``."""
    recipe = (OPT, *guest_toolchain().cc[1:], *keep)
    include = (KERNEL_DIR, *include)
    return _cached(kind, sources, recipe, ".elf",
                   lambda out: build_program(sources, out, opt=OPT, include=include, keep=keep), headers)


def build_wasm() -> Path:
    """wasm32 of every kernel with ziglang's clang, each ``kernel_<name>`` exported, no entry point."""
    sources = kernel_sources()
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "wasm32-freestanding", OPT, "-nostdlib",
           f"-I{KERNEL_DIR}", "-Wl,--no-entry", *[f"-Wl,--export={symbol(k)}" for k in KERNELS]]
    return _cached("wasm", sources, tuple(cmd[1:]), ".wasm",
                   lambda out: _run([*cmd, *map(str, sources), "-o", str(out)], "zig cc (wasm32 kernels)"))
