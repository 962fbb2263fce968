"""Counted loops, whose loads and stores are checked once per entry into the loop instead of once per iteration.

A counted loop is one straight run of code — its head the only way in, no branch, call, jump or ``ecall`` inside —
closed by ``bne iv, bound, head``, where ``iv`` is written once in the run, by ``addi iv, iv, step``, and
``bound`` not at all. Entered with ``iv`` = v, it runs exactly n = (bound − v) / step iterations when that is a
whole number from 1 to ``BERM_LOOP_MAX`` (berm_code.h, ``berm_trips``): at the branch of iteration t, ``iv`` is
v + (t + 1)·step, and the first t + 1 with (t + 1)·step ≡ bound − v (mod 2^64) is n, since n·step < 2^64. A trap
or an interrupt may end it sooner, never later.

Its loads and stores through one register that the run steps the same way (``addi r, r, c``, written nowhere
else in it) or leaves alone form a loop group: over all n iterations they touch one range, from the range of the
first iteration and the register's step (a member after the ``addi`` sees the stepped value). The loop's entry
checks that range against the two windows the members may use and sets the group's flag ``l<k>_``
(``BERM_LOOP_GROUP``), and the stores account for themselves there: the stack's low-water mark, or a dirty mark
on every page a store starts in (``BERM_LOOP_MARK``; a trap may leave pages marked that were not written, which
costs their restore, nothing else). When every group of the loop passed, the loop runs a second copy of itself
(``LF_<head>``) whose members take no check at all; else the first, whose members test their group's flag
(``BERM_G_LD`` / ``BERM_G_ST``): a group whose range is in neither window, or whose loop's trip count is not
known, leaves every member to the per-access check, so a trap is exactly the interpreter's. Either copy's
back-edge polls and branches back to itself, past the checks.

Measured on tools/kernels (2026-12-01, interleaved against the previous translation in one process): SHA-256's
three loops (message load, schedule, rounds) are counted loops — 14.5% fewer instructions, 11-13% less time;
CRC-32's byte loop loses 20% of its instructions and no time (its load-and-xor chain sets the pace); the sort's
fill loop 4% of its instructions. A single copy whose members test the flag per access kept most of the cost (the
slow paths stay in the loop): SHA-256 −3.7% instructions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass

from berm_aot.analysis import writes
from berm_aot.isa import BRANCHES, Instruction

from .groups import ACCESS_BYTES, SP
from .insn import LOAD_TYPES, STORE_TYPES, lit, reg

MASK = (1 << 64) - 1


@dataclass(frozen=True)
class LoopGroup:
    base: int  # the base register
    slot: int  # its flag ``l<slot>_``: which of its windows holds the whole range (1 or 2; 0: neither, or unknown)
    windows: tuple[str, str]  # the two it may use, the likelier first (as for groups.Group)
    step: int  # the base's change per iteration (0: none)
    lo: int  # in the first iteration, the lowest offset from the base's value at entry a member touches
    hi: int  # ... and one past the highest
    stores: tuple[int, int] | None  # in the first iteration, the lowest and highest offset a store starts at
    members: tuple[int, ...]  # their addresses

    @property
    def flag(self) -> str:
        return f"l{self.slot}_"

    def _span(self, lo: int, hi: int) -> tuple[str, str]:
        """C for the lowest address of [base + lo, base + hi) over every iteration, and the bytes past it to the
        end of the same range over every iteration (n_: the trip count, at most BERM_LOOP_MAX)."""
        base, travel = f"x{self.base}", f"(n_ - 1) * {abs(self.step)}ull"
        first = f"{base} + {lit(lo)}" + (f" - {travel}" if self.step < 0 else "")
        size = f"{lit(hi - lo)}" + (f" + {travel}" if self.step else "")
        return first, size

    def header(self) -> str:
        first, size = self._span(self.lo, self.hi)
        w1, w2 = self.windows
        check = f"BERM_LOOP_GROUP({self.flag}, n_, {w1}, {w2}, {first}, {size});"
        if self.stores is None:
            return check
        low, span = self._span(self.stores[0], self.stores[1])
        return f"{check} BERM_LOOP_MARK({self.flag}, {1 + self.windows.index('STACK')}, {low}, {span});"


@dataclass(frozen=True)
class CountedLoop:
    insns: tuple[Instruction, ...]  # from its head to its closing ``bne``, in order
    iv: int
    bound: int
    step: int
    groups: tuple[LoopGroup, ...]

    @property
    def head(self) -> int:
        return self.insns[0].addr

    @property
    def branch(self) -> int:
        return self.insns[-1].addr

    @property
    def after(self) -> int:
        """Where it goes when it ends: the branch's fall-through."""
        return self.insns[-1].next_pc

    @property
    def body_label(self) -> str:
        """Where the back-edge goes: past the checks at the head."""
        return f"LL_{self.head:x}"

    @property
    def fast_label(self) -> str:
        """The loop's second copy, run when every group's range is in a window: its members take no check."""
        return f"LF_{self.head:x}"

    def header(self) -> list[str]:
        """The C at the loop's head, before its first instruction: the trip count, every group's check, and the
        branch to the second copy when they all passed."""
        trips = f"uint64_t n_ = berm_trips({reg(self.iv)}, {reg(self.bound)}, {self.step});"
        return ["    { /* a counted loop: its accesses are checked for all of its iterations here */",
                f"        {trips}",
                *(f"        {g.header()}" for g in self.groups),
                "    }",
                f"    if ({' && '.join(g.flag for g in self.groups)}) goto {self.fast_label};",
                f"{self.body_label}:;"]


