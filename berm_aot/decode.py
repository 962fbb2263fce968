"""Decode RV64IMAC machine code into ``berm_aot.isa.Instruction``.

``decode(data, offset, addr)`` reads one instruction (2 or 4 bytes) from a buffer; ``decode_raw(raw, addr)``
decodes an instruction word already in hand. Compressed (RVC) encodings are expanded into the base operation they
stand for, with ``cname`` keeping the compressed mnemonic. F/D, Zicsr and privileged encodings decode to
``op == "unsupported"`` (``note`` names the instruction and its extension); every other encoding that is not
RV64IMAC decodes to ``op == "illegal"`` (``note`` says why).

The decoder is written from the tables of the RISC-V unprivileged specification (chapters "RV32I/RV64I",
"M", "A", "C" and the opcode map) and is meant to be audited against them: one table per major opcode, and the
scattered immediates of the compressed formats spelled out as ``(source hi bit, source lo bit, destination lo
bit)`` triples exactly as the specification draws them.

HINT encodings (``c.nop`` with an immediate, ``c.li``/``c.lui``/``c.mv``/``c.add``/``c.slli`` with rd = x0, the
shift-by-zero forms LLVM calls ``c.slli64``/``c.srli64``/``c.srai64``) are valid and decode to their base operation;
they have no effect because writes to x0 are discarded and a shift by zero changes nothing.

Field conventions beyond ``isa.py``: ``fence`` keeps its 12-bit ``fm|pred|succ`` field, unsigned, in ``imm``
(the disassembler prints it; engines ignore it). Register fields that an operation does not use are 0.

Everything but ``addr`` depends only on the raw bits, so decoded fields are cached per raw value.
"""

from __future__ import annotations

from dataclasses import fields as _dataclass_fields

from berm_aot.isa import Instruction

# A decoded instruction minus its address: (size, raw, op, rd, rs1, rs2, imm, aq, rl, cname, note).
Fields = tuple

_CACHE: dict[int, Fields] = {}
_CACHE_LIMIT = 1 << 20


def _bits(x: int, hi: int, lo: int) -> int:
    return (x >> lo) & ((1 << (hi - lo + 1)) - 1)


def _sext(value: int, width: int) -> int:
    sign = 1 << (width - 1)
    return (value & (sign - 1)) - (value & sign)


def _scatter(raw: int, pieces: tuple[tuple[int, int, int], ...]) -> int:
    """Gather an immediate whose bits ``raw[hi:lo]`` land at ``imm[lo_dst + (hi - lo) : lo_dst]``."""
    value = 0
    for hi, lo, dst in pieces:
        value |= _bits(raw, hi, lo) << dst
    return value


def _f(size: int, raw: int, op: str, rd: int = 0, rs1: int = 0, rs2: int = 0, imm: int = 0,
       aq: bool = False, rl: bool = False, cname: str | None = None, note: str | None = None) -> Fields:
    return (size, raw, op, rd, rs1, rs2, imm, aq, rl, cname, note)


def _illegal(size: int, raw: int, why: str) -> Fields:
    return _f(size, raw, "illegal", note=why)


def _unsupported(size: int, raw: int, what: str) -> Fields:
    return _f(size, raw, "unsupported", note=what)


# ---------------------------------------------------------------------------------------------------------------
# 32-bit encodings

_B_IMM = ((31, 31, 12), (30, 25, 5), (11, 8, 1), (7, 7, 11))
_J_IMM = ((31, 31, 20), (30, 21, 1), (20, 20, 11), (19, 12, 12))

