"""Loads through sp that an earlier access of the same frame checked take no check of their own
(berm_aot.emit.frames): an epilogue's restores. Each guest here tries to make such a load read past the end of
guest memory, by bringing sp back to a caller's epilogue from somewhere a return of the function did not leave it:
a nested frame's tail transfer to another function that moves sp and returns to the caller's link, a return that
leaves sp moved, a callee that does. Every one must fault where the interpreter faults, with the host alive, and
the translation must still have made the loads it could prove unchecked."""

from __future__ import annotations

import dataclasses

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit.function import FunctionEmitter
from berm_aot.program import Program
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests import progen
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf
from tests.test_aot_diff import assert_same, run_both

#: The end of a guest source: a function that moves sp 6000 bytes up, past the end of guest memory, and returns,
#: and a pointer to it in .rodata (tests/test_aot_group_levels.py uses it too).
WANDER = r"""
# wander: moves sp 6000 bytes up, past the end of guest memory, and returns.
    .type wander, @function
wander:
    addi sp, sp, 2000
    addi sp, sp, 2000
    addi sp, sp, 2000
    li a0, 7
    ret

    .section .rodata
    .p2align 3
.Lptrs:
    .quad wander
"""

SOURCE = ASM_PRELUDE + r"""
    .globl tail_wild, tail_wild2, tail_near, ret_wild, call_wild, plain
    .type tail_wild, @function
tail_wild:
    li a0, 2
    j rec
    .type tail_wild2, @function
tail_wild2:
    li a0, 3
    j rec2
    .type tail_near, @function
tail_near:
    li a0, 3
    li a1, 1
    j rec
    .type ret_wild, @function
ret_wild:
    li a0, 2
    j unbalanced
    .type call_wild, @function
call_wild:
    addi sp, sp, -16
    sd ra, 8(sp)
    jal ra, wander
    ld ra, 8(sp)             # wander returned with sp past the end of memory: a fault
    addi sp, sp, 16
    ret
    .type plain, @function
plain:
    lla t6, .Lptrs           # a relocation in the code, which every image must carry (--emit-relocs)
    li a0, 5
    li a1, 2
    j rec

# rec(a0: frames to nest, a1: 0 to leave the innermost by wander, 1 by near, 2 by a return): the sum of the
# frames' a0. One call of itself per frame; its only return leaves sp where the frame found it.
    .type rec, @function
rec:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    beqz a0, .Linner
    mv s0, a0
    addi a0, a0, -1
    jal ra, rec
    add a0, a0, s0
    ld ra, 8(sp)             # unchecked: the prologue's saves checked these bytes, if sp is where they were
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Linner:
    li t0, 1
    beqz a1, .Lwander
    beq a1, t0, .Lnear
    li a0, 0
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Lwander:
    j wander                 # a tail transfer out of a nested frame, its frame still allocated
.Lnear:
    j near

# rec2: the same with two calls of itself (the expected link of each nested frame is kept in ctx->shadow).
    .type rec2, @function
rec2:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    beqz a0, .Lleave2
    mv s0, a0
    addi a0, a0, -1
    andi t0, s0, 1
    beqz t0, .Leven
    jal ra, rec2
    j .Ljoin
.Leven:
    jal ra, rec2
.Ljoin:
    add a0, a0, s0
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Lleave2:
    j wander

# unbalanced: the innermost frame returns with sp moved past the end of memory: a return with sp elsewhere than
# the frame found it, so no load after a call of itself may go unchecked.
    .type unbalanced, @function
unbalanced:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    beqz a0, .Lout
    mv s0, a0
    addi a0, a0, -1
    jal ra, unbalanced
    add a0, a0, s0
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Lout:
    addi sp, sp, 2000
    addi sp, sp, 2000
    addi sp, sp, 2000
    ret

# near: returns with sp 16 bytes below where it found it, inside the stack: the caller's epilogue reads the
# nested frame's saves instead of its own.
    .type near, @function
near:
    addi sp, sp, -16
    li a0, 7
    ret
""" + WANDER

ENTRIES = ("tail_wild", "tail_wild2", "tail_near", "ret_wild", "call_wild", "plain")


def _program() -> Program:
    return Program.from_image(read_elf(guest_elf(SOURCE, suffix=".S", keep=ENTRIES)))


def function_emitter(program: Program, name: str, stores_readable: bool = True) -> FunctionEmitter:
    """The emitter of the function ``name`` of ``program``, its facts computed (nothing emitted yet)."""
    analysis = analyse(program)
    info = next(f for f in analysis.functions if f.func.name == name)
    return FunctionEmitter(analysis, info, "", stores_readable=stores_readable)


def test_the_epilogues_after_a_call_of_itself_are_unchecked_only_where_every_return_keeps_sp():
    program = _program()
    for name in ("rec", "rec2"):
        emitter = function_emitter(program, name)
        restores = {i.addr for i in emitter.f.insns if i.op == "ld" and i.rs1 == 2}
        assert restores and restores <= emitter.unchecked, name
        assert emitter.skipped and emitter.tail_resumes and emitter.needs_resume, name
    for name in ("unbalanced", "call_wild"):
        emitter = function_emitter(program, name)
        assert not emitter.skipped and not emitter.tail_resumes, name


def test_sp_brought_back_from_elsewhere_faults_exactly_as_in_the_interpreter():
    program = _program()
    gens = [progen.GenProgram(program.image, program.symbol(name), name) for name in ENTRIES]
    outcomes = {}
    for gen, expected, results in run_both(gens, repeat=2):
        outcomes[gen.listing] = expected
        for got in results:
            assert_same(gen, expected, got)
    top = progen.MEMORY_SIZE - 16
    for name in ("tail_wild", "tail_wild2", "ret_wild", "call_wild"):
        trap = outcomes[name].trap
        assert trap is not None and trap.kind is TrapKind.MEMORY_FAULT and trap.addr > top, (name, trap)
    # sp 16 bytes low, inside the stack: the caller's restores read the nested frame's saves, so it returns to its
    # own link once more and, a frame too many, to the host's link 0, where no frame expects a return
    near = outcomes["tail_near"].trap
    assert near is not None and near.kind is TrapKind.BAD_INDIRECT_TARGET and near.addr == 0, near
    assert outcomes["plain"].trap is None and outcomes["plain"].a0 == 5 + 4 + 3 + 2 + 1


def test_a_store_proves_bytes_for_a_load_only_when_every_store_window_byte_is_readable():
    program = _program()
    windows = layout_for(program.image).windows()
    assert windows.loads_cover_stores()
    beyond = windows.stack_lo + windows.stack_span + 0x10000  # a store window past the stack: no load reads it
    assert not dataclasses.replace(windows, store_lo=beyond).loads_cover_stores()
    emitter = function_emitter(program, "rec", stores_readable=False)  # the prologue's saves then prove nothing
    assert not emitter.unchecked and not emitter.skipped
    # the resume copy still takes a nested frame's tail transfer: the prologue's check once per depth relies on sp
    assert emitter.levels and emitter.tail_resumes
