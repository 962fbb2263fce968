"""Compare builds of the kernels' guest, or compile flags for it, in one process: each configuration's time ratio
against native, rounds interleaved, so the machine's speed phases hit every configuration alike.

    python tools/bench_ab.py OLD.elf@"-O1 -fcaller-saves -free" NEW.elf@ --kernel fib --rounds 21

A configuration is ``ELF@CFLAGS``: a guest ELF of tools/kernels (as tools/bench_build.py builds it; any build of
those sources, e.g. from an older checkout's bench cache) and the ``BERM_CFLAGS`` its translation is compiled with
(empty: the default, berm_aot/cc.py). tools/bench.py compares Berm with its peers; this compares Berm with itself,
which separate bench.py runs on a busy machine cannot do to a few percent.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import bench_boundary as bb  # noqa: E402
from bench_build import KERNELS, build_native  # noqa: E402
from bench_runners import BermRunner, NativeRunner  # noqa: E402

#: Units of work per timed call (enough for ~1-5 ms of native time).
UNITS = {"sha256": 3000, "crc32": 3000, "sort": 800, "fib": 3000, "tokenize": 2000}


def runner(spec: str) -> BermRunner:
    elf, sep, flags = spec.partition("@")
    if not sep:
        raise SystemExit(f"bench_ab: {spec!r} is not ELF@CFLAGS")
    if flags:
        os.environ["BERM_CFLAGS"] = flags
    else:
        os.environ.pop("BERM_CFLAGS", None)
    return BermRunner("aot", Path(elf).read_bytes())


def ratios(runners: list[BermRunner], native: NativeRunner, kernel: str, rounds: int) -> list[float]:
    """Per configuration, the median over rounds of its time over native's time in the same round."""
    n = UNITS[kernel]
    want = native.call(kernel, n)
    for r in runners:
        if r.call(kernel, n) != want:
            raise SystemExit(f"bench_ab: a configuration computes a different {kernel} checksum from native")
    per = [[] for _ in runners]
    for _ in range(rounds):
        t_native = bb.timed(lambda: native.call(kernel, n))
        for i, r in enumerate(runners):
            per[i].append(bb.timed(lambda: r.call(kernel, n)) / t_native)
    return [statistics.median(x) for x in per]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", metavar="ELF@CFLAGS")
    parser.add_argument("--kernel", action="append", choices=KERNELS, help="default: all of them")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    runners = [runner(spec) for spec in args.configs]
    native = NativeRunner(build_native())
    kernels = args.kernel or list(KERNELS)
    print_table(args.configs, {k: ratios(runners, native, k, args.rounds) for k in kernels})
    return 0


def print_table(columns: list[str], table: dict[str, list[float]]) -> None:
    """A Markdown table of ``table`` (kernel → one ratio per column), with the geometric mean over kernels."""
    print("| kernel | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for k, row in table.items():
        print(f"| {k} | " + " | ".join(f"{x:.3f}×" for x in row) + " |")
    if len(table) > 1:
        means = [math.exp(statistics.fmean(math.log(row[i]) for row in table.values())) for i in range(len(columns))]
        print("| geometric mean | " + " | ".join(f"{x:.3f}×" for x in means) + " |")


if __name__ == "__main__":
    sys.exit(main())
