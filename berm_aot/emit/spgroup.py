"""Groups of sp-relative loads and stores checked together (berm_rt.h, BERM_SP_GROUP): a prologue's register saves,
an epilogue's restores, a run of spills. One range check, and for stores one compare with the stack's low-water
mark (ctx->stack_low), replace one check (and, for stores, one dirty-page mark) per access: on recursive ``fib``
the per-access checks were half the run time, and marking the pages of each frame's saves a tenth of what remained.

A group is a run of loads and stores through sp in one basic block — no label in between (no other way in), no
branch, call or other transfer (every member runs once the first does) — with sp unchanged between them (a member
may load sp: it ends the group). Groups spanning conditional branches measured slower on tools/kernels/tokenize:
their check ran on paths that then reached one member only.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from berm_aot.analysis import BRANCHES, writes
from berm_aot.isa import Instruction

from .insn import LOAD_TYPES, STORE_TYPES

#: Bytes each load and store accesses.
ACCESS_BYTES = {"lb": 1, "lbu": 1, "sb": 1, "lh": 2, "lhu": 2, "sh": 2, "lw": 4, "lwu": 4, "sw": 4, "ld": 8, "sd": 8}
SP = 2


@dataclass(frozen=True)
class SpGroup:
    lo: int  # the lowest offset from sp a member touches
    size: int  # bytes from sp + lo past the last byte a member touches
    first_store: int | None  # the lowest offset a store writes at (None: loads only)

    def header(self) -> str:
        """The C that checks the group (and lowers the stack's low-water mark to its stores) at its first member."""
        check = f"BERM_SP_GROUP(x2, {self.lo}, {self.size}u);"
        if self.first_store is None:
            return check
        return f"{check} BERM_SP_GROUP_MARK(x2, {self.first_store});"


def _member(insn: Instruction) -> bool:
    return insn.rs1 == SP and (insn.op in LOAD_TYPES or insn.op in STORE_TYPES)


def _ends_run(insn: Instruction, falls_through: bool) -> bool:
    """No member after ``insn`` may share its group."""
    op = insn.op
    return (not falls_through or SP in writes(insn) or op in BRANCHES
            or op in ("jal", "jalr", "ebreak", "illegal", "unsupported"))


def sp_groups(insns: list[Instruction], labels: Container[int],
              follows: Mapping[int, bool]) -> tuple[dict[int, SpGroup], frozenset[int]]:
    """``(group by the address of its first member, the addresses of every member)`` for one function's
    instructions in emission order; ``follows[addr]``: the next instruction emitted is the one ``addr`` falls
    through to."""
    groups: dict[int, SpGroup] = {}
    members: set[int] = set()
    run: list[Instruction] = []

    def close() -> None:
        if len(run) >= 2:
            lo = min(i.imm for i in run)
            stores = [i.imm for i in run if i.op in STORE_TYPES]
            groups[run[0].addr] = SpGroup(lo, max(i.imm + ACCESS_BYTES[i.op] for i in run) - lo,
                                          min(stores, default=None))
            members.update(i.addr for i in run)
        run.clear()

    for insn in insns:
        if insn.addr in labels:
            close()
        if _member(insn):
            run.append(insn)
        if _ends_run(insn, follows.get(insn.addr, False)):
            close()
    close()
    return groups, frozenset(members)
