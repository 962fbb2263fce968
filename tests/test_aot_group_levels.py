"""A group through sp in a function whose calls of itself run in its C frame is checked once per depth
(BERM_GROUP_LEVEL, berm_aot.emit.frames.same_at_each_depth): every frame at one depth has the same sp there, as long
as each frame's calls of itself are made at one known sp and each nested frame gives its caller back the sp it
found. The guests here break the second half: a nested frame's tail transfer to a function that moves sp and then
returns to the caller's link, after which the caller calls itself again at the moved sp — past the end of guest
memory, or lower in the stack than it has been. The next frame at that depth must not reuse the check the first
one passed: the C frame then goes on in the resume copy, where every group is checked. Each run ends exactly as on
the interpreter, the second run of each (on the same pooled region) included, so a store the level let go
unmarked would show.

``lastcall`` calls itself as its last instruction, so the call's link is the next function's first instruction. The
resume copy's entry lists the links of the function's calls of itself, and must leave for such a link the way the
function does after the call, not jump to a label it does not have (a C compile error: found by tools/fuzz_diff.py
``--mutate 3 --targets 3``, seed 4021, in a function whose resume copy came from its jump table)."""

from __future__ import annotations

from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.traps import TrapKind
from tests import progen
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf
from tests.test_aot_diff import assert_same, run_both
from tests.test_aot_frame_loads import WANDER, function_emitter

#: Where the second call's frame at depth 2 stores its 16 bytes of saves after `sink` moved sp from 0xfffc0 (the
#: innermost frame's) 4 KiB down: inside the stack, below every byte the run stored before, so those stores must
#: lower the stack's low-water mark for the reset to undo them.
SUNK_FRAME = 0xFEFB0

SOURCE = ASM_PRELUDE + r"""
    .globl up, down, plain, skewed, last
    .type up, @function
up:
    li a0, 2
    li a1, 0
    j lrec
    .type down, @function
down:
    li t0, 0xfefb0           # SUNK_FRAME: zero at every start, if the last run's stores there were undone
    ld s2, 0(t0)
    ld s3, 8(t0)
    li a0, 2
    li a1, 1
    j lrec
    .type plain, @function
plain:
    lla t6, .Lptrs           # a relocation in the code, which every image must carry (--emit-relocs)
    li a0, 6
    li a1, 2
    j lrec
    .type skewed, @function
skewed:
    li a0, 5
    j skew
    .type last, @function
last:
    li a0, 3
    j lastcall

# lrec(a0: frames to nest, a1: how the innermost of the first calls leaves: 0 by wander, 1 by sink, 2 by a
# return). Each frame with a0 > 0 calls itself twice, at one sp, with a0 - 1 and then with a0 - 1 and a1 = 2; it
# returns the sum of both and its a0. The restores go through t1, not sp: no load of this function is unchecked,
# so only the checks once per depth need the resume copy.
    .type lrec, @function
lrec:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    beqz a0, .Linner
    mv s0, a0
    addi a0, s0, -1
    jal ra, lrec
    slli t2, s0, 32          # keep the first call's result in s0's upper half
    add s0, t2, s0
    add s0, s0, a0
    srli a0, s0, 32
    addi a0, a0, -1
    li a1, 2
    jal ra, lrec
    slli t2, s0, 32
    srli t2, t2, 32
    add a0, a0, t2
    mv t1, sp
    ld ra, 8(t1)
    ld s0, 0(t1)
    addi sp, sp, 16
    ret
.Linner:
    li t0, 1
    beqz a1, .Lwander
    beq a1, t0, .Lsink
    li a0, 0
    mv t1, sp
    ld ra, 8(t1)
    ld s0, 0(t1)
    addi sp, sp, 16
    ret
.Lwander:
    j wander                 # a tail transfer out of a nested frame, its frame still allocated
.Lsink:
    j sink

# skew: two calls of itself at different sp, so one depth has two sps: no check once per depth.
    .type skew, @function
skew:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    beqz a0, .Lskew_out
    mv s0, a0
    addi a0, a0, -1
    andi t0, s0, 1
    beqz t0, .Lskew_even
    jal ra, skew
    j .Lskew_join
.Lskew_even:
    addi sp, sp, -16
    jal ra, skew
    addi sp, sp, 16
.Lskew_join:
    add a0, a0, s0
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Lskew_out:
    li a0, 0
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret

# lastcall(a0): 1 + 10 per frame. Its call of itself is its last instruction: the nested frame returns into
# after_last, another function, which ends the caller's frame.
    .type lastcall, @function
lastcall:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    bnez a0, .Lcall
    li a0, 1
    j after_last
.Lcall:
    addi a0, a0, -1
    jal ra, lastcall
    .type after_last, @function
after_last:
    addi a0, a0, 10
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret

# sink: moves sp 4 KiB down, inside the stack, and returns.
    .type sink, @function
sink:
    lui t0, 0x1
    sub sp, sp, t0
    li a0, 7
    ret
""" + WANDER

