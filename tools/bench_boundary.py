"""Berm's boundary figures (DESIGN.md performance table) and the peers' equivalents, each a plain measurement.

Times are the CPU time of the measuring thread (``time.thread_time``): the guest, the interpreter and every peer
run in the calling thread, and on a machine shared with other builds, wall time mostly measures who else was
scheduled. Only the cold compile (a C compiler in other processes, on every core) and the first load in a fresh
process (timed by that process: what a user waits for, file reads and the dlopen included) are wall time.

Per-call figures time batches of calls and take the median of the per-call batch means, so the clock's own cost
does not pollute sub-microsecond results. Loop figures are net of a baseline: the host calls' of the same loop
without the ecall, the capability's of a zero-iteration run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from berm_abi.names import fnv1a64
from berm_host.linker import Linker
from bench_runners import BermRunner, NativeRunner, WasmRunner, children_cpu_time

#: The 256 bytes every measured invocation pulls with berm.args.read.
PING_ARGS = b'{"pad":"' + b"x" * 246 + b'"}'
PING_RESULT = '{"len":256}'
NOOP_CAPABILITY = "bench.noop"
NOOP_REPLY = b"pong"


#: The clock of every figure but the cold compile.
clock = time.thread_time


def p50_per_call(fn: Callable[[], object], calls: int, batch: int = 50) -> float:
    """Median over batches of the mean seconds per call of ``fn()``; ``calls`` in total, after one warm-up."""
    fn()
    means = []
    for _ in range(max(1, calls // batch)):
        t0 = clock()
        for _ in range(batch):
            fn()
        means.append((clock() - t0) / batch)
    return statistics.median(means)


def timed(fn: Callable[[], object], clock: Callable[[], float] = clock) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def net_per_iteration(loops: list[Callable[[], object]], baseline: Callable[[], object], n: int,
                      repeats: int) -> list[float]:
    """Seconds per iteration of each of ``loops`` (n iterations each) net of ``baseline``: (median time of the loop
    − median time of ``baseline()``) / n, never negative. Each repeat runs them all, so load that drifts during the
    measurement weighs on each alike."""
    times: list[list[float]] = [[] for _ in range(len(loops) + 1)]
    for _ in range(repeats):
        for fn, samples in zip((baseline, *loops), times):
            samples.append(timed(fn))
    base, *rest = map(statistics.median, times)
    return [max(0.0, t - base) / n for t in rest]


def invoke_p50(engine_kind: str, elf: bytes, calls: int) -> float:
    """One call of the ``ping`` tool from Python through ``Harness.call``: fresh memory, 256-byte args pulled."""
    from berm_host.engine import Engine

    harness = Engine(kind=engine_kind).load(elf).harness()
    got = harness.call("ping", PING_ARGS)
    if got != PING_RESULT:
        raise RuntimeError(f"ping on {engine_kind} returned {got!r}, expected {PING_RESULT!r}")
    return p50_per_call(lambda: harness.call("ping", PING_ARGS), calls, batch=max(1, min(50, calls // 20)))


#: The guest loops of the host-call figures (tools/kernels/boundary.c), n iterations each, each iteration's call
#: returning the arguments' length: berm.args.read of 8 bytes, which translated code sends to the core's dispatch
#: (ctx->ecall2), and berm.args.len, which the translator inlines into a read of a field of ctx (no call).
HOSTCALL_LOOPS = ("bench_args_read_loop", "bench_args_len_loop")
#: The same loop without the ecall: what both are net of.
NO_CALL_LOOP = "bench_no_call_loop"


def hostcall_seconds(runner: BermRunner, n: int, repeats: int) -> list[float]:
    """Seconds per host call of each of ``HOSTCALL_LOOPS`` inside the guest, net of ``NO_CALL_LOOP``."""

    def loop(entry: str) -> Callable[[], None]:
        def run() -> None:
            got = runner.run(entry, int_args=(n,), args=PING_ARGS).a0
            if entry != NO_CALL_LOOP and got != n * len(PING_ARGS):
                raise RuntimeError(f"{runner.name}: {entry} returned {got}, expected {n * len(PING_ARGS)}")
        return run

    return net_per_iteration([loop(entry) for entry in HOSTCALL_LOOPS], loop(NO_CALL_LOOP), n, repeats)


def capability_seconds(runner: BermRunner, n: int, repeats: int) -> float:
    """One round trip to a Python capability (call, staged reply pulled with berm.result.read)."""
    linker = Linker()
    linker.define(NOOP_CAPABILITY, lambda _request: NOOP_REPLY)
    number = fnv1a64(NOOP_CAPABILITY)

    def run(k: int) -> None:
        got = runner.run("bench_capability_loop", int_args=(k, number), linker=linker).a0
        if got != k * 2 * len(NOOP_REPLY):
            raise RuntimeError(f"{runner.name}: capability loop returned {got}, expected {k * 2 * len(NOOP_REPLY)}")

    # Net of a zero-iteration run: the loop's own few instructions are lost in a round trip through Python.
    return net_per_iteration([lambda: run(n)], lambda: run(0), n, repeats)[0]


def cached_load_p50(elf: bytes, cache: Path, loads: int) -> float:
    """``Engine(...).load`` of an image in ``cache`` in steady state: after a first load in this process (which
    compiles the image if ``cache`` lacks it, and memoises what every later load reuses: the C compiler's files and
    version line in the cache key), a new Engine each time (its images are its own), the previous load's image
    dropped, so each load hashes the ELF, checksums the object and dlopens it afresh."""
    from berm_host.engine import Engine

    Engine(kind="aot", cache_dir=cache).load(elf)
    return p50_per_call(lambda: Engine(kind="aot", cache_dir=cache).load(elf), loads, batch=1)


#: A fresh process's first load of an image: the timer starts after the imports (Python's start and the imports are
#: no part of a load; the first Engine(kind="aot") imports the backend, so the child imports it first), on the wall
#: clock (a load that finds no version line in the cache runs ``cc --version`` in a child process of its own).
_FIRST_LOAD = """
import sys, time
from pathlib import Path
import berm_host.aot.backend
from berm_host.engine import Engine
elf = Path(sys.argv[1]).read_bytes()
t0 = time.perf_counter()
Engine(kind="aot", cache_dir=Path(sys.argv[2])).load(elf)
print(time.perf_counter() - t0)
"""


def first_load_p50(elf: Path, cache: Path, runs: int) -> float:
    """The median wall time of the first load of ``elf`` from ``cache`` (which must hold it) in each of ``runs``
    fresh Python processes (``_FIRST_LOAD``). A RuntimeError when a child fails or writes to the cache: it compiled
    (the image was not in the cache), or found the toolchain anew (berm_aot/cc.py, ``_toolchain``), and the
    figure would not be a cached load."""
    before = set(cache.rglob("*"))
    times = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", _FIRST_LOAD, str(elf), str(cache)], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"a fresh process's load exited with status {proc.returncode}: {proc.stderr.strip()}")
        if set(cache.rglob("*")) != before:
            raise RuntimeError(f"a fresh process's load of {elf.name} wrote to the cache: it was not a cached load")
        times.append(float(proc.stdout))
    return statistics.median(times)


def cold_compile_seconds(elf: bytes, runs: int, caches: Path) -> tuple[float, float, list[float], float]:
    """Loading an image into an empty cache (translate, compile on all cores, load), ``runs`` times, each into a
    cache of its own: ``caches``/0, /1, …, which are kept (the cached-load figures load from /0).
    Returns the median wall time, the median CPU time of this process and its compiler children
    (which does not depend on what else the machine is running), every run's wall time (one compile takes ~10 s,
    and on this kind of machine the same compile moves by a third from one minute to the next), and the median CPU
    time of this process alone: reading, analysing and translating the image, the rest being the compilers'."""
    from berm_host.engine import Engine

    def cpu() -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, children_cpu_time()

    walls, cpus, owns = [], [], []
    for run in range(runs):
        w0, (own0, kids0) = time.perf_counter(), cpu()
        Engine(kind="aot", cache_dir=caches / str(run)).load(elf)
        walls.append(time.perf_counter() - w0)
        own1, kids1 = cpu()
        owns.append(own1 - own0)
        cpus.append(own1 - own0 + kids1 - kids0)
    return statistics.median(walls), statistics.median(cpus), walls, statistics.median(owns)


def cffi_floor(native: NativeRunner, calls: int) -> float:
    """A cffi ABI-mode call of a native function that returns at once (``kernel_fib(0)``)."""
    fn = native.function("kernel_fib")
    return p50_per_call(lambda: fn(0), calls, batch=1000)


def wasmtime_instantiate_call(wasm: WasmRunner, calls: int) -> float:
    """wasmtime-py's per-invocation cost: a new Store, instantiate the module, call a function that returns."""
    import wasmtime

    def once() -> None:
        store = wasmtime.Store(wasm.engine)
        wasmtime.Instance(store, wasm.module, []).exports(store)["kernel_fib"](store, 0)

    return p50_per_call(once, calls, batch=20)
