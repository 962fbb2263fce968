"""``berm run ELF SYMBOL [ARG ...]``: call one global function of an image with integer arguments, no manifest and
no capabilities — a debugging tool for guests and engines.

Arguments go to a0..a7 (decimal or 0x-hex, negative as two's complement); the output is ``a0=0x… a1=0x…``.
On a trap it prints the trap, the pc with function+offset, the instruction there and every register, and exits 2.
When the guest called ``berm.fail``, its text is printed on stderr and the exit status is 1.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time

from berm_abi.errors import BermError
from berm_aot.elf import read_elf_file
from berm_aot.errors import about_file
from berm_aot.program import Program
from berm_cli import arguments
from berm_cli.interrupt import interruptible
from berm_cli.terminal import compile_notice, failure_text, shown
from berm_host.backend import RunRequest, RunResult
from berm_host.declaration import parse_memory
from berm_host.interp import InterpBackend
from berm_host.layout import DEFAULT_MEMORY
from berm_host.traps import Trap

MASK64 = (1 << 64) - 1
ABI_NAMES = ("zero ra sp gp tp t0 t1 t2 s0 s1 a0 a1 a2 a3 a4 a5 a6 a7 "
             "s2 s3 s4 s5 s6 s7 s8 s9 s10 s11 t3 t4 t5 t6").split()
#: The global symbols named when the one asked for is not there and none is close to it.
SYMBOLS_SHOWN = 8


#: A 64-bit argument's text: ASCII decimal or 0x-hex digits, optionally negative. Matched before int() reads it,
#: which took "0x-5", "1_000", " +7" and non-ASCII digits (found by a review).
_INT_ARG = re.compile(r"(-?)(?:0[xX]([0-9a-fA-F]+)|([0-9]+))")


def parse_int_arg(text: str) -> int:
    """A 64-bit argument: decimal or 0x-hex, optionally negative (two's complement)."""
    match = _INT_ARG.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{_cut(text)!r} is not a decimal or 0x-hex integer")
    sign, hex_digits, decimal = match.groups()
    # not read by int(), whose limit is 4,300 digits: it cannot fit anyway; leading zeros are no digits of it (found
    # by a review: 1 with 67 zeros before it was said not to fit)
    digits = (hex_digits or decimal).lstrip("0") or "0"
    if len(digits) > 64:
        raise argparse.ArgumentTypeError(f"{_cut(text)} does not fit 64 bits")
    value = int(digits, 16 if hex_digits else 10)
    value = -value if sign else value
    if not -(1 << 63) <= value <= MASK64:
        raise argparse.ArgumentTypeError(f"{_cut(text)} does not fit 64 bits")
    return value & MASK64


def _cut(text: str) -> str:
    """At most 40 characters of ``text``, marked when cut (a review: 70 hex digits were shown as 38, unmarked)."""
    return text if len(text) <= 40 else text[:40] + "…"


def add_arguments(p) -> None:
    p.add_argument("elf", type=arguments.path, help="the RV64 image")
    p.add_argument("symbol", help="a global function symbol of the image")
    p.add_argument("args", nargs="*", type=parse_int_arg, metavar="ARG",
                   help="up to 8 integers for a0..a7, decimal or 0x-hex (a negative hex one after --: berm run ELF "
                        "SYMBOL -- -0x10)")
    p.add_argument("--engine", choices=("interp", "aot"), default="interp", help="execution engine (default interp)")
    p.add_argument("--memory", metavar="SIZE", default=str(DEFAULT_MEMORY),
                   help="guest memory: 65536, 64K, 64M, 1G (default 64M)")
    p.add_argument("--timeout", type=arguments.seconds, default=60.0, metavar="SECONDS", help="deadline (default 60)")


def _load(args):
    """(program, backend) for the image in the chosen engine. The interpreter is built directly (it needs nothing
    but the program); translated code comes from ``berm_host.engine`` (compiled on a cache miss)."""
    size = parse_memory(args.memory, "--memory")
    if args.engine == "interp":
        image = read_elf_file(args.elf)
        with about_file(args.elf):
            program = Program.from_image(image)
        return program, InterpBackend(program, size)
    from berm_host.engine import Engine

    image = Engine(kind="aot", memory_size=size, deadline=args.timeout,
                   on_compile=compile_notice("berm run")).load(args.elf)
    return image.program, image.backend


def format_registers(regs: tuple[int, ...]) -> list[str]:
    """Every register by ABI name, four to a line."""
    cells = [f"{name:>4}={value:#018x}" for name, value in zip(ABI_NAMES, regs)]
    return ["  " + " ".join(cells[i:i + 4]) for i in range(0, 32, 4)]


def format_trap(program, result: RunResult) -> list[str]:
    from berm_aot.disasm import disassemble

    trap = result.trap
    lines = [str(Trap(trap)), f"  pc {trap.pc:#x} in {program.symbolize(trap.pc)}",
             *(f"  {line}" for line in trap.chain_lines())]
    if program.in_code(trap.pc):
        lines.append(f"  instruction: {disassemble(program.instruction(trap.pc))}")
    else:
        lines.append("  instruction: (no code at this address)")
    return lines + format_registers(result.regs)


def _known_symbols(program: Program, name: str) -> str:
    """What a misnamed symbol might have been, in parentheses: the closest names (a typo, likely), else the first few
    (a newcomer's walkthrough: the error named none, and berm inspect lists no symbols) and why a function of the
    author's own might be missing (found by a review: ``berm build`` links with --gc-sections)."""
    names = program.global_names()
    close = difflib.get_close_matches(name, names, n=3)
    if close:
        return f"(did you mean {', '.join(map(repr, close))}?)"
    more = f", … {len(names)} in all" if len(names) > SYMBOLS_SHOWN else ""
    listed = f"it has {', '.join(map(repr, names[:SYMBOLS_SHOWN]))}{more}" if names else "it has none"
    return (f"({listed}); a function no tool reaches is left out of an image linked with --gc-sections, as berm "
            "build links it: in C, __attribute__((used, retain)) keeps it")


def run(args) -> int:
    if len(args.args) > 8:
        raise BermError(f"at most 8 integer arguments fit a0..a7, not {len(args.args)}")
    program, backend = _load(args)
    entry = program.symbol(args.symbol)
    if entry is None:
        raise BermError(f"{args.elf} has no global symbol {args.symbol!r} {_known_symbols(program, args.symbol)}")
    if not program.in_code(entry):  # it ran, and trapped at an address the symbol's name was missing from (a review)
        raise BermError(f"{args.elf}: {args.symbol!r} is not a function: it names {entry:#x}, outside the image's code")
    request = RunRequest(entry=entry, int_args=tuple(args.args), deadline=time.monotonic() + args.timeout)
    result = interruptible(lambda: backend.run(request))
    if result.trap is not None:
        print(shown("\n".join(format_trap(program, result))), file=sys.stderr)
        return 2
    print(f"a0={result.a0:#x} a1={result.a1:#x}")
    if result.failure is not None:
        print(f"berm.fail: {failure_text(result.failure.decode('utf-8', 'replace'))}", file=sys.stderr)
        return 1
    return 0