ENTRIES = ("up", "down", "plain", "skewed", "last")


class _Sunk(progen.GenProgram):
    """Also compares the bytes around where `sink` leaves sp."""

    @property
    def snapshot(self) -> tuple[tuple[int, int], ...]:
        return (*super().snapshot, (SUNK_FRAME - 0x100, 0x200))


def _program() -> Program:
    return Program.from_image(read_elf(guest_elf(SOURCE, suffix=".S", keep=ENTRIES)))


def test_a_prologue_is_checked_once_per_depth_only_where_every_call_of_itself_keeps_one_sp():
    program = _program()
    lrec = function_emitter(program, "lrec")
    prologue = lrec.f.insns[1].addr  # sd ra, 8(sp)
    assert set(lrec.levels) == {prologue} and not lrec.unchecked
    assert lrec.tail_resumes and lrec.needs_resume
    code = "\n".join(lrec.emit())
    assert f"BERM_GROUP_LEVEL({lrec.levels[prologue]}, " in code
    skew = function_emitter(program, "skew")
    assert skew.self_calls and not skew.levels
    lastcall = function_emitter(program, "lastcall")
    assert lastcall.levels and lastcall.tail_resumes
    assert not lastcall.f.contains(lastcall.self_calls[0])  # the link is after_last's first instruction


def test_sp_moved_under_a_depth_already_checked_ends_exactly_as_in_the_interpreter():
    program = _program()
    gens = [_Sunk(program.image, program.symbol(name), name) for name in ENTRIES]
    outcomes = {}
    for gen, expected, results in run_both(gens, repeat=2):
        outcomes[gen.listing] = expected
        for got in results:
            assert_same(gen, expected, got)
    # up: the second call's frame at depth 2 stores past the end of memory
    trap = outcomes["up"].trap
    assert trap is not None and trap.kind is TrapKind.MEMORY_FAULT and trap.addr >= progen.MEMORY_SIZE, trap
    # down: that frame stores its saves 4 KiB down the stack, then the caller's restores read through t1 where
    # nothing was saved: ra is 0
    down = outcomes["down"]
    assert down.trap is not None and down.trap.kind is TrapKind.BAD_INDIRECT_TARGET and down.trap.addr == 0, down.trap
    assert down.regs[18] == down.regs[19] == 0
    assert outcomes["plain"].trap is None and outcomes["plain"].a0 == _plain(6)
    assert outcomes["skewed"].trap is None and outcomes["skewed"].a0 == 5 + 4 + 3 + 2 + 1
    assert outcomes["last"].trap is None and outcomes["last"].a0 == 1 + 10 * 4


def _plain(n: int) -> int:
    """What lrec(n, 2) returns."""
    return 0 if n == 0 else 2 * _plain(n - 1) + n
