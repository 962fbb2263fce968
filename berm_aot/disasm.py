"""Render a decoded instruction as text, the way ``llvm-objdump -d`` (LLVM 14) prints it by default.

ABI register names, LLVM's default aliases (``li``, ``mv``, ``nop``, ``ret``, ``j``, ``jr``, ``beqz``, ``not``,
``neg``, ``sext.w``, ``seqz``, …), and branch and jump targets as absolute hex addresses. A compressed
instruction prints as the base instruction it expands to, as LLVM prints it — except the HINT encodings LLVM keeps
in compressed form (``c.nop 5``, ``c.li zero, 3``, ``c.slli64 a0``, …), which print that way here too.

Where Berm and LLVM differ on purpose:
- an illegal encoding prints ``<illegal: why>`` (LLVM: ``<unknown>``), except ``c.unimp`` (0x0000), which both
  print ``unimp``;
- an unsupported one prints ``<unsupported: what>`` (e.g. ``<unsupported: csrrw (Zicsr)>``) where LLVM prints
  the instruction;
- a ``fence`` with reserved field values (which LLVM 14 refuses to decode) prints as the fence it executes as,
  and an empty predecessor or successor set prints as ``0`` (LLVM 14: ``unknown``).
"""

from __future__ import annotations

from berm_aot.isa import BRANCHES, Instruction

ABI_NAMES = (
    "zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1", "a0", "a1", "a2", "a3", "a4", "a5",
    "a6", "a7", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "t3", "t4", "t5", "t6",
)

_LOADS = frozenset({"lb", "lh", "lw", "ld", "lbu", "lhu", "lwu"})
_STORES = frozenset({"sb", "sh", "sw", "sd"})
_R_TYPE = frozenset("""
    add sub sll slt sltu xor srl sra or and addw subw sllw srlw sraw
    mul mulh mulhsu mulhu div divu rem remu mulw divw divuw remw remuw
""".split())
_I_TYPE = frozenset("addi slti sltiu xori ori andi slli srli srai addiw slliw srliw sraiw".split())
_BARE = frozenset({"ecall", "ebreak", "fence.i"})

# Branches against x0 that LLVM prints with one register: (op, which operand is x0, alias), in LLVM's order of
# preference (it matters when both operands are x0).
_BRANCH_ZERO = (("beq", "rs2", "beqz"), ("bne", "rs2", "bnez"), ("bge", "rs1", "blez"), ("bge", "rs2", "bgez"),
                ("blt", "rs2", "bltz"), ("blt", "rs1", "bgtz"))
# Two-register aliases of an I-type with a fixed immediate: (op, imm) -> alias.
_UNARY_I = {("xori", -1): "not", ("sltiu", 1): "seqz", ("addiw", 0): "sext.w"}
# Two-register aliases of an R-type with x0 as one operand, in the same form and order as _BRANCH_ZERO.
_UNARY_R = (("sub", "rs1", "neg"), ("subw", "rs1", "negw"), ("sltu", "rs1", "snez"), ("slt", "rs2", "sltz"),
            ("slt", "rs1", "sgtz"))
# Compressed HINTs LLVM prints in their compressed form (rd = x0, or a shift by zero).
_HINTS_RD0 = frozenset({"c.nop", "c.li", "c.lui", "c.slli", "c.mv", "c.add"})
_SHIFT64 = frozenset({"c.slli64", "c.srli64", "c.srai64"})
_FENCE_BITS = "iorw"


def _reg(r: int) -> str:
    return ABI_NAMES[r]


def _target(insn: Instruction) -> str:
    return f"{(insn.addr + insn.imm) & 0xFFFFFFFFFFFFFFFF:#x}"


def _upper(imm: int) -> int:
    """The 20-bit field of ``lui``/``auipc`` as LLVM prints it (unsigned)."""
    return (imm >> 12) & 0xFFFFF


def _fence_set(bits: int) -> str:
    return "".join(c for k, c in enumerate(_FENCE_BITS) if bits >> (3 - k) & 1) or "0"


def _fence(insn: Instruction) -> str:
    fm, pred, succ = insn.imm >> 8, insn.imm >> 4 & 0xF, insn.imm & 0xF
    if fm == 8 and pred == succ == 0b0011:
        return "fence.tso"
    if pred == succ == 0xF:
        return "fence"
    return f"fence {_fence_set(pred)}, {_fence_set(succ)}"


