"""Which local targets each indirect jump of a function branches to directly; any other local target is reached
through the function's resume copy (berm_aot.emit.function, ``resume=True``).

ABI §6 lets every indirect jump of a function reach every legal target inside it. Translated literally, each
``jr`` and ``ret`` is a C edge into every jump-table case of the function, so gcc sees loops entered in the middle
(irreducible: no loop optimisation, registers allocated for the whole function at once) and merges the register
facts of unrelated code at every case (a constant hoisted out of a loop is no longer known inside it). On
tools/kernels' tokenizer, whose two ``switch`` statements become two jump tables in one function, dropping those
edges took a third of the instructions and 2.1x native down to 1.3x.

So each jump site branches directly only to where it is expected to go:

- a jump through a table: the entries of that table. The site's register was loaded (``ld``/``lw``/``lwu``) in the
  site's block from ``base (+ index)``, and ``base`` holds the table's address there. That is known from the
  constant registers (berm_aot.emit.consts) computed *optimistically*: each local target is entered only from
  the jumps expected to reach it, so a ``lla s4, table`` hoisted out of the loop around a ``switch`` is still known
  at the ``jr`` inside it. Expectations and constants are refined together a few rounds;
- a return (``jalr x0, 0(ra)``): no local target;
- any other jump: every local target.

Another local target still works, exactly as the interpreter runs it: the jump leaves the function's C frame for its
resume copy, the same code translated with every edge, entered at that target. The guess decides speed only, never
what is legal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from berm_aot.analysis import FunctionInfo, writes
from berm_aot.image import ElfImage
from berm_aot.isa import Instruction

from .consts import constants_from, meet_constants
from .dataflow import MASK, components, control_edges

_TABLE_LOADS = {"ld": 8, "lw": 4, "lwu": 4}
RA = 1
S = TypeVar("S")
#: Rounds of refining expectations and constants together (tokenize's two tables settle in two).
ROUNDS = 4


def dynamic_jumps(info: FunctionInfo) -> list[Instruction]:
    """The jumps decided here: each ``jalr x0`` whose target is not known at translation time. berm_aot.emit.function
    sends exactly these to a dispatch block (it asks this function which they are)."""
    return [insn for insn in info.insns
            if insn.op == "jalr" and insn.rd == 0 and insn.addr not in info.static_targets]


def _is_return(insn: Instruction) -> bool:
    return insn.rs1 == RA and insn.imm == 0


def jump_targets(info: FunctionInfo, tables: Mapping[int, tuple[int, tuple[int, ...]]], image: ElfImage
                 ) -> dict[int, tuple[int, ...]] | None:
    """For each of ``dynamic_jumps(info)``, the local targets it branches to directly, in address order; None when
    every one of them may branch to every local target (the function then needs no resume copy). ``tables``:
    ``Analysis.jump_tables``. Linear in the function's size and its tables' (a crafted image must not make the
    translation quadratic: many jumps over one big table, many targets)."""
    if not info.local_targets:
        return None
    everything = tuple(info.local_targets)
    local = set(everything)
    sites = dynamic_jumps(info)
    if not _in_loops(info, [site.addr for site in sites if not _is_return(site)], local):
        return None  # no loop to keep whole, whatever the jumps expect (the common case: skip the work)
    position = {insn.addr: k for k, insn in enumerate(info.insns)}
    sets = _TargetSets(tables, local, everything)
    expected: dict[int, tuple[int, ...]] = {}
    seeds: dict[int, dict[int, int]] = {info.start: {}}
    for _ in range(ROUNDS):
        known = constants_from(image, info.insns, seeds)
        new = {site.addr: _expected(info, position, site, sets, known) for site in sites}
        if all(new[a] is expected.get(a) for a in new):
            break
        expected = new
        seeds = entry_seeds(info.start, sites, expected, known, meet_constants, {})
    if all(targets is everything for targets in expected.values()):
        return None
    return expected


class _TargetSets:
    """The expected-target tuples, one object per distinct set (the return's, every target's, each table's), so
    that jumps sharing a set are told apart from others by identity: hashing or comparing a table's tuple once per
    jump would make many jumps over one big table quadratic."""

    def __init__(self, tables: Mapping[int, tuple[int, tuple[int, ...]]], local: set[int],
                 everything: tuple[int, ...]):
        self.tables, self.local, self.everything = tables, local, everything
        self.none: tuple[int, ...] = ()
        self._of_table: dict[tuple[int, int], tuple[int, ...] | None] = {}

    def table(self, start: int, width: int) -> tuple[int, ...] | None:
        """The local targets of the ``width``-byte table at ``start``; None when there is none of only local
        targets there."""
        key = (start, width)
        if key not in self._of_table:
            size, entries = self.tables.get(start, (0, ()))
            found = None
            if entries and size == width and self.local.issuperset(entries):
                found = tuple(sorted(set(entries)))
                found = self.everything if found == self.everything else found
            self._of_table[key] = found
        return self._of_table[key]


def entry_seeds(start: int, sites: list[Instruction], expected: Mapping[int, tuple[int, ...]],
                known: Mapping[int, S], meet: Callable[[S, S], S], empty: S) -> dict[int, S]:
    """The entry state of the function's start (``empty``) and of each local target: what the jumps expected to
    reach it agree on, from ``known`` (a state before each instruction of a dataflow: constants, stack pointers).
    The jumps sharing one set of targets are met first, so the work is per set, not per jump and target."""
    by_set: dict[int, tuple[tuple[int, ...], S]] = {}  # by the set's identity (see _TargetSets)
    for site in sites:
        targets = expected[site.addr]
        if targets and site.addr in known:
            state = known[site.addr]
            if id(targets) in by_set:
                state = meet(by_set[id(targets)][1], state)
            by_set[id(targets)] = (targets, state)
    seeds: dict[int, S] = {start: empty}
    for targets, state in by_set.values():
        for target in targets:
            seeds[target] = meet(seeds[target], state) if target in seeds else state
    return seeds


def _expected(info: FunctionInfo, position: Mapping[int, int], site: Instruction, sets: _TargetSets,
              known: Mapping[int, dict[int, int]]) -> tuple[int, ...]:
    if _is_return(site):
        return sets.none
    block = _block_before(info, position[site.addr])
    load = _last_write(block, site.rs1)
    if load is None or load.op not in _TABLE_LOADS:
        return sets.everything
    bases = [(load, load.rs1)]
    index = _last_write(block[:block.index(load)], load.rs1)
    if index is not None and index.op == "add":
        bases = [(index, index.rs1), (index, index.rs2)]
    for at, base in bases:
        value = known.get(at.addr, {}).get(base) if base else None
        found = None if value is None else sets.table((value + load.imm) & MASK, _TABLE_LOADS[load.op])
        if found is not None:
            return found
    return sets.everything


def _block_before(info: FunctionInfo, k: int) -> list[Instruction]:
    """The instructions that run straight into ``info.insns[k]``: back from it while each falls through to the next
    and no jump lands between them."""
    insns = info.insns
    j = k
    while (j > 0 and insns[j].addr not in info.labels and insns[j - 1].next_pc == insns[j].addr
           and insns[j - 1].falls_through):
        j -= 1
    return insns[j:k]


def _last_write(block: list[Instruction], reg: int) -> Instruction | None:
    for insn in reversed(block):
        if reg in writes(insn):
            return insn
    return None


def _in_loops(info: FunctionInfo, jumps: list[int], local: set[int]) -> bool:
    """Whether some local target lies on a cycle of the function's control flow, where each of ``jumps`` may go to
    any local target. Only there do the other jumps' edges cost anything (a loop entered in the middle, facts merged
    inside it); a ``switch`` after a loop needs no resume copy, which would double its function's compile."""
    edges = control_edges(info.insns, jumps, local)
    return any((len(component) > 1 or node in edges[node]) and node in local
               for component in components(edges) for node in component)
