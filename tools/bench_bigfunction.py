"""What one large guest function costs to compile and to run, whole and in chunks (berm_aot/emit/chunks.py).

The guest is one generated C function: a loop around a 32-way switch whose cases are long runs of arithmetic, loads
and stores on a static array and small branches (``--statements`` of them; 3,000 make about 12,000 RV64
instructions), or, with ``--keywords``, the committed Rust image harnesses/rust-probe/rust-keywords.elf, whose
``match`` of 1,000 byte-string arms rustc makes one function of about 23,000 instructions (a call looks all 1,000
words up; ``--keywords ELF`` takes a build with fewer arms: KEYWORDS in harnesses/rust-probe/build.rs). It is
translated and compiled cold twice: as Berm translates it (whole up to ``chunks.CHUNKED_ABOVE`` instructions, in
chunks above), and cut into chunks of ``chunks.CHUNK_INSNS`` whatever its size (``--whole`` compiles it whole
instead, whatever its size: slow and memory-hungry past ~8,000 instructions).
Each build's answer is checked against the interpreter's, then both are timed side by side.

    python tools/bench_bigfunction.py --statements 2000    # under the threshold: whole against chunks
    python tools/bench_bigfunction.py --whole               # 3,000 statements, past it: whole against chunks
    python tools/bench_bigfunction.py --keywords --whole    # the Rust match: whole against chunks
    python tools/bench_bigfunction.py --keywords kw350.elf --whole    # a build of it with 350 arms

Compile figures: wall time, the compilers' CPU time, the largest compiler's peak memory (of all compiles so far in
this process: compile the larger build first to read it). Run figures: the median of the measuring thread's CPU time.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from bench_runners import children_cpu_time  # noqa: E402

from berm_aot.analysis import analyse  # noqa: E402
from berm_aot.emit import chunks  # noqa: E402
from berm_host.backend import RunRequest  # noqa: E402
from berm_host.engine import Engine  # noqa: E402
from tests.guests import guest_elf  # noqa: E402
from tests.test_aot_chunks import in_chunks  # noqa: E402
from tests.test_rust_keywords import ELF as KEYWORDS_ELF  # noqa: E402
from tests.test_rust_keywords import WORDS  # noqa: E402

VARIABLES = "abcde"


def big_function_source(statements: int, seed: int = 5) -> str:
    """``u64 huge(u64 x, u64 rounds)``: ``rounds`` iterations of a switch over 32 cases of ``statements / 32``
    statements each."""
    rng = random.Random(seed)
    lines = ["typedef unsigned long u64;", "static u64 buf[256];",
             "__attribute__((noinline)) u64 huge(u64 x, u64 rounds) {",
             "  u64 a = x, b = x ^ 0x9e3779b97f4a7c15ul, c = 1, d = 2, e = 3;",
             "  for (u64 r = 0; r < rounds; r++) {", "    switch ((a ^ r) % 32) {"]
    for case in range(32):
        lines.append(f"    case {case}:")
        for k in range(statements // 32):
            v, w, z = (rng.choice(VARIABLES) for _ in range(3))
            op, pick = rng.choice("+^*-"), rng.random()
            if pick < 0.15:
                lines.append(f"      buf[({w} + {k}) & 255] = {v} {op} {z};")
            elif pick < 0.28:
                lines.append(f"      {v} += buf[({z} ^ {k}) & 255];")
            elif pick < 0.35:
                lines.append(f"      if ({v} & {1 << (k % 13)}) {w} = ({w} << 3) | ({z} >> 61); "
                             f"else {w} ^= {rng.getrandbits(32)}ul;")
            else:
                lines.append(f"      {v} = ({w} {op} {z}) + {rng.getrandbits(20)}ul;")
        lines.append("      break;")
    lines += ["    }", "  }", "  return a ^ b ^ c ^ d ^ e;", "}", "u64 _start(u64 x, u64 r) { return huge(x, r); }"]
    return "\n".join(lines)


def compile_cold(elf: bytes, cache: Path, above: int, size: int):
    """The loaded image, and (its largest function's chunks, wall s, compilers' CPU s, largest compiler's peak MB
    so far)."""
    before = children_cpu_time()
    start = time.monotonic()
    with in_chunks(above, size):
        image = Engine(kind="aot", cache_dir=cache).load(elf)
        largest = max(analyse(image.program).functions, key=lambda f: len(f.insns))
        plan = chunks.chunk_plan(largest, image.program)
    wall, cpu = time.monotonic() - start, children_cpu_time() - before
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return image, (1 if plan is None else len(plan.parts), wall, cpu, peak)


@dataclass(frozen=True)
class Subject:
    """What is compiled, and one call of it: ``check(image)`` is compared with the interpreter's, ``timed(image)``
    is what the run figure times."""

    elf: bytes
    title: str
    check: Callable[[object], object]
    timed: Callable[[object], object]


def generated_subject(statements: int, rounds: int) -> Subject:
    elf = guest_elf(big_function_source(statements), keep=("_start", "huge"))

    def call(image, n):
        got = image.backend.run(RunRequest(entry=image.program.symbol("huge"), int_args=(7, n)))
        return got.a0, got.trap

    return Subject(elf, f"{statements} statements; per call: {rounds} iterations of the loop",
                   lambda image: call(image, 300), lambda image: call(image, rounds))


def keywords_subject(elf: Path) -> Subject:
    text = b'"' + b" ".join(WORDS) + b'"'

    def call(image):
        return image.harness(name="keywords").call("lookup", text)

    return Subject(elf.read_bytes(), f"{elf.name}; per call: a lookup of rust-keywords' {len(WORDS)} words", call, call)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=20000, help="loop iterations per timed call")
    parser.add_argument("--keywords", nargs="?", type=Path, const=KEYWORDS_ELF, metavar="ELF",
                        help="the Rust image rust-keywords.elf (or this build of it) instead")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--whole", action="store_true", help="compile the first build whole, whatever its size")
    args = parser.parse_args(argv)
    subject = keywords_subject(args.keywords) if args.keywords else generated_subject(args.statements, args.rounds)
    interp = Engine(kind="interp").load(subject.elf)
    insns = max(len(f.insns) for f in analyse(interp.program).functions)
    first = ("whole", 1 << 62, chunks.CHUNK_INSNS) if args.whole else (
        "as translated", chunks.CHUNKED_ABOVE, chunks.CHUNK_INSNS)
    builds = [first, (f"chunks of {chunks.CHUNK_INSNS}", 0, chunks.CHUNK_INSNS)]
    print(f"one function of {insns} instructions ({subject.title}); chunked above {chunks.CHUNKED_ABOVE}\n")
    print("| build | chunks | cold compile, wall | compilers' CPU | largest compiler so far | per call |")
    print("|---|---|---|---|---|---|")
    images, rows = {}, {}
    with tempfile.TemporaryDirectory(prefix="berm-bigfunction-") as tmp:
        for name, above, size in builds:
            images[name], rows[name] = compile_cold(subject.elf, Path(tmp) / str(len(rows)), above, size)
        want = subject.check(interp)
        for name, image in images.items():
            if (got := subject.check(image)) != want:
                print(f"{name}: {got}, the interpreter {want}")
                return 1
        times: dict[str, list[float]] = {name: [] for name in images}
        for _ in range(args.repeats):
            for name, image in images.items():
                start = time.thread_time()
                subject.timed(image)
                times[name].append(time.thread_time() - start)
    for name, (parts, wall, cpu, peak) in rows.items():
        print(f"| {name} | {parts if parts > 1 else 'none'} | {wall:.1f} s | {cpu:.1f} s | {peak:.0f} MB "
              f"| {statistics.median(times[name]) * 1e3:.2f} ms |")
    print(f"\nper call: the median of {args.repeats}; every build's answer matched the interpreter's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
