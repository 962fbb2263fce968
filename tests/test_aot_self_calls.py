"""A function's direct calls to itself run the new frame in the same C frame (berm_aot/emit/function.py,
_self_call): the expected return address of each interrupted frame lives in ctx->shadow (or, with one self-call
site, follows from depth). Everything a frame can do must end exactly as on the reference interpreter — the whole
register file, pc and trap — from any depth: return, trap, hit the depth limit, leave by a direct or an indirect
tail call, return to a forged address. A trap's call chain (TrapInfo.callers) too: translated code records each C
frame's frames as the trap unwinds through it (berm_code.h, berm_trace), the frames of a function calling itself
from one site by depth alone, from several through the links it keeps in ctx->shadow."""

from __future__ import annotations

import time

import pytest

from berm_abi.names import core_number
from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit.dataflow import components
from berm_aot.emit import emit_program
from berm_aot.emit import function as function_module
from berm_aot.program import Program
from berm_host.aot.runtime import lib
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import MAX_CALL_DEPTH, TRACE_KEEP, layout_for
from berm_host.traps import REPEATS_SHOWN, TrapInfo, TrapKind
from tests.bounded import GRACE, ends_within
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long u64;

__attribute__((noinline)) u64 helper(u64 x) { return x * 2 + 1; }
u64 (*volatile helper_ptr)(u64) = helper;

/* plain recursion: the result depends on every frame */
__attribute__((noinline)) u64 rec(u64 n) {
    if (n == 0) return 1;
    return rec(n - 1) * 3 + n;
}

/* recursion that faults n frames deep (a load from address 8) */
__attribute__((noinline)) u64 rec_trap(u64 n, u64 salt) {
    if (n == 0) return *(volatile u64 *)8 + salt;
    return rec_trap(n - 1, salt ^ n) + n;
}

/* n frames deep, leave by a tail call: direct (mode 0) or through a function pointer (mode 1) */
__attribute__((noinline)) u64 rec_tail(u64 n, u64 mode) {
    if (n == 0) {
        if (mode == 0) return helper(mode + 7);
        return helper_ptr(mode + 7);
    }
    return rec_tail(n - 1, mode) * 5 + n;
}

/* n frames deep, jump to `target` with the return address intact (mode 0) or return to it (mode 1), without
   the epilogue */
__attribute__((noinline)) u64 rec_forge(u64 n, u64 target, u64 mode) {
    if (n == 0) {
        if (mode == 0) __asm__ volatile("li a0, 5\n jr %0" :: "r"(target) : "a0");
        __asm__ volatile("mv ra, %0\n ret" :: "r"(target) : "ra");
        __builtin_unreachable();
    }
    return rec_forge(n - 1, target, mode) * 3 + n;
}

/* mutual recursion through a function pointer, with self-recursion inside each step */
u64 bounce(u64 n);
u64 (*volatile bounce_ptr)(u64) = bounce;
__attribute__((noinline)) u64 bounce(u64 n) {
    if (n == 0) return 3;
    if (n % 3 == 0) return bounce_ptr(n - 1) + 1;
    return bounce(n - 1) * 7 + n;
}

/* 2^n calls and not one backward branch (written out: a compiler turns one of two recursive calls into a loop) */
__asm__(".text\n .globl spin\n .type spin, @function\n .p2align 1\n"
        "spin:\n beqz a0, 1f\n addi sp, sp, -16\n sd ra, 8(sp)\n sd a0, 0(sp)\n addi a0, a0, -1\n call spin\n"
        " ld a0, 0(sp)\n addi a0, a0, -1\n call spin\n ld ra, 8(sp)\n addi sp, sp, 16\n1: ret\n"
        " .size spin, .-spin\n");
u64 spin(u64 n);

__attribute__((noinline)) u64 leaf(u64 *p) { return *p + 1; }
__attribute__((noinline)) u64 middle(u64 *p) { return leaf(p) * 3; }
__attribute__((noinline)) u64 outer(u64 *p) { return middle(p) + 7; }

/* n frames deep through two call sites of its own (odd n calls from the first, even n from the second), then
   loads from p, or (tail != 0) leaves the innermost frame by a tail call to leaf(p) */
