"""A counted loop whose group's range is in no window leaves each member to its own, out-of-line check
(berm_host/aot/berm_code.h: BERM_G_LD / BERM_G_ST through berm_load_slow / berm_store_slow). Loops running into the
end of the heap (the guard page) and the end of memory, byte by byte, with every access width: the values each
member loads and stores, the trap that ends the loop and every register at it must be exactly the interpreter's."""

from __future__ import annotations

from berm_aot.analysis import analyse
from berm_aot.emit.function import FunctionEmitter
from berm_aot.program import Program
from tests import progen
from tests.rvenc import Label, Op, li
from tests.test_aot_diff import assert_same, run_both

T0, T2, T3, T4, T6 = 5, 7, 28, 29, 31
WIDTHS = (("sb", "lb", 1), ("sh", "lh", 2), ("sw", "lw", 4), ("sd", "ld", 8))
TRIPS = 4


def store_load_loop(store: str | None, load: str, size: int, base: int) -> progen.GenProgram:
    """Four iterations from ``base`` up by ``size``: store a negative value (unless ``store`` is None), load it back
    (sign-extended by the load), add it up in t4."""
    first = [Op(store, rs1=T0, rs2=T6)] if store else []
    ops = [*li(T0, base), *li(T2, base + size * TRIPS), *li(T6, -0x7F7E7D7C7B7A7978), Op("addi", rd=T4),
           Op("addi", rd=T3), Label(".l"), *first, Op(load, rd=T3, rs1=T0),
           Op("add", rd=T4, rs1=T4, rs2=T3), Op("addi", rd=T0, rs1=T0, imm=size),
           Op("bne", rs1=T0, rs2=T2, target=".l"),
           Op("jalr", rs1=1)]
    image = progen.build_image([progen.Function("f0", ops)])
    return progen.GenProgram(image, image.entry, f"{store}/{load} x{TRIPS} from {base:#x}")


def test_the_loop_is_a_counted_loop_with_one_group():
    """Else the test below would only test the per-access checks (BERM_LD / BERM_ST), not the loop's members."""
    program = Program.from_image(store_load_loop("sw", "lw", 4, progen.DATA).image)
    analysis = analyse(program)
    loops = FunctionEmitter(analysis, analysis.by_start[progen.TEXT], "").loops
    assert len(loops) == 1 and [len(g.members) for loop in loops.values() for g in loop.groups] == [2]


def test_members_checked_one_by_one_load_store_and_trap_as_the_interpreter():
    """A mutation review of berm_code.h: on the out-of-line path, BERM_G_LD zero-extending what it loaded, and
    berm_load_slow / berm_store_slow checking one byte instead of the access's n (an access reaching past the end
    of memory) passed the tests (their loops load small positive values, and none straddles an end with every
    width). Each loop here ends in a trap where its range straddles an end, or runs whole just below it."""
    gens, ends = [], (progen.guard_lo(), progen.MEMORY_SIZE)
    for end in ends:
        for store, load, size in WIDTHS:
            for base in range(end - size * TRIPS - 8, end - size * TRIPS + 8):
                gens.append(store_load_loop(store, load, size, base))
                gens.append(store_load_loop(None, load, size, base))
    traps = negative = 0
    for gen, expected, (got,) in run_both(gens):
        assert_same(gen, expected, got)
        traps += expected.trap is not None
        negative += expected.trap is not None and expected.regs[T4] >> 63  # loaded, then trapped
    assert 0 < traps < len(gens) and negative


def test_a_loop_whose_range_is_larger_than_memory_traps_at_its_first_bad_access():
    """A loop of 2^20 or 2^29 trips of 8 bytes: its range (8 MiB, 4 GiB) is larger than every window, which the
    range check (BERM_RANGE_IN) must refuse rather than let ``SPAN + 8 - n`` wrap around to a bound every address
    passes (a mutation review: no loop of the tests had a range larger than the stack, and such a mutant ran the
    loop unchecked, reading outside guest memory). From below the image it traps at once; from .data it runs up
    to the guard page and traps there, like the interpreter."""
    gens = []
    for base, trips in ((0x100, 1 << 20), (progen.DATA, 1 << 20), (progen.DATA, 1 << 29)):
        ops = [*li(T0, base), *li(T2, base + 8 * trips), Op("addi", rd=T4), Label(".l"), Op("ld", rd=T3, rs1=T0),
               Op("add", rd=T4, rs1=T4, rs2=T3), Op("addi", rd=T0, rs1=T0, imm=8),
               Op("bne", rs1=T0, rs2=T2, target=".l"), Op("jalr", rs1=1)]
        image = progen.build_image([progen.Function("f0", ops)], data=(5).to_bytes(8, "little"))
        gens.append(progen.GenProgram(image, image.entry, f"ld x{trips} from {base:#x}"))
    for (gen, expected, (got,)), fault in zip(run_both(gens), (0x100, progen.guard_lo(), progen.guard_lo())):
        assert expected.trap is not None and expected.trap.addr == fault, gen.listing
        assert_same(gen, expected, got)


def test_what_members_checked_one_by_one_stored_is_gone_in_the_next_run():
    """A loop sums the 64 bytes below an end (the guard page, the end of memory), then a second loop stores into
    them from 4 bytes in, up by 8, until its last store straddles the end and traps: its group is in no window, so
    each store went through berm_store_slow, which must mark it like any store. Run twice: the second run's sum
    must be 0 again (a mutation review: berm_store_slow marking the store window's pages in the fine map only, or
    not marking the stack's, passed every test — their loops that store in no window's range trap at once)."""
    T5 = 30
    gens = []
    for end in (progen.guard_lo(), progen.MEMORY_SIZE):
        lo = end - 64
        ops = [*li(T0, lo), *li(T2, end), Op("addi", rd=T5), Label(".sum"), Op("ld", rd=T3, rs1=T0),
               Op("add", rd=T5, rs1=T5, rs2=T3), Op("addi", rd=T0, rs1=T0, imm=8),
               Op("bne", rs1=T0, rs2=T2, target=".sum"),
               *li(T0, lo + 4), *li(T2, lo + 4 + 8 * 8), *li(T6, -1), Label(".store"), Op("sd", rs1=T0, rs2=T6),
               Op("addi", rd=T0, rs1=T0, imm=8), Op("bne", rs1=T0, rs2=T2, target=".store"), Op("jalr", rs1=1)]
        image = progen.build_image([progen.Function("f0", ops)])
        gens.append(progen.GenProgram(image, image.entry, f"sum, then store up to {end:#x}"))
    for (gen, expected, results), end in zip(run_both(gens, repeat=2), (progen.guard_lo(), progen.MEMORY_SIZE)):
        assert expected.trap is not None and expected.trap.addr == end - 4 and expected.regs[T5] == 0
        for got in results:
            assert_same(gen, expected, got)
