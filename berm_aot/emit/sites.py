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

from collections.abc import Mapping

from berm_aot.analysis import FunctionInfo, writes
from berm_aot.image import ElfImage
from berm_aot.isa import Instruction

from .consts import constants_from, meet_constants
from .dataflow import successors

MASK = (1 << 64) - 1
_TABLE_LOADS = {"ld": 8, "lw": 4, "lwu": 4}
RA = 1
#: Rounds of refining expectations and constants together (tokenize's two tables settle in two).
_ROUNDS = 4


def jump_targets(info: FunctionInfo, tables: Mapping[int, tuple[int, tuple[int, ...]]], image: ElfImage
                 ) -> dict[int, tuple[int, ...]] | None:
    """For each indirect jump of ``info`` (a ``jalr x0`` whose target is not known at translation time), the local
    targets it branches to directly, in address order; None when every one of them may branch to every local
    target (the function then needs no resume copy). ``tables``: ``Analysis.jump_tables``."""
    if not info.local_targets:
        return None
    everything = tuple(info.local_targets)
    local = set(everything)
    sites = [insn for insn in info.insns
             if insn.op == "jalr" and insn.rd == 0 and insn.addr not in info.static_targets]
    if not _in_loops(info, {site.addr: everything for site in sites if site.rs1 != RA}, local):
        return None  # no loop to keep whole, whatever the jumps expect (the common case: skip the work)
    expected: dict[int, tuple[int, ...]] = {}
    seeds: dict[int, dict[int, int]] = {info.start: {}}
    for _ in range(_ROUNDS):
        known = constants_from(image, info.insns, seeds)
        new = {site.addr: _expected(info, site, tables, known, local, everything) for site in sites}
        if new == expected:
            break
        expected = new
        seeds = {info.start: {}}
        for site in sites:
            for target in expected[site.addr] if site.addr in known else ():
                state = known[site.addr]
                seeds[target] = meet_constants(seeds[target], state) if target in seeds else dict(state)
    if all(targets == everything for targets in expected.values()):
        return None
    return expected


def _expected(info: FunctionInfo, site: Instruction, tables: Mapping[int, tuple[int, tuple[int, ...]]],
              known: Mapping[int, dict[int, int]], local: set[int], everything: tuple[int, ...]) -> tuple[int, ...]:
    if site.rs1 == RA and site.imm == 0:
        return ()
    block = _block_before(info, site)
    load = _last_write(block, site.rs1)
    if load is None or load.op not in _TABLE_LOADS:
        return everything
    bases = [(load, load.rs1)]
    index = _last_write(block[:block.index(load)], load.rs1)
    if index is not None and index.op == "add":
        bases = [(index, index.rs1), (index, index.rs2)]
    for at, base in bases:
        value = known.get(at.addr, {}).get(base) if base else None
        width, entries = tables.get((value + load.imm) & MASK, (0, ())) if value is not None else (0, ())
        if entries and width == _TABLE_LOADS[load.op] and local.issuperset(entries):
            return tuple(sorted(set(entries)))
    return everything


def _block_before(info: FunctionInfo, site: Instruction) -> list[Instruction]:
    """The instructions that run straight into ``site``: back from it while each falls through to the next and no
    jump lands between them."""
    insns = info.insns
    k = next(i for i, insn in enumerate(insns) if insn.addr == site.addr)
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


def _in_loops(info: FunctionInfo, jumps: Mapping[int, tuple[int, ...]], local: set[int]) -> bool:
    """Whether some local target lies on a cycle of the function's control flow, with ``jumps`` (indirect jump →
    its targets) as edges too. Only there do the other jumps' edges cost anything (a loop entered in the middle,
    facts merged inside it); a ``switch`` after a loop needs no resume copy, which would double its function's
    compile."""
    code = {insn.addr: insn for insn in info.insns}

    def after(addr: int) -> list[int]:
        return [n for n in successors(code[addr]) if n in code] + list(jumps.get(addr, ()))

    for target in local & code.keys():
        seen: set[int] = set()
        work = after(target)
        while work:
            addr = work.pop()
            if addr == target:
                return True
            if addr not in seen:
                seen.add(addr)
                work += after(addr)
    return False