__asm__(".text\n .globl twice\n .type twice, @function\n .p2align 1\n"
        "twice:\n bnez a0, 1f\n bnez a2, 4f\n ld a0, 0(a1)\n ret\n"
        "4:\n mv a0, a1\n tail leaf\n"
        "1:\n addi sp, sp, -16\n sd ra, 8(sp)\n andi t0, a0, 1\n addi a0, a0, -1\n beqz t0, 2f\n"
        " call twice\n .globl twice_odd\n twice_odd:\n j 3f\n"
        "2:\n call twice\n .globl twice_even\n twice_even:\n"
        "3:\n ld ra, 8(sp)\n addi sp, sp, 16\n ret\n"
        " .size twice, .-twice\n");
u64 twice(u64 n, u64 *p, u64 tail);

u64 pick(u64 i, u64 a, u64 b, u64 c) {
    switch (i) {
    case 0: return rec(a);
    case 1: return rec_trap(a, b);
    case 2: return rec_tail(a, b);
    case 3: return rec_forge(a, b, c);
    case 4: return spin(a);
    default: return bounce(a);
    }
}
"""

NAMES = ("rec", "rec_trap", "rec_tail", "rec_forge", "bounce", "spin", "helper", "pick", "leaf", "middle", "outer",
         "twice")


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    elf = guest_elf(SOURCE, keep=NAMES)
    symbols = {s.name: s.value for s in read_elf(elf).symbols}
    cache = tmp_path_factory.mktemp("cache")
    backends = {kind: Engine(kind=kind, cache_dir=cache).load(elf).backend for kind in ("aot", "interp")}
    return symbols, backends


def run_both(guest, name, *args):
    symbols, backends = guest
    request = RunRequest(entry=symbols[name], int_args=args)
    aot, interp = (backends[k].run(request) for k in ("aot", "interp"))
    assert (aot.trap, aot.pc, aot.failure) == (interp.trap, interp.pc, interp.failure), f"{name}{args}"
    for r in range(32):
        assert aot.regs[r] == interp.regs[r], f"{name}{args}: x{r} aot {aot.regs[r]:#x} vs interp {interp.regs[r]:#x}"
    return aot


@pytest.mark.parametrize("n", [0, 1, 2, 50, 3000])
def test_recursion_returns_through_every_frame(guest, n):
    want = 1
    for k in range(1, n + 1):
        want = (want * 3 + k) % (1 << 64)
    assert run_both(guest, "rec", n).a0 == want


def test_recursion_to_the_depth_limit_traps_the_same(guest):
    result = run_both(guest, "rec", 20000)
    assert result.trap is not None and result.trap.kind == TrapKind.STACK_EXHAUSTED
    # one call site 9,998 times: shown REPEATS_SHOWN times, the rest of the kept frames counted, then the unkept
    site = result.trap.callers[0][1]
    assert {where for _, where in result.trap.callers} == {site} and site.startswith("rec+")
    assert result.trap.chain_lines() == [f"called from {site}"] * REPEATS_SHOWN + [
        f"[the line above repeated {TRACE_KEEP - REPEATS_SHOWN} more times]",
        f"... and {MAX_CALL_DEPTH - 1 - TRACE_KEEP:,} more frames"]


@pytest.mark.parametrize("sites, expected", [
    ("a", ["a"]),
    ("aaa", ["a", "a", "a"]),
    ("aaaa", ["a", "a", "a", "[the line above repeated 1 more time]"]),
    ("abbbbbba", ["a", "b", "b", "b", "[the line above repeated 3 more times]", "a"]),
    ("aaaaabbbb", ["a", "a", "a", "[the line above repeated 2 more times]", "b", "b", "b",
                   "[the line above repeated 1 more time]"]),
])
def test_a_chain_counts_a_line_repeated_more_than_three_times_in_a_row(sites, expected):
    info = TrapInfo(TrapKind.STACK_EXHAUSTED, pc=0x1000, callers=tuple((0x2000, f"f_{s}+0x8") for s in sites))
    assert info.chain_lines() == [(e if e.startswith("[") else f"called from f_{e}+0x8") for e in expected]


@pytest.mark.parametrize("n", [0, 1, 7, 400])
def test_a_fault_deep_in_the_recursion_leaves_the_interpreters_registers(guest, n):
    result = run_both(guest, "rec_trap", n, 0x1234)
    assert result.trap is not None and result.trap.kind == TrapKind.MEMORY_FAULT and result.trap.addr == 8


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("n", [0, 1, 9, 200])
def test_a_tail_call_out_of_a_nested_frame_returns_into_it(guest, n, mode):
    want = (mode + 7) * 2 + 1
    for k in range(1, n + 1):
        want = (want * 5 + k) % (1 << 64)
    assert run_both(guest, "rec_tail", n, mode).a0 == want


@pytest.mark.parametrize("n", [0, 1, 5])
def test_a_jump_or_a_forged_return_from_a_nested_frame(guest, n):
    symbols, _ = guest
    # a jump to a legal function entry, ra intact: helper(5) runs as the frame's continuation and returns to its
    # link; the frame skipped its epilogue, so with frames above it their sp is 16 bytes low and the next one up
    # returns to a stale address
    jumped = run_both(guest, "rec_forge", n, symbols["helper"], 0)
    if n == 0:
        assert jumped.trap is None and jumped.a0 == 11
    else:
        assert jumped.trap is not None and jumped.trap.kind == TrapKind.BAD_INDIRECT_TARGET
    # the middle of a function, data and 0, jumped or returned to: bad targets, except that 0 is the top frame's
    # own return address (the run's)
    for mode in (0, 1):
        for target in (symbols["rec_forge"] + 2, symbols["helper_ptr"], 0):
            result = run_both(guest, "rec_forge", n, target, mode)
            if n == 0 and target == 0:
                assert result.trap is None
            else:
                assert result.trap is not None and result.trap.kind == TrapKind.BAD_INDIRECT_TARGET


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 100])
def test_recursion_mixed_with_calls_through_a_pointer(guest, n):
    run_both(guest, "bounce", n)


def test_a_fault_two_calls_deep_names_both_callers(guest):
    trap = run_both(guest, "outer", 0).trap
    assert trap.kind is TrapKind.MEMORY_FAULT and trap.where.split("+")[0] == "leaf"
    assert [where.split("+")[0] for _, where in trap.callers] == ["middle", "outer"] and trap.unkept == 0
    assert trap.chain_lines() == [f"called from {trap.callers[0][1]}", f"called from {trap.callers[1][1]}"]
    entry = run_both(guest, "leaf", 0).trap  # the entry frame is no caller
    assert entry.kind is TrapKind.MEMORY_FAULT and entry.callers == () and entry.chain_lines() == []


@pytest.mark.parametrize("tail", [0, 1])
@pytest.mark.parametrize("n", [1, 2, 5, TRACE_KEEP, TRACE_KEEP + 1, 300])
def test_the_call_chain_of_a_fault_deep_in_recursion_through_two_call_sites(guest, n, tail):
    """With ``tail`` the innermost frame is left by a tail call, and the function it reached (leaf) faults as that
    frame's continuation: the frame is on the chain once."""
    symbols, _ = guest
    trap = run_both(guest, "twice", n, 0, tail).trap
    assert trap.kind is TrapKind.MEMORY_FAULT and trap.addr == 0
    assert trap.where.split("+")[0] == ("leaf" if tail else "twice")
    # the frame started at depth k + 1 resumes after the call site its parent (which had n = k) used
    chain = [symbols["twice_odd"] if k % 2 else symbols["twice_even"] for k in range(1, n + 1)]
    assert [link for link, _ in trap.callers] == chain[:TRACE_KEEP] and trap.unkept == max(n - TRACE_KEEP, 0)