def _hint(insn: Instruction) -> str | None:
    """The compressed text of a HINT LLVM does not expand, else None."""
    c = insn.cname
    if c in _SHIFT64:
        return f"{c} {_reg(insn.rd)}"
    if insn.rd != 0 or c not in _HINTS_RD0 or (c == "c.nop" and insn.imm == 0):
        return None
    if c == "c.nop":
        return f"c.nop {insn.imm}"
    if c in ("c.mv", "c.add"):
        return f"{c} zero, {_reg(insn.rs2)}"
    return f"{c} zero, {insn.imm >> 12 if c == 'c.lui' else insn.imm}"  # c.lui: the signed 6-bit field


def _jalr(insn: Instruction) -> str:
    rd, rs1, imm = insn.rd, _reg(insn.rs1), insn.imm
    if rd == 0 and insn.rs1 == 1 and imm == 0:
        return "ret"
    where = rs1 if imm == 0 else f"{imm}({rs1})"
    if rd == 0:
        return f"jr {where}"
    if rd == 1:
        return f"jalr {where}"
    return f"jalr {_reg(rd)}, {where}"


def _zero_alias(insn: Instruction, table: tuple) -> tuple[str, str] | None:
    """The first alias of ``table`` whose x0 operand is x0 in ``insn``, with the name of the other register."""
    regs = {"rs1": insn.rs1, "rs2": insn.rs2}
    for op, zero, alias in table:
        if op == insn.op and regs[zero] == 0:
            return alias, _reg(regs["rs1" if zero == "rs2" else "rs2"])
    return None


def _branch(insn: Instruction) -> str:
    alias = _zero_alias(insn, _BRANCH_ZERO)
    if alias:
        return f"{alias[0]} {alias[1]}, {_target(insn)}"
    return f"{insn.op} {_reg(insn.rs1)}, {_reg(insn.rs2)}, {_target(insn)}"


def _i_type(insn: Instruction) -> str:
    op, rd, rs1, imm = insn.op, _reg(insn.rd), insn.rs1, insn.imm
    if op == "addi":
        if insn.rd == 0 and rs1 == 0 and imm == 0:
            return "nop"
        if rs1 == 0:
            return f"li {rd}, {imm}"
        if imm == 0:
            return f"mv {rd}, {_reg(rs1)}"
    alias = _UNARY_I.get((op, imm))
    if alias:
        return f"{alias} {rd}, {_reg(rs1)}"
    return f"{op} {rd}, {_reg(rs1)}, {imm}"


def _r_type(insn: Instruction) -> str:
    rd = _reg(insn.rd)
    if insn.cname == "c.mv":  # LLVM expands c.mv to addi rd, rs2, 0
        return f"mv {rd}, {_reg(insn.rs2)}"
    alias = _zero_alias(insn, _UNARY_R)
    if alias:
        return f"{alias[0]} {rd}, {alias[1]}"
    return f"{insn.op} {rd}, {_reg(insn.rs1)}, {_reg(insn.rs2)}"


def _atomic(insn: Instruction) -> str:
    ordering = ("aq" if insn.aq else "") + ("rl" if insn.rl else "")
    name = f"{insn.op}.{ordering}" if ordering else insn.op
    if insn.op.startswith("lr."):
        return f"{name} {_reg(insn.rd)}, ({_reg(insn.rs1)})"
    return f"{name} {_reg(insn.rd)}, {_reg(insn.rs2)}, ({_reg(insn.rs1)})"


def disassemble(insn: Instruction) -> str:
    """The instruction as llvm-objdump prints it, with single spaces (``"addi sp, sp, -16"``, ``"ret"``)."""
    op = insn.op
    if op == "illegal":
        return "unimp" if insn.note == "c.unimp" else f"<illegal: {insn.note}>"
    if op == "unsupported":
        return f"<unsupported: {insn.note}>"
    if insn.cname:
        hint = _hint(insn)
        if hint:
            return hint
    if op in _I_TYPE:
        return _i_type(insn)
    if op in _R_TYPE:
        return _r_type(insn)
    if op in _LOADS:
        return f"{op} {_reg(insn.rd)}, {insn.imm}({_reg(insn.rs1)})"
    if op in _STORES:
        return f"{op} {_reg(insn.rs2)}, {insn.imm}({_reg(insn.rs1)})"
    if op in BRANCHES:
        return _branch(insn)
    if op == "jal":
        if insn.rd == 0:
            return f"j {_target(insn)}"
        return f"jal {_target(insn)}" if insn.rd == 1 else f"jal {_reg(insn.rd)}, {_target(insn)}"
    if op == "jalr":
        return _jalr(insn)
    if op in ("lui", "auipc"):
        return f"{op} {_reg(insn.rd)}, {_upper(insn.imm)}"
    if op == "fence":
        return _fence(insn)
    if op in _BARE:
        return op
    return _atomic(insn)
