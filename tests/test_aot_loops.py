"""Counted loops check their accesses once per entry, for all of their iterations (berm_aot/emit/loops.py), and run
a second, unchecked copy when every range passed. With the loop's range at every edge of every window — data,
read-only data, the heap's end at the guard, the stack, 0, near 2^64 — in both directions, with the step before and
after the access, each loop must end exactly as on the reference interpreter (the iterations before a faulting
access have run, the trap names it), and what a loop stored must be gone in the next run."""

from __future__ import annotations

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit.function import FunctionEmitter
from berm_aot.emit.loops import counted_loops
from berm_aot.isa import Instruction
from berm_aot.program import Program
from berm_host.backend import RunRequest
from tests.edge_runs import LOW, TOP, both_engines, outcome
from tests.guests import guest_elf

#: (name, setup, loop body): t0 = the first argument (an address), t1 = the second (a count); each loop adds what
#: it loads into t4, and stores t6 = 0x5a5a...; the result is t4.
LOOPS = [
    # up by 4, the step after the access; the exit compares the pointer itself with t0 + 4 * count
    ("up_after", "slli t2, t1, 2\\n add t2, t2, t0", "lw t3, 0(t0)\\n add t4, t4, t3\\n addi t0, t0, 4\\n bne t0, t2, 1b"),
    # the step before the accesses, which reach behind and ahead of the pointer
    ("up_before", "slli t2, t1, 2\\n add t2, t2, t0",
     "addi t0, t0, 4\\n lw t3, -4(t0)\\n lbu t5, 9(t0)\\n add t4, t4, t3\\n add t4, t4, t5\\n bne t2, t0, 1b"),
    # down by 8
    ("down", "slli t2, t1, 3\\n sub t2, t0, t2", "addi t0, t0, -8\\n ld t3, 0(t0)\\n add t4, t4, t3\\n bne t0, t2, 1b"),
    # a counter ends the loop; the pointer that stores steps by 8 beside it
    ("stores", "mv t5, t1",
     "sd t6, 0(t0)\\n ld t3, 0(t0)\\n add t4, t4, t3\\n addi t0, t0, 8\\n addi t5, t5, -1\\n bnez t5, 1b"),
    # a base the loop leaves alone
    ("fixed", "mv t5, t1", "ld t3, 8(t0)\\n sd t3, 16(t0)\\n add t4, t4, t3\\n addi t5, t5, -1\\n bnez t5, 1b"),
    # bytes, across pages
    ("bytes", "add t2, t0, t1", "sb t6, 0(t0)\\n lbu t3, 0(t0)\\n add t4, t4, t3\\n addi t0, t0, 1\\n bne t0, t2, 1b"),
    # never reaches its bound (t0 + 4 * count + 2): the trip count is unknown, every access is checked
    ("odd", "slli t2, t1, 2\\n add t2, t2, t0\\n addi t2, t2, 2",
     "lw t3, 0(t0)\\n add t4, t4, t3\\n addi t0, t0, 4\\n bne t0, t2, 1b"),
]

SOURCE = "typedef unsigned long u64;\n" + "\n".join(
    f"""u64 {name}(u64 base, u64 count) {{
    u64 out;
    __asm__ volatile("mv t0, %1\\n mv t1, %2\\n li t4, 0\\n li t6, 0x5a5a5a5a5a5a5a5a\\n {setup}\\n 1:\\n {body}\\n mv %0, t4"
                     : "=r"(out) : "r"(base), "r"(count) : "t0", "t1", "t2", "t3", "t4", "t5", "t6", "memory");
    return out;
}}""" for name, setup, body in LOOPS) + """
/* A group through sp before a counted loop, then in the loop a group through a register the loop loads: both
   groups' flags are g0_, each set in its own block. */
u64 chase(u64 base, u64 count) {
    u64 out;
    __asm__ volatile("mv t0, %1\\n mv t1, %2\\n li t4, 0\\n addi sp, sp, -16\\n sd t0, 0(sp)\\n sd t1, 8(sp)\\n"
                     " slli t2, t1, 3\\n add t2, t2, t0\\n"
                     " 1:\\n ld t5, 0(t0)\\n ld t3, 0(t5)\\n ld t6, 8(t5)\\n add t4, t4, t3\\n add t4, t4, t6\\n"
                     " addi t0, t0, 8\\n bne t0, t2, 1b\\n addi sp, sp, 16\\n mv %0, t4"
                     : "=r"(out) : "r"(base), "r"(count) : "t0", "t1", "t2", "t3", "t4", "t5", "t6", "memory");
    return out;
}
u64 pointers[4] = {0x100, 0x100, 0x100, 0x100};  /* below the image: every access through them faults */
u64 data_area[2048] = {[2047] = 1};  /* in .data, zero where the tests read */
const u64 ro_area[512] = {2};
u64 (*const loops[])(u64, u64) = {chase, """ + ", ".join(name for name, _, _ in LOOPS) + """};  /* relocations */
void _start(void) {}
"""

