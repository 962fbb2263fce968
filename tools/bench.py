"""Berm's benchmark: every DESIGN.md performance figure with its target, beside native code and the peers.

    python tools/bench.py            # the full run (the figures in BENCHMARKS.md)
    python tools/bench.py --quick    # a fast smoke run: smaller n, fewer repeats, a smaller cold-compile guest

Everything runs side by side in one process, repetitions interleaved across runners, so the ratios hold on a busy
2-core machine; each figure is a median of the measuring thread's CPU time (wall time for the cold compile and a
fresh process's first load; the CPU time of its processes for qemu-user). Compute kernels (tools/kernels/) run
natively (gcc -O2, the targets' baseline, and gcc -O2 -fno-tree-vectorize, native without SIMD), on wasmtime (as it
comes, and with epoch interruption: the checks a wasmtime that enforces a deadline runs, as Berm does), on qemu-user
(when Debian's qemu-user is installed), on unicorn and on Berm's AOT and interpreter engines; each figure is time
per unit of work with the kernel's fixed setup (its n = 0 run) subtracted, so runners using different n compare;
each ratio is the median of per-round ratios, each against a native run timed just before the runner's. Every call's
checksum, timed ones included, is checked against native's. The output is a Markdown table.
Exit status 1 when any runner computed a different checksum from native or a figure could not be measured.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_boundary as bb  # noqa: E402
from bench_bigguest import build_big_guest  # noqa: E402
from bench_build import KERNELS, build_boundary_guest  # noqa: E402
from bench_runners import UNMEASURED, BermRunner, available_runners  # noqa: E402

from berm_abi.errors import BermError  # noqa: E402

#: A real guest of about the size the cold-compile target names, built by rustc (harnesses/rust-probe/build.sh).
RUST_GUEST = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-keywords.elf"

#: Table columns: runner kind -> heading. Ratios are taken against "native" (gcc -O2, the targets' baseline), except
#: in the one row that says it takes them against "native_no_simd".
COLUMNS = {"aot": "Berm AOT", "native": "native", "native_no_simd": "native -fno-tree-vectorize",
           "wasmtime": "wasmtime", "wasmtime_epoch": "wasmtime, epoch deadline", "qemu": "qemu-user",
           "unicorn": "unicorn", "interp": "Berm interp"}
RATIO_COLUMNS = ("aot", "native_no_simd", "wasmtime", "wasmtime_epoch", "qemu", "unicorn", "interp")
#: The runners whose per-round kernel ratios a kernel's note spreads out (those near native).
SPREAD = ("aot", "wasmtime", "wasmtime_epoch")


@dataclass(frozen=True)
class Plan:
    """How much work each measurement does: ``n`` per kernel and the boundary loop counts are for the fast runners;
    the slow ones do ``1 / SLOW[kind]`` of it (at least one unit)."""

    n: dict[str, int]
    repeats: int
    invoke_calls: int
    hostcall_n: int
    capability_n: int
    loads: int
    first_loads: int  # fresh processes, each timing its first load
    big_functions: int
    compiles: int  # cold compiles of the big guest (the figure is their median)

    def kernel_n(self, kind: str, kernel: str) -> int:
        return scaled(self.n[kernel], kind)


#: Work divisors for the slow runners.
SLOW = {"unicorn": 16, "interp": 400}


def scaled(n: int, kind: str) -> int:
    return max(1, n // SLOW.get(kind, 1))


FULL = Plan(n={"sha256": 8000, "crc32": 8000, "sort": 2000, "fib": 15000, "tokenize": 6000}, repeats=11,
            invoke_calls=20000, hostcall_n=2_000_000, capability_n=100_000, loads=200, first_loads=5,
            big_functions=360, compiles=3)
QUICK = Plan(n={"sha256": 800, "crc32": 800, "sort": 200, "fib": 1500, "tokenize": 600}, repeats=3,
             invoke_calls=2000, hostcall_n=200_000, capability_n=10_000, loads=20, first_loads=3, big_functions=60,
             compiles=1)


@dataclass
class Row:
    figure: str
    target: str = ""
    target_seconds: float | None = None  # Berm AOT meets the target when its figure is at most this
    target_ratio: float | None = None  # … or when its ratio against native is at most this
    cells: dict[str, float] = field(default_factory=dict)  # seconds, by column kind
    ratios: dict[str, float] = field(default_factory=dict)  # by column kind, against native
    note: str = ""
    #: a kernel's per-round time ratios by kind, each against the native run timed just before it
    vs_native: dict[str, list[float]] = field(default_factory=dict)


def fmt_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


# --- compute kernels -----------------------------------------------------------------------------------------------

def measure_kernels(runners: dict, plan: Plan) -> tuple[list[Row], list[str]]:
    """One row per kernel (seconds per unit of work) and the list of checksum mismatches. Every call, timed ones
    included, is checked against native's checksum at its n (a dict look-up, outside the clock): a runner that
    went wrong in one round is caught there. A runner with a wrong checksum gets no figure for that kernel."""
    native = runners["native"]
    want = {(kernel, n): native.call(kernel, n)
            for kernel in KERNELS for kind in runners for n in (0, plan.kernel_n(kind, kernel))}
    wrong: dict[tuple[str, str], str] = {}  # (kernel, kind) -> its first mismatch

    def run(kind: str, kernel: str, n: int) -> float:
        """The time of one call on the runner's clock."""
        runner = runners[kind]
        clock = getattr(runner, "clock", bb.clock)
        t0 = clock()
        got = runner.call(kernel, n)
        seconds = clock() - t0
        if got != want[kernel, n]:
            wrong.setdefault((kernel, kind), f"{kernel} on {kind}: checksum {got:#x}, native says "
                                             f"{want[kernel, n]:#x} (n={n})")
        return seconds

    def per_unit(kind: str, kernel: str) -> float:
        """Seconds per unit of work: the runner's call at its n, less its call at n = 0 (the kernel's setup)."""
        n = plan.kernel_n(kind, kernel)
        return max(0.0, run(kind, kernel, n) - run(kind, kernel, 0)) / n

    rows = []
    for kernel in KERNELS:
        for kind in runners:  # a first, untimed call (warm-up)
            run(kind, kernel, plan.kernel_n(kind, kernel))
        units: dict[str, list[float]] = {kind: [] for kind in runners}  # seconds per unit, every timed run
        vs_native: dict[str, list[float]] = {kind: [] for kind in runners if kind != "native"}
        for _ in range(plan.repeats):
            for kind in vs_native:
                before = per_unit("native", kernel)
                units["native"].append(before)
                units[kind].append(per_unit(kind, kernel))
                vs_native[kind].append(units[kind][-1] / before if before else math.nan)  # rounds stay aligned
        units = {kind: v for kind, v in units.items() if (kernel, kind) not in wrong}
        vs_native = {kind: v for kind, v in vs_native.items() if ("native" in units and kind in units)}
        row = Row(f"kernel {kernel} (per unit)", cells={k: statistics.median(v) for k, v in units.items()},
                  vs_native=vs_native)
        per_round = round_ratios(row, "native")
        row.ratios = {k: statistics.median(v) for k, v in per_round.items()}
        # The note shows how far apart the rounds fall: the machine's speed phases move even paired ratios.
        spread = ", ".join(f"{COLUMNS[k]} {fmt_ratio(v[0])}–{fmt_ratio(v[-1])}"
                           for k, v in per_round.items() if k in SPREAD)
        wrong_here = ", ".join(COLUMNS[kind] for k, kind in wrong if k == kernel)
        row.note = "; ".join(note for note in (
            spread and f"ratio vs native per round, lowest to highest of {plan.repeats}: {spread}",
            wrong_here and f"no figure for {wrong_here}: a wrong checksum (CHECKSUM MISMATCH below)") if note)
        rows.append(row)
    return rows, list(wrong.values())


