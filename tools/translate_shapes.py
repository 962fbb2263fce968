"""How the translation's cost grows with hostile program shapes: each shape is built at about n, 2n and 4n
instructions (assembly, ``tests.guests.guest_elf``), read, analysed and emitted as C (no C compiler), and the script
prints the time of each and its growth per doubling. The translation runs in the host process, and its analysis
before any compile starts, so it must grow linearly: a growth near 4 per doubling is a quadratic analysis (session
22's self-call cycle search was one, found this way). Exit status 1 when a shape grows by more than ``--most`` per
doubling.

    python tools/translate_shapes.py            # every shape from n = 3000 instructions
    python tools/translate_shapes.py --n 1000 --shape cases

CPU time of this process; rerun a shape that looks slow (timing on a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from berm_aot.elf import read_elf  # noqa: E402
from berm_aot.emit import emit_units  # noqa: E402
from berm_aot.program import Program  # noqa: E402
from berm_host.layout import layout_for  # noqa: E402
from tests.elf_samples import ASM_PRELUDE  # noqa: E402
from tests.guests import guest_elf  # noqa: E402

#: Every shape is the function ``f`` (kept alive by ``guest_elf``'s ``keep``, as ``pointer`` below is).
HEAD = ASM_PRELUDE + """
    .globl f
    .type f, @function
f:
    addi sp, sp, -16
    sd ra, 8(sp)
"""
EXIT = "    ld ra, 8(sp)\n    addi sp, sp, 16\n    ret\n"
#: A pointer to f in data: a relocation for the shapes that have none in their code (the reader requires one).
POINTER = '\n    .section .data.keep, "aw", @progbits\n    .globl pointer\npointer:\n    .quad f\n'


def _table(n: int) -> str:
    return '\n    .section .data.table, "aw", @progbits\ntable:\n' + "".join(f"    .quad .L{k}\n" for k in range(n))


def cases(n: int, self_call: bool) -> str:
    """n/2 cases of a jump table, each ending in another indirect jump."""
    n //= 2
    call = "    beqz a0, 1f\n    addi a0, a0, -1\n    call f\n1:\n" if self_call else ""
    body = "".join(f".L{k}:\n    addi a0, a0, 1\n    jr a1\n" for k in range(n))
    return HEAD + call + "    la a1, table\n    ld a1, 0(a1)\n    jr a1\n" + body + _table(n)


def loops_around_self_calls(n: int) -> str:
    """n/4 loops one after another, each calling the function itself."""
    n //= 4
    body = "".join(f".L{k}:\n    addi a0, a0, -1\n    call f\n    bnez a1, .L{k}\n" for k in range(n))
    return HEAD + "    beqz a0, 9f\n" + body + "9:\n" + EXIT + POINTER


def returns_between_self_calls(n: int) -> str:
    """n/7 self-calls, each followed by a return on one path."""
    n //= 7
    body = "".join(f"    beqz a{k % 6}, 8f\n    call f\n    bnez a1, 9f\n8:\n{EXIT}9:\n" for k in range(n))
    return HEAD + body + EXIT + POINTER


def branchy(n: int) -> str:
    """n instructions: arithmetic, stack and memory accesses, forward branches and short backward loops."""
    rng = random.Random(n)
    regs = ["a0", "a1", "a2", "a3", "a4", "a5", "s0", "s1", "t0", "t1"]
    lines = []
    for k in range(n):
        a, b, c = rng.choice(regs), rng.choice(regs), rng.choice(regs)
        pick = rng.random()
        lines.append(f".L{k}:")
        if pick < 0.35:
            lines.append(f"    add {a}, {b}, {c}")
        elif pick < 0.5:
            lines.append(f"    ld {a}, {rng.randrange(0, 256, 8)}(sp)")
        elif pick < 0.65:
            lines.append(f"    sd {a}, {rng.randrange(0, 256, 8)}(sp)")
        elif pick < 0.75:
            lines.append(f"    lw {a}, {rng.randrange(0, 64, 4)}({b})")
        elif pick < 0.9:
            lines.append(f"    bne {a}, {b}, .L{min(n - 1, k + rng.randrange(1, 40))}")
        else:
            lines.append(f"    blt {a}, {b}, .L{max(0, k - rng.randrange(1, 40))}")
    return HEAD + "    addi sp, sp, -512\n" + "\n".join(lines) + "\n    addi sp, sp, 512\n" + EXIT + POINTER


def spills(n: int) -> str:
    """n/4 stores through sp, each to bytes no earlier one wrote, and a load of each (about n/2 instructions): the
    facts of berm_aot.emit.frames grow with every one."""
    n //= 2
    moves = "".join(("    addi sp, sp, -2032\n" if k % 254 == 0 else "") + f"    sd a0, {(k % 254) * 8}(sp)\n"
                    for k in range(n // 2))
    loads = "".join(f"    ld a1, {(k % 254) * 8}(sp)\n" for k in range(n // 2))
    return HEAD + moves + loads + EXIT + POINTER


def many_functions(n: int) -> str:
    """n one-instruction functions."""
    fns = "".join(f"    .globl g{k}\n    .type g{k}, @function\ng{k}:\n    ret\n" for k in range(n))
    return HEAD + EXIT + fns + POINTER + "    .quad g0\n"


SHAPES = {
    "cases": lambda n: cases(n, self_call=False),
    "cases-self-call": lambda n: cases(n, self_call=True),
    "loops-around-self-calls": loops_around_self_calls,
    "returns-between-self-calls": returns_between_self_calls,
    "branchy": branchy,
    "spills": spills,
    "many-functions": many_functions,
}


def translate(source: str) -> tuple[float, int]:
    """CPU seconds to read, analyse and emit the guest built from ``source``, and its instruction count."""
    elf = guest_elf(source, suffix=".S", keep=("f", "pointer"))
    start = time.process_time()
    image = read_elf(elf)
    program = Program.from_image(image)
    for _ in emit_units(program, windows=layout_for(image).windows()):
        pass
    return time.process_time() - start, len(program.code)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000,
                        help="the smallest size of each shape, in instructions (4n stays in one function's limit)")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="only these shapes")
    parser.add_argument("--most", type=float, default=2.8, help="the largest growth per doubling accepted")
    args = parser.parse_args()
    worst = 0.0
    for name in args.shape or SHAPES:
        times = []
        for n in (args.n, 2 * args.n, 4 * args.n):
            seconds, insns = translate(SHAPES[name](n))
            times.append(seconds)
            print(f"{name:28} n={n:<6} {insns:>7} instructions  {seconds:7.3f} s", flush=True)
        growth = (times[2] / max(times[1], 1e-3)) ** 0.5 * (times[1] / max(times[0], 1e-3)) ** 0.5
        worst = max(worst, growth)
        print(f"{name:28} growth per doubling {growth:.2f}", flush=True)
    return 1 if worst > args.most else 0


if __name__ == "__main__":
    sys.exit(main())
