"""Generate a large guest C program for the cold-compile figure: many small functions with loops, a switch
(a jump table), direct calls and a function-pointer table (relocations in data), about 330 bytes of RV64 code each.

Nothing runs it; it exists to be translated and compiled. The output is deterministic for a given size.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench_build import build_guest_program, cache_dir

_OPS = ("a += b * {c}u;", "a ^= (b >> {s}) | (b << (64 - {s}));", "b -= a + {c}u;", "a = (a ^ {c}u) * 3u;",
        "b = b / ((a & 0xff) | 1u);", "a += (b % {c}u) << 2;", "b ^= a >> {s};", "a = a * {c}u + b;")


def _function(i: int, rng: random.Random) -> str:
    cases = []
    for case in range(8):
        op = rng.choice(_OPS).format(c=rng.randrange(3, 1 << 20) | 1, s=rng.randrange(1, 63))
        call = f" a += f{rng.randrange(i)}(b, a);" if i and case % 3 == 0 else ""
        cases.append(f"    case {case}: {op}{call} break;")
    mix = rng.choice(_OPS).format(c=rng.randrange(3, 1 << 20) | 1, s=rng.randrange(1, 63))
    return "\n".join([
        f"__attribute__((noinline)) uint64_t f{i}(uint64_t a, uint64_t b) {{",
        f"    for (uint64_t k = 0; k < (a & 7) + 1; k++) {{ {mix} b += k; }}",
        "    switch ((a ^ b) % 8) {",
        *cases,
        "    }",
        f"    return a > b ? a - b : b ^ {rng.randrange(1 << 30)}u;",
        "}",
    ])


def big_guest_source(functions: int, seed: int = 205) -> str:
    rng = random.Random(seed)
    body = [_function(i, rng) for i in range(functions)]
    table = ", ".join(f"f{i}" for i in range(functions))
    return "\n\n".join([
        "#include <stdint.h>",
        *body,
        f"uint64_t (*const big_table[{functions}])(uint64_t, uint64_t) = {{{table}}};",
        "void _start(void) { static const void *volatile sink; sink = big_table; }",
    ]) + "\n"


def build_big_guest(functions: int) -> Path:
    """The ELF of the generated program with ``functions`` functions (cached like every benchmark guest)."""
    src = cache_dir() / f"bigguest-{functions}.c"
    text = big_guest_source(functions)
    if not src.exists() or src.read_text() != text:
        src.write_text(text)
    return build_guest_program(f"bigguest{functions}", [src], ())
