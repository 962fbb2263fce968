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

from berm_aot.analysis import FunctionInfo, writes
from berm_aot.isa import Instruction

from .dataflow import successors
from .insn import LOAD_TYPES, sp_relative


class Need(IntEnum):
    NONE = 0  # no sp-relative access before sp changes again
    CHECK = 1  # sp-relative loads only
    MARK = 2  # an sp-relative store: check, and mark the pages


def _use(insn: Instruction) -> Need:
    if not sp_relative(insn):
        return Need.NONE
    return Need.CHECK if insn.op in LOAD_TYPES else Need.MARK


def _successors(insn: Instruction, f: FunctionInfo) -> list[int]:
    """Where control may go after ``insn`` without passing another point where sp is re-checked: a dynamic jump
    reaches any legal target inside the function (through its dispatch block)."""
    if insn.op == "jalr" and insn.rd == 0 and insn.addr not in f.static_targets:
        return list(f.local_targets)
    return successors(insn, f.static_targets)


def sp_needs(f: FunctionInfo) -> tuple[Need, dict[int, Need]]:
    """``(at entry, after each instruction)``: what the code that follows needs of ``spok_``. A call passes its
    successor's need through (whether or not the callee changes sp, the reload after it is a point of its own)."""
    here = {insn.addr: insn for insn in f.insns}
    succ = {insn.addr: [a for a in _successors(insn, f) if a in here] for insn in f.insns}
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