_LOAD = {0: "lb", 1: "lh", 2: "lw", 3: "ld", 4: "lbu", 5: "lhu", 6: "lwu"}
_STORE = {0: "sb", 1: "sh", 2: "sw", 3: "sd"}
_BRANCH = {0: "beq", 1: "bne", 4: "blt", 5: "bge", 6: "bltu", 7: "bgeu"}
_OP_IMM = {0: "addi", 2: "slti", 3: "sltiu", 4: "xori", 6: "ori", 7: "andi"}
# Shift immediates: funct3 -> {bits [31:26] (RV64, 6-bit shamt) or [31:25] (w forms): op}.
_SHIFT_IMM = {1: {0x00: "slli"}, 5: {0x00: "srli", 0x10: "srai"}}
_SHIFT_IMM_W = {1: {0x00: "slliw"}, 5: {0x00: "srliw", 0x20: "sraiw"}}
_OP = {
    (0x00, 0): "add", (0x20, 0): "sub", (0x00, 1): "sll", (0x00, 2): "slt", (0x00, 3): "sltu",
    (0x00, 4): "xor", (0x00, 5): "srl", (0x20, 5): "sra", (0x00, 6): "or", (0x00, 7): "and",
    (0x01, 0): "mul", (0x01, 1): "mulh", (0x01, 2): "mulhsu", (0x01, 3): "mulhu",
    (0x01, 4): "div", (0x01, 5): "divu", (0x01, 6): "rem", (0x01, 7): "remu",
}
_OP_32 = {
    (0x00, 0): "addw", (0x20, 0): "subw", (0x00, 1): "sllw", (0x00, 5): "srlw", (0x20, 5): "sraw",
    (0x01, 0): "mulw", (0x01, 4): "divw", (0x01, 5): "divuw", (0x01, 6): "remw", (0x01, 7): "remuw",
}
# A extension: funct5 (bits [31:27]) -> mnemonic stem; width from funct3 (2: .w, 3: .d).
_AMO = {
    0x02: "lr", 0x03: "sc", 0x01: "amoswap", 0x00: "amoadd", 0x04: "amoxor", 0x0C: "amoand", 0x08: "amoor",
    0x10: "amomin", 0x14: "amomax", 0x18: "amominu", 0x1C: "amomaxu",
}
_AMO_WIDTH = {2: "w", 3: "d"}

_CSR = {1: "csrrw", 2: "csrrs", 3: "csrrc", 5: "csrrwi", 6: "csrrsi", 7: "csrrci"}
# SYSTEM with funct3 = 0: exact words, then funct7 (bits [31:25]) with rd = 0 for the fence-like forms. uret (the
# N extension's) is not among them: the N extension left the ratified specification, and its word is reserved.
_SYSTEM_WORDS = {
    0x00000073: "ecall", 0x00100073: "ebreak",
    0x10200073: "sret", 0x30200073: "mret", 0x7B200073: "dret", 0x10500073: "wfi",
    0x18000073: "sfence.w.inval", 0x18100073: "sfence.inval.ir",
}
_SYSTEM_FENCES = {0x09: "sfence.vma", 0x0B: "sinval.vma", 0x11: "hfence.vvma", 0x31: "hfence.gvma",
                  0x13: "hinval.vvma", 0x33: "hinval.gvma"}
# Hypervisor virtual-machine loads and stores (SYSTEM, funct3 = 4): (funct7, rs2 or None for stores) -> name. A store
# has rd = 0: any other rd is a reserved encoding (found by a review: it was "unsupported", refusing the image).
_HYPERVISOR = {
    (0x30, 0): "hlv.b", (0x30, 1): "hlv.bu", (0x32, 0): "hlv.h", (0x32, 1): "hlv.hu", (0x32, 3): "hlvx.hu",
    (0x34, 0): "hlv.w", (0x34, 1): "hlv.wu", (0x34, 3): "hlvx.wu", (0x36, 0): "hlv.d",
    (0x31, None): "hsv.b", (0x33, None): "hsv.h", (0x35, None): "hsv.w", (0x37, None): "hsv.d",
}

