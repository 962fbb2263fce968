"""Every trap the interpreter raises: where it is raised, what it says, and that the trapping instruction had no
effect (registers are the state before it)."""

from __future__ import annotations

import time

import pytest

from berm_abi.names import fnv1a64
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from berm_host.layout import MAX_CALL_DEPTH, SP_BELOW_STACK, layout_for
from berm_host.traps import Trap, TrapKind
from tests import progen
from tests.interp_helpers import run_snippet
from tests.rvenc import Label, Op, la, li

A0, A1, T0 = 10, 11, 5
M = (1 << 64) - 1


def _layout():
    return layout_for(progen.build_image([progen.Function("f0", [])]), progen.MEMORY_SIZE)


def _fault(op: Op, addr: int):
    """Run ``op`` with a1 = ``addr`` (a0 = 7, the store value); return the trap and the registers."""
    r = run_snippet([op], regs={A0: 7, A1: addr & M})
    return r.trap, r.regs


LAYOUT = _layout()
EDGES = [
    ("null", 0, "load"), ("null", 0, "store"),
    ("below the image", progen.TEXT - 8, "load"), ("below the image", progen.TEXT - 1, "load"),
    ("rodata store", progen.RODATA, "store"), ("text store", progen.TEXT, "store"),
    ("straddling into the guard", LAYOUT.guard_lo - 4, "load"), ("guard", LAYOUT.guard_lo, "store"),
    ("guard top", LAYOUT.stack_lo - 1, "load"), ("past the end", LAYOUT.size, "load"),
    ("straddling the end", LAYOUT.size - 4, "store"), ("wrap near 2^64", M - 3, "load"),
    ("wrap near 2^64", M - 7, "store"),
]
#: What a trap message says of where each edge's address points: nothing for an access that starts in valid memory.
REGIONS = {"null": "in the null page", "below the image": "below the image",
           "rodata store": "in read-only memory, code or constants", "text store": "in read-only memory, code or constants",
           "straddling into the guard": "", "guard": "in the guard page below the stack, where a stack overflow lands",
           "guard top": "in the guard page below the stack, where a stack overflow lands",
           "past the end": "past the end of guest memory", "straddling the end": "",
           "wrap near 2^64": "past the end of guest memory"}


@pytest.mark.parametrize("what, addr, kind", EDGES, ids=[f"{w}-{k}" for w, _, k in EDGES])
def test_memory_faults_at_every_boundary(what, addr, kind):
    op = Op("ld", rd=A0, rs1=A1) if kind == "load" else Op("sd", rs1=A1, rs2=A0)
    trap, regs = _fault(op, addr)
    assert trap.kind is TrapKind.MEMORY_FAULT
    assert trap.addr == addr & M
    assert trap.detail == f"{kind} 8 bytes"
    assert regs[A0] == 7  # the load wrote nothing
    assert trap.where.startswith("f0+0x")
    assert trap.region == REGIONS[what]
    said = f"{kind} 8 bytes" + (f", {REGIONS[what]}" if REGIONS[what] else "")
    assert f"guest memory fault at {addr & M:#x} ({said}) in f0+" in str(Trap(trap))


def test_accesses_just_inside_every_boundary_succeed():
    for addr, kind in [(progen.TEXT, "load"), (LAYOUT.guard_lo - 8, "store"), (LAYOUT.stack_lo, "store"),
                       (LAYOUT.size - 8, "store"), (progen.DATA, "store"), (progen.RODATA, "load"),
                       (LAYOUT.guard_lo - 8, "load"), (LAYOUT.stack_lo, "load"), (LAYOUT.size - 8, "load")]:
        op = Op("ld", rd=A0, rs1=A1) if kind == "load" else Op("sd", rs1=A1, rs2=A0)
        trap, _ = _fault(op, addr)
        assert trap is None, (hex(addr), kind)