def test_the_depth_limit_reports_how_many_frames_of_the_chain_it_did_not_keep(guest):
    trap = run_both(guest, "twice", MAX_CALL_DEPTH + 5, 0, 0).trap
    assert trap.kind is TrapKind.STACK_EXHAUSTED
    # the entry frame and MAX_CALL_DEPTH - 1 nested ones: every nested one is a caller of the next
    assert len(trap.callers) == TRACE_KEEP and trap.unkept == MAX_CALL_DEPTH - 1 - TRACE_KEEP
    assert trap.chain_lines()[-1] == f"... and {MAX_CALL_DEPTH - 1 - TRACE_KEEP:,} more frames"


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_the_deadline_stops_recursion_that_never_loops(kind, tmp_path):
    """A frame started by a self-call polls the interrupt flag as a function entry does: ``spin(30)`` makes 2^30
    calls without a single backward branch and must end in the deadline's trap."""
    elf = guest_elf(SOURCE, keep=NAMES)
    entry = next(s.value for s in read_elf(elf).symbols if s.name == "spin")
    backend = Engine(kind=kind, cache_dir=tmp_path).load(elf).backend
    result = ends_within(GRACE, lambda: backend.run(RunRequest(entry=entry, int_args=(30,),
                                                                deadline=time.monotonic() + 0.3)))
    assert result.trap is not None and result.trap.kind == TrapKind.INTERRUPTED


