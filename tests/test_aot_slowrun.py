"""The checked runner (berm_aot/emit/slowrun.py), the slow path of every group of accesses: the rest of a group's run
executed from a table, each access checked on its own. It runs only when a group's range is in no window — rarely,
in ordinary programs — so these tests also compile translations whose every group check fails (``BERM_GROUP``
overridden to 0 in each unit), which sends every run through the runner, and hold them to the interpreter: the
hand-written vectors of every operation, wrapped in a group, and random programs."""

from __future__ import annotations

import contextlib

import pytest

import berm_host.aot.objects as objects
from berm_abi.names import core_number
from berm_aot.emit import emit_units, slowrun
from berm_aot.emit.slowrun import RUN_OPS, row
from berm_aot.isa import BRANCHES, OPS, Instruction
from berm_aot.program import Program
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests import progen
from tests.interp_helpers import snippet_image
from tests.rvenc import Op, li
from tests.test_aot_diff import assert_same, collect, run_both
from tests.test_interp_insns import vectors

SP, A0, T2, T3, T4, T5 = 2, 10, 7, 28, 29, 30
INCLUDE = '#include "berm_code.h"\n'
EVERY_GROUP_FAILS = INCLUDE + "#undef BERM_GROUP\n#define BERM_GROUP(g, W1, W2, base, lo, n) (g = 0)\n"


@contextlib.contextmanager
def every_group_fails(emitted: list[str] | None = None):
    """Translations compiled meanwhile find every group's range in no window; their C is appended to ``emitted``
    (tools/fuzz_diff.py --every-group-fails runs its campaign in this too)."""
    emit = objects.emit_units

    def failing(*args, **kwargs):
        for unit in emit(*args, **kwargs):
            assert INCLUDE in unit
            if emitted is not None:
                emitted.append(unit)
            yield unit.replace(INCLUDE, EVERY_GROUP_FAILS, 1)

    objects.emit_units = failing
    try:
        yield
    finally:
        objects.emit_units = emit


def on_both(ops: list, regs: dict[int, int] | None = None, *, repeat: int = 1, fails: bool = True):
    """Run the snippet ``ops`` on both engines (every group failing, unless not ``fails``), each translated run held
    to the interpreter's: the interpreter's result, and the number of slow paths the translation has (counted
    when ``fails``)."""
    image = snippet_image(ops, regs=regs, data=bytes(64))
    gens = [progen.GenProgram(image, image.entry, repr(ops))]
    emitted: list[str] = []
    with every_group_fails(emitted) if fails else contextlib.nullcontext():
        ((gen, expected, got),) = run_both(gens, repeat=repeat)
        for each in got:
            assert_same(gen, expected, each)
    return expected, sum(unit.count("slow_run(ctx, ") for unit in emitted)


def test_every_operation_a_run_may_hold_has_a_row():
    """Runs end at anything that transfers control or traps by itself (berm_aot.emit.groups); everything else
    must be a row, or emitting it would fail."""
    ends = {"jal", "jalr", "ecall", "ebreak", "illegal", "unsupported", *BRANCHES}
    for op in sorted(OPS - ends):
        assert row(Instruction(0x10000, 4, 0, op, rd=1, rs1=2, rs2=3, imm=8)).startswith("{0x10000ull")
    assert set(RUN_OPS) == OPS - ends - {"auipc"}  # auipc is a lui of its result
    with pytest.raises(ValueError, match="ecall cannot be in a group's run"):
        row(Instruction(0x10000, 4, 0, "ecall"))


def test_every_vector_inside_a_failing_group_runs_as_on_the_interpreter():
    """Each vector of tests/test_interp_insns.py between two loads through sp (one group, whose run holds the vector's
    instructions) runs on the runner: registers, memory and trap as the interpreter's."""
    gens, straight = [], 0
    for k, snippet in enumerate(vectors()):
        straight += not any(isinstance(op, Op) and op.name in BRANCHES for op in snippet["ops"])
        wrapped = [Op("ld", rd=0, rs1=SP, imm=-8), *snippet["ops"], Op("ld", rd=0, rs1=SP, imm=-16)]
        image = snippet_image(**{**snippet, "ops": wrapped})
        gens.append(progen.GenProgram(image, image.entry, f"vector {k} in a group: {snippet}"))
    emitted: list[str] = []
    with every_group_fails(emitted):
        for gen, expected, (got,) in run_both(gens):
            assert_same(gen, expected, got)
    # not vacuous: a run per vector that has no branch (a branch ends the block, and with it the group)
    assert sum(unit.count("slow_run(ctx, ") for unit in emitted) == straight > 100


