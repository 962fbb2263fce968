"""A lone store through a register the translator knows holds a stack address (berm_aot/emit/stackptr.py) tests the
stack window first and the store window second (berm_host/aot/berm_code.h, BERM_SP_ST): read-only data and code are
in neither, and the store must fault there exactly as on the interpreter, leaving memory as it was."""

from __future__ import annotations

import pytest

from berm_host.backend import RunRequest
from tests.edge_runs import both_engines, outcome
from tests.guests import guest_elf

#: ``lone`` stores through t0 = sp + (target - sp): the only access through t0 (one access, not a group).
SOURCE = r"""
typedef unsigned long u64;
u64 data_slot = 7;
const volatile u64 ro_slot = 9;
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
u64 lone(u64 target, u64 value) {
    __asm__ volatile("sub t1, %0, sp\n add t0, sp, t1\n sd %1, 0(t0)" :: "r"(target), "r"(value) : "t0", "t1", "memory");
    return keep(value) - 1;
}
u64 read_slots(u64 unused, u64 unused2) { return data_slot * 100 + ro_slot; }
void _start(void) {}
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return both_engines(guest_elf(SOURCE, keep=("lone", "read_slots", "data_slot", "ro_slot")),
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
