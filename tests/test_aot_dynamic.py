"""Dynamic transfers the static register summaries cannot see, against the interpreter: a ``ret`` whose return
address was replaced by a legal entry (a tail call through ``ret``), indirect calls and indirect tail calls that
read registers their caller's caller set and write registers the caller holds, and unrelaxed calls (``auipc``/
``jalr``) to a function with no symbol. The translated code must end in the interpreter's exact registers and
memory (see berm_aot/analysis.py: ``ctx->wild``)."""

from __future__ import annotations

from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from tests import progen
from tests.elf_samples import label_calls_elf
from tests.progen import Function
from tests.rvenc import Op, la, li
from tests.test_aot_diff import assert_same, run_both

RA, SP, T0, T1, T2, S2, S3, S4, S5, A0 = 1, 2, 5, 6, 7, 18, 19, 20, 21, 10


def _image():
    prologue = [Op("addi", rd=SP, rs1=SP, imm=-32), Op("sd", rs1=SP, rs2=RA)]
    epilogue = [Op("ld", rd=RA, rs1=SP), Op("addi", rd=SP, rs1=SP, imm=32), Op("jalr", rs1=RA)]
    f0 = Function("f0", [
        *prologue, *li(S2, 111), *li(S3, 222), *li(S5, 7),
        *la(T0, "f1"), Op("jalr", rd=RA, rs1=T0),             # indirect call
        Op("add", rd=A0, rs1=A0, rs2=S3), Op("add", rd=A0, rs1=A0, rs2=S4),
        Op("sd", rs1=SP, rs2=A0, imm=8),
        *la(T0, "f3"), Op("jalr", rd=RA, rs1=T0),              # indirect call into an indirect tail call
        Op("add", rd=A0, rs1=A0, rs2=S5),
        *epilogue,
    ])
    f1 = Function("f1", [                                       # returns "into" f2: a tail call through ret
        Op("addi", rd=T2, rs1=RA), *li(S3, 999), *la(RA, "f2"), Op("jalr", rs1=RA),
    ])
    f2 = Function("f2", [
        *li(S4, 555), Op("add", rd=A0, rs1=S2, rs2=S3), Op("jalr", rs1=T2),
    ])
    f3 = Function("f3", [*la(T1, "f4"), Op("jalr", rs1=T1)])   # jr t1: an indirect tail call
    f4 = Function("f4", [Op("add", rd=S5, rs1=S5, rs2=S2), Op("addi", rd=A0, rs1=S5), Op("jalr", rs1=RA)])
    return progen.build_image([f0, f1, f2, f3, f4])


class _Gen:
    def __init__(self):
        self.image = _image()
        self.entry = self.image.entry
        self.listing = "hand-written dynamic-transfer program"
        self.snapshot = ((progen.MEMORY_SIZE - 64, 64),)


def test_dynamic_transfers_match_the_interpreter():
    gen = _Gen()
    expected = InterpBackend(Program.from_image(gen.image), progen.MEMORY_SIZE).run(
        RunRequest(entry=gen.entry, snapshot=gen.snapshot))
    assert expected.trap is None and expected.a0 == 2 * (7 + 111)  # f4: s5 += s2, a0 = s5; then a0 += s5
    assert expected.regs[S3] == 999 and expected.regs[S4] == 555
    for _, want, results in run_both([gen], repeat=2):
        for got in results:
            assert_same(gen, want, got)


def test_unrelaxed_call_and_tail_call_to_a_label_without_a_symbol():
    """``caller`` calls, and ``tailer`` tail-calls, an assembler-local label through an ``auipc``/``jalr`` pair:
    legal (its relocation makes the label a function start), so both reach it and return its answer."""
    image = read_elf(label_calls_elf())
    program = Program.from_image(image)
    answers = {"caller": 20 + 22, "tailer": 30 + 22}
    gens = [progen.GenProgram(image, program.symbol(name), name) for name in answers]
    for gen, expected, results in run_both(gens):
        assert expected.trap is None and expected.a0 == answers[gen.listing], expected.trap
        assert_same(gen, expected, results[0])
