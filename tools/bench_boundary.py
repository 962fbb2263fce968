"""Berm's boundary figures (DESIGN.md performance table) and the peers' equivalents, each a plain measurement.

Times are the CPU time of the measuring thread (``time.thread_time``): the guest, the interpreter and every peer
run in the calling thread, and on a machine shared with other builds, wall time mostly measures who else was
scheduled. Only the cold compile (a C compiler in other processes, on every core) is wall time.

Per-call figures time batches of calls and take the median of the per-call batch means, so the clock's own cost
does not pollute sub-microsecond results. Loop figures subtract a zero-iteration run.
"""

from __future__ import annotations

import os
import statistics
import tempfile
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


def per_iteration(run: Callable[[int], object], n: int, repeats: int) -> float:
    """Seconds per loop iteration: (median time of ``run(n)`` − median time of ``run(0)``) / n, never negative."""
    t_n = statistics.median(timed(lambda: run(n)) for _ in range(repeats))
    t_0 = statistics.median(timed(lambda: run(0)) for _ in range(repeats))
    return max(0.0, t_n - t_0) / n


def invoke_p50(engine_kind: str, elf: bytes, calls: int) -> float:
    """One call of the ``ping`` tool from Python through ``Harness.call``: fresh memory, 256-byte args pulled."""
    from berm_host.engine import Engine

    harness = Engine(kind=engine_kind).load(elf).harness()
    got = harness.call("ping", PING_ARGS)
    if got != PING_RESULT:
        raise RuntimeError(f"ping on {engine_kind} returned {got!r}, expected {PING_RESULT!r}")
    return p50_per_call(lambda: harness.call("ping", PING_ARGS), calls, batch=max(1, min(50, calls // 20)))


def hostcall_seconds(runner: BermRunner, n: int, repeats: int) -> float:
    """One ``berm.args.len`` ecall inside the guest (a loop of n of them)."""
    number = fnv1a64("berm.args.len")

    def run(k: int) -> None:
        got = runner.run("bench_ecall_loop", int_args=(k, number), args=PING_ARGS).a0
        if got != k * len(PING_ARGS):
            raise RuntimeError(f"{runner.name}: berm.args.len loop returned {got}, expected {k * len(PING_ARGS)}")

    return per_iteration(run, n, repeats)


def capability_seconds(runner: BermRunner, n: int, repeats: int) -> float:
    """One round trip to a Python capability (call, staged reply pulled with berm.result.read)."""
    linker = Linker()
    linker.define(NOOP_CAPABILITY, lambda _request: NOOP_REPLY)
    number = fnv1a64(NOOP_CAPABILITY)

    def run(k: int) -> None:
        got = runner.run("bench_capability_loop", int_args=(k, number), linker=linker).a0
        if got != k * 2 * len(NOOP_REPLY):
            raise RuntimeError(f"{runner.name}: capability loop returned {got}, expected {k * 2 * len(NOOP_REPLY)}")

    return per_iteration(run, n, repeats)


def cached_load_p50(elf: bytes, loads: int) -> float:
    """``Engine(...).load`` of an image already in the cache (a new Engine each time, so nothing is memoised; the
    previous load's image is dropped, so each load dlopens its object afresh)."""
    from berm_host.engine import Engine

    with tempfile.TemporaryDirectory(prefix="berm-bench-cache-") as cache:
        Engine(kind="aot", cache_dir=Path(cache)).load(elf)
        return p50_per_call(lambda: Engine(kind="aot", cache_dir=Path(cache)).load(elf), loads, batch=1)


def cold_compile_seconds(elf: bytes, runs: int) -> tuple[float, float, list[float], float]:
    """Loading an image into an empty cache (translate, compile on all cores, load), ``runs`` times, each into a
    cache of its own. Returns the median wall time, the median CPU time of this process and its compiler children
    (which does not depend on what else the machine is running), every run's wall time (one compile takes ~10 s,
    and on this kind of machine the same compile moves by a third from one minute to the next), and the median CPU
    time of this process alone: reading, analysing and translating the image, the rest being the compilers'."""
    from berm_host.engine import Engine

    def cpu() -> tuple[float, float]:
        t = os.times()
        return t.user + t.system, children_cpu_time()

    walls, cpus, owns = [], [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="berm-bench-cold-") as cache:
            w0, (own0, kids0) = time.perf_counter(), cpu()
            Engine(kind="aot", cache_dir=Path(cache)).load(elf)
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