# Floating point. Format suffix from the 2-bit fmt field; extension letter from the format.
_FMT = {0: ("s", "F"), 1: ("d", "D"), 2: ("h", "Zfh"), 3: ("q", "Q")}
_FP_LOAD = {1: "flh", 2: "flw", 3: "fld", 4: "flq"}
_FP_STORE = {1: "fsh", 2: "fsw", 3: "fsd", 4: "fsq"}
_FP_WIDTH_EXT = {1: "Zfh", 2: "F", 3: "D", 4: "Q"}
_FP_FMA = {0x43: "fmadd", 0x47: "fmsub", 0x4B: "fnmsub", 0x4F: "fnmadd"}
_FP_INT = {0: "w", 1: "wu", 2: "l", 3: "lu"}  # integer operand of fcvt, selected by rs2
_FP_BY_RM = {  # OP-FP funct5 (bits [31:27]) whose variant is selected by the rm field (bits [14:12])
    0x04: {0: "fsgnj", 1: "fsgnjn", 2: "fsgnjx"},
    0x05: {0: "fmin", 1: "fmax"},
    0x14: {0: "fle", 1: "flt", 2: "feq"},
}
_FP_ARITH = {0x00: "fadd", 0x01: "fsub", 0x02: "fmul", 0x03: "fdiv", 0x0B: "fsqrt"}
_RESERVED_RM = (5, 6)  # rounding modes 0b101 and 0b110 (7 is "dynamic")


def _fp_name(raw: int) -> str | None:
    """The mnemonic of an OP-FP word (``fadd.d``, ``fcvt.l.s``, ``fmv.x.w``…), None when reserved."""
    funct5, fmt, rm, rs2 = _bits(raw, 31, 27), _bits(raw, 26, 25), _bits(raw, 14, 12), _bits(raw, 24, 20)
    suffix = _FMT[fmt][0]
    xsuffix = "w" if suffix == "s" else suffix  # fmv spells single precision "w"
    if funct5 in _FP_BY_RM:
        stem = _FP_BY_RM[funct5].get(rm)
        return f"{stem}.{suffix}" if stem else None
    if funct5 == 0x1C and rs2 == 0 and rm in (0, 1) and not (rm == 0 and fmt == 3):  # fmv.x.q: RV128 only
        return f"fmv.x.{xsuffix}" if rm == 0 else f"fclass.{suffix}"
    if funct5 == 0x1E and rs2 == 0 and rm == 0 and fmt != 3:
        return f"fmv.{xsuffix}.x"
    if rm in _RESERVED_RM:  # every other operation rounds: rm 5 and 6 are reserved
        return None
    if funct5 in _FP_ARITH and (funct5 != 0x0B or rs2 == 0):  # fsqrt has one source: rs2 is 0
        return f"{_FP_ARITH[funct5]}.{suffix}"
    if funct5 == 0x08 and rs2 in _FMT and rs2 != fmt:
        return f"fcvt.{suffix}.{_FMT[rs2][0]}"
    if funct5 == 0x18 and rs2 in _FP_INT:
        return f"fcvt.{_FP_INT[rs2]}.{suffix}"
    if funct5 == 0x1A and rs2 in _FP_INT:
        return f"fcvt.{suffix}.{_FP_INT[rs2]}"
    return None


def _fp_op(raw: int) -> Fields:
    name = _fp_name(raw)
    if name is None:
        return _illegal(4, raw, "reserved floating-point encoding")
    return _unsupported(4, raw, f"{name} ({_FMT[_bits(raw, 26, 25)][1]})")


def _system(raw: int) -> Fields:
    funct3 = _bits(raw, 14, 12)
    if funct3 in _CSR:
        return _unsupported(4, raw, f"{_CSR[funct3]} (Zicsr)")
    if funct3 == 0:
        word = _SYSTEM_WORDS.get(raw)
        if word in ("ecall", "ebreak"):
            return _f(4, raw, word)
        if word is not None:
            return _unsupported(4, raw, f"{word} (privileged)")
        fence = _SYSTEM_FENCES.get(_bits(raw, 31, 25))
        if fence is not None and _bits(raw, 11, 7) == 0:
            return _unsupported(4, raw, f"{fence} (privileged)")
    if funct3 == 4:
        funct7 = _bits(raw, 31, 25)
        name = _HYPERVISOR.get((funct7, None if funct7 & 1 else _bits(raw, 24, 20)))
        if name is not None and not (funct7 & 1 and _bits(raw, 11, 7)):
            return _unsupported(4, raw, f"{name} (privileged)")
    return _illegal(4, raw, "reserved SYSTEM encoding")


