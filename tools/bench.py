"""Berm's benchmark: every DESIGN.md performance figure with its target, beside native code and the peers.

    python tools/bench.py            # the full run (the figures in BENCHMARKS.md)
    python tools/bench.py --quick    # a fast smoke run: smaller n, fewer repeats, a smaller cold-compile guest

Everything runs side by side in one process, repetitions interleaved across runners, so the ratios hold on a busy
2-core machine; each figure is a median of the measuring thread's CPU time (wall time for the cold compile; the
CPU time of its processes for qemu-user). Compute kernels (tools/kernels/) run natively (gcc -O2), on wasmtime, on
qemu-user (when Debian's qemu-user is installed), on unicorn and on Berm's AOT and interpreter engines; each figure
is time per unit of work with the kernel's fixed setup (its n = 0 run) subtracted, so runners using different n
compare; each ratio is the median of per-round ratios against native's run in the same round. The output is a
Markdown table.
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
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_boundary as bb  # noqa: E402
from bench_bigguest import build_big_guest  # noqa: E402
from bench_build import KERNELS, build_boundary_guest  # noqa: E402
from bench_runners import BermRunner, available_runners  # noqa: E402

from berm_abi.errors import BermError  # noqa: E402

#: A real guest of about the size the cold-compile target names, built by rustc (harnesses/rust-probe/build.sh).
RUST_GUEST = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-keywords.elf"

#: Table columns: runner kind -> heading. Ratios are taken against "native".
COLUMNS = {"aot": "Berm AOT", "native": "native", "wasmtime": "wasmtime", "qemu": "qemu-user", "unicorn": "unicorn",
           "interp": "Berm interp"}
RATIO_COLUMNS = ("aot", "wasmtime", "qemu", "unicorn", "interp")
#: The runners whose per-round kernel ratios a kernel's note spreads out (the two near native).
SPREAD = ("aot", "wasmtime")


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
    big_functions: int
    compiles: int  # cold compiles of the big guest (the figure is their median)

    def kernel_n(self, kind: str, kernel: str) -> int:
        return scaled(self.n[kernel], kind)


#: Work divisors for the slow runners.
SLOW = {"unicorn": 16, "interp": 400}


def scaled(n: int, kind: str) -> int:
    return max(1, n // SLOW.get(kind, 1))


FULL = Plan(n={"sha256": 8000, "crc32": 8000, "sort": 2000, "fib": 15000, "tokenize": 6000}, repeats=11,
            invoke_calls=20000, hostcall_n=2_000_000, capability_n=100_000, loads=200, big_functions=360,
            compiles=3)
QUICK = Plan(n={"sha256": 800, "crc32": 800, "sort": 200, "fib": 1500, "tokenize": 600}, repeats=3,
             invoke_calls=2000, hostcall_n=200_000, capability_n=10_000, loads=20, big_functions=60,
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


def fmt_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×" if x < 10 else f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


# --- compute kernels -----------------------------------------------------------------------------------------------

def measure_kernels(runners: dict, plan: Plan) -> tuple[list[Row], list[str]]:
    """One row per kernel (seconds per unit of work) and the list of checksum mismatches."""
    native = runners["native"]
    wrong = []
    for kernel in KERNELS:
        for kind, runner in runners.items():
            n = plan.kernel_n(kind, kernel)
            got, want = runner.call(kernel, n), native.call(kernel, n)
            if got != want:
                wrong.append(f"{kernel} on {kind}: checksum {got:#x}, native says {want:#x} (n={n})")
    rows = []
    for kernel in KERNELS:
        units: dict[str, list[float]] = {kind: [] for kind in runners}  # seconds per unit, one per repeat
        for _ in range(plan.repeats):
            for kind, runner in runners.items():
                n, clock = plan.kernel_n(kind, kernel), getattr(runner, "clock", bb.clock)
                t_n = bb.timed(lambda: runner.call(kernel, n), clock)
                units[kind].append(max(0.0, t_n - bb.timed(lambda: runner.call(kernel, 0), clock)) / n)
        row = Row(f"kernel {kernel} (per unit)", cells={k: statistics.median(v) for k, v in units.items()})
        # Ratios pair each repeat with native's sample from the same round, so load that drifts during the run
        # cancels out.
        per_round = {k: sorted(a / b for a, b in zip(units[k], units["native"]) if b)
                     for k in RATIO_COLUMNS if k in units}
        row.ratios = {k: statistics.median(v) for k, v in per_round.items() if v}
        # The machine's speed phases (a busy neighbour on the core) slow translated code more than native code,
        # so one run's rounds can fall in two clusters (fib: 1.6x and 2.1x): the note shows how far apart.
        row.note = f"ratio vs native per round, lowest to highest of {plan.repeats}: " + ", ".join(
            f"{COLUMNS[k]} {fmt_ratio(v[0])}–{fmt_ratio(v[-1])}" for k, v in per_round.items() if k in SPREAD and v)
        rows.append(row)
    return rows, wrong


def geomean_row(kernel_rows: list[Row]) -> Row:
    row = Row("kernels: geometric mean of time ratios vs native", target="≤ 1.25× native", target_ratio=1.25)
    for kind in RATIO_COLUMNS:
        ratios = [r.ratios[kind] for r in kernel_rows if r.ratios.get(kind)]
        if len(ratios) == len(kernel_rows):
            row.ratios[kind] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return row


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

    boundary = build_boundary_guest().read_bytes()
    invoke = Row("one invocation from Python (256-byte args pulled, small result), p50", "≤ 2 µs", 2e-6,
                 note="native: cffi ABI-mode call floor; wasmtime: new Store + instantiate + call")
    hostcall = Row("one core host call (berm.args.len) inside the guest", "≤ 5 ns", 5e-9)
    capability = Row("one capability served by Python, round trip", "≤ 1 µs", 1e-6,
                     note="call + berm.result.read of a 4-byte reply")
    load = Row("loading a cached image (new Engine + load), p50", "≤ 1 ms", 1e-3)
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
        measure(hostcall, kind, lambda: bb.hostcall_seconds(runner, scaled(plan.hostcall_n, kind), plan.repeats))
        measure(capability, kind,
                lambda: bb.capability_seconds(runner, scaled(plan.capability_n, kind), plan.repeats))
    if "aot" in runners:
        measure(load, "aot", lambda: bb.cached_load_p50(boundary, plan.loads))
        measure(compile_row, "aot",
                lambda: cold_compile(big.read_bytes(), plan.compiles, compile_row, compile_cpu), compile_cpu)
        measure(rust_row, "aot",
                lambda: cold_compile(RUST_GUEST.read_bytes(), plan.compiles, rust_row, rust_cpu), rust_cpu)
    return [invoke, hostcall, capability, load, compile_row, compile_cpu, rust_row, rust_cpu], failures


def cold_compile(elf: bytes, runs: int, row: Row, cpu_row: Row) -> tuple[float, float]:
    """The median wall and CPU time of ``runs`` cold compiles of ``elf``; ``row``'s note gets every run's wall time,
    ``cpu_row``'s how much of the CPU time was the translation's rather than the compilers'."""
    wall, cpu, walls, own = bb.cold_compile_seconds(elf, runs)
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
    return (f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n- machine: {os.cpu_count()} cores "
            f"(nproc), {cpu}; load average at start {load}\n- Python {platform.python_version()}, {gcc}")


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
    columns = {k: v for k, v in COLUMNS.items() if k in runners}
    kernel_rows, wrong = measure_kernels(runners, plan)
    boundary_rows, failures = measure_boundary(runners, plan)
    print("\n" + render([*kernel_rows, geomean_row(kernel_rows), *boundary_rows], columns))
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
