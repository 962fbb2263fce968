"""Every RV64IMAC operation on the reference interpreter, at the edge cases the specification spells out.

Expected values are written out by hand from the ISA manual (not computed by the code under test)."""

from __future__ import annotations

import pytest

from berm_host.traps import TrapKind
from tests import progen
from tests.interp_helpers import run_snippet
from tests.rvenc import Label, Op, la

M = (1 << 64) - 1
MIN64 = 1 << 63
A0, A1, A2, A3, T0 = 10, 11, 12, 13, 5


def neg(v: int) -> int:
    return v & M


REGISTER_OPS = [
    ("add", M, 1, 0), ("sub", 0, 1, M), ("sll", 1, 63, MIN64), ("sll", 1, 64, 1), ("sll", 3, 65, 6),
    ("slt", neg(-1), 1, 1), ("slt", 1, neg(-1), 0), ("slt", neg(-5), neg(-5), 0), ("sltu", neg(-1), 1, 0), ("sltu", 1, neg(-1), 1),
    ("xor", 0xF0, 0xFF, 0x0F), ("or", 0xF0, 0x0F, 0xFF), ("and", 0xF0, 0x3C, 0x30),
    ("srl", MIN64, 63, 1), ("srl", MIN64, 64, MIN64), ("sra", MIN64, 63, M), ("sra", MIN64, 1, 0xC << 60),
    # M extension: signs of the high products
    ("mul", M, M, 1), ("mul", 1 << 32, 1 << 32, 0),
    ("mulh", neg(-1), neg(-1), 0), ("mulh", MIN64, MIN64, 1 << 62), ("mulh", neg(-1), 1, M),
    ("mulhu", M, M, M - 1), ("mulhu", MIN64, 2, 1),
    ("mulhsu", neg(-1), M, M), ("mulhsu", 1, M, 0), ("mulhsu", MIN64, M, MIN64),  # -2^63 * (2^64-1) = -2^127 + 2^63: high half -2^63
    # division: by zero and overflow never trap
    ("div", neg(-7), 2, neg(-3)), ("div", 7, neg(-2), neg(-3)), ("div", 5, 0, M), ("div", MIN64, neg(-1), MIN64),
    ("divu", 7, 2, 3), ("divu", 5, 0, M), ("divu", M, 1, M),
    ("rem", neg(-7), 2, neg(-1)), ("rem", 7, neg(-2), 1), ("rem", 5, 0, 5), ("rem", MIN64, neg(-1), 0),
    ("remu", 7, 2, 1), ("remu", 5, 0, 5),
    # w forms: 32-bit operations, results sign-extended, upper operand bits ignored
    ("addw", 0x7FFFFFFF, 1, 0xFFFFFFFF80000000), ("addw", 0xFFFFFFFF, 1, 0), ("subw", 0, 1, M),
    ("sllw", 1, 31, 0xFFFFFFFF80000000), ("sllw", 1, 32, 1), ("sllw", 0x1_0000_0001, 0, 1),
    ("srlw", 0xFFFFFFFF80000000, 4, 0x08000000), ("srlw", 0x80000000, 0, 0xFFFFFFFF80000000),
    ("srlw", 0x80000000, 32, 0xFFFFFFFF80000000),
    ("sraw", 0x80000000, 31, M), ("sraw", 0x7FFFFFFF, 32, 0x7FFFFFFF), ("sraw", 0xFFFF_0000_4000_0000, 30, 1),
    ("mulw", 0x7FFFFFFF, 2, neg(-2)), ("mulw", 0x1_0000_0003, 0x1_0000_0005, 15),
    ("divw", 0x80000000, neg(-1), 0xFFFFFFFF80000000), ("divw", 5, 0, M), ("divw", 0xFFFFFFFF_00000007, 2, 3),
    ("divw", neg(-7), 2, neg(-3)), ("divw", 6, 0x1_0000_0002, 3),  # rs2's upper half is ignored too
    ("divuw", 5, 0, M), ("divuw", 0x80000000, 1, 0xFFFFFFFF80000000), ("divuw", 0xFFFFFFFF, 0x1_0000_0001, M),
    ("divuw", 0x1_0000_0006, 2, 3),
    ("remw", 0x80000000, neg(-1), 0), ("remw", 0x1_8000_0001, 0, 0xFFFFFFFF80000001), ("remw", neg(-7), 2, M),
    ("remw", 0x1_0000_0000, 3, 0),  # 2^32 % 3 = 1: only the low word (0) is divided
    ("remuw", 0x80000001, 0, 0xFFFFFFFF80000001), ("remuw", 7, 0x1_0000_0002, 1), ("remuw", 0x1_0000_0000, 3, 0),
]


