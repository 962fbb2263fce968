"""Loads and stores through one base register in one block are checked as a group (berm_aot/emit/groups.py): one
range check against the two windows the accesses may use, then no check per member. With the base at every edge of
every window — data, read-only data, the heap's end at the guard, the stack, 0, near 2^64 — each group must end
exactly as on the reference interpreter (the members before a faulting one have run, the trap names the faulting
one), and what a group stored must be gone in the next run, in the data window and in the stack alike."""

from __future__ import annotations

import pytest

from berm_host.backend import RunRequest
from tests.edge_runs import LOW, TOP, both_engines, outcome
from tests.guests import guest_elf

#: (name, the group through t0 = the first argument; t1 = the second; the result is t3 ^ t4).
GROUPS = [
    ("loads", "ld t3, -8(t0)\\n lwu t4, 4(t0)\\n lbu t5, 2(t0)"),
    ("wide_loads", "ld t3, -2048(t0)\\n ld t4, 2040(t0)"),
    ("stores", "sd t1, -8(t0)\\n sw t1, 4(t0)\\n ld t3, -8(t0)\\n lwu t4, 4(t0)"),
    ("wide_stores", "sd t1, -2048(t0)\\n sd t1, 2040(t0)\\n ld t3, -2048(t0)\\n ld t4, 2040(t0)"),
    # a member loads into the base: the group ends there, the next access goes through the loaded value
    ("rebase", "ld t3, 0(t0)\\n ld t0, 8(t0)\\n ld t4, 0(t0)"),
    # two groups interleaved, through t0 and t2 = t0 + 16
    ("interleaved", "addi t2, t0, 16\\n sd t1, 0(t0)\\n sd t1, 0(t2)\\n ld t3, 8(t0)\\n ld t4, 8(t2)"),
]

SOURCE = "typedef unsigned long u64;\n" + "\n".join(
    f"""u64 {name}(u64 base, u64 value) {{
    u64 out;
    __asm__ volatile("mv t0, %1\\n mv t1, %2\\n li t3, 0\\n li t4, 0\\n {body}\\n xor %0, t3, t4"
                     : "=r"(out) : "r"(base), "r"(value) : "t0", "t1", "t2", "t3", "t4", "t5", "memory");
    return out;
}}""" for name, body in GROUPS) + """
u64 data_area[1024] = {[1023] = 1};  /* in .data, zero where the tests read */
const u64 ro_area[512] = {2};
/* Stores through a pointer into the caller's stack: the translator cannot know it holds a stack address. */
__attribute__((noinline)) u64 through(u64 *p, u64 v) { return stores((u64)p, v); }
u64 on_my_stack(u64 unused, u64 value) {
    volatile u64 frame[8];
    frame[0] = 0;
    u64 before = frame[3];
    return through((u64 *)&frame[4], value) + before;
}
void _start(void) {}
"""



@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    elf = guest_elf(SOURCE, keep=("data_area", "ro_area", "on_my_stack", *(name for name, _ in GROUPS)))
    return both_engines(elf, tmp_path_factory.mktemp("cache"))


def bases(symbols, layout) -> list[int]:
    points = {symbols["data_area"], symbols["data_area"] + 8 * 1024, symbols["ro_area"], layout.image_lo,
              layout.writable_lo, layout.heap_start, layout.guard_lo, LOW, TOP}
    # every byte offset near each point and near +-2 KiB of it: a range one byte short of the group's would pass
    deltas = [d for k in (-2048, 0, 2048) for d in range(k - 12, k + 13)]
    spread = {p + d for p in points for d in deltas}
    return sorted(spread | {0, 8, 2048, (1 << 64) - 8, (1 << 64) - 2048})


@pytest.mark.parametrize("name", [name for name, _ in GROUPS])
def test_group_at_every_edge_matches_the_interpreter(engines, name):
    symbols, layout, backends = engines
    results = []
    for base in bases(symbols, layout):
        request = RunRequest(entry=symbols[name], int_args=(base, 0x1122334455667788))
        got, want = (outcome(backends[k].run(request)) for k in ("aot", "interp"))
        assert got == want, f"{name} with base={base:#x}: aot {got} vs interp {want}"
        results.append(got)
    assert any(r[1] is None for r in results) and any(r[1] is not None for r in results)  # edges really straddle


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("name", ["stores", "wide_stores", "interleaved"])
def test_stored_by_a_group_is_gone_in_the_next_run(engines, kind, name):
    symbols, layout, backends = engines
    backend = backends[kind]
    spots = [symbols["data_area"] + 2048, symbols["data_area"] + 4096 + 8, layout.heap_start + 2048,
             layout.guard_lo - 2048, LOW + 2048, TOP - 4096]
    for base in spots:
        assert backend.run(RunRequest(entry=symbols[name], int_args=(base, 0xFF))).trap is None
    for base in spots:
        for reader in ("loads", "wide_loads"):
            result = backend.run(RunRequest(entry=symbols[reader], int_args=(base, 0)))
            assert result.trap is None and result.a0 == 0, f"{name}: stale bytes near {base:#x} read by {reader}"


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_group_into_the_callers_stack_is_gone_in_the_next_run(engines, kind):
    """The group's base points into the stack though the translator cannot know it: the group's second window
    (the stack's) holds it, and its stores are restored like any stack store."""
    symbols, _, backends = engines
    backend = backends[kind]
    first = backend.run(RunRequest(entry=symbols["on_my_stack"], int_args=(0, 0x77)))
    assert first.trap is None and first.a0 == 0x77 ^ 0x77 ^ 0  # stores: t3 ^ t4 of the same value
    again = backend.run(RunRequest(entry=symbols["on_my_stack"], int_args=(0, 0x77)))
    assert again.trap is None and again.a0 == first.a0  # frame[3] (read before the call) is zero again
