"""Control transfers of the translated code at their edges (berm_aot/emit/function.py)."""

from __future__ import annotations

import pytest

from berm_host.traps import TrapKind
from tests import progen
from tests.bounded import GRACE, ends_within
from tests.rvenc import Label, Op, la
from tests.test_aot_diff import assert_same, run_both


def test_a_jump_to_itself_ends_at_the_deadline():
    """A back-edge polls the interrupt flag, and a transfer to its own address is one (``j .``, ``beq x0, x0, .``,
    their compressed forms), as is a local jump whose target is known at translation time (``auipc``/``jalr``):
    a translation polling only before jumps to lower addresses, or not at such a jump, spun there past the
    deadline (a mutation review; the other loops of the tests all span more than one instruction, and none is
    closed by an unrelaxed jump)."""
    loops = {
        "j .": [Op("jal", rd=0, target=".s")],
        "beq x0, x0, .": [Op("beq", rs1=0, rs2=0, target=".s")],
        "c.j .": [Op("c.j", target=".s")],
        "c.beqz s0, .": [Op("c.beqz", rs1=8, target=".s")],
        # an unrelaxed ``tail .s`` (its target known at translation: a local jump, checked then)
        "auipc t1; jalr x0, t1": [Op("auipc", rd=6, target=".s", pcrel="hi"),
                                  Op("jalr", rs1=6, target=".s", pcrel="lo")],
    }
    gens = []
    for name, ops in loops.items():
        image = progen.build_image([progen.Function("f0", [Op("addi", rd=8), Op("addi", rd=10, imm=7), Label(".s"),
                                                           *ops, Op("jalr", rs1=1)])])
        gens.append(progen.GenProgram(image, image.entry, name))

    def runs() -> list:
        return list(run_both(gens, deadline=0.2))

    for gen, expected, (got,) in ends_within(GRACE * len(gens), runs):
        for result in (expected, got):  # where the check fired may differ (SEMANTICS.md): not compared
            assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED, gen.listing
            assert result.regs[10] == 7 and gen.image.entry < result.trap.pc < gen.image.entry + 32, gen.listing


def test_an_unrelaxed_call_whose_offset_is_odd_calls_the_even_address():
    """``auipc t1; jalr ra, lo(t1)`` is resolved at translation time (berm_aot/analysis.py), and ``jalr`` clears
    bit 0 of its target: an odd ``lo`` still calls the function at the even address below it, on both engines (a
    translator resolving the odd address found no legal target there and trapped: no test had an odd offset)."""

    def build(lo: int):
        f0 = [Op("addi", rd=2, rs1=2, imm=-16), Op("sd", rs1=2, rs2=1), Op("auipc", rd=6, imm=0),
              Op("jalr", rd=1, rs1=6, imm=lo), Op("ld", rd=1, rs1=2), Op("addi", rd=2, rs1=2, imm=16),
              Op("jalr", rs1=1)]
        f1 = [Op("addi", rd=10, imm=0x77), Op("jalr", rs1=1)]
        return progen.build_image([progen.Function("f0", f0), progen.Function("f1", f1)], table=("f1",))

    at = {s.name: s.value for s in build(1).symbols}
    image = build(at["f1"] - (at["f0"] + 8) + 1)  # the auipc is at f0 + 8
    gen = progen.GenProgram(image, image.entry, "f0 calls f1 + 1 through auipc/jalr")
    for _, expected, (got,) in run_both([gen]):
        assert expected.trap is None and expected.regs[10] == 0x77
        assert_same(gen, expected, got)


_SAVE = [Op("addi", rd=2, rs1=2, imm=-16), Op("sd", rs1=2, rs2=1)]
_RESTORE = [Op("ld", rd=1, rs1=2), Op("addi", rd=2, rs1=2, imm=16), Op("jalr", rs1=1)]


