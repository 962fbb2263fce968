"""What the sandbox's checks cost the compute kernels: Berm as it is, against the same translation with checks
taken out, all timed against native code in one process (rounds interleaved, as in tools/bench_ab.py).

    python tools/bench_limits.py            # well under a minute

Configurations (each a set of macro overrides of berm_host/aot/berm_code.h, placed after its #include in every
emitted unit):
- ``berm``: the shipped code.
- ``no-memory-checks``: loads and stores go straight to guest memory — no bounds check, no dirty mark, no group
  check (BERM_LD_, BERM_ST_, BERM_GROUP, BERM_GROUP_MARK, BERM_GROUP_LEVEL).
- ``no-checks``: also no interrupt poll at back-edges and no entry or call-depth check (BERM_POLL, BERM_ENTRY,
  BERM_SELF_CALL): what is left is the translation alone (registers exact at every exit, the RV64 code itself).

The two reduced configurations are **unsafe** and exist only here: they are compiled into a temporary code cache
this tool deletes, never into a user's, and run only the kernels (whose answers are checked against native's).
Where tools/bench_insns.py counts instructions, this measures time: on this machine a check that adds
instructions may cost no time (crc32's loop is bound by its load-xor chain) and a removed one may move code.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from bench_ab import print_table, ratios  # noqa: E402
from bench_build import KERNELS, build_guest, build_native  # noqa: E402
from bench_runners import BermRunner, NativeRunner  # noqa: E402

import berm_host.aot.objects as objects  # noqa: E402

INCLUDE = '#include "berm_code.h"\n'

#: Each override first insists the macro exists, so a renamed macro fails the compile instead of measuring nothing.
_MEMORY = {
    "BERM_LD_(IN1, IN2, dst, T, addr, pc)":
        "do { uint64_t a_ = (addr); T v_; memcpy(&v_, M + a_, sizeof v_); dst = (uint64_t)(int64_t)v_; } while (0)",
    "BERM_ST_(IN1, MARK1, IN2, MARK2, T, addr, val, pc)":
        "do { uint64_t a_ = (addr); T v_ = (T)(val); memcpy(M + a_, &v_, sizeof v_); } while (0)",
    "BERM_GROUP(g, W1, W2, base, lo, n)": "(g = 1)",
    "BERM_GROUP_MARK(g, stack, base, first, last)": "((void)0)",
    "BERM_GROUP_LEVEL(v, g, stack, ...)": "(g = (stack))",
}
_CONTROL = {
    "BERM_POLL(pc)": "((void)0)",
    "BERM_ENTRY(pc)": "((void)0)",
    "BERM_SELF_CALL(pc, start, link, enter)": "do { link; enter; } while (0)",
}
CONFIGS = {"berm": {}, "no-memory-checks": _MEMORY, "no-checks": {**_MEMORY, **_CONTROL}}


def overrides(macros: dict[str, str]) -> str:
    lines = []
    for head, body in macros.items():
        name = head.split("(")[0]
        lines += [f"#ifndef {name}", f'#error "bench_limits: berm_code.h no longer defines {name}"', "#endif",
                  f"#undef {name}", f"#define {head} {body}"]
    return "\n".join(lines) + "\n"


def runner(elf: bytes, macros: dict[str, str], cache: Path) -> BermRunner:
    """Berm on ``elf`` with every emitted unit carrying ``macros``, compiled into the cache ``cache``."""
    emit = objects.emit_units
    extra = overrides(macros) if macros else ""

    def patched(*args, **kwargs):
        for unit in emit(*args, **kwargs):
            if INCLUDE not in unit:
                raise SystemExit("bench_limits: an emitted unit no longer includes berm_code.h")
            yield unit.replace(INCLUDE, INCLUDE + extra, 1)

    saved = os.environ.get("BERM_CACHE_DIR")
    os.environ["BERM_CACHE_DIR"] = str(cache)
    objects.emit_units = patched
    try:
        return BermRunner("aot", elf)
    finally:
        objects.emit_units = emit
        if saved is None:
            del os.environ["BERM_CACHE_DIR"]
        else:
            os.environ["BERM_CACHE_DIR"] = saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", action="append", choices=KERNELS, help="default: all of them")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    elf = build_guest().read_bytes()
    kernels = args.kernel or list(KERNELS)
    with tempfile.TemporaryDirectory(prefix="berm-limits-") as tmp:
        runners = [runner(elf, macros, Path(tmp) / name) for name, macros in CONFIGS.items()]
        native = NativeRunner(build_native())
        table = {k: ratios(runners, native, k, args.rounds) for k in kernels}
    print_table(list(CONFIGS), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
