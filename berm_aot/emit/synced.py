"""Registers whose C local certainly holds the value in ``ctx->regs`` at each instruction of a function, so that a
call stores only the others before the callee reads ``ctx->regs``.

A translated function loads its registers from ``ctx->regs`` on entry, and after every call it reloads what the
callee may have written (everything, after a dynamic transfer): at both points every local equals its slot. An
instruction that writes a register breaks that for it until the next call. A call site used to store every
register the function writes; a loop calling a small function stored them all on every iteration, though only
its counter and the arguments had changed. A group's slow path, which runs its accesses on ``ctx->regs``, stores
the same way; exits and traps still store everything the function writes (shared blocks reached from everywhere:
storing less at a function's ``ret`` alone took 0.3% off rust-probe's instructions and grew its C).

Nothing here is trusted beyond what it proves on every path. A local target is entered by the function's own
indirect jumps too (a ``switch``'s cases): it starts with what every jump that may branch to it agrees on — each
jump its expected targets (berm_aot.emit.sites; another target leaves for the resume copy), every target when
there are no expectations. Two passes, not a fixpoint: the first, with nothing known at any local target, gives
each jump a state no larger than its true one, so what the jumps to a target agree on there is a safe start for
it in the second (whose states can only be larger). A resume copy, entered at any local target, starts knowing
nothing there; a function whose calls to itself run in its own C frame (``FunctionEmitter._self_call``: no
store, no reload) is not analysed at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from berm_aot.analysis import FunctionInfo, writes
from berm_aot.isa import Instruction

from .dataflow import forward
from .sites import dynamic_jumps, entry_seeds


def synced_registers(info: FunctionInfo, expected: Mapping[int, tuple[int, ...]] | None, *,
                     entered: bool = True) -> dict[int, frozenset[int]]:
    """For each instruction of ``info``, the registers of ``info.touched`` whose local equals ``ctx->regs`` on every
    path to it. ``expected``: each dynamic jump's directly reached local targets (None: every one);
    ``entered``: whether the function's start is the C function's entry (not in a resume copy)."""
    touched = info.touched

    def transfer(insn: Instruction, synced: frozenset[int]) -> frozenset[int]:
        if insn.op in ("jal", "jalr") and insn.rd:
            return touched  # a call continues only after reloading what the callee may have written
        return synced - writes(insn)

    def meet(a: frozenset[int], b: frozenset[int]) -> frozenset[int]:
        return a & b

    nothing = {t: frozenset() for t in info.local_targets}
    if not entered:
        return forward(info.insns, nothing, frozenset(), transfer, meet)
    first = forward(info.insns, {**nothing, info.start: touched}, frozenset(), transfer, meet)
    if not nothing:
        return first
    everything = tuple(info.local_targets)
    jumps = dynamic_jumps(info)
    reach = {jump.addr: everything if expected is None else expected[jump.addr] for jump in jumps}
    local = set(everything)
    for insn in info.insns:  # an unrelaxed `tail` to a local target (a goto)
        target = info.static_targets.get(insn.addr)
        if insn.op == "jalr" and insn.rd == 0 and target in local:
            jumps.append(insn)
            reach[insn.addr] = (target,)
    return forward(info.insns, entry_seeds(info.start, jumps, reach, first, meet, touched), frozenset(), transfer, meet)