def round_ratios(row: Row, baseline: str) -> dict[str, list[float]]:
    """Each runner's per-round ratios against ``baseline``, sorted. Every ratio is taken against a native run timed
    just before the runner's (a round of every runner lasts a second or more, and the machine's speed phases change
    faster than that: against one native run per round, fib's ratios spread from 0.84× to 2.37× in one run and
    1.08× to 1.28× paired). Against another baseline, a ratio is the quotient of the two ratios against native."""
    if baseline != "native" and baseline not in row.vs_native:  # it computed a wrong checksum, or did not run
        return {}
    base = row.vs_native.get(baseline)
    quotients = {k: v if base is None else [r / b if b else math.nan for r, b in zip(v, base)]
                 for k in RATIO_COLUMNS if k != baseline and (v := row.vs_native.get(k)) is not None}
    per_round = {k: sorted(x for x in v if math.isfinite(x)) for k, v in quotients.items()}
    return {k: v for k, v in per_round.items() if v}


def geomean_row(kernel_rows: list[Row], baseline: str, row: Row) -> Row:
    """``row`` with each runner's geometric mean over the kernels of its ratio against ``baseline`` (when every
    kernel has one)."""
    for kind in RATIO_COLUMNS:
        ratios = [statistics.median(v) for r in kernel_rows if (v := round_ratios(r, baseline).get(kind))]
        if len(ratios) == len(kernel_rows):
            row.ratios[kind] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return row