def _amo(raw: int) -> Fields:
    width = _AMO_WIDTH.get(_bits(raw, 14, 12))
    stem = _AMO.get(_bits(raw, 31, 27))
    rd, rs1, rs2 = _bits(raw, 11, 7), _bits(raw, 19, 15), _bits(raw, 24, 20)
    if width is None or stem is None or (stem == "lr" and rs2 != 0):
        return _illegal(4, raw, "reserved atomic encoding")
    return _f(4, raw, f"{stem}.{width}", rd, rs1, rs2, aq=bool(raw >> 26 & 1), rl=bool(raw >> 25 & 1))


def _decode32(raw: int) -> Fields:
    opcode = raw & 0x7F
    rd, funct3, rs1, rs2 = _bits(raw, 11, 7), _bits(raw, 14, 12), _bits(raw, 19, 15), _bits(raw, 24, 20)
    i_imm = _sext(raw >> 20, 12)
    if opcode == 0x37:
        return _f(4, raw, "lui", rd, imm=_sext(raw & 0xFFFFF000, 32))
    if opcode == 0x17:
        return _f(4, raw, "auipc", rd, imm=_sext(raw & 0xFFFFF000, 32))
    if opcode == 0x6F:
        return _f(4, raw, "jal", rd, imm=_sext(_scatter(raw, _J_IMM), 21))
    if opcode == 0x67 and funct3 == 0:
        return _f(4, raw, "jalr", rd, rs1, imm=i_imm)
    if opcode == 0x63 and funct3 in _BRANCH:
        return _f(4, raw, _BRANCH[funct3], rs1=rs1, rs2=rs2, imm=_sext(_scatter(raw, _B_IMM), 13))
    if opcode == 0x03 and funct3 in _LOAD:
        return _f(4, raw, _LOAD[funct3], rd, rs1, imm=i_imm)
    if opcode == 0x23 and funct3 in _STORE:
        imm = _sext(_bits(raw, 31, 25) << 5 | _bits(raw, 11, 7), 12)
        return _f(4, raw, _STORE[funct3], rs1=rs1, rs2=rs2, imm=imm)
    if opcode == 0x13:
        if funct3 in _OP_IMM:
            return _f(4, raw, _OP_IMM[funct3], rd, rs1, imm=i_imm)
        op = _SHIFT_IMM[funct3].get(_bits(raw, 31, 26))
        if op is not None:
            return _f(4, raw, op, rd, rs1, imm=_bits(raw, 25, 20))
    elif opcode == 0x1B:
        if funct3 == 0:
            return _f(4, raw, "addiw", rd, rs1, imm=i_imm)
        op = _SHIFT_IMM_W.get(funct3, {}).get(_bits(raw, 31, 25))
        if op is not None:
            return _f(4, raw, op, rd, rs1, imm=_bits(raw, 24, 20))
    elif opcode == 0x33 or opcode == 0x3B:
        op = (_OP if opcode == 0x33 else _OP_32).get((_bits(raw, 31, 25), funct3))
        if op is not None:
            return _f(4, raw, op, rd, rs1, rs2)
    elif opcode == 0x0F:
        if funct3 == 0:
            return _f(4, raw, "fence", imm=_bits(raw, 31, 20))
        if funct3 == 1:
            return _f(4, raw, "fence.i")
    elif opcode == 0x73:
        return _system(raw)
    elif opcode == 0x2F:
        return _amo(raw)
    elif opcode == 0x07 and funct3 in _FP_LOAD:
        return _unsupported(4, raw, f"{_FP_LOAD[funct3]} ({_FP_WIDTH_EXT[funct3]})")
    elif opcode == 0x27 and funct3 in _FP_STORE:
        return _unsupported(4, raw, f"{_FP_STORE[funct3]} ({_FP_WIDTH_EXT[funct3]})")
    elif opcode in _FP_FMA:
        if funct3 in _RESERVED_RM:
            return _illegal(4, raw, "reserved floating-point encoding")
        suffix, ext = _FMT[_bits(raw, 26, 25)]
        return _unsupported(4, raw, f"{_FP_FMA[opcode]}.{suffix} ({ext})")
    elif opcode == 0x53:
        return _fp_op(raw)
    if opcode & 0x1F == 0x1F:
        return _illegal(4, raw, "instruction longer than 32 bits")
    return _illegal(4, raw, f"not an RV64IMAC encoding (opcode {opcode:#04x})")


