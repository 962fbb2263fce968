"""A function too large for one C function, translated as several: its chunks.

Why: the C compiler's time and memory grow faster than a function's size. gcc -O1 on one function of 8,000
load/branch/store instructions takes 9 s and 340 MB, of 16,000 27 s and 650 MB (2026-12-03); -O0 is no way out (3.3
and 9.7 s, as much memory), since gcc's C front end alone is quadratic in a function's labels times its scopes
(-fsyntax-only: 0.9 and 4.0 s). A function over ``CHUNKED_ABOVE`` instructions is cut, by address, into chunks of
at most ``CHUNK_INSNS``, each a C function of its own that the C compiler takes in linear time, in parallel with the
others.

How a chunk runs: it is entered at one of its entries, the address in ``ctx->next`` — every address control reaches
from outside the chunk: the function's start (chunk 0), the targets of branches and jumps in other chunks, a
fall-through or a call's link that crosses a cut, and every legal indirect target of the function (any of its
indirect jumps may branch there: a chunk's branches to its own targets in a switch, and leaves for the others after
one check, ``Chunks.legal_name``, defined once). Leaving a chunk for another is a tail transfer to the entry
(``ctx->next``, ``BERM_TAIL``), which the function's own C function (``<p>f_<start>``, what callers and the lookups
know, which enters chunk 0 at the start) runs in a loop with the same link and depth, choosing the chunk by address:
no native stack grows, a return from any chunk returns from the function, a trap in any chunk shows the function's
frame, and a tail transfer to another function leaves the loop for the caller's dispatch loop, as from any function.
(Through the caller's dispatch loop, which found the chunk among all function starts and then all chunk entries, a
call of rust-keywords' lookup below took 0.21 ms, not 0.16.) Each chunk is translated as a function of its own whose
every entry starts knowing nothing (no constants, no stack facts, no register in sync), and whose calls of the
function itself are ordinary calls; the whole function's facts are not needed, so the translation stays linear too.

Where the cuts go: within the second half of each chunk's room, at the instruction boundary that the fewest of the
function's direct control edges cross (a fall-through is one: the best cuts follow a jump or a return, outside every
loop), so a loop is rarely cut.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

from berm_aot.analysis import FunctionInfo, part_of
from berm_aot.isa import Instruction
from berm_aot.program import Program

from .dataflow import successors

#: Functions with more instructions than this are translated in chunks; every function of the bundled guests and
#: of the benchmark is far below it (the largest, rust-probe's words tool: 2,988) but rust-keywords' match (23,279
#: instructions, harnesses/rust-probe/build.rs). A transfer between chunks is a return to the function's loop, a
#: choice of chunk by address, a call, the chunk's choice among its entries and the registers' stores and loads.
#: Chunks trade run time in the function for a compile several times faster, in a fraction of the memory
#: (2026-12-03, cold compiles of the whole image, tools/bench_bigfunction.py):
#: - rust-keywords built with 350 arms (a function of 8,425 instructions; --keywords ELF): 10.9 s (11.4 s of CPU,
#:   262 MB) whole, 3.0 s (4.8 s) in 4 chunks; a call looking up 1,000 words 0.06 ms whole, 0.10 ms in chunks. With
#:   600 arms (14,494): 21.5 s (21.6 s, 542 MB) whole, 3.9 s (6.3 s) in 7 chunks, 0.08 against 0.14 ms. With 1,000
#:   (23,279; --keywords): 42 s (41.7 s, 1.1 GB) whole, 5.6 s (9.8 s, 122 MB) in 11 chunks; 0.08 ms a call whole,
#:   0.16 ms in chunks (a lookup crosses chunks 1.7 times on average, callgrind: every miss goes to the one block
#:   that returns 0).
#: - a generated loop around a 32-way switch, crossing chunks on most iterations: 10,849 instructions in 7.4 s (7.0 s
#:   of CPU, 250 MB) whole and 1.5 s (2.1 s) in 3 chunks, and ran 1.48 against 1.70 ms; 23,315 in 18.6 s (17.5 s,
#:   434 MB) whole and 3.5 s (5.8 s) in 7 chunks, and ran 3.95 against 3.82 ms.
#: So the line is drawn at 8,192 (16,384 until then): one such function compiled whole would take most of the 10 s a
#: cold compile of a 100 KB guest is meant to take (the issue's target), and a few hundred MB per compiler.
CHUNKED_ABOVE = 8_192
#: The most instructions in one chunk.
CHUNK_INSNS = 4_096


@dataclass(frozen=True)
class Chunks:
    """How ``whole`` is translated: ``parts[k]`` is chunk k as a function of its own, its entries its local
    targets."""

    whole: FunctionInfo
    parts: tuple[FunctionInfo, ...]

    @cached_property
    def home(self) -> dict[int, int]:
        """Every chunk's entry → the chunk."""
        return {t: k for k, part in enumerate(self.parts) for t in part.local_targets}

    def name(self, prefix: str, k: int) -> str:
        return f"{prefix}f_{self.whole.start:x}_c{k}"

    def legal_name(self, prefix: str) -> str:
        """The C function telling whether an address is a legal target of the function's indirect jumps, defined
        once beside chunk 0: a chunk's indirect jump branches to its own targets and leaves for the others through
        it. Each chunk listing every target (a case apiece) made the C of a function with a jump table of n entries
        grow as n times its chunks: 15,000 entries compiled in 75 s, 50,000 not within the compile timeout."""
        return f"{prefix}f_{self.whole.start:x}_legal"

    def legal_prototype(self, prefix: str) -> str:
        return f"BERM_HIDDEN int {self.legal_name(prefix)}(uint64_t t);"


