"""A small RV64IMAC assembler for tests: instruction encoders (32-bit and compressed) and a two-pass layout with
labels, written from the RISC-V unprivileged specification's encoding tables — independent of ``berm_aot.decode``,
so that tests built with it check the decoder too.

``Op(name, rd=…, rs1=…, rs2=…, imm=…)`` is one instruction: ``name`` is a base mnemonic (``"add"``, ``"amoadd.w"``),
a compressed one (``"c.add"``) or raw bits (``".half"``/``".word"`` with the bits in ``imm``). Branches and jumps may name a label (``target=``) instead of an offset;
``la(rd, label)`` is the ``auipc``/``addi`` pair that materialises an address (recorded as a PCREL_HI20 site).
``assemble(items, base, extern)`` lays a list of ``Op`` and ``Label`` out at ``base`` and returns the bytes, the label
addresses (``extern`` ones included) and the PCREL_HI20 sites.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace

MASK64 = (1 << 64) - 1

# --- 32-bit encodings -------------------------------------------------------------------------------------------

_BRANCH = {"beq": 0, "bne": 1, "blt": 4, "bge": 5, "bltu": 6, "bgeu": 7}
_LOAD = {"lb": 0, "lh": 1, "lw": 2, "ld": 3, "lbu": 4, "lhu": 5, "lwu": 6}
_STORE = {"sb": 0, "sh": 1, "sw": 2, "sd": 3}
_OP_IMM = {"addi": 0, "slti": 2, "sltiu": 3, "xori": 4, "ori": 6, "andi": 7}
_SHIFT_IMM = {"slli": (1, 0), "srli": (5, 0), "srai": (5, 0x10)}  # funct3, funct6
_SHIFT_IMM_W = {"slliw": (1, 0), "srliw": (5, 0), "sraiw": (5, 0x20)}  # funct3, funct7
_OP = {  # funct3, funct7
    "add": (0, 0), "sub": (0, 0x20), "sll": (1, 0), "slt": (2, 0), "sltu": (3, 0), "xor": (4, 0), "srl": (5, 0),
    "sra": (5, 0x20), "or": (6, 0), "and": (7, 0),
    "mul": (0, 1), "mulh": (1, 1), "mulhsu": (2, 1), "mulhu": (3, 1), "div": (4, 1), "divu": (5, 1),
    "rem": (6, 1), "remu": (7, 1),
}
_OP_32 = {
    "addw": (0, 0), "subw": (0, 0x20), "sllw": (1, 0), "srlw": (5, 0), "sraw": (5, 0x20),
    "mulw": (0, 1), "divw": (4, 1), "divuw": (5, 1), "remw": (6, 1), "remuw": (7, 1),
}
_AMO = {"lr": 0x02, "sc": 0x03, "amoswap": 0x01, "amoadd": 0x00, "amoxor": 0x04, "amoand": 0x0C, "amoor": 0x08,
        "amomin": 0x10, "amomax": 0x14, "amominu": 0x18, "amomaxu": 0x1C}
_FIXED = {"ecall": 0x00000073, "ebreak": 0x00100073, "fence": 0x0FF0000F, "fence.i": 0x0000100F}

BRANCH_OPS = tuple(_BRANCH)
LOAD_OPS = tuple(_LOAD)
STORE_OPS = tuple(_STORE)
ALU_RR_OPS = tuple(_OP) + tuple(_OP_32)
ALU_RI_OPS = tuple(_OP_IMM) + ("addiw",)
SHIFT_IMM_OPS = tuple(_SHIFT_IMM) + tuple(_SHIFT_IMM_W)
AMO_OPS = tuple(f"{b}.{w}" for b in _AMO for w in "wd")


def _check(value: int, lo: int, hi: int, what: str) -> int:
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} outside [{lo}, {hi}]")
    return value


def _r(opcode: int, f3: int, f7: int, rd: int, rs1: int, rs2: int) -> int:
    return f7 << 25 | rs2 << 20 | rs1 << 15 | f3 << 12 | rd << 7 | opcode


def _i(opcode: int, f3: int, rd: int, rs1: int, imm: int) -> int:
    return (_check(imm, -2048, 2047, "I-immediate") & 0xFFF) << 20 | rs1 << 15 | f3 << 12 | rd << 7 | opcode


def _s(opcode: int, f3: int, rs1: int, rs2: int, imm: int) -> int:
    imm = _check(imm, -2048, 2047, "S-immediate") & 0xFFF
    return (imm >> 5) << 25 | rs2 << 20 | rs1 << 15 | f3 << 12 | (imm & 0x1F) << 7 | opcode


def _b(f3: int, rs1: int, rs2: int, off: int) -> int:
    _check(off, -4096, 4094, "branch offset")
    o = off & 0x1FFF
    return ((o >> 12) & 1) << 31 | ((o >> 5) & 0x3F) << 25 | rs2 << 20 | rs1 << 15 | f3 << 12 | \
        ((o >> 1) & 0xF) << 8 | ((o >> 11) & 1) << 7 | 0x63


def _j(rd: int, off: int) -> int:
    _check(off, -(1 << 20), (1 << 20) - 2, "jal offset")
    o = off & 0x1FFFFF
    return ((o >> 20) & 1) << 31 | ((o >> 1) & 0x3FF) << 21 | ((o >> 11) & 1) << 20 | ((o >> 12) & 0xFF) << 12 | \
        rd << 7 | 0x6F


def encode32(op: "Op") -> int:
    n, rd, rs1, rs2, imm = op.name, op.rd, op.rs1, op.rs2, op.imm
    if n in _FIXED:
        return _FIXED[n]
    if n == "lui":
        return (imm >> 12 & 0xFFFFF) << 12 | rd << 7 | 0x37
    if n == "auipc":
        return (imm >> 12 & 0xFFFFF) << 12 | rd << 7 | 0x17
    if n == "jal":
        return _j(rd, imm)
    if n == "jalr":
        return _i(0x67, 0, rd, rs1, imm)
    if n in _BRANCH:
        return _b(_BRANCH[n], rs1, rs2, imm)
    if n in _LOAD:
        return _i(0x03, _LOAD[n], rd, rs1, imm)
    if n in _STORE:
        return _s(0x23, _STORE[n], rs1, rs2, imm)
    if n in _OP_IMM:
        return _i(0x13, _OP_IMM[n], rd, rs1, imm)
    if n == "addiw":
        return _i(0x1B, 0, rd, rs1, imm)
    if n in _SHIFT_IMM:
        f3, f6 = _SHIFT_IMM[n]
        return f6 << 26 | _check(imm, 0, 63, "shamt") << 20 | rs1 << 15 | f3 << 12 | rd << 7 | 0x13
    if n in _SHIFT_IMM_W:
        f3, f7 = _SHIFT_IMM_W[n]
        return f7 << 25 | _check(imm, 0, 31, "shamt") << 20 | rs1 << 15 | f3 << 12 | rd << 7 | 0x1B
    if n in _OP:
        return _r(0x33, *_OP[n], rd, rs1, rs2)
    if n in _OP_32:
        return _r(0x3B, *_OP_32[n], rd, rs1, rs2)
    base, _, width = n.partition(".")
    if base in _AMO and width in ("w", "d"):
        return _AMO[base] << 27 | op.aq << 26 | op.rl << 25 | rs2 << 20 | rs1 << 15 | \
            (2 if width == "w" else 3) << 12 | rd << 7 | 0x2F
    raise ValueError(f"no 32-bit encoding for {n!r}")


# --- compressed encodings ----------------------------------------------------------------------------------------

def _place(imm: int, pieces: tuple[tuple[int, int, int], ...]) -> int:
    """Scatter immediate bits: each ``(inst_hi, imm_hi, imm_lo)`` puts ``imm[imm_hi:imm_lo]`` at ``inst_hi`` down."""
    out = 0
    for inst_hi, hi, lo in pieces:
        width = hi - lo + 1
        out |= ((imm >> lo) & ((1 << width) - 1)) << (inst_hi - width + 1)
    return out


def _creg(r: int) -> int:
    """The 3-bit field of a compressed register operand (x8..x15)."""
    return _check(r, 8, 15, "compressed register") - 8


def _aligned(imm: int, lo: int, hi: int, align: int, what: str) -> int:
    _check(imm, lo, hi, what)
    if imm % align:
        raise ValueError(f"{what} {imm} is not a multiple of {align}")
    return imm


_CIMM6 = ((12, 5, 5), (6, 4, 0))
_CJ = ((12, 11, 11), (11, 4, 4), (10, 9, 8), (8, 10, 10), (7, 6, 6), (6, 7, 7), (5, 3, 1), (2, 5, 5))
_CB = ((12, 8, 8), (11, 4, 3), (6, 7, 6), (4, 2, 1), (2, 5, 5))
_CMEM_W = ((12, 5, 3), (6, 2, 2), (5, 6, 6))
_CMEM_D = ((12, 5, 3), (6, 7, 6))
_CA = {"c.sub": (0, 0), "c.xor": (0, 1), "c.or": (0, 2), "c.and": (0, 3), "c.subw": (1, 0), "c.addw": (1, 1)}

COMPRESSED_OPS = (
    "c.addi4spn", "c.lw", "c.ld", "c.sw", "c.sd", "c.nop", "c.addi", "c.addiw", "c.li", "c.addi16sp", "c.lui",
    "c.srli", "c.srai", "c.andi", *_CA, "c.j", "c.beqz", "c.bnez", "c.slli", "c.lwsp", "c.ldsp", "c.jr", "c.mv",
    "c.ebreak", "c.jalr", "c.add", "c.swsp", "c.sdsp",
)


def encode16(op: "Op") -> int:
    n, rd, rs1, rs2, imm = op.name, op.rd, op.rs1, op.rs2, op.imm
    if n == "c.addi4spn":
        imm = _aligned(imm, 4, 1020, 4, "c.addi4spn immediate")
        return _place(imm, ((12, 5, 4), (10, 9, 6), (6, 2, 2), (5, 3, 3))) | _creg(rd) << 2
    if n in ("c.lw", "c.sw", "c.ld", "c.sd"):
        wide = n in ("c.ld", "c.sd")
        imm = _aligned(imm, 0, 248 if wide else 124, 8 if wide else 4, f"{n} offset")
        f3 = {"c.lw": 2, "c.ld": 3, "c.sw": 6, "c.sd": 7}[n]
        reg = rd if n in ("c.lw", "c.ld") else rs2
        return f3 << 13 | _place(imm, _CMEM_D if wide else _CMEM_W) | _creg(rs1) << 7 | _creg(reg) << 2
    if n in ("c.nop", "c.addi", "c.addiw", "c.li"):
        f3 = {"c.nop": 0, "c.addi": 0, "c.addiw": 1, "c.li": 2}[n]
        return f3 << 13 | _place(_check(imm, -32, 31, f"{n} immediate"), _CIMM6) | rd << 7 | 1
    if n == "c.addi16sp":
        imm = _aligned(imm, -512, 496, 16, "c.addi16sp immediate")
        return 3 << 13 | _place(imm, ((12, 9, 9), (6, 4, 4), (5, 6, 6), (4, 8, 7), (2, 5, 5))) | 2 << 7 | 1
    if n == "c.lui":  # imm is the final value (imm << 12 already applied), like Instruction.imm
        imm = _aligned(imm, -(1 << 17), (1 << 17) - 4096, 4096, "c.lui value")
        return 3 << 13 | _place(imm >> 12, _CIMM6) | rd << 7 | 1
    if n in ("c.srli", "c.srai", "c.andi"):
        f2 = {"c.srli": 0, "c.srai": 1, "c.andi": 2}[n]
        lo, hi = (-32, 31) if n == "c.andi" else (1, 63)
        return 4 << 13 | _place(_check(imm, lo, hi, f"{n} immediate"), _CIMM6) | f2 << 10 | _creg(rd) << 7 | 1
    if n in _CA:
        hi_bit, f2 = _CA[n]
        return 4 << 13 | hi_bit << 12 | 3 << 10 | _creg(rd) << 7 | f2 << 5 | _creg(rs2) << 2 | 1
    if n == "c.j":
        return 5 << 13 | _place(_aligned(imm, -2048, 2046, 2, "c.j offset"), _CJ) | 1
    if n in ("c.beqz", "c.bnez"):
        imm = _aligned(imm, -256, 254, 2, f"{n} offset")
        return (6 if n == "c.beqz" else 7) << 13 | _place(imm, _CB) | _creg(rs1) << 7 | 1
    if n == "c.slli":
        return _place(_check(imm, 1, 63, "c.slli shamt"), _CIMM6) | rd << 7 | 2
    if n == "c.lwsp":
        return 2 << 13 | _place(_aligned(imm, 0, 252, 4, "c.lwsp offset"), ((12, 5, 5), (6, 4, 2), (3, 7, 6))) | \
            rd << 7 | 2
    if n == "c.ldsp":
        return 3 << 13 | _place(_aligned(imm, 0, 504, 8, "c.ldsp offset"), ((12, 5, 5), (6, 4, 3), (4, 8, 6))) | \
            rd << 7 | 2
    if n == "c.jr":
        return 4 << 13 | rs1 << 7 | 2
    if n == "c.mv":
        return 4 << 13 | rd << 7 | rs2 << 2 | 2
    if n == "c.ebreak":
        return 4 << 13 | 1 << 12 | 2
    if n == "c.jalr":
        return 4 << 13 | 1 << 12 | rs1 << 7 | 2
    if n == "c.add":
        return 4 << 13 | 1 << 12 | rd << 7 | rs2 << 2 | 2
    if n == "c.swsp":
        return 6 << 13 | _place(_aligned(imm, 0, 252, 4, "c.swsp offset"), ((12, 5, 2), (8, 7, 6))) | rs2 << 2 | 2
    if n == "c.sdsp":
        return 7 << 13 | _place(_aligned(imm, 0, 504, 8, "c.sdsp offset"), ((12, 5, 3), (9, 8, 6))) | rs2 << 2 | 2
    raise ValueError(f"no compressed encoding for {n!r}")


# --- instructions, labels, layout -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One instruction. ``target`` names a label: branches/jumps get ``imm = label - pc``; ``pcrel`` ``"hi"``/``"lo"``
    turn an ``auipc``/``addi`` into the two halves of ``label - (address of the auipc)``."""

    name: str
    rd: int = 0
    rs1: int = 0
    rs2: int = 0
    imm: int = 0
    aq: bool = False
    rl: bool = False
    target: str | None = None
    pcrel: str | None = None

    @property
    def size(self) -> int:
        return 2 if self.name.startswith("c.") or self.name == ".half" else 4


