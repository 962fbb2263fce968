"""What every RV64IMAC operation computes, as one table line each, and the handlers built from those lines.

The tables are the readable part of the oracle: ``ALU`` says what ``add``…``remuw`` compute over ``A`` (rs1's value)
and ``B`` (rs2's value, or the immediate for the I-forms) as Python integers; ``BRANCH`` the branch conditions;
``AMO`` what each atomic stores given the loaded ``L``. Register values are held unsigned (0 ≤ v < 2^64); each
result is masked to 64 bits on write, so Python's unbounded integers make overflow cases (``div`` of −2^63 by −1,
``mulh*``) come out right without special cases.

Handlers are closures ``h(x, m, st) -> next_pc`` over one decoded instruction: ``x`` is the register list, ``m``
the raw guest memory buffer, ``st`` the run state (``berm_host.interp.run.RunState``). The factories for the
table-driven ops are generated once at import from the table text, so each handler evaluates its expression
inline instead of calling a function per instruction.
"""

from __future__ import annotations

import struct

from berm_aot.isa import Instruction
from berm_host.layout import Layout

from .trap import MemoryFault

M = (1 << 64) - 1
M32 = (1 << 32) - 1


def s64(v: int) -> int:
    """``v`` (unsigned 64-bit) as a signed integer."""
    return v - (1 << 64) if v >> 63 else v


def s32(v: int) -> int:
    """The low 32 bits of ``v`` as a signed integer."""
    v &= M32
    return v - (1 << 32) if v >> 31 else v


def sx32(v: int) -> int:
    """The low 32 bits of ``v`` sign-extended to an unsigned 64-bit value (every ``w`` result)."""
    return s32(v) & M


def div(a: int, b: int, ones: int) -> int:
    """Truncating division as RISC-V defines it: x/0 = ``ones`` (all bits set); overflow falls out of the masking."""
    if b == 0:
        return ones
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def rem(a: int, b: int) -> int:
    """The remainder that goes with ``div`` (sign of the dividend); x%0 = x."""
    if b == 0:
        return a
    return a - b * div(a, b, 0)


#: op -> expression over A, B. The I-forms map onto these through ``IMM_FORMS``.
ALU: dict[str, str] = {
    "add": "A + B",
    "sub": "A - B",
    "sll": "A << (B & 63)",
    "slt": "int(s64(A) < s64(B))",
    "sltu": "int(A < B)",
    "xor": "A ^ B",
    "srl": "A >> (B & 63)",
    "sra": "s64(A) >> (B & 63)",
    "or": "A | B",
    "and": "A & B",
    "addw": "sx32(A + B)",
    "subw": "sx32(A - B)",
    "sllw": "sx32(A << (B & 31))",
    "srlw": "sx32((A & M32) >> (B & 31))",
    "sraw": "sx32(s32(A) >> (B & 31))",
    "mul": "A * B",
    "mulh": "(s64(A) * s64(B)) >> 64",
    "mulhsu": "(s64(A) * B) >> 64",
    "mulhu": "(A * B) >> 64",
    "div": "div(s64(A), s64(B), -1)",
    "divu": "div(A, B, M)",
    "rem": "rem(s64(A), s64(B))",
    "remu": "rem(A, B)",
    "mulw": "sx32(A * B)",
    "divw": "sx32(div(s32(A), s32(B), -1))",
    "divuw": "sx32(div(A & M32, B & M32, M))",
    "remw": "sx32(rem(s32(A), s32(B)))",
    "remuw": "sx32(rem(A & M32, B & M32))",
}

#: I-form -> the register form whose expression it shares (B is the immediate, masked to 64 bits).
IMM_FORMS: dict[str, str] = {
    "addi": "add", "slti": "slt", "sltiu": "sltu", "xori": "xor", "ori": "or", "andi": "and",
    "slli": "sll", "srli": "srl", "srai": "sra",
    "addiw": "addw", "slliw": "sllw", "srliw": "srlw", "sraiw": "sraw",
}

BRANCH: dict[str, str] = {
    "beq": "A == B",
    "bne": "A != B",
    "blt": "s64(A) < s64(B)",
    "bge": "s64(A) >= s64(B)",
    "bltu": "A < B",
    "bgeu": "A >= B",
}

#: load op -> struct format (its size is the access size; lower-case formats sign-extend).
LOADS: dict[str, str] = {"lb": "<b", "lh": "<h", "lw": "<i", "ld": "<q", "lbu": "<B", "lhu": "<H", "lwu": "<I"}
STORES: dict[str, str] = {"sb": "<B", "sh": "<H", "sw": "<I", "sd": "<Q"}

#: AMO base name -> the value stored, over L (the loaded value, zero-extended), B (rs2), S (signed view of the
#: access width) and W (the width's mask). ``rd`` always receives L (sign-extended for ``.w``).
AMO: dict[str, str] = {
    "amoswap": "B",
    "amoadd": "L + B",
    "amoxor": "L ^ B",
    "amoand": "L & B",
    "amoor": "L | B",
    "amomin": "L if S(L) < S(B) else B",
    "amomax": "L if S(L) > S(B) else B",
    "amominu": "L if L < (B & W) else B",
    "amomaxu": "L if L > (B & W) else B",
}

_NAMESPACE = {"s64": s64, "s32": s32, "sx32": sx32, "div": div, "rem": rem, "M": M, "M32": M32}


