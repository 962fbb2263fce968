"""The resume copy finishing nested self-call frames (berm_aot/emit/function.py: ``_self_call``, ``_nested_exits``,
``_indirect_block``, ``resume=True``), where test_aot_resume.py and test_aot_self_calls.py leave gaps:

- a function with several self-call sites keeps the expected link of each interrupted frame in ctx->shadow and
  the current one in ``exp_``: entering the resume copy from a nested frame must hand over that frame's ``exp_``
  and the C frame's own ``depth0_``, or the frames above it return to the wrong site (or skip returning at all).
  test_aot_resume.py's recursive guest has one self-call site, where depth alone names the link;
- an infinite loop reachable only in the resume copy must still poll the interrupt flag (a deadline ends it);
- recursion without end that starts in the resume copy (its frames are self-calls inside the resume copy) must hit
  the call-depth limit exactly where the interpreter does.

One hand-written guest, ``walk``, serves all three. It recurses through one of two call sites per frame, and each
frame then dispatches twice through a one-entry jump table inside a loop (so it gets a resume copy). The chosen
frame reads past that table into the next ones, each a legal local target the jump does not expect: a case that
returns normally, a loop that never ends, or a third self-call site that recurses for ever.
``test_walk_is_translated_with_a_resume_copy`` checks that the translation really has those expectations, so the
other tests cannot silently stop taking the resume path. Every outcome is compared with the interpreter's, the
whole register file included, except an interrupt's, whose timing differs between engines.

Broken on purpose in berm_aot/emit/function.py, the translation fails these tests: the registers not stored before
the resume copy is entered, the copy given the current depth as depth0 or the C frame's ``ret`` as ``exp``, unexpected
targets sent to the trap, no interrupt poll on the copy's back-edges, no shadow kept by its self-calls, a wrong depth
limit at its self-calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit import emit_program
from berm_aot.emit.function import FunctionEmitter, resume_name
from berm_aot.emit.sites import jump_targets
from berm_aot.program import Program
from berm_host.backend import Backend, RunRequest, RunResult
from berm_host.engine import Engine
from berm_host.layout import DEPTH_DETAIL, layout_for
from berm_host.traps import TrapKind
from tests.bounded import ends_within
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf

SOURCE = ASM_PRELUDE + r"""
    .globl walk
# walk(a0: n, a1: sites, a2: overrun_at, a3: overrun index) -> a0
# Frame n > 0 calls walk(n - 1) from site B when bit n of `sites` is set, else from site A, and scales the result
# by 5 (B) or 3 (A); frame 0 starts from 1. Every frame then adds n and runs two rounds through table C (+3 each).
# The frame whose n is `overrun_at` reads its first round's entry at `overrun index` instead of 0: past table C.
# a1, a2 and a3 are never written, so every frame sees the same ones.
    .type walk, @function
walk:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    mv s0, a0
    beqz s0, .Lleaf
    addi a0, s0, -1
    srl t0, a1, s0
    andi t0, t0, 1
    bnez t0, .LsiteB
    jal ra, walk            # site A
    slli t1, a0, 1
    add a0, a0, t1
    j .Ldispatch
.LsiteB:
    jal ra, walk            # site B
    slli t1, a0, 2
    add a0, a0, t1
    j .Ldispatch
.Lleaf:
    li a0, 1
.Ldispatch:
    add a0, a0, s0
    li t5, 2
    li t4, 0
    bne s0, a2, .Lround
    mv t4, a3
.Lround:
    lla t3, .LtabC
    lla t6, .LtabD          # the tables past C start where code takes their address, so C has one entry
    lla t6, .LtabE
    lla t6, .LtabF
    slli t1, t4, 3
    add t1, t1, t3
    ld t2, 0(t1)
    jr t2
.LC0:                       # the only case the jump expects
    addi a0, a0, 3
    j .Lnext
.LD0:                       # index 1: a case of table D, finishing the frame as usual
    slli a0, a0, 1
    addi a0, a0, 7
    j .Lnext
.LE0:                       # index 2: a loop that never ends
    addi t6, t6, 1
    j .LE0
.LF0:                       # index 3: walk(n) again, from a third site, which overruns here again: no end
    mv a0, s0
    jal ra, walk
.Lnext:
    li t4, 0
    addi t5, t5, -1
    bnez t5, .Lround
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret

    .section .rodata
    .p2align 3
.LtabC:
    .quad .LC0
.LtabD:
    .quad .LD0
.LtabE:
    .quad .LE0
.LtabF:
    .quad .LF0
