"""Instructions executed per unit of work of each compute kernel: native x86, the guest's RV64, Berm's x86.

    python tools/bench_insns.py        # needs valgrind (Debian: apt install valgrind); ~2 minutes

Where tools/bench.py says how much slower translated code is, this says why, free of the machine's noise: how much
longer the guest's own RV64 code is than native x86 (what the ISA costs), and how many x86 instructions Berm
executes per guest instruction (what the translation and the sandbox's checks cost).

- x86 counts come from valgrind's callgrind over a child process that makes one call of the kernel at n and one
  at 2n units (``PYTHONHASHSEED=0``, so Python's own work is the same in both): (I(2n) − I(n)) / n. Berm's child
  loads the image from a code cache this process filled first, so no translation is counted.
- RV64 counts come from unicorn running the guest ELF with a hook on every instruction, the same difference.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from bench_build import KERNELS, build_guest, build_native  # noqa: E402
from bench_runners import BermRunner, NativeRunner, UnicornRunner  # noqa: E402

from berm_aot.elf import read_elf  # noqa: E402

#: Units of work per measurement (the second call does twice as many).
UNITS = {"sha256": 100, "crc32": 100, "sort": 40, "fib": 100, "tokenize": 100}


def _child(kind: str, kernel: str, n: int) -> None:
    """Run ``kernel`` once at ``n`` units on ``kind`` (``native`` or ``aot``): what callgrind counts."""
    runner = NativeRunner(build_native()) if kind == "native" else BermRunner("aot", build_guest().read_bytes())
    runner.call(kernel, n)


def _callgrind_total(kind: str, kernel: str, n: int, env: dict[str, str]) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
           "--child", kind, kernel, str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"callgrind of {kind} {kernel} n={n} failed:\n{proc.stderr[-2000:]}")
    return int(found.group(1))


def x86_per_unit(kind: str, kernel: str, env: dict[str, str]) -> int:
    n = UNITS[kernel]
    return (_callgrind_total(kind, kernel, 2 * n, env) - _callgrind_total(kind, kernel, n, env)) // n


def rv64_per_unit(runner: UnicornRunner, kernel: str) -> int:
    from unicorn import UC_HOOK_CODE

    count = [0]

    def hook(uc, address, size, data):
        count[0] += 1

    handle = runner.uc.hook_add(UC_HOOK_CODE, hook)
    try:
        n = UNITS[kernel]
        totals = []
        for units in (n, 2 * n):
            count[0] = 0
            runner.call(kernel, units)
            totals.append(count[0])
    finally:
        runner.uc.hook_del(handle)
    return (totals[1] - totals[0]) // n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("KIND", "KERNEL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    if shutil.which("valgrind") is None:
        print("bench_insns: valgrind is not installed (Debian: apt install valgrind)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="berm-insns-") as cache:
        env = {**os.environ, "PYTHONHASHSEED": "0", "BERM_CACHE_DIR": cache}
        os.environ["BERM_CACHE_DIR"] = cache
        BermRunner("aot", build_guest().read_bytes())  # translate and compile now, outside the counted children
        unicorn = UnicornRunner(read_elf(build_guest().read_bytes()))
        print("| kernel | native x86 | guest RV64 | Berm x86 | RV64 / native | Berm x86 per RV64 | Berm / native |")
        print("|---|---|---|---|---|---|---|")
        for kernel in KERNELS:
            native, berm = x86_per_unit("native", kernel, env), x86_per_unit("aot", kernel, env)
            rv64 = rv64_per_unit(unicorn, kernel)
            print(f"| {kernel} | {native:,} | {rv64:,} | {berm:,} | {rv64 / native:.2f} | {berm / rv64:.2f} | "
                  f"{berm / native:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
