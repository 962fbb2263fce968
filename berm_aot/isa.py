"""The shape of one decoded instruction: the contract between the decoder, the disassembler, the reference
interpreter and the C emitter.

Compressed (RVC) instructions are *expanded* into the base instruction they stand for (``c.addi4spn`` is an
``addi``, ``c.jr`` a ``jalr x0, rs1, 0``, ``c.mv`` an ``add rd, x0, rs2``, ``c.li`` an ``addi rd, x0, imm``…), so
every engine implements only the base ``op`` set below; ``cname`` keeps the compressed mnemonic for display.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Every base operation an ``Instruction.op`` may name. Engines implement exactly these.
OPS: frozenset[str] = frozenset(
    """
    lui auipc jal jalr
    beq bne blt bge bltu bgeu
    lb lh lw ld lbu lhu lwu
    sb sh sw sd
    addi slti sltiu xori ori andi slli srli srai
    add sub sll slt sltu xor srl sra or and
    addiw slliw srliw sraiw addw subw sllw srlw sraw
    fence fence.i ecall ebreak
    mul mulh mulhsu mulhu div divu rem remu
    mulw divw divuw remw remuw
    lr.w sc.w amoswap.w amoadd.w amoxor.w amoand.w amoor.w amomin.w amomax.w amominu.w amomaxu.w
    lr.d sc.d amoswap.d amoadd.d amoxor.d amoand.d amoor.d amomin.d amomax.d amominu.d amomaxu.d
    illegal unsupported
    """.split()
)
#: The conditional branches.
BRANCHES: frozenset[str] = frozenset({"beq", "bne", "blt", "bge", "bltu", "bgeu"})
#: Operations after which execution never continues at the next instruction, whatever their operands.
NO_FALL_THROUGH: frozenset[str] = frozenset({"ebreak", "illegal", "unsupported"})


@dataclass(frozen=True, slots=True)
class Instruction:
    """One decoded instruction at ``addr``.

    ``imm`` is a signed Python int with its final meaning: the byte offset for branches and ``jal``; the shifted,
    sign-extended value for ``lui``/``auipc`` (``imm << 12``); the shift amount for shift-immediates; the
    offset for loads, stores and ``jalr``. Unused register fields are 0.

    ``op == "illegal"``: the bytes are not a valid RV64IMAC encoding (including ``c.unimp`` = 0x0000).
    ``op == "unsupported"``: a valid encoding of an extension this host refuses (F/D, Zicsr, privileged);
    ``note`` says which (e.g. ``"csrrw (Zicsr)"``).
    """

    addr: int
    size: int  # 2 or 4
    raw: int
    op: str
    rd: int = 0
    rs1: int = 0
    rs2: int = 0
    imm: int = 0
    aq: bool = False
    rl: bool = False
    cname: str | None = None  # the compressed mnemonic ("c.addi"), None for a 32-bit encoding
    note: str | None = None  # why an instruction is illegal or unsupported

    @property
    def next_pc(self) -> int:
        return self.addr + self.size

    @property
    def falls_through(self) -> bool:
        """Execution may continue at ``next_pc``: at once, or (a call) when the callee returns."""
        return self.op not in NO_FALL_THROUGH and not (self.op in ("jal", "jalr") and self.rd == 0)


def checks_sp(insn: Instruction) -> bool:
    """Whether ``insn``'s write to sp is checked against the stack's lowest address (docs/SEMANTICS.md): every write
    except ``addi sp, sp, imm`` (``c.addi16sp`` too), which moves sp by at most 2 KiB, less than the guard page
    below the stack, so the frames of ordinary functions pay nothing."""
    return insn.rd == 2 and not (insn.op == "addi" and insn.rs1 == 2)
