"""C for the instructions that only compute: ALU, loads, stores and atomics. Control transfers and ``ecall`` live
in ``berm_aot.emit.function``, which knows the function around them.

Every statement refers to guest registers as C locals ``x1``…``x31`` (``x0`` reads as 0, writes go to the
sink ``zz``) and to the macros of berm_host/aot/berm_code.h. A fault jumps to the function's ``trap`` label
before the instruction has any effect.
"""

from __future__ import annotations

from berm_aot.demangle import shown_name
from berm_aot.isa import Instruction

MASK = (1 << 64) - 1


def lit(value: int) -> str:
    """A C uint64_t literal."""
    return f"{value & MASK:#x}ull"


def comment(text: str) -> str:
    """``text`` made safe inside a C comment: printable ASCII only (anything else, a newline included, becomes
    ``?``), and no ``*/`` to end the comment. Symbol names come from the guest's ELF: a name that closed the comment
    put its own C into the object the host loads (it ran as a constructor in the host process)."""
    if not (text.isascii() and text.isprintable()):  # printable ASCII is exactly " " to "~"
        text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text.replace("*/", "*?/")


def name_comment(name: str) -> str:
    """A function's name inside a C comment, as messages show it: demangled, and cut to ``MAX_NAME`` characters
    (found by a review: whole, a long name shared by a thousand functions' symbols was written at each of them,
    600 MB of C from a 400 KB image)."""
    return comment(shown_name(name))


def reg(n: int) -> str:
    return f"x{n}" if n else "0ull"


def dst(n: int) -> str:
    return f"x{n}" if n else "zz"


_BIN = {
    "add": "{a} + {b}", "sub": "{a} - {b}", "xor": "{a} ^ {b}", "or": "{a} | {b}", "and": "{a} & {b}",
    "sll": "{a} << ({b} & 63)", "srl": "{a} >> ({b} & 63)", "sra": "(uint64_t)((int64_t){a} >> ({b} & 63))",
    "slt": "(uint64_t)((int64_t){a} < (int64_t){b})", "sltu": "(uint64_t)({a} < {b})",
    "addw": "berm_sx32({a} + {b})", "subw": "berm_sx32({a} - {b})",
    "sllw": "berm_sx32((uint32_t){a} << ({b} & 31))", "srlw": "berm_sx32((uint32_t){a} >> ({b} & 31))",
    "sraw": "(uint64_t)(int64_t)((int32_t){a} >> ({b} & 31))",
    "mul": "{a} * {b}", "mulh": "berm_mulh({a}, {b})", "mulhsu": "berm_mulhsu({a}, {b})",
    "mulhu": "berm_mulhu({a}, {b})", "div": "berm_div({a}, {b})", "divu": "berm_divu({a}, {b})",
    "rem": "berm_rem({a}, {b})", "remu": "berm_remu({a}, {b})", "mulw": "berm_sx32({a} * {b})",
    "divw": "berm_divw({a}, {b})", "divuw": "berm_divuw({a}, {b})", "remw": "berm_remw({a}, {b})",
    "remuw": "berm_remuw({a}, {b})",
}

_IMM = {
    "addi": "{a} + {i}", "xori": "{a} ^ {i}", "ori": "{a} | {i}", "andi": "{a} & {i}",
    "slti": "(uint64_t)((int64_t){a} < (int64_t){i})", "sltiu": "(uint64_t)({a} < {i})",
    "slli": "{a} << {s}", "srli": "{a} >> {s}", "srai": "(uint64_t)((int64_t){a} >> {s})",
    "addiw": "berm_sx32({a} + {i})", "slliw": "berm_sx32((uint32_t){a} << {s})",
    "srliw": "berm_sx32((uint32_t){a} >> {s})", "sraiw": "(uint64_t)(int64_t)((int32_t){a} >> {s})",
}

LOAD_TYPES = {"lb": "int8_t", "lh": "int16_t", "lw": "int32_t", "ld": "int64_t",
              "lbu": "uint8_t", "lhu": "uint16_t", "lwu": "uint32_t"}
STORE_TYPES = {"sb": "uint8_t", "sh": "uint16_t", "sw": "uint32_t", "sd": "uint64_t"}

#: AMO ``new`` values over the old value ``o`` and the source ``s`` (both of the signed type S, unsigned U).
_AMO = {
    "amoswap": "s", "amoadd": "(S)((U)o + (U)s)", "amoxor": "(S)((U)o ^ (U)s)", "amoand": "(S)((U)o & (U)s)",
    "amoor": "(S)((U)o | (U)s)", "amomin": "o < s ? o : s", "amomax": "o > s ? o : s",
    "amominu": "(U)o < (U)s ? o : s", "amomaxu": "(U)o > (U)s ? o : s",
}

BRANCH_CONDS = {
    "beq": "{a} == {b}", "bne": "{a} != {b}", "blt": "(int64_t){a} < (int64_t){b}",
    "bge": "(int64_t){a} >= (int64_t){b}", "bltu": "{a} < {b}", "bgeu": "{a} >= {b}",
}


