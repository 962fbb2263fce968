"""A lone store through a register the translator knows holds a stack address (berm_aot/emit/stackptr.py) tests the
stack window first and the store window second (berm_host/aot/berm_code.h, BERM_SP_ST): read-only data and code are
in neither, and the store must fault there exactly as on the interpreter, leaving memory as it was."""

from __future__ import annotations

import pytest

from berm_host.backend import RunRequest
from tests.edge_runs import both_engines, outcome
from tests import progen
from tests.guests import guest_elf
from tests.rvenc import Op, li
from tests.test_aot_diff import assert_same, run_both

#: ``lone`` stores through t0 = sp + (target - sp): the only access through t0 (one access, not a group).
SOURCE = r"""
typedef unsigned long u64;
u64 data_slot = 7;
const volatile u64 ro_slot = 9;
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
u64 lone(u64 target, u64 value) {
    __asm__ volatile("sub t1, %0, sp\n add t0, sp, t1\n sd %1, 0(t0)"
                     :: "r"(target), "r"(value) : "t0", "t1", "memory");
    return keep(value) - 1;
}
u64 lone_load(u64 target, u64 unused) {
    u64 out;
    __asm__ volatile("sub t1, %1, sp\n add t0, sp, t1\n ld %0, 0(t0)" : "=r"(out) : "r"(target) : "t0", "t1", "memory");
    return keep(out) - 1;
}
u64 read_slots(u64 unused, u64 unused2) { return data_slot * 100 + ro_slot; }
void _start(void) {}
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return both_engines(guest_elf(SOURCE, keep=("lone", "lone_load", "read_slots", "data_slot", "ro_slot")),
                        tmp_path_factory.mktemp("cache"))


def test_a_lone_store_through_a_stack_pointer_into_read_only_memory_faults(engines):
    """A mutation review: BERM_SP_ST testing the load window second (read-only data and code in it) instead of the
    store window passed every test (their stores through a stack pointer into read-only data were groups)."""
    symbols, _, backends = engines
    for target in (symbols["ro_slot"], symbols["ro_slot"] + 4, symbols["lone"], symbols["data_slot"]):
        request = RunRequest(entry=symbols["lone"], int_args=(target, 0xAB))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"lone store to {target:#x}: aot {got} vs interp {want}"
        assert (want[1] is None) == (target == symbols["data_slot"]), want
    for kind, backend in backends.items():
        backend.run(RunRequest(entry=symbols["lone"], int_args=(symbols["ro_slot"], 0xAB)))
        assert backend.run(RunRequest(entry=symbols["read_slots"], int_args=(0, 0))).a0 == 709, kind


def test_a_lone_load_through_a_stack_pointer_reads_read_only_memory(engines):
    """The same register for a load (BERM_SP_LD: the stack window, then the load window): read-only data and code
    are readable. A mutation review: BERM_SP_LD testing the store window second passed every test."""
    symbols, _, backends = engines
    for target in (symbols["ro_slot"], symbols["lone"], symbols["data_slot"], 0x100):
        request = RunRequest(entry=symbols["lone_load"], int_args=(target, 0))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"lone load from {target:#x}: aot {got} vs interp {want}"
        assert (want[1] is None) == (target != 0x100), want
    read = backends["aot"].run(RunRequest(entry=symbols["lone_load"], int_args=(symbols["ro_slot"], 0)))
    assert read.trap is None and read.a0 == 9


def test_a_misaligned_atomic_outside_memory_is_misaligned_first():
    """SEMANTICS.md: an atomic's alignment is checked before its bounds, so a misaligned atomic at an address no
    window holds is the misaligned fault (BERM_ATOMIC_ADDR). A mutation review: the two checks swapped passed every
    test (their misaligned atomics were all in bounds)."""
    T0, T1, T3 = 5, 6, 28
    gens = []
    for addr in (0x101, progen.RODATA + 2, progen.guard_lo() + 2, progen.MEMORY_SIZE - 2, (1 << 64) - 2):
        for op in ("lr.w", "sc.d", "amoadd.w", "amoswap.d"):
            args = dict(rd=T3, rs1=T0) if op.startswith("lr") else dict(rd=T3, rs1=T0, rs2=T1)
            image = progen.build_image([progen.Function("f0", [*li(T0, addr), *li(T1, 7), Op(op, **args),
                                                               Op("jalr", rs1=1)])])
            gens.append(progen.GenProgram(image, image.entry, f"{op} at {addr:#x}"))
    for gen, expected, (got,) in run_both(gens):
        assert expected.trap is not None and "misaligned" in expected.trap.detail, gen.listing
        assert_same(gen, expected, got)