def geomean_rows(kernel_rows: list[Row]) -> list[Row]:
    """Against gcc -O2 (the target's baseline), and against the same without SIMD when it ran."""
    rows = [geomean_row(kernel_rows, "native", Row("kernels: geometric mean of time ratios vs native",
                                                   target="≤ 1.25× native", target_ratio=1.25))]
    if any("native_no_simd" in r.vs_native for r in kernel_rows):
        rows.append(geomean_row(kernel_rows, "native_no_simd", Row(
            "kernels: geometric mean of time ratios vs native -fno-tree-vectorize (gcc -O2 without SIMD): this "
            "row's \"/ native\" columns are against that build")))
    return rows


# --- boundary figures ----------------------------------------------------------------------------------------------

def measure_boundary(runners: dict, plan: Plan) -> tuple[list[Row], list[str]]:
    """The DESIGN.md boundary rows, and what failed (a figure that fails leaves its cell empty, the rest runs)."""
    failures: list[str] = []

    def measure(row: Row, kind: str, fn, *more: Row) -> None:
        """``row``'s cell for ``kind`` is ``fn()``; with ``more`` rows, ``fn()`` returns one value per row."""
        try:
            values = fn()
        except (BermError, RuntimeError) as exc:
            failures.append(f"{row.figure} on {COLUMNS[kind]}: {exc}")
            return
        for r, value in zip((row, *more), values if more else (values,)):
            r.cells[kind] = value

    def measure_loads(what: str, elf: Path, cache: Path) -> list[Row]:
        """The cached-load rows of ``elf`` from ``cache``: in steady state, and a fresh process's first load."""
        steady = Row(f"loading a cached image, steady state (new Engine + load, after a first load in this process), "
                     f"p50: {what}", "≤ 1 ms", 1e-3)
        first = Row(f"… its first load in a fresh process (wall clock, timed in the child after its imports), p50 of "
                    f"{plan.first_loads} processes", "≤ 1 ms", 1e-3,
                    note="what a process does at its first load only: read the toolchain the code cache keeps "
                         "(compiler, version line, as and ld) and check it against the file system, for the cache "
                         "key; start the watchdog thread")
        measure(steady, "aot", lambda: bb.cached_load_p50(elf.read_bytes(), cache, plan.loads))
        measure(first, "aot", lambda: bb.first_load_p50(elf, cache, plan.first_loads))
        objects = sum(p.stat().st_size for p in cache.rglob("*.so"))
        steady.note = (f"ELF {elf.stat().st_size / 1024:.0f} KB, translated object {objects / 1024:.0f} KB: a cached "
                       f"load hashes the ELF (SHA-256) and checksums the object (CRC-32C)")
        return [steady, first]

    boundary_elf = build_boundary_guest()
    boundary = boundary_elf.read_bytes()
    invoke = Row("one invocation from Python (256-byte args pulled, small result), p50", "≤ 2 µs", 2e-6,
                 note="native: cffi ABI-mode call floor; wasmtime: new Store + instantiate + call")
    hostcall = Row("one core host call inside the guest, dispatched by the core: berm.args.read of 8 bytes, net of "
                   "the same loop without the ecall", "≤ 5 ns", 5e-9,
                   note="Berm AOT: translated code calls ctx->ecall2, the core's dispatch of two-argument calls, "
                        "which checks the buffer is writable and copies 8 bytes; Berm interp: its ecall handler")
    inlined = Row("… berm.args.len, which the translator inlines into a read of a ctx field (no call), net of the "
                  "same loop", note="Berm interp: its ecall handler serves it like any call")
    capability = Row("one capability served by Python, round trip", "≤ 1 µs", 1e-6,
                     note="call + berm.result.read of a 4-byte reply, net of a zero-iteration run")
    big = build_big_guest(plan.big_functions)
    compile_row = Row(f"compiling a {guest_code_kb(big):.0f} KB guest cold (wall)", "≤ 10 s (~100 KB)", 10.0)
    compile_cpu = Row("… the CPU time of that compile, compiler processes included")
    rust_row = Row(f"compiling a {guest_code_kb(RUST_GUEST):.0f} KB Rust guest cold (wall): rust-keywords, its largest "
                   f"function {largest_function_insns(RUST_GUEST):,} instructions", "≤ 10 s (~100 KB)", 10.0)
    rust_cpu = Row("… the CPU time of that compile, compiler processes included")
    invoke.cells["native"] = bb.cffi_floor(runners["native"], plan.invoke_calls * 10)
    if "wasmtime" in runners:
        invoke.cells["wasmtime"] = bb.wasmtime_instantiate_call(runners["wasmtime"], plan.invoke_calls // 10)
    for kind in ("aot", "interp"):
        if kind not in runners:
            continue
        runner = BermRunner(kind, boundary)
        measure(invoke, kind, lambda: bb.invoke_p50(kind, boundary, scaled(plan.invoke_calls, kind)))
        measure(hostcall, kind, lambda: bb.hostcall_seconds(runner, scaled(plan.hostcall_n, kind), plan.repeats),
                inlined)
        measure(capability, kind,
                lambda: bb.capability_seconds(runner, scaled(plan.capability_n, kind), plan.repeats))
    rows = [invoke, hostcall, inlined, capability]
    if "aot" not in runners:
        return rows, failures
    with tempfile.TemporaryDirectory(prefix="berm-bench-caches-") as tmp:
        caches = Path(tmp)
        rows += measure_loads("the boundary guest", boundary_elf, caches / "boundary")
        measure(compile_row, "aot", lambda: cold_compile(big.read_bytes(), plan.compiles, caches / "big",
                                                         compile_row, compile_cpu), compile_cpu)
        rows += [compile_row, compile_cpu]
        if "aot" in compile_row.cells:  # the loads of a guest of the size the compile target names, from its cache
            rows += measure_loads(f"the {guest_code_kb(big):.0f} KB-code guest compiled above", big,
                                  caches / "big" / "0")
        measure(rust_row, "aot", lambda: cold_compile(RUST_GUEST.read_bytes(), plan.compiles, caches / "rust",
                                                      rust_row, rust_cpu), rust_cpu)
    return [*rows, rust_row, rust_cpu], failures


def cold_compile(elf: bytes, runs: int, caches: Path, row: Row, cpu_row: Row) -> tuple[float, float]:
    """The median wall and CPU time of ``runs`` cold compiles of ``elf``, into ``caches``/0, /1, …; ``row``'s note
    gets every run's wall time, ``cpu_row``'s how much of the CPU time was the translation's rather than the
    compilers'."""
    wall, cpu, walls, own = bb.cold_compile_seconds(elf, runs, caches)
    if runs > 1:
        row.note = f"median of {runs} compiles, each into an empty cache: " + ", ".join(f"{w:.2f} s" for w in walls)
    cpu_row.note = f"of which this process (reading, analysing, translating to C): {own:.2f} s; the rest the compilers'"
    return wall, cpu


def guest_code_kb(elf: Path) -> float:
    from berm_aot.elf import read_elf

    return sum(s.size for s in read_elf(elf.read_bytes()).executable_sections()) / 1024


def largest_function_insns(elf: Path) -> int:
    from berm_aot.analysis import analyse
    from berm_aot.elf import read_elf
    from berm_aot.program import Program

    return max(len(f.insns) for f in analyse(Program.from_image(read_elf(elf.read_bytes()))).functions)


# --- output --------------------------------------------------------------------------------------------------------

def render(rows: list[Row], columns: dict[str, str]) -> str:
    head = ["figure", "target", *columns.values(), *(f"{columns[k]} / native" for k in RATIO_COLUMNS if k in columns),
            "meets target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [fmt_seconds(r.cells[k]) if k in r.cells else "" for k in columns]
        ratios = [fmt_ratio(r.ratios[k]) if k in r.ratios else "" for k in RATIO_COLUMNS if k in columns]
        lines.append("| " + " | ".join([r.figure, r.target, *cells, *ratios, verdict(r)]) + " |")
    notes = [f"- {r.figure}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def verdict(r: Row) -> str:
    if r.target_seconds is not None and "aot" in r.cells:
        return "yes" if r.cells["aot"] <= r.target_seconds else "no"
    if r.target_ratio is not None and "aot" in r.ratios:
        return "yes" if r.ratios["aot"] <= r.target_ratio else "no"
    return ""


def machine_facts() -> str:
    info = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    # The model name alone ("AMD EPYC") hid a change of microarchitecture between sessions (family 25 model 1,
    # Zen 3, then model 17, Zen 4), under which tokenize's ratio went from 1.09x to 1.55x.
    cpu = info.get("model name", platform.processor())
    if "cpu family" in info and "model" in info:
        cpu += f" (family {info['cpu family']}, model {info['model']})"
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n- commit: {git_commit()}\n- machine: "
            f"{os.cpu_count()} cores (nproc), {cpu}; load average at start {load}\n- Python "
            f"{platform.python_version()}, {gcc}")


def git_commit() -> str:
    """The commit measured, and whether the work tree differs from it (read-only: no lock, no index refresh)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(Path(__file__).resolve().parent), *args],
                              capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    return commit + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (smaller n, fewer repeats)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    print(f"# Berm benchmark ({'quick' if args.quick else 'full'} run)\n\n{machine_facts()}\n"
          f"- command: python tools/bench.py{' --quick' if args.quick else ''}\n", flush=True)
    runners, missing = available_runners()
    for kind, why in missing.items():
        print(f"- {COLUMNS[kind]}: {why}")
    for peer, why in UNMEASURED.items():
        print(f"- {peer}: not measured ({why})")
    columns = {k: v for k, v in COLUMNS.items() if k in runners}
    kernel_rows, wrong = measure_kernels(runners, plan)
    boundary_rows, failures = measure_boundary(runners, plan)
    print("\n" + render([*kernel_rows, *geomean_rows(kernel_rows), *boundary_rows], columns))
    print(f"\nKernel work per unit: sha256 = one 256-byte message, crc32 = 1 KiB, sort = 256 words filled and sorted, "
          f"fib = fib(14..15), tokenize = a 2 KiB scan. n per run: {plan.n} (unicorn n/{SLOW['unicorn']}, interpreter "
          f"n/{SLOW['interp']}); medians of {plan.repeats} interleaved repeats.")
    for line in failures:
        print(f"FAILED: {line}")
    for line in wrong:
        print(f"CHECKSUM MISMATCH: {line}")
    return 1 if wrong or failures else 0


if __name__ == "__main__":
    sys.exit(main())