INTERRUPTED_AT_A_SELF_CALL = ASM_PRELUDE + r"""
    .globl selfrec
    .type selfrec, @function
selfrec:                    # a0 = 0: log (the host interrupts this run then), then call itself with a0 = 1
    bnez a0, .Lout
    mv a0, sp
    li a1, 1
    li a7, %d
    ecall
    li a0, 1
    addi sp, sp, -16
    sd ra, 8(sp)
    li ra, 0x1234
    jal ra, selfrec
.Llink:
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
.Lout:
    ret
""" % core_number("berm.log")


def test_an_interrupt_seen_at_a_self_call_shows_the_written_link(tmp_path):
    """The interrupt is noticed by the self-call's check (BERM_SELF_CALL): the trap is at the callee's first
    instruction, so the call has run and ra holds its link — as the interpreter would show — not what it held
    before (a regression: the fused check once polled before writing the link), and the frame it entered is on the
    call chain (it was once entered after the check). The host's log callback interrupts the run, so the moment is
    exact."""
    elf = guest_elf(INTERRUPTED_AT_A_SELF_CALL, suffix=".S", keep=("selfrec",))
    program = Program.from_image(read_elf(elf))
    regions = []

    def interrupt(*_):
        lib.berm_interrupt(regions[0].ptr, regions[0].ptr.generation)

    backend = Engine(kind="aot", cache_dir=tmp_path).load(elf).backend
    entry = program.symbol("selfrec")
    backend.run(RunRequest(entry=entry, int_args=(1,)))  # makes the region the next run uses
    regions.append(backend.memory.pool[-1])
    result = backend.run(RunRequest(entry=entry, int_args=(0,), log=interrupt))
    assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED
    link = next(a for a, i in sorted(program.code.items()) if i.op == "jal" and i.rd == 1) + 4
    assert result.pc == entry and result.regs[1] == link
    assert result.trap.callers == ((link, program.symbolize(link - 4)),)  # named where the call was made


NEVER_RETURNS = ASM_PRELUDE + r"""
    .globl by_jal, after_jal, by_cjalr, after_cjalr, dies
    .type by_jal, @function
by_jal:                     # its last instruction is a call that never returns
    addi sp, sp, -16
    sd ra, 8(sp)
    jal ra, dies
    .type after_jal, @function
after_jal:                  # where that call would return
    ret
    .type by_cjalr, @function
by_cjalr:                   # the same through a 2-byte c.jalr
    addi sp, sp, -16
    sd ra, 8(sp)
    la t1, dies
    c.jalr t1
    .type after_cjalr, @function
after_cjalr:
    ret
    .type dies, @function
dies:
    ebreak
"""


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("caller, call_size", [("by_jal", 4), ("by_cjalr", 2)])
def test_a_call_that_never_returns_is_named_where_it_was_made(kind, caller, call_size, tmp_path):
    """A call that is its function's last instruction (a panic, ``berm_panic``) returns, were it to, to the start of
    the next function. The chain named that function (a Rust panic showed ``called from
    core::panicking::assert_failed`` for a panic in a tool); it names the call now."""
    elf = guest_elf(NEVER_RETURNS, suffix=".S", keep=("by_jal", "after_jal", "by_cjalr", "after_cjalr", "dies"))
    program = Program.from_image(read_elf(elf))
    backend = Engine(kind=kind, cache_dir=tmp_path).load(elf).backend
    trap = backend.run(RunRequest(entry=program.symbol(caller))).trap
    assert trap.kind is TrapKind.BREAKPOINT and trap.where == "dies"
    link = program.symbol(f"after_{caller[3:]}")
    assert trap.callers == ((link, f"{caller}+{link - call_size - program.symbol(caller):#x}"),)
    assert trap.chain_lines() == [f"called from {caller}+{link - call_size - program.symbol(caller):#x}"]


