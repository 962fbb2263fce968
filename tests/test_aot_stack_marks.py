"""Stores into the stack mark only the fine dirty map (berm_code.h, BERM_MARK_STACK); the core folds those marks
into the coarse map after each run. A run that finds the stack slots a previous run wrote below its sp — across
pages and 256 KiB blocks of the 1 MiB stack, stored through sp and through another register — must still read zero
on both engines."""

from __future__ import annotations

import pytest

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf
from berm_aot.emit.function import FunctionEmitter
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from tests.guests import guest_elf

OFFSETS = (-8, -2048, -4096, -5000, -70000, -300000, -700000, -1040000)

#: P moves sp to the slot, loads it through t1 and stores the old sp there with sp as the base register (what the
#: translator emits BERM_SP_ST for), then restores sp; Q does the same 8 bytes lower, loading through t2 and storing
#: through t1 (BERM_ST, or BERM_SP_ST when the translator knows t1 is sp + k). Each store is the only access through
#: its base (two would be a group: BERM_GROUP, which lowers stack_low instead of marking pages; the
#: test_aot_sp_window and test_aot_groups tests cover those). The result counts, in base 3, the slots found
#: non-zero.
SOURCE = r"""
typedef unsigned long u64;
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
u64 probe(u64 n) {
    u64 seen = 0, v;
#define P(OFF) __asm__ volatile("li t1, " #OFF "\n add t1, sp, t1\n mv t2, sp\n mv sp, t1\n ld %0, 0(t1)\n" \
                                "sd t2, 0(sp)\n mv sp, t2" : "=r"(v) :: "t1", "t2", "memory"); \
               seen = seen * 3 + (v != 0);
#define Q(OFF) __asm__ volatile("li t1, " #OFF "- 8\n add t1, sp, t1\n mv t2, t1\n ld %0, 0(t2)\n sd sp, 0(t1)" \
                                : "=r"(v) :: "t1", "t2", "memory"); \
               seen = seen * 3 + (v != 0);
    PROBES
    return keep(seen) - 1;
}
"""


@pytest.fixture(scope="module")
def elf():
    return guest_elf(SOURCE.replace("PROBES", " ".join(f"P({o}) Q({o})" for o in OFFSETS)), keep=("probe",))


def test_no_store_here_is_in_a_group(elf):
    """Else the stores would lower stack_low and never reach the per-access marks this file is about."""
    program = Program.from_image(read_elf(elf))
    analysis = analyse(program)
    groups = FunctionEmitter(analysis, analysis.by_start[program.symbol("probe")], "").groups.values()
    assert not [g for g in groups if g.stores is not None]


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_stack_written_through_sp_is_fresh_for_the_next_run(elf, kind, tmp_path):
    entry = next(s.value for s in read_elf(elf).symbols if s.name == "probe")
    backend = Engine(kind=kind, cache_dir=tmp_path).load(elf).backend
    for _ in range(3):
        result = backend.run(RunRequest(entry=entry, int_args=(1,)))
        assert result.trap is None and result.failure is None
        assert result.a0 == 0