def chunk_plan(info: FunctionInfo, program: Program) -> Chunks | None:
    """The chunks of ``info``, or None when it is small enough to be one C function."""
    insns = info.insns
    if len(insns) <= CHUNKED_ABOVE:
        return None
    cuts = _cuts(insns, CHUNK_INSNS, info.static_targets)
    index = {insn.addr: k for k, insn in enumerate(insns)}
    entries: list[set[int]] = [set() for _ in range(len(cuts) + 1)]

    def chunk(k: int) -> int:
        return bisect.bisect_right(cuts, k)

    if info.start in index:
        entries[0].add(info.start)
    for target in info.local_targets:
        if target in index:
            entries[chunk(index[target])].add(target)
    for k, insn in enumerate(insns):
        for target in _direct_targets(insn, info.static_targets):
            j = index.get(target)
            if j is not None and chunk(j) != chunk(k):
                entries[chunk(j)].add(target)
    bounds = [0, *cuts, len(insns)]
    ranges = [info.start, *(insns[c].addr for c in cuts), info.end]
    parts = tuple(part_of(info, program, ranges[k], ranges[k + 1], insns[bounds[k]:bounds[k + 1]], sorted(entries[k]))
                  for k in range(len(entries)))
    return Chunks(info, parts)


def _direct_targets(insn: Instruction, static_targets: dict[int, int]) -> list[int]:
    """Where ``insn`` sends control without an indirect jump decided at run time: its successors, and the target of
    an unrelaxed ``tail`` to a local target (an ``auipc``/``jalr`` pair)."""
    targets = successors(insn)
    if insn.op == "jalr" and insn.rd == 0 and insn.addr in static_targets:
        targets.append(static_targets[insn.addr])
    return targets


def _cuts(insns: list[Instruction], size: int, static_targets: dict[int, int]) -> list[int]:
    """The indices of the instructions that start chunks 1, 2, ...: each chunk holds at most ``size`` instructions,
    and its cut is where the fewest direct control edges cross, among the second half of its room (the latest of
    those on a tie)."""
    n = len(insns)
    index = {insn.addr: k for k, insn in enumerate(insns)}
    # crossing[c]: the edges between an instruction before index c and one at or after it
    delta = [0] * (n + 2)
    for k, insn in enumerate(insns):
        for target in _direct_targets(insn, static_targets):
            j = index.get(target)
            if j is not None and j != k:
                delta[min(j, k) + 1] += 1
                delta[max(j, k) + 1] -= 1
    crossing, running = [0] * (n + 1), 0
    for c in range(n + 1):
        running += delta[c]
        crossing[c] = running
    cuts, begin = [], 0
    while n - begin > size:
        best = min(range(begin + max(1, size // 2), begin + size + 1), key=lambda c: (crossing[c], -c))
        cuts.append(best)
        begin = best
    return cuts