# ---------------------------------------------------------------------------------------------------------------
# 16-bit encodings (RVC, RV64 column of the specification's tables)

_C_ADDI4SPN = ((12, 11, 4), (10, 7, 6), (6, 6, 2), (5, 5, 3))
_C_LW = ((12, 10, 3), (6, 6, 2), (5, 5, 6))
_C_LD = ((12, 10, 3), (6, 5, 6))
_C_IMM6 = ((12, 12, 5), (6, 2, 0))
_C_ADDI16SP = ((12, 12, 9), (6, 6, 4), (5, 5, 6), (4, 3, 7), (2, 2, 5))
_C_LUI = ((12, 12, 17), (6, 2, 12))
_C_J = ((12, 12, 11), (11, 11, 4), (10, 9, 8), (8, 8, 10), (7, 7, 6), (6, 6, 7), (5, 3, 1), (2, 2, 5))
_C_B = ((12, 12, 8), (11, 10, 3), (6, 5, 6), (4, 3, 1), (2, 2, 5))
_C_LWSP = ((12, 12, 5), (6, 4, 2), (3, 2, 6))
_C_LDSP = ((12, 12, 5), (6, 5, 3), (4, 2, 6))
_C_SWSP = ((12, 9, 2), (8, 7, 6))
_C_SDSP = ((12, 10, 3), (9, 7, 6))

_C_ARITH = {(0, 0): ("c.sub", "sub"), (0, 1): ("c.xor", "xor"), (0, 2): ("c.or", "or"), (0, 3): ("c.and", "and"),
            (1, 0): ("c.subw", "subw"), (1, 1): ("c.addw", "addw")}


def _c(raw: int, cname: str, op: str, rd: int = 0, rs1: int = 0, rs2: int = 0, imm: int = 0) -> Fields:
    return _f(2, raw, op, rd, rs1, rs2, imm, cname=cname)


def _quadrant0(raw: int, funct3: int) -> Fields:
    rd_, rs1_ = 8 + _bits(raw, 4, 2), 8 + _bits(raw, 9, 7)  # the 3-bit register fields name x8..x15
    if funct3 == 0:
        if raw == 0:
            return _illegal(2, raw, "c.unimp")
        imm = _scatter(raw, _C_ADDI4SPN)
        if imm == 0:
            return _illegal(2, raw, "reserved c.addi4spn (immediate 0)")
        return _c(raw, "c.addi4spn", "addi", rd_, 2, imm=imm)
    if funct3 == 1:
        return _unsupported(2, raw, "c.fld (D)")
    if funct3 == 2:
        return _c(raw, "c.lw", "lw", rd_, rs1_, imm=_scatter(raw, _C_LW))
    if funct3 == 3:
        return _c(raw, "c.ld", "ld", rd_, rs1_, imm=_scatter(raw, _C_LD))
    if funct3 == 5:
        return _unsupported(2, raw, "c.fsd (D)")
    if funct3 == 6:
        return _c(raw, "c.sw", "sw", rs1=rs1_, rs2=rd_, imm=_scatter(raw, _C_LW))
    if funct3 == 7:
        return _c(raw, "c.sd", "sd", rs1=rs1_, rs2=rd_, imm=_scatter(raw, _C_LD))
    return _illegal(2, raw, "reserved compressed encoding")