def test_a_faulting_store_writes_nothing():
    r = run_snippet([Op("sd", rs1=A1, rs2=A0)], regs={A0: M, A1: LAYOUT.guard_lo - 4},
                    snapshot=((LAYOUT.guard_lo - 8, 16),))
    assert r.trap.kind is TrapKind.MEMORY_FAULT
    assert r.snapshot[0] == bytes(16)


@pytest.mark.parametrize("op", [Op("amoswap.d", rd=A0, rs1=A1, rs2=T0), Op("amoadd.w", rd=A0, rs1=A1, rs2=T0),
                                Op("sc.d", rd=A0, rs1=A1, rs2=T0), Op("sc.w", rd=A0, rs1=A1, rs2=T0)],
                         ids=lambda op: op.name)
def test_atomics_that_store_need_writable_memory(op):
    """An AMO or sc on read-only data is a store fault (lr there is a plain load); nothing is written."""
    n = 4 if op.name.endswith(".w") else 8
    r = run_snippet([op], regs={A0: 7, A1: progen.RODATA, T0: 0x55}, snapshot=((progen.RODATA, 8),))
    assert r.trap.kind is TrapKind.MEMORY_FAULT
    assert (r.trap.addr, r.trap.detail) == (progen.RODATA, f"store {n} bytes")
    assert r.regs[A0] == 7 and r.snapshot[0] == bytes(8)
    r = run_snippet([Op("lr.d", rd=A0, rs1=A1), Op("lr.w", rd=T0, rs1=A1)], regs={A0: 7, T0: 7, A1: progen.RODATA})
    assert r.trap is None and r.regs[A0] == 0 and r.regs[T0] == 0


def test_writing_sp_below_the_stack_traps_with_the_value_and_keeps_sp():
    """SEMANTICS.md: every write to sp but ``addi sp, sp, imm`` is checked; the trap's address is the value sp would
    have had, sp keeps its old value, an AMO's store stands, a link into sp traps before the transfer (even to a
    target the CFI check would refuse). Exactly the lowest address is fine."""
    sp, low = LAYOUT.initial_sp, LAYOUT.stack_lo
    f1 = progen.Function("f1", [Op("addi", rd=A0, imm=9), Op("jalr", rs1=1)])
    cases = [  # (ops before the checked write, the write, the value it would give sp)
        (li(T0, sp - low + 16), Op("sub", rd=2, rs1=2, rs2=T0), low - 16),  # a frame larger than the stack
        ([], Op("addi", rd=2, rs1=A1, imm=-8), low - 8),  # not ``addi sp, sp``: checked
        (li(A1, progen.DATA), Op("ld", rd=2, rs1=A1), 0x1234),
        ([*li(A1, progen.DATA), Op("addi", rd=T0, imm=0x55)], Op("amoswap.d", rd=2, rs1=A1, rs2=T0),
         0x1234),
        ([], Op("jal", rd=2, target="f1"), "link"),
        (li(T0, progen.DATA), Op("jalr", rd=2, rs1=T0), "link"),  # to data: the CFI check would refuse it
    ]
    for setup, write, value in cases:
        r = run_snippet([*setup, write, Op("addi", rd=A0, imm=1)], regs={A1: low}, helpers=[f1],
                        data=(0x1234).to_bytes(8, "little"), snapshot=((progen.DATA, 8),))
        at = 4 * (len(li(A1, low)) + len(setup))  # the offset of the write in f0
        assert r.trap.kind is TrapKind.STACK_EXHAUSTED, write
        assert (r.trap.addr, r.trap.detail) == (progen.TEXT + at + 4 if value == "link" else value,
                                                SP_BELOW_STACK), write
        assert r.regs[2] == sp and r.regs[A0] == 0, write  # sp as it was; nothing ran after (f1 did not run)
        assert r.trap.where == f"f0+{at:#x}", write
        if write.name == "amoswap.d":
            assert r.snapshot[0] == (0x55).to_bytes(8, "little")
    r = run_snippet([Op("addi", rd=2, rs1=A1, imm=0), Op("addi", rd=A0, imm=1), Op("addi", rd=2, rs1=2, imm=64)],
                    regs={A1: low})
    assert r.trap is None and r.regs[A0] == 1


