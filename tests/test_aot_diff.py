"""Translated code against the reference interpreter: random programs from tests/progen.py must end in the same
registers, pc, trap (kind, pc, addr, detail, where), failure text and data/stack memory.

Compiling C is the slow step, so hypothesis only generates: the programs of a whole run are collected first and
translated with distinct symbol prefixes into one shared object (one compile). A failure prints the program's
listing (there is no shrinking across a batch).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from berm_aot.program import Program
from berm_host.aot.backend import AotBackend
from berm_host.aot.objects import compile_programs
from berm_host.layout import layout_for
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from tests import progen

PROGRAMS = 80


def collect(strategy, n: int) -> list:
    """``n`` examples drawn from ``strategy`` (hypothesis as a generator)."""
    out = []

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(example):
        out.append(example)

    draw()
    return out


def run_both(gens: list[progen.GenProgram], *, repeat: int = 1):
    """Yield (gen, interp result, [aot results]) for each program, all translated into one object."""
    programs = [Program.from_image(g.image) for g in gens]
    with tempfile.TemporaryDirectory(prefix="berm-diff-") as tmp:
        so = Path(tmp) / "batch.so"
        compile_programs([(p, layout_for(p.image, progen.MEMORY_SIZE).windows(), f"p{i}_")
                          for i, p in enumerate(programs)], so)
        for i, (gen, program) in enumerate(zip(gens, programs)):
            request = RunRequest(entry=gen.entry, snapshot=gen.snapshot)
            expected = InterpBackend(program, progen.MEMORY_SIZE).run(request)
            aot = AotBackend(program, progen.MEMORY_SIZE, code=(so, f"p{i}_"))
            yield gen, expected, [aot.run(request) for _ in range(repeat)]


def assert_same(gen, expected, got) -> None:
    where = f"\n{gen.listing}"
    assert got.trap == expected.trap, f"trap: aot {got.trap} vs interp {expected.trap}{where}"
    assert got.pc == expected.pc, where
    for r in range(32):
        assert got.regs[r] == expected.regs[r], f"x{r}: aot {got.regs[r]:#x} vs interp {expected.regs[r]:#x}{where}"
    assert got.failure == expected.failure, where
    for k, (a, b) in enumerate(zip(got.snapshot, expected.snapshot)):
        if a != b:
            off = next(i for i in range(len(a)) if a[i] != b[i])
            raise AssertionError(f"snapshot {k} differs at +{off:#x}{where}")


def test_aot_matches_interpreter():
    gens = collect(progen.programs(), PROGRAMS)
    assert len(gens) >= PROGRAMS // 2
    # each program runs twice on the same pooled region: the second run also checks the memory reset
    for gen, expected, results in run_both(gens, repeat=2):
        for got in results:
            assert_same(gen, expected, got)
