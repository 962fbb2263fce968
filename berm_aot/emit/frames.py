"""What sp relative to the frame's entry tells. Loads through sp that need no check: the bytes they read were already
found inside guest memory by an earlier access of the same frame — an epilogue's restores, whose bytes the
prologue's saves checked. And groups through sp whose check passes once per depth of a recursion (below).

A forward dataflow over one function tracks, per instruction, facts about the current frame (one activation of
the function): ``("off", d)``, sp is the frame's entry sp plus d, and ``("chk", lo, hi)``, one access of this
frame found the bytes from entry sp + lo to entry sp + hi inside one window a load may read. The windows are
constants of the layout the code is translated for, so a fact of the second kind holds for the rest of the frame,
whatever sp does later. A load through sp at a known d whose bytes one such access covered reads memory that
access proved readable: it needs no check (``unchecked_loads``).

sp is known only where every path agrees: ``addi sp, sp, imm`` moves it by imm, any other write of sp forgets it,
and so does a call of another function (the callee may return with any sp). A call of the function by itself
keeps it when every indirect jump of the function (every return among them) leaves with sp at the frame's entry
value (d = 0): then a nested frame that returns restores the caller's sp — by induction on frames, the nested
frame's own calls having returned before it did. The dataflow first assumes that, then checks it, and computes
again without it when it fails. A nested frame may also end in a tail transfer to another function (a jump to a
function entry) whose chain later returns to the caller's link with any sp: that is no return the function
makes, so the C frame's rest then runs in its resume copy, which checks everything
(berm_aot.emit.function, ``_nested_exits``).

Facts of stores count only when every store window byte is one a load may read (``Windows.loads_cover_stores``):
the prologue's saves are stores, the epilogue's restores loads.

fib went from 35,501 to 32,801 x86 instructions per unit of work (-7.6%; callgrind, as tools/bench_insns.py
counts), 6% less time in a fast phase of the machine and no difference in a slow one (three copies of each build
in one process); sort -0.5% instructions, 1-3% time; the other kernels unchanged.

The offsets also say where sp is the same for every frame at one depth of a C frame (``same_at_each_depth``):
when every call of the function by itself is made at one known d, the frame k calls deep enters at the C frame's
entry sp plus k·d, so a group through sp at a known offset covers the same bytes in all of them, and its check
and stack mark need to pass once per depth (berm_host/aot/berm_code.h, ``BERM_GROUP_LEVEL``). A nested frame's
tail transfer breaks that too, and takes the resume copy the same way. fib: 32,801 to 30,575 x86 instructions
per unit (-6.8%); sort unchanged (its recursion is rare).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping

from berm_aot.analysis import writes
from berm_aot.isa import Instruction

from .dataflow import forward
from .groups import ACCESS_BYTES, SP
from .insn import LOAD_TYPES, STORE_TYPES

State = frozenset  # of ("off", d) and ("chk", lo, hi) facts
#: The most facts a state holds: a later access adds none (a prologue's saves come first). Each instruction's state
#: is a new set, so without a bound a function of n spills would cost n² to translate.
MAX_FACTS = 64


def offset(state: State) -> int | None:
    """d when sp is the frame's entry sp plus d on every path here, else None."""
    for fact in state:
        if fact[0] == "off":
            return fact[1]
    return None


def _forget_sp(state: State) -> State:
    return frozenset(f for f in state if f[0] != "off")


def _transfer(insn: Instruction, state: State, self_calls: Container[int], stores: bool) -> State:
    d = offset(state)
    if (d is not None and insn.rs1 == SP and len(state) < MAX_FACTS
            and (insn.op in LOAD_TYPES or (stores and insn.op in STORE_TYPES))):
        lo = d + insn.imm  # the access runs on the old sp (a load into sp writes it after)
        state = state | {("chk", lo, lo + ACCESS_BYTES[insn.op])}
    if insn.op in ("jal", "jalr") and insn.rd and insn.addr not in self_calls:
        return _forget_sp(state)  # a call: the callee may leave sp anywhere (one linking into sp writes it below)
    if SP not in writes(insn):
        return state
    if insn.op == "addi" and insn.rs1 == SP and d is not None:
        return _forget_sp(state) | {("off", d + insn.imm)}
    return _forget_sp(state)


def frame_facts(insns: list[Instruction], start: int, local_targets: list[int], self_calls: Container[int],
                stores: bool) -> tuple[dict[int, State], bool]:
    """``(the facts at each instruction, whether calls of itself kept sp)`` for one function (``insns``;
    ``self_calls``: the addresses of its calls of itself; ``stores``: whether stores' facts count). A local target
    is entered by an indirect jump: nothing is known there."""
    roots = {t: State() for t in local_targets}
    if start not in roots:
        roots[start] = State({("off", 0)})

    def solve(trusted: Container[int]) -> dict[int, State]:
        return forward(insns, roots, State(), lambda insn, s: _transfer(insn, s, trusted, stores), _meet)

    if self_calls:
        facts = solve(self_calls)
        if all(offset(facts[i.addr]) == 0 for i in insns if i.op == "jalr" and i.rd == 0 and i.addr in facts):
            return facts, True
    return solve(()), False


def _meet(a: State, b: State) -> State:
    return a & b


def unchecked_loads(insns: list[Instruction], facts: Mapping[int, State]) -> set[int]:
    """The loads through sp whose bytes an earlier access of the frame proved readable (at their known d)."""
    out = set()
    for insn in insns:
        if insn.rs1 == SP and insn.op in LOAD_TYPES and insn.addr in facts:
            d = offset(facts[insn.addr])
            if d is not None and _covered(facts[insn.addr], d + insn.imm, d + insn.imm + ACCESS_BYTES[insn.op]):
                out.add(insn.addr)
    return out


def _covered(state: State, lo: int, hi: int) -> bool:
    return any(f[0] == "chk" and f[1] <= lo and hi <= f[2] for f in state)


def same_at_each_depth(facts: Mapping[int, State], self_call_sites: Collection[int], heads: list[int]) -> set[int]:
    """The instructions among ``heads`` where sp has one value per depth of a C frame whose calls of the function by
    itself run in it (berm_aot.emit.function, ``_self_call``): sp is known there, relative to the frame's entry sp,
    and every such call is made at one same known d — so the frame k calls deep enters at the C frame's entry sp plus
    k·d, whichever call site and whenever it ran. A check of a range at a fixed offset from sp there that passed once
    holds for every later frame at the same depth (``BERM_GROUP_LEVEL``)."""
    at_calls = {offset(facts[s]) if s in facts else None for s in self_call_sites}
    if len(at_calls) != 1 or None in at_calls:
        return set()
    return {h for h in heads if h in facts and offset(facts[h]) is not None}