def test_random_programs_with_every_group_failing_match_the_interpreter():
    gens = collect(progen.programs(), 80, derandomize=True)
    emitted: list[str] = []
    with every_group_fails(emitted):
        for gen, expected, results in run_both(gens, repeat=2):
            for got in results:
                assert_same(gen, expected, got)
    assert sum(unit.count("slow_run(ctx, ") for unit in emitted) >= 100


@pytest.mark.parametrize("fails", [False, True], ids=["checked", "forced"])
def test_a_run_that_traps_keeps_the_registers_its_function_wrote(fails):
    """A register the function wrote before the group (held in a C local, not yet in ctx->regs) and that the run
    writes later: when the run traps first, the trap shows the local's value. (The runner's registers were once
    reloaded from ctx->regs without being stored first: t3 came back as it was at the function's entry.)"""
    ops = [Op("addi", rd=T3, imm=7), Op("addi", rd=T4, imm=9),
           Op("ld", rd=T3, rs1=A0, imm=0), Op("ld", rd=T4, rs1=A0, imm=8)]
    expected, _ = on_both(ops, {A0: 8}, fails=fails)  # a0 = 8: in no window, the first load faults
    assert expected.trap is not None and expected.regs[T3] == 7 and expected.regs[T4] == 9


def test_an_ecall_ends_a_group():
    """A run never holds an ``ecall`` (the runner serves no host call): accesses on both sides of one make two groups
    or none, and the program runs as on the interpreter with every group failing."""
    ops = [Op("ld", rd=13, rs1=SP, imm=-8), Op("sd", rd=0, rs1=SP, rs2=13, imm=-24),
           *li(17, core_number("berm.args.len")), Op("ecall"),
           Op("ld", rd=14, rs1=SP, imm=-16), Op("sd", rd=0, rs1=SP, rs2=14, imm=-32)]
    expected, runs = on_both(ops)
    assert expected.trap is None and runs == 2


def test_the_runs_of_overlapping_groups_stay_linear_in_the_code(monkeypatch):
    """Groups through two registers that keep overlapping chain one segment across a whole block. Each group's slow
    path once had a table of its own from its first member to the segment's end (C quadratic in the block's length:
    a review's 2,406-instruction function made 76 MB of C, 5,000 instructions took 1.2 GB of Python memory to emit),
    then register sets of its own (the C linear, its translation quadratic: 9,606 instructions took 76 s). A function
    has one table holding each segment once, and a segment's registers are found once."""
    A1, T0, T1 = 11, 5, 6

    def chain(k: int):
        ops = [*li(A0, progen.DATA), Op("ld", rd=A1, rs1=A0, imm=16), Op("ld", rd=A0, rs1=A0, imm=24),
               Op("ld", rd=T0, rs1=A0, imm=0), Op("ld", rd=T1, rs1=A1, imm=0)]
        for _ in range(k):  # each addi closes its register's group while the other's is open
            ops += [Op("ld", rd=T0, rs1=A0, imm=8), Op("addi", rd=A0, rs1=A0, imm=0), Op("ld", rd=T0, rs1=A0, imm=0),
                    Op("ld", rd=T1, rs1=A1, imm=8), Op("addi", rd=A1, rs1=A1, imm=0), Op("ld", rd=T1, rs1=A1, imm=0)]
        data = bytes(16) + (progen.DATA + 8).to_bytes(8, "little") + progen.DATA.to_bytes(8, "little") + bytes(32)
        return snippet_image(ops, data=data)

    looked_at = []  # instructions whose registers the slow paths asked for
    for name in ("reads", "writes"):
        real = getattr(slowrun, name)
        monkeypatch.setattr(slowrun, name, lambda insn, real=real: looked_at.append(insn) or real(insn))

    def work(image) -> tuple[int, int]:
        looked_at.clear()
        program = Program.from_image(image)
        size = sum(map(len, emit_units(program, windows=layout_for(image, progen.MEMORY_SIZE).windows())))
        return size, len(looked_at)

    (small_c, small_work), (large_c, large_work) = work(chain(50)), work(chain(400))
    assert large_c < 10 * small_c and large_work < 10 * small_work  # 8x the instructions; quadratic was ~60x
    large = chain(400)
    gens = [progen.GenProgram(large, large.entry, "400 links of overlapping groups")]
    for gen, expected, (got,) in run_both(gens):
        assert expected.trap is None
        assert_same(gen, expected, got)


def test_a_run_checks_a_write_to_sp():
    """An sp write below the stack inside a run (of a group through a0): the stack trap, sp as it was. (From a
    review: no test had an sp write inside a run, so a runner that skipped the check, or wrote sp first, passed.)"""
    expected, runs = on_both([Op("ld", rd=T3, rs1=A0, imm=0), Op("addi", rd=SP, imm=16),
                              Op("ld", rd=T4, rs1=A0, imm=8)], {A0: progen.DATA})
    assert runs == 1 and expected.trap is not None and expected.trap.kind is TrapKind.STACK_EXHAUSTED and expected.regs[SP] != 16