def _f1(body=()):
    return progen.Function("f1", [*body, Op("addi", rd=A0, imm=1), Op("jalr", rs1=1)])


@pytest.mark.parametrize("what, setup", [
    ("middle of an instruction", [*la(T0, "f1"), Op("addi", rd=T0, rs1=T0, imm=2)]),
    ("data", li(T0, progen.DATA)),
    ("unnamed code address", [*la(T0, "f1"), Op("addi", rd=T0, rs1=T0, imm=4)]),
    ("zero", []),
])
def test_indirect_calls_to_illegal_targets_trap(what, setup):
    r = run_snippet([*setup, Op("jalr", rd=1, rs1=T0)], helpers=[_f1([Op("addi", rd=0, imm=0)] * 2)])
    assert r.trap.kind is TrapKind.BAD_INDIRECT_TARGET
    assert r.trap.addr == r.regs[T0]
    assert r.regs[1] == 0  # rd (ra) was not written
    assert str(Trap(r.trap)).startswith(f"guest trapped: indirect jump to an unknown target {r.trap.addr:#x} in f0")


def test_legal_indirect_call_and_tail_call():
    f2 = progen.Function("f2", [Op("addi", rd=A1, imm=2), Op("jalr", rs1=1)])
    f1 = progen.Function("f1", [Op("addi", rd=A0, imm=1), *la(T0, "f2"), Op("jalr", rs1=T0)])  # tail call to f2
    saved = [Op("sd", rs1=2, rs2=1, imm=-8)], [Op("ld", rd=1, rs1=2, imm=-8)]
    r = run_snippet([*saved[0], *la(T0, "f1"), Op("jalr", rd=1, rs1=T0), *saved[1]], helpers=[f1, f2])
    assert r.trap is None and (r.regs[A0], r.regs[A1]) == (1, 2)


def test_jump_table_inside_the_function_is_legal_but_not_from_elsewhere():
    ops = [Op("ld", rd=T0, rs1=A1), Op("jalr", rs1=T0), Op("addi", rd=A0, imm=9), Label(".case"),
           Op("addi", rd=A0, rs1=A0, imm=1)]
    r = run_snippet([*li(A1, progen.RODATA), *ops], table=(".case",))
    assert r.trap is None and r.regs[A0] == 1
    f1 = progen.Function("f1", [Op("ld", rd=T0, rs1=A1), Op("jalr", rs1=T0)])  # same target, from another function
    r = run_snippet([*li(A1, progen.RODATA), Op("jal", rd=1, target="f1"), Op("addi", rd=A0, imm=5), Label(".case")],
                    helpers=[f1],
                    table=(".case",))
    assert r.trap.kind is TrapKind.BAD_INDIRECT_TARGET and r.trap.where.startswith("f1+")


def test_forged_return_address_traps():
    f1 = progen.Function("f1", [Op("addi", rd=1, rs1=1, imm=4), Op("jalr", rs1=1)])
    r = run_snippet([Op("jal", rd=1, target="f1"), Op("addi", rd=A0, imm=1), Op("addi", rd=A0, imm=2)], helpers=[f1])
    assert r.trap.kind is TrapKind.BAD_INDIRECT_TARGET
    assert r.trap.addr == progen.TEXT + 8 and r.trap.where == "f1+0x4"


def test_ebreak_and_compressed_ebreak():
    for op in (Op("ebreak"), Op("c.ebreak")):
        r = run_snippet([Op("addi", rd=A0, imm=1), op])
        assert r.trap.kind is TrapKind.BREAKPOINT and r.pc == progen.TEXT + 4 and r.trap.where == "f0+0x4"
        assert str(Trap(r.trap, "tool")) == "harness trapped in tool: guest executed ebreak in f0+0x4"