def _factory(name: str, params: str, body: str):
    """Compile ``def name(params): def h(x, m, st): body; return h`` once, in the semantics namespace."""
    src = f"def {name}({params}):\n    def h(x, m, st):\n" + "".join(f"        {line}\n" for line in body) + \
        "    return h\n"
    ns: dict = {}
    exec(compile(src, f"<berm interp {name}>", "exec"), dict(_NAMESPACE), ns)  # noqa: S102 - our own table text
    return ns[name]


_ALU_RR = {op: _factory(f"rr_{op}", "rd, rs1, rs2, nxt",
                        ["A = x[rs1]", "B = x[rs2]", f"x[rd] = ({e}) & M", "return nxt"]) for op, e in ALU.items()}
_ALU_RI = {op: _factory(f"ri_{op}", "rd, rs1, B, nxt",
                        ["A = x[rs1]", f"x[rd] = ({e}) & M", "return nxt"]) for op, e in ALU.items()}
_BRANCHES = {op: _factory(f"br_{op}", "rs1, rs2, target, nxt",
                          ["A = x[rs1]", "B = x[rs2]", f"return target if {e} else nxt"]) for op, e in BRANCH.items()}


def nop(insn: Instruction):
    """Handler for an instruction with no effect (``fence``, ``fence.i``, an ALU op writing x0)."""
    nxt = insn.next_pc

    def h(x, m, st):
        return nxt
    return h


def alu(insn: Instruction):
    """Handler for a register-register or register-immediate ALU op (and ``lui``/``auipc``)."""
    nxt = insn.next_pc
    if insn.rd == 0:
        return nop(insn)  # a write to x0 is discarded and ALU ops have no other effect
    if insn.op in ALU:
        return _ALU_RR[insn.op](insn.rd, insn.rs1, insn.rs2, nxt)
    if insn.op in IMM_FORMS:
        return _ALU_RI[IMM_FORMS[insn.op]](insn.rd, insn.rs1, insn.imm & M, nxt)
    rd, value = insn.rd, (insn.imm if insn.op == "lui" else insn.addr + insn.imm) & M  # lui / auipc

    def h(x, m, st):
        x[rd] = value
        return nxt
    return h


def branch(insn: Instruction):
    return _BRANCHES[insn.op](insn.rs1, insn.rs2, (insn.addr + insn.imm) & M, insn.next_pc)


# ``load`` and ``store`` spell the bounds test of ``Layout.readable``/``Layout.writable`` out inline, with the bounds
# bound to locals: it runs for every memory access, where a method call per access would be the largest cost.
# tests/test_interp_traps.py checks both against every edge of the layout.

def load(insn: Instruction, layout: Layout):
    unpack = struct.Struct(LOADS[insn.op]).unpack_from
    n = struct.calcsize(LOADS[insn.op])
    rd, rs1, imm, nxt = insn.rd, insn.rs1, insn.imm, insn.next_pc
    lo, glo, slo, top = layout.image_lo, layout.guard_lo, layout.stack_lo, layout.size
    detail = f"load {n} bytes"

    def h(x, m, st):
        a = (x[rs1] + imm) & M
        e = a + n
        if not ((lo <= a and e <= glo) or (slo <= a and e <= top)):
            raise MemoryFault(a, detail)
        v = unpack(m, a)[0]
        if rd:
            x[rd] = v & M
        return nxt
    return h


def store(insn: Instruction, layout: Layout):
    fmt = STORES[insn.op]
    pack = struct.Struct(fmt).pack_into
    n = struct.calcsize(fmt)
    mask = (1 << (8 * n)) - 1
    rs1, rs2, imm, nxt = insn.rs1, insn.rs2, insn.imm, insn.next_pc
    lo, glo, slo, top = layout.writable_lo, layout.guard_lo, layout.stack_lo, layout.size
    detail = f"store {n} bytes"

    def h(x, m, st):
        a = (x[rs1] + imm) & M
        e = a + n
        if not ((lo <= a and e <= glo) or (slo <= a and e <= top)):
            raise MemoryFault(a, detail)
        pack(m, a, x[rs2] & mask)
        return nxt
    return h


def atomic(insn: Instruction, layout: Layout):
    """``lr``, ``sc`` and every AMO: naturally aligned or a fault; single-hart, so ``sc`` always succeeds."""
    base, width = insn.op.split(".")
    n = 4 if width == "w" else 8
    fmt = struct.Struct("<I" if n == 4 else "<Q")
    W = (1 << (8 * n)) - 1
    S = s32 if n == 4 else s64
    widen = sx32 if n == 4 else (lambda v: v)
    rd, rs1, rs2, nxt = insn.rd, insn.rs1, insn.rs2, insn.next_pc
    is_load = base == "lr"
    allowed = layout.readable if is_load else layout.writable
    detail = f"{'load' if is_load else 'store'} {n} bytes"
    compute = None if base in ("lr", "sc") else eval(f"lambda L, B: ({AMO[base]}) & W", {"S": S, "W": W})  # noqa: S307

    def h(x, m, st):
        a = x[rs1]
        if a % n:
            raise MemoryFault(a, f"misaligned {n}-byte atomic")
        if not allowed(a, n):
            raise MemoryFault(a, detail)
        if base == "sc":
            fmt.pack_into(m, a, x[rs2] & W)
            result = 0
        else:
            loaded = fmt.unpack_from(m, a)[0]
            if compute is not None:
                fmt.pack_into(m, a, compute(loaded, x[rs2]))
            result = widen(loaded)
        if rd:
            x[rd] = result
        return nxt
    return h