"""

KINDS = ("aot", "interp")
MASK = 2**64 - 1
#: the overrun indices: which table past C the chosen frame's first round reads
RETURNS, SPINS, RECURSES = 1, 2, 3
#: `sites` masks: every frame calls from site A, from site B, or alternately
ALL_A, ALL_B, ALTERNATE = 0, MASK, 0xAAAA_AAAA_AAAA_AAAA
#: an overrun_at no frame has
NOWHERE = MASK
#: seconds a run that should end may take (each ends in under a second alone; 5 s was not enough on a 2-core machine
#: at load 12): a translation that loops must fail, not hang
DEADLINE = 30.0


@dataclass(frozen=True)
class Guest:
    elf: bytes
    entry: int
    backends: dict[str, Backend]


@pytest.fixture(scope="module")
def guest(tmp_path_factory) -> Guest:
    elf = guest_elf(SOURCE, suffix=".S", keep=("walk",))
    entry = next(s.value for s in read_elf(elf).symbols if s.name == "walk")
    cache = tmp_path_factory.mktemp("cache")
    return Guest(elf, entry, {kind: Engine(kind=kind, cache_dir=cache).load(elf).backend for kind in KINDS})


def walk(guest: Guest, kind: str, n: int, sites: int, overrun_at: int = NOWHERE, index: int = 0,
         deadline: float | None = None) -> RunResult:
    """``walk(n, sites, overrun_at, index)`` on one engine."""
    request = RunRequest(entry=guest.entry, int_args=(n, sites, overrun_at, index), deadline=deadline)
    return guest.backends[kind].run(request)


def walk_both(guest: Guest, *args: int) -> RunResult:
    """``walk`` on both engines, which must end identically (trap, pc, failure, every register); the AOT result."""
    aot, interp = (walk(guest, kind, *args, deadline=time.monotonic() + DEADLINE) for kind in KINDS)
    assert (aot.trap, aot.pc, aot.failure) == (interp.trap, interp.pc, interp.failure), f"walk{args}"
    for r in range(32):
        assert aot.regs[r] == interp.regs[r], f"walk{args}: x{r} aot {aot.regs[r]:#x} vs interp {interp.regs[r]:#x}"
    return aot


def expected_walk(n: int, sites: int, overrun_at: int = NOWHERE) -> int:
    """What ``walk(n, sites, overrun_at, RETURNS)`` returns, computed from its comment."""
    value = 1
    for k in range(n + 1):
        if k:
            value *= 5 if sites >> k & 1 else 3
        value += k
        for index in ((RETURNS if k == overrun_at else 0), 0):
            value = value + 3 if index == 0 else value * 2 + 7
        value &= MASK
    return value


def test_walk_is_translated_with_a_resume_copy(guest):
    """The premises of the other tests: ``walk`` has several self-call sites (so interrupted frames keep their links
    in ctx->shadow), its table jump expects table C's one case and none of the overrun targets, and the emitted C
    has its resume copy."""
    program = Program.from_image(read_elf(guest.elf))
    analysis = analyse(program)
    info = next(f for f in analysis.functions if f.func.name == "walk")
    assert len(FunctionEmitter(analysis, info, "").self_calls) == 3
    expected = jump_targets(info, analysis.jump_tables, program.image)
    assert expected is not None
    table_jumps = [targets for addr, targets in expected.items() if program.instruction(addr).rs1 != 1]
    assert len(table_jumps) == 1 and len(table_jumps[0]) == 1
    overrun_targets = set(info.local_targets) - set(table_jumps[0])
    assert len(overrun_targets) == 3  # .LD0, .LE0, .LF0: each reached only through the resume copy
    source = "".join(emit_program(program, windows=layout_for(program.image).windows()))
    assert f"{resume_name('', info.start)}(berm_ctx *ctx" in source  # the copy is defined…
    assert f"return {resume_name('', info.start)}(ctx" in source  # …and entered from walk


@pytest.mark.parametrize("sites", [ALL_A, ALL_B, ALTERNATE], ids=["site_a", "site_b", "alternate"])
@pytest.mark.parametrize("n, overrun_at", [(3, 0), (3, 2), (3, 3), (6, 0), (6, 4), (6, NOWHERE)])
def test_an_unexpected_target_in_a_nested_frame_finishes_every_frame(guest, n, sites, overrun_at):
    """The frame ``overrun_at`` (0: the innermost, ``n``: the outermost, which is the C frame's own; NOWHERE: no
    overrun, the baseline) jumps to table D's case: the resume copy finishes it and returns through every frame
    above it, each to the call site that started it."""
    result = walk_both(guest, n, sites, overrun_at, RETURNS)
    assert result.trap is None and result.pc == 0
    assert result.a0 == expected_walk(n, sites, overrun_at)


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_reached_only_in_the_resume_copy_ends_at_the_deadline(guest, kind):
    """Frame 1 of 4 overruns into a loop without end: only the deadline stops it. The timing of an interrupt differs
    between engines, so only its kind is compared; then the same image takes the same path into the resume copy
    again, to a case that returns, undisturbed."""
    result = ends_within(DEADLINE, lambda: walk(guest, kind, 4, ALTERNATE, 1, SPINS, deadline=time.monotonic() + 0.3))
    assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED, result.trap
    after = walk(guest, kind, 4, ALTERNATE, 1, RETURNS, deadline=time.monotonic() + DEADLINE)
    assert after.trap is None and after.a0 == expected_walk(4, ALTERNATE, 1)


@pytest.mark.parametrize("sites", [ALL_A, ALTERNATE], ids=["site_a", "alternate"])
@pytest.mark.parametrize("n, overrun_at", [(0, 0), (5, 0), (5, 3)])
def test_recursion_without_end_inside_the_resume_copy_is_stack_exhausted(guest, n, sites, overrun_at):
    """Frame ``overrun_at`` overruns into a call of walk(overrun_at) that overruns the same way, so from then on the
    resume copy calls itself (frames below ``overrun_at`` still return each time) until the call-depth limit."""
    result = walk_both(guest, n, sites, overrun_at, RECURSES)
    assert result.trap is not None and result.trap.kind is TrapKind.STACK_EXHAUSTED, result.trap
    assert result.trap.detail == DEPTH_DETAIL