IMMEDIATE_OPS = [
    ("addi", 5, -6, M), ("addi", 0, 2047, 2047), ("addi", 0, -2048, neg(-2048)),
    ("slti", neg(-2), -1, 1), ("slti", 0, -1, 0), ("sltiu", 0, 1, 1), ("sltiu", 5, -1, 1), ("sltiu", M, -1, 0),
    ("xori", 0, -1, M), ("ori", 0x100, 0xFF, 0x1FF), ("andi", M, -2048, neg(-2048)),
    ("slli", 1, 63, MIN64), ("srli", MIN64, 63, 1), ("srai", MIN64, 63, M), ("srai", 0x4000, 14, 1),
    ("addiw", 0xFFFFFFFF, 1, 0), ("addiw", 0x7FFFFFFF, 1, 0xFFFFFFFF80000000), ("addiw", 0x1_0000_0000, -1, M),
    ("slliw", 1, 31, 0xFFFFFFFF80000000), ("slliw", 0xFFFFFFFF, 0, M),
    ("srliw", 0xFFFFFFFF, 31, 1), ("srliw", 0x80000000, 0, 0xFFFFFFFF80000000),
    ("sraiw", 0x80000000, 31, M), ("sraiw", 0xF_7FFF_FFFF, 31, 0),
]


LOADS = [
    ("lb", neg(-128)), ("lbu", 0x80), ("lh", 0xFFFFFFFFFFFF8180), ("lhu", 0x8180),
    ("lw", 0xFFFFFFFF83828180), ("lwu", 0x83828180), ("ld", 0x8786858483828180),
]


BRANCHES = [
    ("beq", 5, 5, True), ("beq", 5, 6, False), ("bne", 5, 6, True), ("bne", M, M, False),
    ("blt", neg(-1), 1, True), ("blt", 1, neg(-1), False), ("bge", neg(-1), neg(-1), True), ("bge", neg(-2), 1, False),
    ("bltu", neg(-1), 1, False), ("bltu", 1, neg(-1), True), ("bgeu", neg(-1), 1, True), ("bgeu", 0, 1, False),
    # equal operands: only bge/bgeu branch
    ("blt", neg(-3), neg(-3), False), ("bltu", M, M, False), ("bgeu", M, M, True),
]


AMOS = [
    ("amoswap.w", 0x80000000, 5, 5, 0xFFFFFFFF80000000),
    ("amoadd.w", 0xFFFFFFFF, 1, 0, M), ("amoadd.d", M, 2, 1, M), ("amoadd.d", 1, 1 << 32, (1 << 32) + 1, 1),
    ("amoxor.w", 0xF0F0F0F0, 0xFFFFFFFF, 0x0F0F0F0F, 0xFFFFFFFFF0F0F0F0),
    ("amoand.d", 0xFF00, 0x0FF0, 0x0F00, 0xFF00), ("amoor.w", 0x1, 0x8000_0000, 0x80000001, 1),
    ("amomin.w", 0xFFFFFFFF, 1, 0xFFFFFFFF, M), ("amominu.w", 0xFFFFFFFF, 1, 1, M),
    ("amomax.w", 0xFFFFFFFF, 1, 1, M), ("amomaxu.w", 0xFFFFFFFF, 1, 0xFFFFFFFF, M),
    ("amomin.w", 5, 0x1_FFFF_FFFF, 0xFFFFFFFF, 5),  # rs2's upper half is ignored by .w: it is -1
    ("amominu.w", 5, 0xFFFFFFFF_00000001, 1, 5), ("amomaxu.w", 5, 0x1_0000_0001, 5, 5),  # ... and unsigned: 1
    ("amomin.d", M, 1, M, M), ("amominu.d", M, 1, 1, M), ("amomax.d", M, 1, 1, M), ("amomaxu.d", M, 1, M, M),
    ("amomax.d", MIN64, neg(-1), neg(-1), MIN64), ("amominu.d", MIN64, 3, 3, MIN64),
]