@dataclass(frozen=True)
class Label:
    name: str


def encode(op: Op) -> bytes:
    """The little-endian bytes of one instruction (its immediates already final). ``Op(".half", imm=…)`` and
    ``Op(".word", imm=…)`` emit raw bits (for illegal or unsupported encodings)."""
    if op.name in (".half", ".word"):
        return op.imm.to_bytes(op.size, "little")
    if op.size == 2:
        return struct.pack("<H", encode16(op))
    return struct.pack("<I", encode32(op))


def la(rd: int, label: str) -> list[Op]:
    """``auipc rd, %pcrel_hi(label); addi rd, rd, %pcrel_lo``: the address of ``label`` in ``rd``."""
    return [Op("auipc", rd=rd, target=label, pcrel="hi"), Op("addi", rd=rd, rs1=rd, target=label, pcrel="lo")]


def li(rd: int, value: int) -> list[Op]:
    """Instructions that put the 64-bit ``value`` in ``rd`` (the usual lui/addiw/slli/addi expansion)."""
    v = value & MASK64
    v = v - (1 << 64) if v >> 63 else v
    if -2048 <= v < 2048:
        return [Op("addi", rd=rd, imm=v)]
    if -(1 << 31) <= v < (1 << 31):
        hi = (v + 0x800) >> 12
        lo = v - (hi << 12)
        ops = [Op("lui", rd=rd, imm=(hi & 0xFFFFF) << 12)]
        return ops + ([Op("addiw", rd=rd, rs1=rd, imm=lo)] if lo else [])
    lo = ((v & 0xFFF) ^ 0x800) - 0x800
    hi = (v - lo) >> 12
    shift = 12
    while not hi & 1:
        hi >>= 1
        shift += 1
    ops = li(rd, hi) + [Op("slli", rd=rd, rs1=rd, imm=shift)]
    return ops + ([Op("addi", rd=rd, rs1=rd, imm=lo)] if lo else [])


