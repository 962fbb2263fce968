"""Which registers hold a stack address (berm_aot/emit/stackptr.py): a guess that only orders the two window tests
of an access, so these tests pin what it guesses rather than an outcome (tests/test_aot_sp_window.py checks those)."""

from __future__ import annotations

import pytest

from berm_aot.emit.sites import jump_targets
from berm_aot.emit.stackptr import stack_pointers
from tests.elf_samples import ASM_PRELUDE
from tests.guests import analysed_function

A3 = 13

SOURCE = ASM_PRELUDE + r"""
    .globl f, g
    .type g, @function
g:
    ret
    .type f, @function
f:
    addi sp, sp, -64
    addi a3, sp, 8
    j .Lhead
.Lhead:
    lla t0, .Ltab
    ld t1, 0(t0)
    jr t1
.Lcase:
    sd zero, 0(a3)
    j .Lhead
.Lother:
    call g
.Lafter:
    sd zero, 0(a3)
    ret

    .section .rodata
    .p2align 3
.Ltab:
    .quad .Lcase
.Lextra:
    .quad .Lother
"""


@pytest.fixture(scope="module")
def f():
    program, analysis, info = analysed_function(SOURCE, "f", keep=("f", "g"))
    at = {i.addr: i for i in info.insns}
    # the stores through a3: the case's, then the one after the call
    stores = [a for a, i in sorted(at.items()) if i.op == "sd" and i.rs1 == A3]
    head = next(a for a, i in sorted(at.items()) if i.op == "auipc")
    return info, analysis, program, stores, head


def test_a_plain_jump_keeps_what_a_call_forgets(f):
    info, analysis, program, stores, head = f
    known = stack_pointers(info.insns, info.start, info.local_targets,
                           jump_targets(info, analysis.jump_tables, program.image))
    assert A3 in known[head]  # through `j .Lhead`
    assert A3 not in known[stores[1]]  # after `call g`


def test_a_case_knows_what_the_jumps_expected_to_reach_it_agree_on(f):
    info, analysis, program, stores, _ = f
    expected = jump_targets(info, analysis.jump_tables, program.image)
    assert expected is not None
    assert A3 in stack_pointers(info.insns, info.start, info.local_targets, expected)[stores[0]]
    # without expectations a local target may be entered from anywhere: nothing is known there
    assert A3 not in stack_pointers(info.insns, info.start, info.local_targets)[stores[0]]
    # a target no jump expects (.Lother, reached only by an overrun) still starts knowing nothing
    assert A3 not in stack_pointers(info.insns, info.start, info.local_targets, expected)[stores[1]]