def _quadrant1(raw: int, funct3: int) -> Fields:
    rd = _bits(raw, 11, 7)
    imm6 = _sext(_scatter(raw, _C_IMM6), 6)
    if funct3 == 0:
        return _c(raw, "c.nop" if rd == 0 else "c.addi", "addi", rd, rd, imm=imm6)
    if funct3 == 1:
        if rd == 0:
            return _illegal(2, raw, "reserved c.addiw (rd = x0)")
        return _c(raw, "c.addiw", "addiw", rd, rd, imm=imm6)
    if funct3 == 2:
        return _c(raw, "c.li", "addi", rd, 0, imm=imm6)
    if funct3 == 3:
        if rd == 2:
            imm = _sext(_scatter(raw, _C_ADDI16SP), 10)
            if imm == 0:
                return _illegal(2, raw, "reserved c.addi16sp (immediate 0)")
            return _c(raw, "c.addi16sp", "addi", 2, 2, imm=imm)
        imm = _sext(_scatter(raw, _C_LUI), 18)
        if imm == 0:
            return _illegal(2, raw, "reserved c.lui (immediate 0)")
        return _c(raw, "c.lui", "lui", rd, imm=imm)
    if funct3 == 4:
        rd_, rs2_ = 8 + _bits(raw, 9, 7), 8 + _bits(raw, 4, 2)
        funct2 = _bits(raw, 11, 10)
        if funct2 in (0, 1):
            op, shamt = ("srli", "srai")[funct2], _scatter(raw, _C_IMM6)
            return _c(raw, f"c.{op}" if shamt else f"c.{op}64", op, rd_, rd_, imm=shamt)
        if funct2 == 2:
            return _c(raw, "c.andi", "andi", rd_, rd_, imm=imm6)
        names = _C_ARITH.get((_bits(raw, 12, 12), _bits(raw, 6, 5)))
        if names is None:
            return _illegal(2, raw, "reserved compressed arithmetic encoding")
        return _c(raw, names[0], names[1], rd_, rd_, rs2_)
    if funct3 == 5:
        return _c(raw, "c.j", "jal", 0, imm=_sext(_scatter(raw, _C_J), 12))
    rs1_ = 8 + _bits(raw, 9, 7)
    offset = _sext(_scatter(raw, _C_B), 9)
    if funct3 == 6:
        return _c(raw, "c.beqz", "beq", rs1=rs1_, rs2=0, imm=offset)
    return _c(raw, "c.bnez", "bne", rs1=rs1_, rs2=0, imm=offset)


def _quadrant2(raw: int, funct3: int) -> Fields:
    rd, rs2 = _bits(raw, 11, 7), _bits(raw, 6, 2)
    if funct3 == 0:
        shamt = _scatter(raw, _C_IMM6)
        return _c(raw, "c.slli" if shamt else "c.slli64", "slli", rd, rd, imm=shamt)
    if funct3 == 1:
        return _unsupported(2, raw, "c.fldsp (D)")
    if funct3 == 2:
        if rd == 0:
            return _illegal(2, raw, "reserved c.lwsp (rd = x0)")
        return _c(raw, "c.lwsp", "lw", rd, 2, imm=_scatter(raw, _C_LWSP))
    if funct3 == 3:
        if rd == 0:
            return _illegal(2, raw, "reserved c.ldsp (rd = x0)")
        return _c(raw, "c.ldsp", "ld", rd, 2, imm=_scatter(raw, _C_LDSP))
    if funct3 == 4:
        if _bits(raw, 12, 12) == 0:
            if rs2 != 0:
                return _c(raw, "c.mv", "add", rd, 0, rs2)
            if rd == 0:
                return _illegal(2, raw, "reserved c.jr (rs1 = x0)")
            return _c(raw, "c.jr", "jalr", 0, rd)
        if rs2 != 0:
            return _c(raw, "c.add", "add", rd, rd, rs2)
        if rd == 0:
            return _c(raw, "c.ebreak", "ebreak")
        return _c(raw, "c.jalr", "jalr", 1, rd)
    if funct3 == 5:
        return _unsupported(2, raw, "c.fsdsp (D)")
    if funct3 == 6:
        return _c(raw, "c.swsp", "sw", rs1=2, rs2=rs2, imm=_scatter(raw, _C_SWSP))
    return _c(raw, "c.sdsp", "sd", rs1=2, rs2=rs2, imm=_scatter(raw, _C_SDSP))