MISALIGNED_ATOMICS = [("lr.w", 2), ("sc.w", 1), ("amoadd.w", 2), ("amoor.w", 3), ("lr.d", 4), ("sc.d", 6),
                      ("amoswap.d", 4), ("amomaxu.d", 1), ("amoand.d", 7), ("amominu.d", 2)]


# What each vector runs (run_snippet's arguments): tests/test_aot_vectors.py runs them all on translated code too.

def register_op(op: str, a: int, b: int) -> dict:
    return dict(ops=[Op(op, rd=A2, rs1=A0, rs2=A1)], regs={A0: a, A1: b})


def immediate_op(op: str, a: int, imm: int) -> dict:
    return dict(ops=[Op(op, rd=A2, rs1=A0, imm=imm)], regs={A0: a})


def load(op: str) -> dict:
    return dict(ops=[Op(op, rd=A0, rs1=A1)], regs={A1: progen.DATA}, data=bytes(range(0x80, 0x88)))


def branch(op: str, a: int, b: int) -> dict:
    return dict(ops=[Op(op, rs1=A0, rs2=A1, target=".t"), Op("addi", rd=A2, imm=1), Label(".t")], regs={A0: a, A1: b})


def _word(value: int, n: int) -> bytes:
    return (value & ((1 << (8 * n)) - 1)).to_bytes(n, "little")


def amo(op: str, mem: int, rs2: int) -> dict:
    n = 4 if op.endswith(".w") else 8
    return dict(ops=[Op(op, rd=A0, rs1=A1, rs2=A2, aq=True, rl=True)], regs={A1: progen.DATA + 8, A2: rs2},
                data=bytes(8) + _word(mem, n) + bytes(8))


def misaligned_atomic(op: str, offset: int) -> dict:
    rs2 = 0 if op.startswith("lr") else A2
    return dict(ops=[Op("addi", rd=A2, imm=1), Op(op, rd=A0, rs1=A1, rs2=rs2)], regs={A1: progen.DATA + offset},
                data=bytes(16))


def vectors() -> list[dict]:
    """Every vector of the tables above as the snippet it runs."""
    return [*(register_op(op, a, b) for op, a, b, _ in REGISTER_OPS),
            *(immediate_op(op, a, imm) for op, a, imm, _ in IMMEDIATE_OPS), *(load(op) for op, _ in LOADS),
            *(branch(op, a, b) for op, a, b, _ in BRANCHES), *(amo(op, mem, rs2) for op, mem, rs2, _, _ in AMOS),
            *(misaligned_atomic(op, offset) for op, offset in MISALIGNED_ATOMICS)]


@pytest.mark.parametrize("op, a, b, expected", REGISTER_OPS)
def test_register_ops(op, a, b, expected):
    assert run_snippet(**register_op(op, a, b)).regs[A2] == expected


@pytest.mark.parametrize("op, a, imm, expected", IMMEDIATE_OPS)
def test_immediate_ops(op, a, imm, expected):
    assert run_snippet(**immediate_op(op, a, imm)).regs[A2] == expected


def test_lui_and_auipc_sign_extend():
    r = run_snippet([Op("lui", rd=A0, imm=-(1 << 31)), Op("lui", rd=A1, imm=0x7FFFF000),
                     Op("auipc", rd=A2, imm=-4096), Op("auipc", rd=A3, imm=0)])
    assert r.regs[A0] == 0xFFFFFFFF80000000 and r.regs[A1] == 0x7FFFF000
    assert r.regs[A2] == progen.TEXT + 8 - 4096 and r.regs[A3] == progen.TEXT + 12


