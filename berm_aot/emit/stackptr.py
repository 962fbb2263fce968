"""Registers that hold an address in the guest's stack — sp plus an offset (``addi a3, sp, 24``, a loop's
``addi a3, a3, 4`` over a local array, ``add a5, a3, a4``) — at each instruction of a function.

A load or store through such a register tests the stack window first (berm_code.h, BERM_SP_LD / BERM_SP_ST):
both windows are always tested before a fault, so the order never changes an outcome, only which test succeeds
first. Testing the data window first for a local array costs a failed compare on every access (SHA-256's message
schedule: 3.1× native with it, 2.5× without).
"""

from __future__ import annotations

from collections.abc import Mapping

from berm_aot.analysis import writes
from berm_aot.isa import Instruction

from .dataflow import forward
from .sites import ROUNDS, entry_seeds

SP = 2


def _transfer(insn: Instruction, state: frozenset[int]) -> frozenset[int]:
    op, rd = insn.op, insn.rd
    if op in ("jal", "jalr") and rd:
        return frozenset()  # a call: the callee may change anything (a plain jump changes nothing)
    written = writes(insn)
    if not written:
        return state
    stacky = state | {SP}
    derived = ((op == "addi" and insn.rs1 in stacky)
               or (op == "add" and (insn.rs1 in stacky) != (insn.rs2 in stacky))
               or (op == "sub" and insn.rs1 in stacky and insn.rs2 not in stacky))
    return (state | {rd}) if derived and rd != SP else state - written


def _meet(a: frozenset[int], b: frozenset[int]) -> frozenset[int]:
    return a & b


def stack_pointers(insns: list[Instruction], start: int, local_targets: list[int],
                   expected: Mapping[int, tuple[int, ...]] | None = None) -> dict[int, frozenset[int]]:
    """For each instruction, the registers (sp itself excluded) holding sp plus something on every path to it.

    A local target is entered by indirect jumps. Without ``expected`` (berm_aot.emit.sites: each jump's expected
    targets) it starts knowing nothing; with it, it starts with what the jumps expected to reach it agree on,
    refined a few rounds as sites does for constants: a guess (a jump it did not expect may enter it with
    anything), which is all this needs to be. tokenize's local counts array, whose address is taken before its
    ``switch`` loop, is then still known inside the cases (one failed compare per increment without it)."""
    if expected is None:
        return forward(insns, [start, *local_targets], frozenset(), _transfer, _meet)
    sites = [insn for insn in insns if insn.addr in expected]
    seeds: dict[int, frozenset[int]] = {start: frozenset()}
    for _ in range(ROUNDS):
        known = forward(insns, seeds, frozenset(), _transfer, _meet)
        new = entry_seeds(start, sites, expected, known, _meet, frozenset())
        if new == seeds:
            break
        seeds = new
    return forward(insns, {**{t: frozenset() for t in local_targets}, **seeds}, frozenset(), _transfer, _meet)