def _straight(insn: Instruction) -> bool:
    return insn.op not in BRANCHES and insn.op not in ("jal", "jalr", "ecall", "ebreak", "illegal", "unsupported")


def _member(insn: Instruction) -> bool:
    return insn.rs1 != 0 and (insn.op in LOAD_TYPES or insn.op in STORE_TYPES)


def counted_loops(insns: list[Instruction], labels: Container[int], follows: Mapping[int, bool],
                  stack_at: Mapping[int, Container[int]], first_slot: int = 0) -> dict[int, CountedLoop]:
    """The counted loops among one function's instructions (in emission order), by the address of their head;
    ``follows[addr]``: the next instruction emitted is the one ``addr`` falls through to; ``stack_at[addr]``: the
    registers holding a stack address there. Flags are numbered from ``first_slot``, one per group."""
    index = {insn.addr: k for k, insn in enumerate(insns)}
    # straight[k]: the first instruction of the straight run ending at k — from it up to k no label but its own, and
    # every instruction before k straight and falling through to the next. A loop's head must lie in it: one pass
    # here, where checking each backward branch's body took time quadratic in a run of branches to one head.
    straight, first = [], 0
    for k, insn in enumerate(insns):
        if k == 0 or insn.addr in labels or not (_straight(insns[k - 1]) and follows[insns[k - 1].addr]):
            first = k
        straight.append(first)
    loops: dict[int, CountedLoop] = {}
    slot = first_slot
    for k, branch in enumerate(insns):
        if branch.op != "bne" or branch.rs1 == branch.rs2:
            continue
        j = index.get((branch.addr + branch.imm) & MASK)
        if j is None or not straight[k] <= j < k:
            continue
        body = insns[j:k]
        written = Counter(r for insn in body for r in writes(insn))
        steps = {insn.rd: (pos, insn.imm) for pos, insn in enumerate(body)
                 if insn.op == "addi" and insn.rd == insn.rs1 and insn.imm and written[insn.rd] == 1}
        exits = [(iv, bound) for iv, bound in ((branch.rs1, branch.rs2), (branch.rs2, branch.rs1))
                 if iv in steps and not written[bound]]
        if not exits:
            continue
        iv, bound = exits[0]
        members: dict[int, list[tuple[int, Instruction]]] = {}
        for pos, insn in enumerate(body):
            if _member(insn) and (insn.rs1 in steps or not written[insn.rs1]):
                members.setdefault(insn.rs1, []).append((pos, insn))
        groups = []
        for base, run in members.items():
            at, step = steps.get(base, (len(body), 0))
            offsets = [(insn.imm + (step if pos > at else 0), insn) for pos, insn in run]
            stores = [off for off, insn in offsets if insn.op in STORE_TYPES]
            data = "STORE" if stores else "LOAD"
            first = run[0][1]
            stacky = base == SP or base in stack_at.get(first.addr, ())
            groups.append(LoopGroup(base, slot, ("STACK", data) if stacky else (data, "STACK"), step,
                                    min(off for off, _ in offsets),
                                    max(off + ACCESS_BYTES[insn.op] for off, insn in offsets),
                                    (min(stores), max(stores)) if stores else None,
                                    tuple(insn.addr for _, insn in run)))
            slot += 1
        if groups:
            loops[insns[j].addr] = CountedLoop(tuple(insns[j:k + 1]), iv, bound, steps[iv][1], tuple(groups))
    return loops