def test_writes_to_x0_are_discarded():
    data = bytes([0x80]) + bytes(7)
    ops = [Op("addi", rd=0, imm=5), Op("lui", rd=0, imm=4096), Op("add", rd=0, rs1=A0, rs2=A0),
           Op("lb", rd=0, rs1=A1), Op("amoadd.d", rd=0, rs1=A1, rs2=A0), Op("jal", rd=0, imm=4),
           Op("add", rd=A2, rs1=0, rs2=0), Op("ori", rd=A3, rs1=0, imm=0)]
    r = run_snippet(ops, regs={A0: 7, A1: progen.DATA}, data=data)
    assert r.trap is None and r.regs[0] == 0 and r.regs[A2] == 0 and r.regs[A3] == 0


@pytest.mark.parametrize("op, expected", LOADS)
def test_loads_sign_or_zero_extend(op, expected):
    assert run_snippet(**load(op)).regs[A0] == expected


def test_misaligned_plain_accesses_are_allowed():
    data = bytes(range(16))
    r = run_snippet([Op("ld", rd=A0, rs1=A1, imm=1), Op("sw", rs1=A1, rs2=A2, imm=9), Op("lhu", rd=A3, rs1=A1, imm=9)],
                    regs={A1: progen.DATA, A2: 0xAABBCCDD}, data=data, snapshot=((progen.DATA, 16),))
    assert r.regs[A0] == int.from_bytes(bytes(range(1, 9)), "little")
    assert r.regs[A3] == 0xCCDD
    assert r.snapshot[0] == bytes(range(9)) + bytes.fromhex("ddccbbaa") + bytes(range(13, 16))


@pytest.mark.parametrize("op, size", [("sb", 1), ("sh", 2), ("sw", 4), ("sd", 8)])
def test_stores_truncate(op, size):
    r = run_snippet([Op(op, rs1=A1, rs2=A0)], regs={A0: 0x1122334455667788, A1: progen.DATA}, data=bytes(8),
                    snapshot=((progen.DATA, 8),))
    assert r.snapshot[0] == (0x1122334455667788).to_bytes(8, "little")[:size] + bytes(8 - size)


@pytest.mark.parametrize("op, a, b, taken", BRANCHES)
def test_branches_compare_signed_or_unsigned(op, a, b, taken):
    assert run_snippet(**branch(op, a, b)).regs[A2] == (0 if taken else 1)


def test_backward_branch_loop():
    ops = [Label(".l"), Op("addi", rd=A0, rs1=A0, imm=3), Op("addi", rd=A1, rs1=A1, imm=-1),
           Op("bne", rs1=A1, rs2=0, target=".l")]
    assert run_snippet(ops, regs={A1: 1000}).regs[A0] == 3000


@pytest.mark.parametrize("op, mem, rs2, stored, rd", AMOS)
def test_amos(op, mem, rs2, stored, rd):
    n = 4 if op.endswith(".w") else 8
    r = run_snippet(**amo(op, mem, rs2), snapshot=((progen.DATA + 8, n),))
    assert r.trap is None
    assert r.snapshot[0] == _word(stored, n)
    assert r.regs[A0] == rd


def test_lr_sc_single_hart():
    ops = [Op("lr.w", rd=A0, rs1=A1), Op("sc.w", rd=A2, rs1=A1, rs2=A3), Op("lr.d", rd=A3, rs1=A1),
           Op("sc.d", rd=T0, rs1=A1, rs2=A0)]
    r = run_snippet(ops, regs={A1: progen.DATA, A2: 99, A3: 0x1234_5678_9ABC_DEF0, T0: 99},
                    data=_word(0x80000001, 8), snapshot=((progen.DATA, 8),))
    assert r.regs[A0] == 0xFFFFFFFF80000001  # lr.w sign-extends
    assert r.regs[A2] == 0 and r.regs[T0] == 0  # sc always succeeds on the single hart
    assert r.regs[A3] == 0x9ABCDEF0  # sc.w stored the low word of the old A3; the upper half stayed 0
    assert r.snapshot[0] == _word(0xFFFFFFFF80000001, 8)


