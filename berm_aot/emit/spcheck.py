"""Where a translated function must re-check its sp (berm_rt.h, BERM_SP_SYNC / BERM_SP_CHECK).

A function with sp-relative accesses keeps one flag, ``spok_``: "every sp-relative access of this function lies in
the stack window at the current sp". The flag must be right wherever such an access runs, so every write of sp
(and the function's entry) is a point where it may be recomputed. Most of those points are dead — the entry is
followed by ``addi sp, sp, -N``, an epilogue's ``addi sp, sp, N`` by ``ret`` — and a point followed only by loads
needs the check but not the dirty-page marks. A backward dataflow over the function's control flow says, for each
point, what the code after it needs before the next point: nothing, the check, or the check and the marks.
"""

from __future__ import annotations

from enum import IntEnum

from berm_aot.analysis import BRANCHES, FunctionInfo, writes
from berm_aot.isa import Instruction

from .insn import LOAD_TYPES, sp_relative

MASK = (1 << 64) - 1


class Need(IntEnum):
    NONE = 0  # no sp-relative access before sp changes again
    CHECK = 1  # sp-relative loads only
    MARK = 2  # an sp-relative store: check, and mark the pages


def _use(insn: Instruction) -> Need:
    if not sp_relative(insn):
        return Need.NONE
    return Need.CHECK if insn.op in LOAD_TYPES else Need.MARK


def _successors(insn: Instruction, f: FunctionInfo, here: dict[int, Instruction]) -> list[int]:
    """Addresses inside the function that control may reach right after ``insn`` (a call continues at its link
    address; an indirect jump at any legal local target)."""
    op = insn.op
    if op in ("ebreak", "illegal", "unsupported"):
        return []
    if op == "jal" and insn.rd == 0:
        out = [(insn.addr + insn.imm) & MASK]
    elif op == "jalr" and insn.rd == 0:
        out = list(f.local_targets)
        if insn.addr in f.static_targets:
            out.append(f.static_targets[insn.addr])
    else:
        out = [insn.next_pc]
        if op in BRANCHES:
            out.append((insn.addr + insn.imm) & MASK)
    return [a for a in out if a in here]


def sp_needs(f: FunctionInfo) -> tuple[Need, dict[int, Need]]:
    """``(at entry, after each instruction)``: what the code that follows needs of ``spok_``. A call passes its
    successor's need through (whether or not the callee changes sp, the reload after it is a point of its own)."""
    here = {insn.addr: insn for insn in f.insns}
    succ = {insn.addr: _successors(insn, f, here) for insn in f.insns}
    before = {a: Need.NONE for a in here}
    after = {a: Need.NONE for a in here}
    changed = True
    while changed:
        changed = False
        for insn in reversed(f.insns):
            a = insn.addr
            out = max((before[s] for s in succ[a]), default=Need.NONE)
            kills = 2 in writes(insn) and insn.op not in ("jal", "jalr")
            new = max(_use(insn), Need.NONE if kills else out)
            if out != after[a] or new != before[a]:
                after[a], before[a] = out, new
                changed = True
    entry = before.get(f.start, Need.NONE)
    return entry, after