NAMES = tuple(name for name, _, _ in LOOPS)


@pytest.fixture(scope="module")
def elf():
    return guest_elf(SOURCE, keep=("data_area", "ro_area", "loops", "chase", "pointers", *NAMES))


@pytest.fixture(scope="module")
def engines(elf, tmp_path_factory):
    return both_engines(elf, tmp_path_factory.mktemp("cache"))


def edges(symbols, layout) -> list[int]:
    return sorted({symbols["data_area"], symbols["data_area"] + 8 * 2048, symbols["ro_area"], layout.image_lo,
                   layout.writable_lo, layout.heap_start, layout.guard_lo, LOW, TOP})


def test_every_loop_here_is_a_counted_loop(elf):
    """Else the tests below would only test the per-access checks."""
    program = Program.from_image(read_elf(elf))
    analysis = analyse(program)
    for name in NAMES:
        info = analysis.by_start[program.symbol(name)]
        loops = FunctionEmitter(analysis, info, "").loops
        assert len(loops) == 1, name
        assert all(g.members for loop in loops.values() for g in loop.groups)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "odd"])
def test_loop_at_every_edge_matches_the_interpreter(engines, name):
    symbols, layout, backends = engines
    results = []
    for edge in edges(symbols, layout):
        for count in (1, 2, 3, 7):
            # the loop's range starting, ending or straddling the edge, byte by byte
            for base in range(edge - 8 * count - 24, edge + 8 * count + 25):
                request = RunRequest(entry=symbols[name], int_args=(base % 2**64, count))
                got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
                assert got == want, f"{name} base={base % 2**64:#x} count={count}: aot {got} vs interp {want}"
                results.append(got)
    assert any(r[1] is None for r in results) and any(r[1] is not None for r in results)  # edges really straddle


@pytest.mark.parametrize("base", [0, 8, 2**64 - 8, 2**64 - 4096])
@pytest.mark.parametrize("name", ["up_after", "down", "stores", "bytes"])
def test_loop_wrapping_around_the_address_space_traps_as_the_interpreter(engines, name, base):
    symbols, _, backends = engines
    request = RunRequest(entry=symbols[name], int_args=(base, 4096))
    got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
    assert got == want and got[1] is not None