@pytest.mark.parametrize("op, offset", MISALIGNED_ATOMICS)
def test_misaligned_atomics_fault(op, offset):
    n = 4 if op.endswith(".w") else 8
    r = run_snippet(**misaligned_atomic(op, offset))
    assert r.trap.kind is TrapKind.MEMORY_FAULT
    assert r.trap.addr == progen.DATA + offset and r.trap.detail == f"misaligned {n}-byte atomic"
    assert r.regs[A0] == 0 and r.regs[A2] == 1  # the atomic had no effect


def test_fences_do_nothing():
    r = run_snippet([Op("fence"), Op("fence.i"), Op("addi", rd=A0, imm=1)])
    assert r.trap is None and r.regs[A0] == 1


def test_jalr_clears_bit_zero_and_reads_rs1_before_writing_rd():
    f1 = progen.Function("f1", [Op("addi", rd=A0, imm=42), Op("jalr", rs1=1)])
    ops = [*la(1, "f1"), Op("addi", rd=1, rs1=1, imm=1), Op("jalr", rd=1, rs1=1), Op("addi", rd=A1, imm=7),
           Op("ld", rd=1, rs1=2, imm=-8)]
    r = run_snippet([Op("sd", rs1=2, rs2=1, imm=-8), *ops], helpers=[f1])
    assert r.trap is None
    assert (r.regs[A0], r.regs[A1]) == (42, 7)  # f1 ran and returned to the link jalr wrote after reading ra


@pytest.mark.parametrize("ops, reg, expected", [
    ([Op("c.addi", rd=A0, imm=-32)], A0, neg(-32)), ([Op("c.addi", rd=A0, imm=31)], A0, 31),
    ([Op("c.li", rd=A0, imm=-32)], A0, neg(-32)), ([Op("c.li", rd=A0, imm=31)], A0, 31),
    ([Op("c.lui", rd=A0, imm=-(1 << 17))], A0, neg(-(1 << 17))), ([Op("c.lui", rd=A0, imm=(1 << 17) - 4096)], A0, 0x1F000),
    ([Op("c.li", rd=A0, imm=-1), Op("c.addiw", rd=A0, imm=1)], A0, 0),
    ([Op("c.lui", rd=A0, imm=4096), Op("c.addiw", rd=A0, imm=-32)], A0, 4096 - 32),
    ([Op("c.li", rd=A0, imm=1), Op("c.slli", rd=A0, imm=63)], A0, MIN64),
    ([Op("c.li", rd=A0, imm=-32), Op("c.srli", rd=A0, imm=63)], A0, 1),
    ([Op("c.li", rd=A0, imm=-32), Op("c.srai", rd=A0, imm=63)], A0, M),
    ([Op("c.li", rd=A0, imm=-1), Op("c.andi", rd=A0, imm=-32)], A0, neg(-32)),
    ([Op("c.li", rd=A0, imm=-1), Op("c.andi", rd=A0, imm=31)], A0, 31),
    ([Op("c.addi4spn", rd=A0, imm=1020)], A0, progen.MEMORY_SIZE - 16 + 1020),
    ([Op("c.addi16sp", imm=-512), Op("c.mv", rd=A0, rs2=2), Op("c.addi16sp", imm=496), Op("c.addi16sp", imm=16)],
     A0, progen.MEMORY_SIZE - 16 - 512),
    ([Op("c.li", rd=A0, imm=5), Op("c.li", rd=A1, imm=-3), Op("c.subw", rd=A0, rs2=A1)], A0, 8),
    ([Op("c.lui", rd=A0, imm=-(1 << 17)), Op("c.addw", rd=A0, rs2=A0)], A0, neg(-(1 << 18))),
    ([Op("c.li", rd=A0, imm=6), Op("c.li", rd=A1, imm=3), Op("c.xor", rd=A0, rs2=A1)], A0, 5),
    ([Op("c.li", rd=A0, imm=6), Op("c.li", rd=A1, imm=3), Op("c.or", rd=A0, rs2=A1)], A0, 7),
    ([Op("c.li", rd=A0, imm=6), Op("c.li", rd=A1, imm=3), Op("c.and", rd=A0, rs2=A1)], A0, 2),
    ([Op("c.li", rd=A0, imm=6), Op("c.li", rd=A1, imm=3), Op("c.sub", rd=A0, rs2=A1)], A0, 3),
    ([Op("c.li", rd=A0, imm=6), Op("c.add", rd=A0, rs2=A0)], A0, 12),
    ([Op("c.nop")], A0, 0),
])
def test_compressed_immediates_at_their_extremes(ops, reg, expected):
    r = run_snippet(ops)
    assert r.trap is None
    assert r.regs[reg] == expected


