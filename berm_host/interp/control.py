"""Control transfer (docs/SEMANTICS.md "Entry and return"): calls push a shadow-stack frame, a ``jalr`` to the
top frame's return address pops it, every other ``jalr`` goes through the program's CFI check. Also the
instructions that only trap or call the host: ``ecall``, ``ebreak``, illegal and unsupported encodings.
"""

from __future__ import annotations

from berm_aot.isa import Instruction
from berm_aot.program import Program
from berm_host.layout import DEPTH_DETAIL, MAX_CALL_DEPTH, SP_BELOW_STACK
from berm_host.traps import TrapKind

from .hostcalls import host_call
from .semantics import M
from .trap import GuestTrap, Returned


def _push(frames: list[int], link: int) -> None:
    """Push a call frame, or the stack-exhausted trap when the shadow stack is full (before any effect)."""
    if len(frames) >= MAX_CALL_DEPTH:
        raise GuestTrap(TrapKind.STACK_EXHAUSTED, 0, DEPTH_DETAIL)
    frames.append(link)


def sp_checked(h, insn: Instruction, stack_lo: int):
    """``h``, the handler of an instruction that writes sp, trapping (stack exhausted, the value sp would have had as
    the address) when that value is below ``stack_lo``: a frame larger than the room left would skip the guard page
    and write the heap. sp keeps its old value; the instruction's other effects (an AMO's store) stand, except that
    a jal/jalr, whose link it would be, traps before it transfers (SEMANTICS.md)."""
    if insn.op in ("jal", "jalr"):
        link = insn.next_pc
        if link >= stack_lo:
            return h

        def before(x, m, st):
            raise GuestTrap(TrapKind.STACK_EXHAUSTED, link, SP_BELOW_STACK)
        return before

    def after(x, m, st):
        old = x[2]
        nxt = h(x, m, st)
        if x[2] < stack_lo:
            new, x[2] = x[2], old
            raise GuestTrap(TrapKind.STACK_EXHAUSTED, new, SP_BELOW_STACK)
        return nxt
    return after


def jal(insn: Instruction):
    rd, link, target = insn.rd, insn.next_pc, (insn.addr + insn.imm) & M
    if rd == 0:
        def h(x, m, st):
            return target
        return h

    def h(x, m, st):
        _push(st.frames, link)
        x[rd] = link
        return target
    return h


def jalr(insn: Instruction, program: Program):
    rd, rs1, imm, link, pc = insn.rd, insn.rs1, insn.imm, insn.next_pc, insn.addr
    check = program.check_indirect
    is_call = rd != 0

    def h(x, m, st):
        target = (x[rs1] + imm) & M & ~1
        frames = st.frames
        if not is_call and target == frames[-1]:
            frames.pop()
            if not frames:
                raise Returned
            return target
        if check(pc, target, is_call) is None:
            raise GuestTrap(TrapKind.BAD_INDIRECT_TARGET, target)
        if is_call:
            _push(frames, link)
            x[rd] = link
        return target
    return h


def ecall(insn: Instruction):
    nxt = insn.next_pc

    def h(x, m, st):
        x[10] = host_call(st, x[17], x[10], x[11]) & M
        return nxt
    return h


def trap_only(insn: Instruction):
    """``ebreak`` (breakpoint), an illegal encoding, or an extension this host refuses (illegal instruction)."""
    if insn.op == "ebreak":
        kind, detail = TrapKind.BREAKPOINT, ""
    else:
        kind, detail = TrapKind.ILLEGAL_INSTRUCTION, insn.note or ""

    def h(x, m, st):
        raise GuestTrap(kind, 0, detail)
    return h