_QUADRANTS = (_quadrant0, _quadrant1, _quadrant2)


def _decode16(raw: int) -> Fields:
    return _QUADRANTS[raw & 3](raw, raw >> 13)


# ---------------------------------------------------------------------------------------------------------------
# Public entry points


def _fields(raw: int) -> Fields:
    fields = _CACHE.get(raw)
    if fields is None:
        fields = _decode16(raw) if raw & 3 != 3 else _decode32(raw)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[raw] = fields
    return fields


class _Unfrozen:
    """An Instruction under construction.

    A frozen dataclass's __init__ sets each of its twelve fields through object.__setattr__, which is most of the
    cost of decoding a large text section. This class has the very same slots and no frozen __setattr__, so its
    fields are set with plain (fast) attribute stores; assigning ``__class__`` then turns the object into an
    ordinary, frozen Instruction (Python allows it because the two layouts are identical). Together about twice as
    fast as calling Instruction(...).
    """

    __slots__ = Instruction.__slots__

    def __init__(self, addr: int, f: Fields):
        self.addr = addr
        (self.size, self.raw, self.op, self.rd, self.rs1, self.rs2, self.imm, self.aq, self.rl, self.cname,
         self.note) = f


if tuple(f.name for f in _dataclass_fields(Instruction)) != (
        "addr", "size", "raw", "op", "rd", "rs1", "rs2", "imm", "aq", "rl", "cname", "note"):
    raise ImportError("berm_aot.isa.Instruction changed shape: update berm_aot.decode._Unfrozen and Fields")


def _make(addr: int, f: Fields) -> Instruction:
    insn = _Unfrozen(addr, f)
    insn.__class__ = Instruction
    return insn


def decode_raw(raw: int, addr: int) -> Instruction:
    """Decode the instruction word ``raw`` found at ``addr``.

    When the two low bits are not ``11`` the instruction is compressed and only ``raw & 0xFFFF`` is used;
    otherwise ``raw & 0xFFFFFFFF`` is the 32-bit word.
    """
    raw &= 0xFFFF if raw & 3 != 3 else 0xFFFFFFFF
    return _make(addr, _fields(raw))


def decode(data: bytes | memoryview, offset: int, addr: int) -> Instruction:
    """Decode the instruction at ``data[offset:]``, which the guest sees at ``addr``.

    Reads 2 bytes, or 4 when the first halfword says the instruction is 32 bits long. When ``data`` ends before
    the instruction does, the result is ``op == "illegal"`` with ``note == "truncated"`` (``size`` is the length
    the encoding announced, ``raw`` the bytes that were there).
    """
    if offset < 0:
        raise ValueError(f"negative offset {offset}")
    try:
        raw = data[offset] | data[offset + 1] << 8
        if raw & 3 == 3:
            raw |= data[offset + 2] << 16 | data[offset + 3] << 24
    except IndexError:
        return _truncated(data, offset, addr)
    fields = _CACHE.get(raw)
    return _make(addr, fields if fields is not None else _fields(raw))


def _truncated(data: bytes | memoryview, offset: int, addr: int) -> Instruction:
    raw = int.from_bytes(data[offset:offset + 3], "little")
    return _make(addr, _illegal(4 if raw & 3 == 3 else 2, raw, "truncated"))