@pytest.mark.parametrize("f1, what", [
    ([*_SAVE, Op("jal", rd=1, target="f2"), *_RESTORE], "f0 -> f1 -> f2 writes a3"),
    ([*la(6, "f2"), Op("jalr", rs1=6)], "f0 -> f1 -jr-> f2 writes a3"),
])
def test_a_register_written_below_a_callee_is_seen_by_the_caller(f1, what):
    """f0 calls f1, which reaches f2, which writes a3 and returns to f0: f0 must see it. After a direct call the
    caller reloads what its callee may write, the callee's callees included (berm_aot/analysis.py,
    ``writes_closure``); when f1 leaves by ``jr`` to f2's entry (a tail transfer decided at run time), only the
    dynamic transfer's bump of ctx->wild tells f0 to reload more than f1's summary. (A mutation review: summaries of
    the callee's own writes only, and a ``jr`` to an entry that did not bump ctx->wild, each passed every test.)"""
    functions = [progen.Function("f0", [*_SAVE, Op("addi", rd=13, imm=1), Op("jal", rd=1, target="f1"),
                                        Op("addi", rd=10, rs1=13), *_RESTORE]),
                 progen.Function("f1", f1),
                 progen.Function("f2", [Op("addi", rd=13, imm=0x55), Op("jalr", rs1=1)])]
    image = progen.build_image(functions)
    gen = progen.GenProgram(image, image.entry, what)
    for _, expected, (got,) in run_both([gen]):
        assert expected.trap is None and expected.regs[10] == 0x55
        assert_same(gen, expected, got)


def test_a_call_to_no_code_writes_its_link_before_trapping():
    """``jal ra`` to an address with no code (here .data): the illegal-instruction trap at that address, with ra
    already holding the link, as the interpreter has it (a mutation review: a translation trapping before it wrote
    the link passed every test)."""
    ops = [Op("addi", rd=10, imm=7), Op("jal", rd=1, imm=progen.DATA - (progen.TEXT + 4)), Op("jalr", rs1=1)]
    image = progen.build_image([progen.Function("f0", ops)])
    assert image.entry == progen.TEXT
    gen = progen.GenProgram(image, image.entry, "jal ra, .data")
    for _, expected, (got,) in run_both([gen]):
        assert expected.trap.kind is TrapKind.ILLEGAL_INSTRUCTION and expected.trap.pc == progen.DATA
        assert expected.regs[1] == progen.TEXT + 8
        assert_same(gen, expected, got)


_ODD_RETURNS = {
    "ori ra, ra, 1; ret": [Op("ori", rd=1, rs1=1, imm=1), Op("jalr", rs1=1)],
    "jalr x0, 1(ra)": [Op("jalr", rs1=1, imm=1)],
}


@pytest.mark.parametrize("ret", list(_ODD_RETURNS))
def test_a_return_through_an_odd_link_returns(ret):
    """A return compares its target with the link it expects before clearing bit 0 (every link is even, so an even
    target equal to it needs no mask) and again after: an odd ``ra`` (or offset) still returns, from a function
    called once, from the frames of a function calling itself, and from the entry function to the host (a
    translation with only the first compare sent these to the unknown-target path)."""
    back = _ODD_RETURNS[ret]
    f0 = [*_SAVE, Op("addi", rd=10), Op("addi", rd=11, imm=2), Op("jal", rd=1, target="f1"),
          Op("addi", rd=10, rs1=10, imm=0x40), Op("ld", rd=1, rs1=2), Op("addi", rd=2, rs1=2, imm=16), *back]
    f1 = [*_SAVE, Op("beq", rs1=11, rs2=0, target=".leaf"), Op("addi", rd=11, rs1=11, imm=-1),
          Op("jal", rd=1, target="f1"), Label(".leaf"), Op("addi", rd=10, rs1=10, imm=1), Op("ld", rd=1, rs1=2),
          Op("addi", rd=2, rs1=2, imm=16), *back]
    image = progen.build_image([progen.Function("f0", f0), progen.Function("f1", f1)])
    gen = progen.GenProgram(image, image.entry, f"f0 -> f1 -> f1 -> f1, each returning by {ret}")
    for _, expected, (got,) in run_both([gen]):
        assert expected.trap is None and expected.regs[10] == 0x43, gen.listing
        assert_same(gen, expected, got)