def test_compressed_loads_and_stores_at_their_largest_offsets():
    ops = [Op("c.addi16sp", imm=-512), Op("c.sdsp", rs2=A0, rs1=2, imm=504), Op("c.ldsp", rd=A1, rs1=2, imm=504),
           Op("c.swsp", rs2=A0, rs1=2, imm=252), Op("c.lwsp", rd=A2, rs1=2, imm=252),
           Op("c.sd", rs1=8, rs2=A0, imm=248), Op("c.ld", rd=A3, rs1=8, imm=248),
           Op("c.sw", rs1=8, rs2=A0, imm=124), Op("c.lw", rd=9, rs1=8, imm=124), Op("c.addi16sp", imm=496),
           Op("c.addi16sp", imm=16)]
    r = run_snippet(ops, regs={A0: 0x8000_0000_8000_0001, 8: progen.DATA}, data=bytes(256))
    assert r.trap is None
    assert r.regs[A1] == 0x8000_0000_8000_0001 and r.regs[A3] == 0x8000_0000_8000_0001
    assert r.regs[A2] == 0xFFFFFFFF80000001 and r.regs[9] == 0xFFFFFFFF80000001
    assert r.regs[2] == progen.MEMORY_SIZE - 16


def test_compressed_jumps_and_branches_at_their_extremes():
    pad = [Op("c.nop")] * 125  # c.beqz jumps 2 + 250 + 2 = 254 bytes, its largest forward offset
    far = [Op("c.nop")] * 1020
    ops = [Op("c.li", rd=A0, imm=0), Op("c.beqz", rs1=A0, target=".b"), *pad, Op("c.li", rd=A1, imm=1), Label(".b"),
           Op("c.bnez", rs1=A0, target=".c"), Op("c.j", target=".j"), Label(".c"), Op("c.li", rd=A2, imm=1),
           *far, Label(".j")]
    r = run_snippet(ops)
    assert r.trap is None and r.regs[A1] == 0 and r.regs[A2] == 0


def test_call_depth_counts_jal_and_returns():
    body = [Op("addi", rd=2, rs1=2, imm=-16), Op("sd", rs1=2, rs2=1), Op("addi", rd=A0, rs1=A0, imm=-1),
            Op("beq", rs1=A0, rs2=0, target=".done"), Op("jal", rd=1, target="f1"), Label(".done"),
            Op("addi", rd=A1, rs1=A1, imm=1), Op("ld", rd=1, rs1=2), Op("addi", rd=2, rs1=2, imm=16), Op("jalr", rs1=1)]
    f1 = progen.Function("f1", body)
    r = run_snippet([Op("sd", rs1=2, rs2=1, imm=-8), Op("addi", rd=2, rs1=2, imm=-16), Op("jal", rd=1, target="f1"),
                     Op("addi", rd=2, rs1=2, imm=16), Op("ld", rd=1, rs1=2, imm=-8)], regs={A0: 500}, helpers=[f1])
    assert r.trap is None and r.regs[A1] == 500