@dataclass(frozen=True)
class Assembled:
    code: bytes
    labels: dict[str, int]
    pcrel_sites: tuple[tuple[int, str], ...]  # (address of an auipc, label it names): PCREL_HI20 relocations


def assemble(items: list[Op | Label], base: int, extern: Mapping[str, int] | None = None) -> Assembled:
    """Lay ``items`` out from ``base``, resolve label references, encode. ``extern``: addresses of labels defined
    outside the code (a jump table in read-only data), which ``la`` may name."""
    labels: dict[str, int] = dict(extern or {})
    pc = base
    for item in items:
        if isinstance(item, Label):
            if item.name in labels:
                raise ValueError(f"label {item.name!r} defined twice")
            labels[item.name] = pc
        else:
            pc += item.size
    out = bytearray()
    sites = []
    pc = base
    for item in items:
        if isinstance(item, Label):
            continue
        op = item
        if op.target is not None:
            delta = labels[op.target] - pc
            if op.pcrel == "hi":
                sites.append((pc, op.target))
                op = replace(op, imm=((delta + 0x800) >> 12) << 12)
            elif op.pcrel == "lo":
                delta += 4  # relative to the auipc just before
                op = replace(op, imm=delta - (((delta + 0x800) >> 12) << 12))
            else:
                op = replace(op, imm=delta)
        out += encode(op)
        pc += op.size
    return Assembled(bytes(out), labels, tuple(sites))