def test_a_loop_whose_trip_count_is_unknown_traps_as_the_interpreter(engines):
    """``odd`` never meets its bound: it runs until an access faults, every access checked."""
    symbols, layout, backends = engines
    for end in (layout.guard_lo, TOP):  # where loads going up meet a fault soon
        for base in range(end - 64, end + 4):
            request = RunRequest(entry=symbols["odd"], int_args=(base, 5))
            got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
            assert got == want and got[1] is not None, f"odd base={base:#x}: aot {got} vs interp {want}"


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("name", ["stores", "bytes", "fixed"])
def test_stored_by_a_loop_is_gone_in_the_next_run(engines, kind, name):
    symbols, layout, backends = engines
    backend = backends[kind]
    spots = [symbols["data_area"] + 8, layout.heap_start + 4000, layout.guard_lo - 3 * 4096 - 8, LOW + 2048,
             TOP - 3 * 4096]
    count = 3 * 4096 // (1 if name == "bytes" else 8) if name != "fixed" else 5  # three pages and more
    for base in spots:
        result = backend.run(RunRequest(entry=symbols[name], int_args=(base, count)))
        assert result.trap is None, (name, hex(base), result.trap)
    for base in spots:
        result = backend.run(RunRequest(entry=symbols["up_after"], int_args=(base, 3 * 4096 // 4)))
        assert result.trap is None and result.a0 == 0, f"{name}: stale bytes from {base:#x}"


def test_a_group_inside_a_counted_loop_is_checked_in_both_copies(engines):
    """Found in review: the loop's second copy left out the checks of groups not its own, so a member ran on the
    flag another block had set (here the one through sp before the loop) — an access through a loaded pointer
    with no check at all. Both engines must trap at the first access through the bad pointer."""
    symbols, _, backends = engines
    request = RunRequest(entry=symbols["chase"], int_args=(symbols["pointers"], 4))
    got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
    assert want[1] is not None and want[1][2] == 0x100
    assert got == want


def test_a_run_of_branches_to_one_head_is_one_loop():
    """Found by a review: every backward branch's body was checked anew, quadratic in a run of 64K branches to one
    head (3.3 s). Only the first closes a counted loop (the others have it in their bodies); finding that is one
    pass now, so 150,000 of them take a fraction of a second (and a return of the quadratic scan, hours)."""
    head = 0x10000
    insns = [Instruction(head, 4, 0, "ld", rd=7, rs1=5), Instruction(head + 4, 4, 0, "addi", rd=5, rs1=5, imm=8)]
    insns += [Instruction(head + 8 + 4 * k, 4, 0, "bne", rs1=5, rs2=6, imm=-(8 + 4 * k)) for k in range(150_000)]
    loops = counted_loops(insns, {head}, {i.addr: True for i in insns}, {})
    assert list(loops) == [head] and loops[head].branch == head + 8 and loops[head].step == 8


def test_a_loop_writing_its_counter_bound_or_a_base_otherwise_is_checked_access_by_access():
    """A loop is counted only when its induction variable is written once in it (by its ``addi``) and its bound not
    at all, and a loop group's base is one the loop steps or leaves alone: else the trip count or the range the
    entry checks is not the loop's. Here ``t0`` steps by -4 and then by 8; the bound ``t2`` moves too; a base ``t5``
    is loaded in the loop (valid at entry, then a pointer below the image): in each, a load lies below the image,
    where both engines must trap at it (a mutation review: a translator taking any of them for a counted loop or a
    loop group checked a range that missed that load at entry, and ran it unchecked)."""
    from berm_host.layout import layout_for
    from tests import progen
    from tests.rvenc import Label, Op, li
    from tests.test_aot_diff import assert_same, run_both

    T0, T2, T3, T4, T5 = 5, 7, 28, 29, 30
    twice = [Label(".l"), Op("addi", rd=T0, rs1=T0, imm=-4), Op("lw", rd=T3, rs1=T0), Op("add", rd=T4, rs1=T4, rs2=T3),
             Op("addi", rd=T0, rs1=T0, imm=8), Op("bne", rs1=T0, rs2=T2, target=".l")]
    moving = [Label(".l"), Op("lw", rd=T3, rs1=T0), Op("add", rd=T4, rs1=T4, rs2=T3), Op("addi", rd=T0, rs1=T0, imm=-4),
              Op("addi", rd=T2, rs1=T2, imm=-2), Op("bne", rs1=T0, rs2=T2, target=".l")]
    loaded = [Label(".l"), Op("ld", rd=T5, rs1=T0), Op("lw", rd=T3, rs1=T5), Op("add", rd=T4, rs1=T4, rs2=T3),
              Op("addi", rd=T0, rs1=T0, imm=8), Op("bne", rs1=T0, rs2=T2, target=".l")]
    lo = layout_for(progen.build_image([progen.Function("f0", [Op("jalr", rs1=1)])]), progen.MEMORY_SIZE).image_lo
    gens, faults = [], []
    for base in (lo, lo + 64):
        # twice: four loads from base - 4 up; moving: four loads from base + 8 down, the bound closing in by 2 a pass;
        # loaded: two pointers from .data, base + 64 and base - 4
        data = b"".join(p.to_bytes(8, "little") for p in (lo + 64, base - 4))
        for name, setup, body in (("twice", [*li(T0, base), *li(T2, base + 16)], twice),
                                  ("moving", [*li(T0, base + 8), *li(T2, base)], moving),
                                  ("loaded", [*li(T0, progen.DATA), *li(T2, progen.DATA + 16), *li(T5, lo)], loaded)):
            image = progen.build_image([progen.Function("f0", [*setup, Op("addi", rd=T4), *body,
                                                               Op("addi", rd=10, rs1=T4), Op("jalr", rs1=1)])],
                                       data=data)
            gens.append(progen.GenProgram(image, image.entry, f"{name} from {base:#x}"))
            faults.append(lo - 4 if base == lo else None)
    for (gen, expected, (got,)), fault in zip(run_both(gens), faults):
        assert (expected.trap and expected.trap.addr) == fault, gen.listing
        assert_same(gen, expected, got)


def test_what_a_loop_stored_at_its_highest_offset_is_gone_in_the_next_run():
    """A counted loop marks every page its stores start in at its entry (berm_aot/emit/loops.py): from its lowest
    store's offset to its highest's. Here the two stores of an iteration are 2040 bytes apart, the second on the
    next page; each run first reads what the second store overwrites, which must be 0 every time (a mutation
    review: a mark from the lowest offset only passed every loop of the tests, each with one store)."""
    from berm_host.layout import layout_for
    from tests import progen
    from tests.rvenc import Label, Op, li
    from tests.test_aot_diff import assert_same, run_both

    T0, T2, T6, A0 = 5, 7, 31, 10
    probe = progen.build_image([progen.Function("f0", [Op("jalr", rs1=1)])])
    base = layout_for(probe, progen.MEMORY_SIZE).heap_start + 4000
    ops = [*li(T0, base), *li(T2, base + 16), *li(T6, 0x5A5A), *li(A0, base + 2040), Op("ld", rd=A0, rs1=A0),
           Label(".l"), Op("sd", rs1=T0, rs2=T6), Op("sd", rs1=T0, rs2=T6, imm=2040), Op("addi", rd=T0, rs1=T0, imm=8),
           Op("bne", rs1=T0, rs2=T2, target=".l"), Op("jalr", rs1=1)]
    image = progen.build_image([progen.Function("f0", ops)])
    assert layout_for(image, progen.MEMORY_SIZE).heap_start == base - 4000
    gen = progen.GenProgram(image, image.entry, "two stores a page apart")
    for _, expected, results in run_both([gen], repeat=2):
        assert expected.trap is None and expected.regs[A0] == 0
        for got in results:
            assert_same(gen, expected, got)


def test_a_loop_with_one_group_in_no_window_runs_checked():
    """The loop's second, unchecked copy runs only when every one of its groups passed: here the group through t0
    lies in .data and the one through t5 below the image, where both engines must trap at its first load (a
    mutation review: a translator taking the second copy when any group passed ran that load unchecked; every loop
    of the tests had one group)."""
    from berm_host.layout import layout_for
    from tests import progen
    from tests.rvenc import Label, Op, li
    from tests.test_aot_diff import assert_same, run_both

    T0, T2, T3, T4, T5 = 5, 7, 28, 29, 30
    lo = layout_for(progen.build_image([progen.Function("f0", [Op("jalr", rs1=1)])]), progen.MEMORY_SIZE).image_lo
    gens = []
    for bad in (lo - 4, progen.DATA):
        ops = [*li(T0, progen.DATA), *li(T2, progen.DATA + 16), *li(T5, bad), Label(".l"), Op("lw", rd=T3, rs1=T0),
               Op("lw", rd=T4, rs1=T5), Op("addi", rd=T0, rs1=T0, imm=4), Op("bne", rs1=T0, rs2=T2, target=".l"),
               Op("jalr", rs1=1)]
        image = progen.build_image([progen.Function("f0", ops)])
        gens.append(progen.GenProgram(image, image.entry, f"two groups, t5 = {bad:#x}"))
    for (gen, expected, (got,)), fault in zip(run_both(gens), (lo - 4, None)):
        assert (expected.trap and expected.trap.addr) == fault, gen.listing
        assert_same(gen, expected, got)
