"""How a program is split into translation units (berm_aot.emit.unit_shares): equal shares, the last one halved so
that the compilers of a parallel build finish close together, and an image split that way runs as one."""

from __future__ import annotations

import re

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit import _UNIT_INSNS, MAX_UNIT_INSNS, MAX_UNITS, emit_program, unit_shares
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import layout_for
from tests.guests import guest_elf

MEMORY = 1 << 20


@pytest.mark.parametrize("total", [0, 1, _UNIT_INSNS, _UNIT_INSNS + 1, 4000, 12_000, 34_305, 100_000,
                                   MAX_UNITS * MAX_UNIT_INSNS, MAX_UNITS * MAX_UNIT_INSNS + 1, 1_000_000])
def test_shares_cover_the_program_and_halve_the_last(total):
    shares = unit_shares(total)
    assert sum(shares) == pytest.approx(total)
    if total <= _UNIT_INSNS:  # one unit: nothing to halve
        assert shares == [total]
        return
    *full, last_a, last_b = shares
    assert len(set(full)) == 1 and full[0] <= MAX_UNIT_INSNS
    assert last_a == last_b == pytest.approx(full[0] / 2)
    if total <= MAX_UNITS * MAX_UNIT_INSNS:
        assert len(full) <= MAX_UNITS - 1
    else:  # more units, of at most MAX_UNIT_INSNS each
        assert len(full) == -(-total // MAX_UNIT_INSNS) - 1


FUNCTIONS = 40
ADDS = 100


def _many_functions() -> str:
    """``_start`` calls f0..f39 in turn, each ``ADDS`` increments of a0: a program of ~4,100 instructions."""
    calls = "\n".join(f"    jal f{i}" for i in range(FUNCTIONS))
    bodies = "\n".join(f"""
    .type f{i}, @function
f{i}:
    .rept {ADDS}
    addi a0, a0, 1
    .endr
    ret""" for i in range(FUNCTIONS))
    return f"""
    .globl _start
    .type _start, @function
_start:
    addi sp, sp, -16
    sd ra, 8(sp)
{calls}
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
{bodies}
    .data
    .globl table
table:
    .dword _start
"""


def test_a_program_is_emitted_in_its_shares_and_runs_as_one(tmp_path):
    elf = guest_elf(_many_functions(), suffix=".S", keep=("table",))
    program = Program.from_image(read_elf(elf))
    functions = analyse(program).functions
    assert len(functions) == FUNCTIONS + 1
    units = emit_program(program, windows=layout_for(program.image, MEMORY).windows())
    shares = unit_shares(sum(len(f.insns) for f in functions))
    assert len(shares) == 4 and len(units) == len(shares)
    defined = [len(re.findall(r"^BERM_HIDDEN uint64_t f_[0-9a-f]+\(.*\) \{$", unit, re.M)) for unit in units]
    assert sum(defined) == FUNCTIONS + 1
    assert defined[0] > defined[-1] and defined[1] > defined[-2]  # the last two units are the small ones
    image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)
    assert image.backend.run(RunRequest(entry=program.image.entry)).regs[10] == FUNCTIONS * ADDS


def _chain() -> str:
    """f0 calls f1, which calls f2, … f39, each after ``ADDS`` increments of a0: calls cross from unit to unit. Each
    function has a section of its own, so each call has a relocation (within one section the assembler resolves a
    call itself, and a call to an address no relocation names traps: ABI.md §6)."""
    bodies = "\n".join(f"""
    .section .text.f{i}, "ax", @progbits
    .type f{i}, @function
f{i}:
    addi sp, sp, -16
    sd ra, 8(sp)
    .rept {ADDS}
    addi a0, a0, 1
    .endr
    {f"call f{i + 1}" if i + 1 < FUNCTIONS else "nop"}
    ld ra, 8(sp)
    addi sp, sp, 16
    ret""" for i in range(FUNCTIONS))
    return f"""
    .section .text._start, "ax", @progbits
    .globl _start
    .type _start, @function
_start:
    tail f0
{bodies}
    .data
    .globl table
table:
    .dword _start
"""


def test_a_unit_declares_the_functions_it_defines_or_calls(tmp_path):
    """Each unit but the first declares only what it names (the first holds the lookups of every function): every
    unit declaring every function made units as large as the program has functions. The compiler's ``-w`` would hide
    a call to an undeclared function, compiled with an ``int`` result, so the declarations are checked here."""
    elf = guest_elf(_chain(), suffix=".S", keep=("table",))
    program = Program.from_image(read_elf(elf))
    units = emit_program(program, windows=layout_for(program.image, MEMORY).windows())
    assert len(units) > 2
    crossing = 0
    for k, unit in enumerate(units):
        declared = set(re.findall(r"^BERM_HIDDEN uint64_t (f_[0-9a-f]+)\(.*\);$", unit, re.M))
        defined = set(re.findall(r"^BERM_HIDDEN uint64_t (f_[0-9a-f]+)\(.*\) \{$", unit, re.M))
        called = set(re.findall(r"= (f_[0-9a-f]+)\(ctx,", unit))
        crossing += len(called - defined)
        assert called | defined <= declared
        if k:
            assert declared == called | defined
    assert crossing >= len(units) - 1  # each unit but the last calls the next one's first function
    image = Engine(kind="aot", memory_size=MEMORY, cache_dir=tmp_path).load(elf)
    assert image.backend.run(RunRequest(entry=program.image.entry)).regs[10] == FUNCTIONS * ADDS
