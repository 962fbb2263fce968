"""Constant registers, so an ``ecall`` learns its number at translation time: a forward dataflow over each
function's control flow (compilers hoist ``li a7, N`` out of loops), meeting at joins by keeping only the
registers every predecessor agrees on; a call forgets everything.

Tracks ``lui``/``auipc``/``addi``/``addiw``/``ori``/``xori``/``andi``/``slli``/``add`` chains, and ``ld``/``lw``/
``lwu`` from a read-only segment at a constant address (rustc loads call numbers from ``.rodata``; read-only
segments never change, since stores to them trap).
"""

from __future__ import annotations

from collections.abc import Mapping

from berm_aot.image import ElfImage
from berm_aot.isa import Instruction

from .dataflow import forward

MASK = (1 << 64) - 1


def _sx32(v: int) -> int:
    v &= 0xFFFFFFFF
    return (v ^ 0x80000000) - 0x80000000 & MASK


class Constants:
    """Known register values at the current point; ``enter(state)`` at every block start."""

    def __init__(self, image: ElfImage):
        self._image = image
        self._known: dict[int, int] = {}

    def enter(self, state: dict[int, int]) -> None:
        self._known = dict(state)

    def state(self) -> dict[int, int]:
        return dict(self._known)

    def get(self, r: int) -> int | None:
        return 0 if r == 0 else self._known.get(r)

    def step(self, insn: Instruction) -> None:
        """Account for ``insn`` having executed."""
        op, rd = insn.op, insn.rd
        value = self._value(insn)
        if op in ("ecall",):
            self._known.pop(10, None)
        elif op in ("jal", "jalr"):
            if rd:
                self._known.clear()  # a call: the callee may change anything (a jump changes no register)
        elif rd:
            if value is None:
                self._known.pop(rd, None)
            else:
                self._known[rd] = value & MASK

    def _value(self, insn: Instruction) -> int | None:
        op, imm = insn.op, insn.imm
        a = self.get(insn.rs1)
        if op == "lui":
            return imm
        if op == "auipc":
            return insn.addr + imm
        if a is None:
            return None
        if op == "addi":
            return a + imm
        if op == "addiw":
            return _sx32(a + imm)
        if op == "ori":
            return a | (imm & MASK)
        if op == "xori":
            return a ^ (imm & MASK)
        if op == "andi":
            return a & (imm & MASK)
        if op == "slli":
            return a << (imm & 63)
        if op == "add":
            b = self.get(insn.rs2)
            return None if b is None else a + b
        if op in ("ld", "lw", "lwu"):
            return self._rodata(op, (a + imm) & MASK)
        return None

    def _rodata(self, op: str, addr: int) -> int | None:
        n = 8 if op == "ld" else 4
        for seg in self._image.segments:
            if not seg.writable and seg.vaddr <= addr and addr + n <= seg.vaddr + len(seg.data):
                raw = int.from_bytes(seg.data[addr - seg.vaddr:addr - seg.vaddr + n], "little")
                return _sx32(raw) if op == "lw" else raw
        return None


def block_entry_constants(image: ElfImage, insns: list[Instruction], start: int,
                          local_targets: list[int]) -> dict[int, dict[int, int]]:
    """The registers known constant at the start of each instruction of one function (``insns`` in address
    order), by a forward dataflow to a fixpoint; nothing is known at the start and at each local target."""
    return constants_from(image, insns, {root: {} for root in (start, *local_targets)})


def constants_from(image: ElfImage, insns: list[Instruction], seeds: Mapping[int, dict[int, int]]
                   ) -> dict[int, dict[int, int]]:
    """The same, from the instructions ``seeds`` names, each entered with the constants it maps them to."""
    consts = Constants(image)

    def transfer(insn: Instruction, state: dict[int, int]) -> dict[int, int]:
        consts.enter(state)
        consts.step(insn)
        return consts.state()

    return forward(insns, seeds, {}, transfer, meet_constants)


def meet_constants(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    """What two paths agree on."""
    return {r: v for r, v in a.items() if b.get(r) == v}