#: ``compute``'s ``group`` for an access whose range is known to be in a window: no check at all.
CHECKED = "checked"


def compute(insn: Instruction, stack_base: bool = False, group: str | None = None) -> str | None:
    """The C statement for a computing instruction, or None when ``insn`` is not one. ``stack_base``: the base
    register of a load or store holds a stack address (berm_aot.emit.stackptr), so the stack window is tested
    first, as for sp itself. ``group``: ``CHECKED`` for a member of a group that runs only when the group's check
    passed (berm_aot.emit.groups; a counted loop's second copy), or the flag of the counted loop's group this
    access belongs to, set at the loop's head (berm_aot.emit.loops), which the access tests."""
    op = insn.op
    a, b = reg(insn.rs1), reg(insn.rs2)
    if op in _BIN:
        return f"{dst(insn.rd)} = {_BIN[op].format(a=a, b=b)};"
    if op == "srliw" and insn.imm & 31:
        # bit 31 of the result is 0: the sign extension is a zero extension, which x86's 32-bit shift does for
        # free once gcc's -free sees it (berm_aot/cc.py)
        return f"{dst(insn.rd)} = (uint64_t)((uint32_t){a} >> {insn.imm & 31});"
    if op in _IMM:
        return f"{dst(insn.rd)} = {_IMM[op].format(a=a, i=lit(insn.imm), s=insn.imm & 63)};"
    if op == "lui":
        return f"{dst(insn.rd)} = {lit(insn.imm)};"
    if op == "auipc":
        return f"{dst(insn.rd)} = {lit(insn.addr + insn.imm)};"
    if op in LOAD_TYPES and group == CHECKED:
        return f"BERM_GROUPED_LD({dst(insn.rd)}, {LOAD_TYPES[op]}, {a} + {lit(insn.imm)});"
    if op in STORE_TYPES and group == CHECKED:
        return f"BERM_GROUPED_ST({STORE_TYPES[op]}, {a} + {lit(insn.imm)}, {b});"
    if op in LOAD_TYPES and group:
        return f"BERM_G_LD({group}, {dst(insn.rd)}, {LOAD_TYPES[op]}, {a} + {lit(insn.imm)}, {lit(insn.addr)});"
    if op in STORE_TYPES and group:
        return f"BERM_G_ST({group}, {STORE_TYPES[op]}, {a} + {lit(insn.imm)}, {b}, {lit(insn.addr)});"
    if op in LOAD_TYPES:
        # stack accesses test the stack window first (the order changes no outcome, only the common path)
        kind = "SP_LD" if insn.rs1 == 2 or stack_base else "LD"
        return f"BERM_{kind}({dst(insn.rd)}, {LOAD_TYPES[op]}, {a} + {lit(insn.imm)}, {lit(insn.addr)});"
    if op in STORE_TYPES:
        kind = "SP_ST" if insn.rs1 == 2 or stack_base else "ST"
        return f"BERM_{kind}({STORE_TYPES[op]}, {a} + {lit(insn.imm)}, {b}, {lit(insn.addr)});"
    if op in ("fence", "fence.i"):
        return ";"
    if "." in op:
        return _atomic(insn)
    return None


def _atomic(insn: Instruction) -> str:
    return atomic(insn.op, reg(insn.rs1), reg(insn.rs2), dst(insn.rd), lit(insn.addr))


def atomic(op: str, addr: str, src: str, out: str, pc: str) -> str:
    """The C of the atomic ``op`` at the guest address ``addr`` with the source register's value ``src``, writing
    ``out``: aligned and in its window (BERM_ATOMIC_ADDR, a fault at ``pc`` else), then the operation."""
    s_type = "int32_t" if op.endswith(".w") else "int64_t"
    store = 0 if op.startswith("lr.") else 1
    return f"{{ BERM_ATOMIC_ADDR(a_, {s_type}, {addr}, {store}, {pc}); {_atomic_body(op, 'a_', src, out)} }}"


def _atomic_body(op: str, addr: str, src: str, out: str) -> str:
    """The C of the atomic ``op`` at guest address ``addr`` (aligned and in its window: checked before), with the
    source register's value ``src``, writing ``out``."""
    base, width = op.split(".")
    s_type, u_type = ("int32_t", "uint32_t") if width == "w" else ("int64_t", "uint64_t")
    if base == "lr":
        return f"{s_type} o; memcpy(&o, M + {addr}, sizeof o); {out} = (uint64_t)(int64_t)o;"
    if base == "sc":
        return f"{s_type} s = ({s_type}){src}; memcpy(M + {addr}, &s, sizeof s); BERM_MARK({addr}); {out} = 0;"
    new = _AMO[base].replace("(S)", f"({s_type})").replace("(U)", f"({u_type})")
    return (f"{s_type} s = ({s_type}){src}, o; memcpy(&o, M + {addr}, sizeof o); {s_type} n = {new}; "
            f"memcpy(M + {addr}, &n, sizeof n); BERM_MARK({addr}); {out} = (uint64_t)(int64_t)o;")