@pytest.mark.parametrize("raw", [Op(".half", imm=0), Op(".word", imm=0xFFFFFFFF), Op(".word", imm=0x0000700B)])
def test_illegal_instructions_trap_when_reached(raw):
    r = run_snippet([Op("addi", rd=A0, imm=1), raw])
    assert r.trap.kind is TrapKind.ILLEGAL_INSTRUCTION and r.pc == progen.TEXT + 4 and r.regs[A0] == 1
    assert str(Trap(r.trap)).startswith("guest trapped: guest reached an illegal instruction")


def test_entering_anywhere_but_a_function_start_is_an_illegal_instruction():
    """As on translated code, which enters functions only: nothing runs."""
    image = progen.build_image([progen.Function("f0", [Op("addi", rd=A0, imm=1), Op("addi", rd=A1, imm=2),
                                                       Op("jalr", rs1=1)])])
    r = InterpBackend(Program.from_image(image), progen.MEMORY_SIZE).run(RunRequest(entry=image.entry + 4))
    assert r.trap.kind is TrapKind.ILLEGAL_INSTRUCTION
    assert (r.pc, r.trap.addr) == (image.entry + 4, image.entry + 4)
    assert r.regs[A1] == 0 and r.regs[A0] == 0


def test_jumping_out_of_code_is_an_illegal_instruction():
    r = run_snippet([Op("jal", rd=0, imm=progen.DATA - progen.TEXT)])
    assert r.trap.kind is TrapKind.ILLEGAL_INSTRUCTION and r.pc == progen.DATA and r.trap.where == f"{progen.DATA:#x}"


def test_unknown_host_call_names_a_known_capability():
    number = fnv1a64("berm.fs.read")
    r = run_snippet([*li(17, number), Op("ecall")])
    assert r.trap.kind is TrapKind.UNKNOWN_HOST_CALL and r.trap.addr == number
    assert f"no host function for call {number} (berm.fs.read, not granted to this harness)" in str(Trap(r.trap))
    r = run_snippet([*li(17, 12345), Op("ecall")])
    assert str(Trap(r.trap)).startswith("guest trapped: no host function for call 12345 in f0+")


def test_deadline_interrupts_an_infinite_loop():
    r = run_snippet([Label(".spin"), Op("addi", rd=A0, rs1=A0, imm=1), Op("jal", target=".spin")],
                    deadline=time.monotonic() + 0.05)
    assert r.trap.kind is TrapKind.INTERRUPTED and r.regs[A0] > 0
    assert str(Trap(r.trap)).startswith("guest trapped: guest was interrupted")


def test_unbounded_tail_recursion_runs_until_the_deadline():
    f1 = progen.Function("f1", [Op("jal", rd=0, target="f1")])
    r = run_snippet([Op("jal", rd=1, target="f1")], helpers=[f1], deadline=time.monotonic() + 0.05)
    assert r.trap.kind is TrapKind.INTERRUPTED


def test_unbounded_recursion_exhausts_the_call_depth():
    f1 = progen.Function("f1", [Op("addi", rd=A0, rs1=A0, imm=1), Op("jal", rd=1, target="f1")])
    r = run_snippet([Op("jal", rd=1, target="f1")], helpers=[f1])
    assert r.trap.kind is TrapKind.STACK_EXHAUSTED
    assert r.regs[A0] == MAX_CALL_DEPTH - 1  # the entry frame plus MAX_CALL_DEPTH - 1 calls fit
    assert r.trap.where == "f1+0x4"
    assert str(Trap(r.trap)).startswith("guest trapped: guest stack exhausted")


def test_recursion_with_big_frames_faults_in_the_guard():
    f1 = progen.Function("f1", [Op("addi", rd=2, rs1=2, imm=-2048), Op("sd", rs1=2, rs2=1),
                                Op("jal", rd=1, target="f1")])
    r = run_snippet([Op("jal", rd=1, target="f1")], helpers=[f1])
    assert r.trap.kind is TrapKind.MEMORY_FAULT and r.trap.detail == "store 8 bytes"
    assert LAYOUT.guard_lo <= r.trap.addr < LAYOUT.stack_lo
