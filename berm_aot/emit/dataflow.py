"""A forward dataflow over one function's instructions, shared by the translator's small analyses (constant
registers, stack pointers): each instruction's entry state is what every path into it agrees on.

States only shrink: the first path to reach an instruction sets its state, later ones ``meet`` it with theirs
(keeping what both agree on), and an instruction is revisited only when its state lost something — so loops reach
a fixpoint. Calls continue at their link address; indirect jumps end a path (their targets are roots).
Also the strongly connected components of such a graph (``components``): where its cycles are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import TypeVar

from berm_aot.isa import BRANCHES
from berm_aot.isa import Instruction

MASK = (1 << 64) - 1

S = TypeVar("S", bound=Sized)


def successors(insn: Instruction) -> list[int]:
    """Where control goes after ``insn`` without an indirect jump (a call: its link address)."""
    op = insn.op
    if op in ("ebreak", "illegal", "unsupported"):
        return []
    if op == "jal":
        return [insn.next_pc if insn.rd else (insn.addr + insn.imm) & MASK]
    if op == "jalr":
        return [insn.next_pc] if insn.rd else []
    if op in BRANCHES:
        return [insn.next_pc, (insn.addr + insn.imm) & MASK]
    return [insn.next_pc]


def forward(insns: list[Instruction], roots: Iterable[int] | Mapping[int, S], empty: S,
            transfer: Callable[[Instruction, S], S], meet: Callable[[S, S], S]) -> dict[int, S]:
    """The entry state of every instruction reachable from ``roots`` (each starting at ``empty``, or at the state
    ``roots`` maps it to)."""
    at = {i.addr: i for i in insns}
    state_in: dict[int, S] = {}
    work: list[int] = []
    for root, state in roots.items() if isinstance(roots, Mapping) else ((root, empty) for root in roots):
        if root in at:
            state_in[root] = state
            work.append(root)
    get = state_in.get
    while work:
        insn = at[work.pop()]
        out = transfer(insn, state_in[insn.addr])
        for nxt in successors(insn):
            old = get(nxt)
            if old is None:
                if nxt in at:
                    state_in[nxt] = out
                    work.append(nxt)
            else:
                new = meet(old, out)
                if len(new) != len(old):
                    state_in[nxt] = new
                    work.append(nxt)
    return state_in


#: A node of ``control_edges`` that is no instruction: "any of the indirect jumps' targets". Each jump has one edge
#: to it and it one to each target, so n jumps and m targets make n + m edges where direct ones made n × m (a
#: function of 2,000 ``jr`` and as many jump-table cases took 1.7 s to translate, and 16,000 instructions of them
#: would take minutes).
ANY_TARGET = -1


def control_edges(insns: list[Instruction], jumps: Sequence[int] = (),
                  targets: Iterable[int] = ()) -> dict[int, list[int]]:
    """Each of ``insns``' successors among them (``successors``), and from each address of ``jumps`` (indirect jumps)
    an edge to each of ``targets`` among them, through ``ANY_TARGET``: the graph ``components`` searches."""
    at = {i.addr for i in insns}
    edges = {i.addr: [n for n in successors(i) if n in at] for i in insns}
    if jumps:
        for addr in jumps:
            edges[addr].append(ANY_TARGET)
        edges[ANY_TARGET] = sorted(at.intersection(targets))
    return edges


def components(edges: Mapping[int, list[int]]) -> list[list[int]]:
    """The strongly connected components of a graph (Tarjan's algorithm, iterative: functions can be long)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    out: list[list[int]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, k = work.pop()
            if k == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            succ = edges[node]
            if k < len(succ):
                work.append((node, k + 1))
                nxt = succ[k]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out