def test_a_run_covers_the_rest_of_an_interleaved_group():
    """Group A (a0) fails; group B (t2) starts inside A's span and ends after it, its last member past the end of
    memory: the run goes to the segment's end, and that member traps there. (A run ending at A's last member ran
    it unchecked: the host process crashed.)"""
    expected, runs = on_both([Op("ld", rd=T3, rs1=A0, imm=0), Op("ld", rd=T4, rs1=T2, imm=0),
                              Op("ld", rd=T5, rs1=A0, imm=8), Op("sd", rs1=T2, rs2=T3, imm=2040)],
                             {A0: progen.DATA, T2: progen.MEMORY_SIZE - 8})
    assert runs == 2 and expected.trap is not None and expected.trap.addr == progen.MEMORY_SIZE - 8 + 2040


def test_a_later_group_of_a_segment_enters_the_run_at_its_own_first_member():
    """Group A (a0) passes its check, group B (t2 = 8, in no window) fails and starts inside A's span: the runner
    starts at B's first member, so the addi between them runs once."""
    ops = [Op("ld", rd=T3, rs1=A0, imm=0), Op("addi", rd=T5, rs1=T5, imm=1), Op("ld", rd=T4, rs1=T2, imm=0),
           Op("ld", rd=T5, rs1=A0, imm=8), Op("ld", rd=T4, rs1=T2, imm=8)]
    expected, _ = on_both(ops, {A0: progen.DATA, T2: 8}, fails=False)
    assert expected.trap is not None and expected.regs[T5] == 1


def test_what_a_run_stored_is_gone_in_the_next_run():
    """A counter in .data that a failing group's run reads, bumps and writes back: each run on the same pooled
    region starts from 0 again (the runner's stores mark their pages for the reset)."""
    counter = [Op("ld", rd=T3, rs1=A0, imm=0), Op("addi", rd=T3, rs1=T3, imm=1), Op("sd", rs1=A0, rs2=T3, imm=0),
               Op("ld", rd=T4, rs1=A0, imm=8)]
    expected, runs = on_both(counter, {A0: progen.DATA}, repeat=3)
    assert runs == 1 and expected.trap is None


def test_a_run_may_set_sp_to_exactly_the_stacks_lowest_address():
    """The runner's sp check is strict: sp at the stack's lowest address is fine, one below traps (a mutation review:
    a runner trapping at the lowest address too passed, no test wrote exactly that inside a run)."""
    from berm_host.layout import stack_size

    lowest = progen.MEMORY_SIZE - stack_size(progen.MEMORY_SIZE)
    for value, traps in ((lowest, False), (lowest - 8, True)):
        expected, runs = on_both([Op("ld", rd=T3, rs1=A0, imm=0), Op("addi", rd=SP, rs1=T5, imm=0),
                                  Op("ld", rd=T4, rs1=A0, imm=8)], {A0: progen.DATA, T5: value})
        assert runs == 1 and (expected.trap is not None) == traps and expected.regs[SP] >= lowest


def test_an_auipc_in_a_run_adds_its_own_address():
    """A run's ``auipc`` is a row loading its result (berm_aot.emit.slowrun.row): the pc plus the immediate, as the
    interpreter computes it (a mutation review: a row holding the immediate alone passed the random programs)."""
    expected, runs = on_both([Op("ld", rd=T3, rs1=A0, imm=0), Op("auipc", rd=T4, imm=0x5000),
                              Op("ld", rd=T5, rs1=A0, imm=8)], {A0: progen.DATA})
    assert runs == 1 and expected.trap is None and expected.regs[T4] > 0x5000


def test_a_run_covers_a_group_that_outlasts_one_nested_in_it():
    """Group A (a0) spans B (t2, nested inside it) and part of C (t5): one segment. A fails (its last member lies
    past the end of memory), so its run goes to the segment's end and that member traps there (a mutation review:
    a segment ending at the nested group's last member ran A's last member unchecked, and no test nested a group
    inside another)."""
    T6 = 31
    ops = [Op("ld", rd=T3, rs1=A0, imm=0), Op("ld", rd=T4, rs1=T2, imm=0), Op("ld", rd=T4, rs1=T2, imm=8),
           Op("ld", rd=T4, rs1=T5, imm=0), Op("addi", rd=T6, rs1=T6, imm=1), Op("ld", rd=T3, rs1=A0, imm=8),
           Op("ld", rd=T4, rs1=T5, imm=8)]
    expected, _ = on_both(ops, {A0: progen.MEMORY_SIZE - 8, T2: progen.DATA, T5: progen.DATA}, fails=False)
    assert expected.trap is not None and expected.trap.addr == progen.MEMORY_SIZE
    assert expected.regs[T6] == 1
