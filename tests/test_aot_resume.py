"""Indirect jumps to a local target their site is not expected to reach (berm_aot.emit.sites): the translated
function branches directly only to its own table's cases (a return: to none), and any other local target — an
index past the end of a table, a forged return address — continues in the function's resume copy. The outcome
must be the interpreter's in every case, nested self-call frames included."""

from __future__ import annotations

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit import emit_program
from berm_aot.emit.sites import jump_targets
from berm_aot.program import Program
from berm_host.layout import layout_for
from tests import progen
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf
from tests.test_aot_diff import assert_same, run_both

SOURCE = ASM_PRELUDE + r"""
    .globl plain, overrun, forged, rec_plain, rec_overrun
    .type plain, @function
plain:
    li a0, 0
    li a2, 0
    j looper
    .type overrun, @function
overrun:                # indices 2 and 3 of table A: table B's entries, cases of the other loop
    li a0, 2
    li a2, 0
    j looper
    .type forged, @function
forged:                 # the return address becomes a case of loop B, once
    li a0, 0
    li a2, 1
    j looper
    .type rec_plain, @function
rec_plain:
    li a0, 5
    li a1, 0
    li a2, 0
    j rec
    .type rec_overrun, @function
rec_overrun:            # the innermost of 6 nested frames reads past table C into table D
    li a0, 5
    li a1, 0
    li a2, 1
    j rec

# looper(a0: added to each index into table A, a2: 1 to return once into loop B): two loops, each dispatching
# through its own jump table, summing what the cases add.
    .type looper, @function
looper:
    li s4, 0
    lla s2, .LtabA
    lla s3, .LtabB
    li t0, 0
    li a1, 0
    li t3, 4
.LloopA:
    andi t1, t0, 1
    add t1, t1, a0
    slli t1, t1, 3
    add t1, t1, s2
    ld t2, 0(t1)
    jr t2
.LA0:
    addi a1, a1, 1
    j .LnextA
.LA1:
    addi a1, a1, 10
.LnextA:
    addi t0, t0, 1
    blt t0, t3, .LloopA
    li t0, 0
.LloopB:
    andi t1, t0, 1
    slli t1, t1, 3
    add t1, t1, s3
    ld t2, 0(t1)
    jr t2
.LB0:
    addi a1, a1, 100
    j .LnextB
.LB1:
    addi a1, a1, 1000
.LnextB:
    addi t0, t0, 1
    blt t0, t3, .LloopB
    mv a0, a1
    beqz a2, .Lout
    bnez s4, .Lreal
    li s4, 1
    li t0, 2
    mv t5, ra
    lla ra, .LB0
    ret
.Lreal:
    mv ra, t5
.Lout:
    ret

# rec(a0: depth, a1: sum, a2: added to the innermost frame's first index into table C): calls itself a0 times, then
# every frame dispatches twice through table C, adding its case's value.
    .type rec, @function
rec:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    mv s0, a0
    lla t4, .LtabD
    beqz a0, .Ldispatch
    addi a0, a0, -1
    jal ra, rec
    li a2, 0
.Ldispatch:
    li t5, 2
.Lround:
    lla t3, .LtabC
    slli t1, a2, 3
    add t1, t1, t3
    ld t2, 0(t1)
    jr t2
.LC0:
    addi a1, a1, 3
    j .Lnext
.LD0:
    addi a1, a1, 7
.Lnext:
    li a2, 0
    addi t5, t5, -1
    bnez t5, .Lround
    mv a0, a1
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret

    .section .rodata
    .p2align 3
.LtabA:
    .quad .LA0, .LA1
.LtabB:
    .quad .LB0, .LB1
.LtabC:
    .quad .LC0
.LtabD:
    .quad .LD0
"""

ENTRIES = ("plain", "overrun", "forged", "rec_plain", "rec_overrun")


def _program() -> Program:
    return Program.from_image(read_elf(guest_elf(SOURCE, suffix=".S", keep=ENTRIES)))


def test_each_jump_expects_its_own_table_and_a_return_none():
    program = _program()
    analysis = analyse(program)
    for name in ("looper", "rec"):
        info = next(f for f in analysis.functions if f.func.name == name)
        expected = jump_targets(info, analysis.jump_tables, program.image)
        assert expected is not None, name
        returns = [targets for addr, targets in expected.items() if program.instruction(addr).rs1 == 1]
        tables = [targets for addr, targets in expected.items() if program.instruction(addr).rs1 != 1]
        assert returns == [()] * (2 if name == "looper" else 1)
        assert sorted(len(t) for t in tables) == ([2, 2] if name == "looper" else [1])
        assert all(set(t) < set(info.local_targets) for t in tables) and len({*tables}) == len(tables)
    source = "".join(emit_program(program, windows=layout_for(program.image).windows()))
    assert source.count("_r(berm_ctx *ctx") == 2  # a resume copy for each


def test_unexpected_local_targets_run_exactly_as_the_interpreter_runs_them():
    program = _program()
    gens = [progen.GenProgram(program.image, program.symbol(name), name) for name in ENTRIES]
    answers = {}
    for gen, expected, results in run_both(gens, repeat=2):
        assert expected.trap is None, (gen.listing, expected.trap)
        answers[gen.listing] = expected.a0
        for got in results:
            assert_same(gen, expected, got)
    assert answers["plain"] == 2 * (1 + 10) + 2 * (100 + 1000)
    assert answers["rec_plain"] == 6 * 2 * 3
    # the unusual paths were taken (and went where the interpreter went)
    assert answers["overrun"] != answers["plain"] and answers["forged"] != answers["plain"]
    assert answers["rec_overrun"] == 6 * 2 * 3 - 3 + 7


def test_many_jumps_through_one_table_share_one_dispatch_block():
    """A crafted image: 300 jumps, each through the same 300-entry table, plus one target outside it (so the
    function gets expectations and a resume copy). One switch over the table serves all 300 jumps; a switch per
    jump would be 90,000 case lines, a quadratic translation a hostile image could use against the host."""
    n = 300
    body = "\n".join(f".Lc{i}:\n    ld t0, 0(s2)\n    c.jr t0" for i in range(n))
    quads = "\n".join(f"    .quad .Lc{i}" for i in range(n))
    source = ASM_PRELUDE + f"""
    .globl h
    .type h, @function
h:
    lla s2, .Ltab
{body}
.Lextra:
    ret
    .section .rodata
    .p2align 3
.Ltab:
{quads}
    .quad 0
    .quad .Lextra
"""
    program = Program.from_image(read_elf(guest_elf(source, suffix=".S", keep=("h",))))
    text = "".join(emit_program(program, windows=layout_for(program.image).windows()))
    assert "_r(berm_ctx *ctx" in text  # the expectations are in force
    assert text.count("    case ") < 8 * n  # the table once in the fast copy, all targets in the resume copy
