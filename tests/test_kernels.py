"""Native as oracle: each benchmark kernel (tools/kernels/) built with gcc and built as an RV64 guest must compute
the same checksum on every engine — Berm's (AOT, interpreter) when present, and the peers the benchmark compares
against (unicorn on the same ELF, qemu-user on the same code as a Linux program, wasmtime on the wasm32 build). Also
checks the boundary-figure guest."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from bench_boundary import HOSTCALL_LOOPS, NO_CALL_LOOP, NOOP_REPLY, PING_ARGS, PING_RESULT  # noqa: E402
from bench_build import (KERNELS, build_boundary_guest, build_guest, build_linux_guest, build_native,  # noqa: E402
                         build_wasm)
from bench_runners import BermRunner, NativeRunner, QemuRunner, UnicornRunner, WasmRunner  # noqa: E402

from berm_abi.names import fnv1a64  # noqa: E402
from berm_aot.elf import read_elf  # noqa: E402
from berm_host.linker import Linker  # noqa: E402

BERM_ENGINES = ("aot", "interp") if importlib.util.find_spec("berm_host.engine") else ()
ENGINES = (*BERM_ENGINES, "unicorn", "wasmtime", "wasmtime_epoch", "qemu")


@pytest.fixture(scope="module")
def native() -> NativeRunner:
    return NativeRunner(build_native())


@pytest.fixture(scope="module")
def guest_elf() -> bytes:
    return build_guest().read_bytes()


@pytest.fixture(scope="module")
def runners(guest_elf):
    """A runner per engine, made on first use; dropped at module teardown (wasmtime objects must not outlive
    the interpreter's shutdown)."""
    makers = {
        "unicorn": lambda: UnicornRunner(read_elf(guest_elf)),
        "wasmtime": lambda: WasmRunner(build_wasm()),
        "wasmtime_epoch": lambda: WasmRunner(build_wasm(), epoch=True),
        "qemu": lambda: QemuRunner(build_linux_guest()),
        **{kind: (lambda kind=kind: BermRunner(kind, guest_elf)) for kind in BERM_ENGINES},
    }
    made: dict[str, object] = {}

    def get(engine: str):
        if engine not in made:
            made[engine] = makers[engine]()
        return made[engine]

    yield get
    made.clear()


def test_checksums_depend_on_the_work(native):
    for kernel in KERNELS:
        values = {native.call(kernel, n) for n in (0, 1, 2, 3)}
        assert len(values) == 4, f"kernel_{kernel} returns the same checksum for different n"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_native(engine, kernel, native, runners):
    if engine == "qemu" and shutil.which("qemu-riscv64") is None:
        pytest.skip("qemu-riscv64 is not installed (setup.sh installs Debian's qemu-user as root)")
    assert runners(engine).call(kernel, 3) == native.call(kernel, 3)


def test_the_epoch_peer_checks_its_deadline(runners):
    """The benchmark's "wasmtime, epoch deadline" column runs code that checks the epoch: given a deadline one tick
    away and the epoch advanced past it, a kernel traps (a runner built without epoch interruption runs it)."""
    import wasmtime

    peer = runners("wasmtime_epoch")
    peer.store.set_epoch_deadline(1)
    peer.engine.increment_epoch()
    try:
        with pytest.raises(wasmtime.Trap, match="interrupt"):
            peer.call("fib", 3)
    finally:
        peer.store.set_epoch_deadline(1 << 62)


@pytest.mark.parametrize("engine", BERM_ENGINES)
def test_boundary_guest(engine):
    from berm_host.engine import Engine

    elf = build_boundary_guest().read_bytes()
    assert Engine(kind=engine).load(elf).harness().call("ping", PING_ARGS) == PING_RESULT
    guest = BermRunner(engine, elf)
    for entry in HOSTCALL_LOOPS:  # each call returns the arguments' length
        assert guest.run(entry, int_args=(5,), args=PING_ARGS).a0 == 5 * len(PING_ARGS)
    # the baseline loop makes no call: each iteration adds the buffer's address, left in a0
    once = guest.run(NO_CALL_LOOP, int_args=(1,), args=PING_ARGS).a0
    assert once and guest.run(NO_CALL_LOOP, int_args=(5,), args=PING_ARGS).a0 == 5 * once
    linker = Linker()
    requests = []
    linker.define("bench.noop", lambda request: requests.append(request) or NOOP_REPLY)
    caps = guest.run("bench_capability_loop", int_args=(3, fnv1a64("bench.noop")), linker=linker)
    assert caps.a0 == 3 * 2 * len(NOOP_REPLY)
    assert requests == [b"\x08\x00\x00\x00benchmrk"] * 3


@pytest.mark.skipif(not BERM_ENGINES, reason="the AOT engine is not built")
@pytest.mark.parametrize("config", ["no-memory-checks", "no-checks"])
def test_bench_limits_configurations_do_the_same_work(config, guest_elf, native, tmp_path, monkeypatch):
    """tools/bench_limits.py's reduced builds still compile against berm_code.h and compute every kernel's
    answer, in a cache of their own (the user's stays clean)."""
    import bench_limits

    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path / "user-cache"))
    runner = bench_limits.runner(guest_elf, bench_limits.CONFIGS[config], tmp_path / config)
    assert [runner.call(k, 3) for k in KERNELS] == [native.call(k, 3) for k in KERNELS]
    assert not (tmp_path / "user-cache").exists() and any((tmp_path / config).iterdir())
    assert os.environ["BERM_CACHE_DIR"] == str(tmp_path / "user-cache")
