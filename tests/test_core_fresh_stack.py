"""Fresh stack memory per invocation where the core's two ways of restoring it meet (core.c, reset_memory): a group
of stores into the stack lowers stack_low and the core restores from there up, byte-exactly; a single store below
it, in the same page, marks that page. Restoring from stack_low must leave that page's mark for the page pass."""

from __future__ import annotations

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit.function import FunctionEmitter
from berm_aot.program import Program
from berm_host.backend import RunRequest
from tests.edge_runs import both_engines
from tests.guests import guest_elf

#: probe reads the slot `below` bytes under sp (through t2) and stores sp there (through t1: one access each, no
#: group); then stores sp twice through t3 at sp - 512 (a group: stack_low drops there, inside the same page).
#: The result is the slot's old value: what an earlier invocation left.
SOURCE = r"""
typedef unsigned long u64;
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
u64 probe(u64 below) {
    u64 v;
    __asm__ volatile("sub t1, sp, %1\n mv t2, t1\n ld %0, 0(t2)\n sd sp, 0(t1)\n"
                     "addi t3, sp, -512\n sd sp, 0(t3)\n sd sp, 8(t3)"
                     : "=&r"(v) : "r"(below) : "t1", "t2", "t3", "memory");
    return keep(v) - 1;
}
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return both_engines(guest_elf(SOURCE, keep=("probe",)), tmp_path_factory.mktemp("cache"))


def test_the_stores_are_one_single_and_one_group(engines):
    """Else the test would not reach the case it is about: both restores in one page."""
    program = Program.from_image(read_elf(guest_elf(SOURCE, keep=("probe",))))
    analysis = analyse(program)
    groups = FunctionEmitter(analysis, analysis.by_start[program.symbol("probe")], "").groups.values()
    assert len([g for g in groups if g.stores is not None]) == 1


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("below", [520, 1024, 3000])
def test_a_single_store_under_a_groups_low_mark_is_restored(engines, kind, below):
    symbols, _, backends = engines
    for _ in range(3):
        result = backends[kind].run(RunRequest(entry=symbols["probe"], int_args=(below,)))
        assert result.trap is None and result.a0 == 0
