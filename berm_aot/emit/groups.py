"""Groups of loads and stores through one base register, checked together (berm_code.h, BERM_GROUP): a prologue's
register saves and an epilogue's restores through sp, a run of spills, neighbouring fields or array elements
(SHA-256's message schedule reads w[i-16], w[i-15], w[i-7] and w[i-2] and writes w[i] through one register). One
range check (at most two compares: see below), and for the stores one compare with the stack's low-water mark (in
the stack window) or one dirty mark per page they start in (at most two: offsets are 12-bit), replace one check (and
one mark) per access: on recursive ``fib`` the per-access checks were half the run time; grouping the message
schedule took about 6% off SHA-256.

A group is a run of at least two loads and stores through the same base register in one basic block — no label in
between (no other way in), no branch, call or other transfer (every member runs once the first does) — with the base
unchanged between them (a member may load into its own base: that ends the group). Groups through different
registers may interleave; each has a flag of its own (``g0_``, ``g1_``, …, numbered afresh in every block). Groups
spanning conditional branches measured slower on tools/kernels/tokenize: their check ran on paths that then reached
one member only.

A group is checked against the stack window and the store window when a member stores (it lies inside the load
window), else the load window, the stack's first when the base is sp or holds a stack address
(berm_aot/emit/stackptr.py). Checking one window only cost SHA-256 a fifth and tokenize two thirds more time: a
pointer argument into the caller's stack, or a local array the analysis does not see, failed the check and sent
every member to the slow path.

The members take no check of their own. When the group's range is in neither window, the group's **run** — its
first member to the end of its segment, where a segment is the union of the overlapping spans (first to last
member) of the block's groups — goes through the checked runner (berm_aot.emit.slowrun), every access checked on its
own exactly as BERM_LD / BERM_ST check it, so a trap is exactly the interpreter's; the code then continues after
the segment. A run ends at the segment, not at the group's last member, so that it covers every other group whose
check it skipped: groups that interleave share one segment. An ``ecall`` ends a block here, so no run holds one.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from berm_aot.analysis import writes
from berm_aot.isa import BRANCHES, Instruction

from .insn import LOAD_TYPES, STORE_TYPES

#: Bytes each load and store accesses.
ACCESS_BYTES = {"lb": 1, "lbu": 1, "sb": 1, "lh": 2, "lhu": 2, "sh": 2, "lw": 4, "lwu": 4, "sw": 4, "ld": 8, "sd": 8}
SP = 2


@dataclass(frozen=True)
class Group:
    base: int  # the base register
    slot: int  # its flag ``g<slot>_``: which of its windows holds all of its range (1 or 2; 0: neither)
    windows: tuple[str, str]  # the two it may use, the likelier first: "STACK", "STORE", "LOAD" (berm_code.h)
    lo: int  # the lowest offset from the base a member touches
    size: int  # bytes from base + lo past the last byte a member touches
    stores: tuple[int, int] | None  # the lowest and highest offsets a store starts at (None: loads only)
    #: the instructions of its segment (one tuple shared by the segment's groups) and where its first member is in
    #: it: the runner runs ``segment[offset:]`` when the group's check fails
    segment: tuple[Instruction, ...]
    offset: int

    @property
    def flag(self) -> str:
        return f"g{self.slot}_"

    def header(self, level: str | None = None) -> str:
        """The C that checks the group (and accounts for its stores) at its first member; with ``level``, the
        variable that lets a frame skip both once a frame of its depth passed (BERM_GROUP_LEVEL: a group through
        sp, stack first, where sp is the same for every frame of one depth of a C frame)."""
        base, (w1, w2) = f"x{self.base}", self.windows
        stack = 1 + self.windows.index("STACK")
        steps = [f"BERM_GROUP({self.flag}, {w1}, {w2}, {base}, {self.lo}, {self.size}u)"]
        if self.stores is not None:
            first, last = self.stores
            steps.append(f"BERM_GROUP_MARK({self.flag}, {stack}, {base}, {first}, {last})")
        if level is None:
            return " ".join(f"{step};" for step in steps)
        return f"BERM_GROUP_LEVEL({level}, {self.flag}, {stack}, {'; '.join(steps)});"


def _member(insn: Instruction) -> bool:
    return insn.rs1 != 0 and (insn.op in LOAD_TYPES or insn.op in STORE_TYPES)


def _ends_block(insn: Instruction, falls_through: bool) -> bool:
    """No member after ``insn`` may share a group with one before it."""
    return (not falls_through or insn.op in BRANCHES
            or insn.op in ("jal", "jalr", "ecall", "ebreak", "illegal", "unsupported"))


def access_groups(insns: list[Instruction], labels: Container[int], follows: Mapping[int, bool],
                  stack_at: Mapping[int, Container[int]], taken: Container[int] = ()
                  ) -> tuple[dict[int, Group], dict[int, Group]]:
    """``(group by the address of its first member, group by the address of every member)`` for one function's
    instructions in emission order; ``follows[addr]``: the next instruction emitted is the one ``addr`` falls
    through to; ``stack_at[addr]``: the registers holding a stack address there; ``taken``: accesses checked
    otherwise (members of a counted loop's groups, berm_aot.emit.loops), in no group here."""
    by_first: dict[int, Group] = {}
    by_member: dict[int, Group] = {}
    accesses: dict[int, list[int]] = {}  # open in the current block, by base register: positions in insns
    closed: list[list[int]] = []  # the current block's groups, in the order their flags are handed out

    def close(base: int) -> None:
        members = accesses.pop(base)
        if len(members) >= 2:
            closed.append(members)

    def close_all() -> None:
        for base in sorted(accesses, key=lambda b: accesses[b][0]):
            close(base)
        spans = _segments([(members[0], members[-1]) for members in closed])
        segments = {span: tuple(insns[span[0]:span[1] + 1]) for span in set(spans.values())}
        for slot, members in enumerate(closed):
            span = spans[members[0]]
            group = _group([insns[k] for k in members], slot, segments[span], members[0] - span[0], stack_at)
            by_first[insns[members[0]].addr] = group
            by_member.update((insns[k].addr, group) for k in members)
        closed.clear()

    for k, insn in enumerate(insns):
        if insn.addr in labels:
            close_all()
        if _member(insn) and insn.addr not in taken:
            accesses.setdefault(insn.rs1, []).append(k)
        for base in writes(insn) & accesses.keys():
            close(base)
        if _ends_block(insn, follows.get(insn.addr, False)):
            close_all()
    close_all()
    return by_first, by_member


def _segments(spans: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """For spans ``(first, last)`` of positions, each span's first → the first and last position of the union of
    overlapping spans it belongs to."""
    union: dict[int, tuple[int, int]] = {}
    firsts: list[int] = []  # of the spans in the current union
    end = -1
    for first, last in sorted(spans):
        if first > end and firsts:
            union.update((f, (firsts[0], end)) for f in firsts)
            firsts = []
        firsts.append(first)
        end = max(end, last)
    union.update((f, (firsts[0], end)) for f in firsts)
    return union


def _group(members: list[Instruction], slot: int, segment: tuple[Instruction, ...], offset: int,
           stack_at: Mapping[int, Container[int]]) -> Group:
    first, base = members[0], members[0].rs1
    stores = [i.imm for i in members if i.op in STORE_TYPES]
    data = "STORE" if stores else "LOAD"
    windows = ("STACK", data) if base == SP or base in stack_at.get(first.addr, ()) else (data, "STACK")
    lo = min(i.imm for i in members)
    return Group(base, slot, windows, lo, max(i.imm + ACCESS_BYTES[i.op] for i in members) - lo,
                 (min(stores), max(stores)) if stores else None, segment, offset)