LOOPS_AROUND_SELF_CALLS = ASM_PRELUDE + r"""
    .globl through, around, switching
    .type through, @function
through:                    # a0 = 0: forever call itself with a0 = 1 (which returns at once), then jump back
    bnez a0, .Lthrough_out
    addi sp, sp, -16
    sd ra, 8(sp)
.Lthrough_loop:
    li a0, 1
    jal ra, through
    j .Lthrough_loop
.Lthrough_out:
    ret
    .type around, @function
around:                     # a0 = 0: forever jump back, calling itself only when a1 != 0 (the test passes 0)
    bnez a0, .Laround_out
    addi sp, sp, -16
    sd ra, 8(sp)
.Laround_loop:
    beqz a1, .Laround_skip
    li a0, 1
    jal ra, around
.Laround_skip:
    j .Laround_loop
.Laround_out:
    ret
    .type switching, @function
switching:                  # a0 = 0: forever jump through a table to its one case, which jumps back; it calls
    bnez a0, .Lswitching_out    # itself only when a1 != 0 (the test passes 0)
    addi sp, sp, -16
    sd ra, 8(sp)
    beqz a1, .Lswitching_loop
    li a0, 1
    jal ra, switching
.Lswitching_loop:
    la t0, .Lswitching_table
    ld t1, 0(t0)
    jr t1
.Lswitching_case:
    j .Lswitching_loop
.Lswitching_out:
    ret
    .section .rodata
.Lswitching_table:
    .dword .Lswitching_case
"""


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    elf = guest_elf(LOOPS_AROUND_SELF_CALLS, suffix=".S", keep=("through", "around", "switching"))
    program = Program.from_image(read_elf(elf))
    code = "\n".join(emit_program(program, windows=layout_for(program.image).windows()))
    cache = tmp_path_factory.mktemp("cache")
    backends = {kind: Engine(kind=kind, cache_dir=cache).load(elf).backend for kind in ("aot", "interp")}
    return program, code, backends


def _back_edge(program: Program, function: str) -> int:
    """The address of the last ``jal x0`` (a ``j``) in ``function``: its loop's back-edge."""
    info = analyse(program).by_start[program.symbol(function)]
    return max(i.addr for i in info.insns if i.op == "jal" and i.rd == 0)


@pytest.mark.parametrize("function, polls", [("through", False), ("around", True), ("switching", True)])
def test_a_back_edge_polls_only_where_a_cycle_passes_no_self_call(loops, function, polls):
    """A loop whose every cycle calls the function itself needs no poll of its own: the self-call's check sees an
    interrupt. One with a path around the self-call still polls at its back-edge, and so does one that goes round
    through a jump table (found by tools/fuzz_diff.py: the table's dispatch branches to its case without a poll, and
    the back-edge had lost its own, so the loop ran past every deadline)."""
    program, code, _ = loops
    assert (f"BERM_POLL({_back_edge(program, function):#x}ull)" in code) is polls


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("function", ["through", "around", "switching"])
def test_the_deadline_stops_a_loop_around_a_self_call(loops, kind, function):
    """The loops run forever and end in the deadline's trap. Translated code sees it in ``through`` at the
    self-call, in the others, which never make one, at the back-edge."""
    program, _, backends = loops
    request = RunRequest(entry=program.symbol(function), int_args=(0, 0), deadline=time.monotonic() + 0.3)
    result = ends_within(GRACE, lambda: backends[kind].run(request))
    assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED


CASES = 300
#: ``cases`` calls itself and then jumps through a table of CASES entries, each case ``jr`` again: CASES indirect
#: jumps and CASES local targets in one function that calls itself.
MANY_JUMPS_AND_CASES = ASM_PRELUDE + r"""
    .globl cases
    .type cases, @function
cases:
    addi sp, sp, -16
    sd ra, 8(sp)
    beqz a0, 1f
    addi a0, a0, -1
    call cases
1:
    la a1, .Lcases_table
    ld a1, 0(a1)
    jr a1
""" + "".join(f".Lcase{k}:\n    addi a0, a0, 1\n    jr a1\n" for k in range(CASES)) + """
    .section .rodata
.Lcases_table:
""" + "".join(f"    .dword .Lcase{k}\n" for k in range(CASES))


def test_the_self_call_cycle_search_grows_with_jumps_plus_targets(monkeypatch):
    """Found by a review of the search for cycles without a self-call: it gave each indirect jump an edge to each
    local target, so n jumps and m cases made n × m edges (500, 1,000 and 2,000 of each: 0.13, 0.45 and 1.69 s to
    translate one function, and an image may hold hundreds). They now pass through one node
    (dataflow.ANY_TARGET): n + m. Counted in the graph the search is given, not timed."""
    sizes = []

    def counting(graph):
        sizes.append(sum(map(len, graph.values())))
        return components(graph)

    program = Program.from_image(read_elf(guest_elf(MANY_JUMPS_AND_CASES, suffix=".S", keep=("cases",))))
    info = analyse(program).by_start[program.symbol("cases")]
    assert len(info.local_targets) >= CASES
    monkeypatch.setattr(function_module, "components", counting)
    emit_program(program, windows=layout_for(program.image).windows())
    assert sizes and max(sizes) <= 2 * (len(info.insns) + len(info.local_targets))
