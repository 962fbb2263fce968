"""Random ``switch`` loops (tests/progen.py ``switch``) on the translated code against the interpreter: each indirect
jump branches directly only to its own table's cases (berm_aot.emit.sites), and an index run past its table into
the next one, or a return address forged to a case, continues in the function's resume copy. test_aot_resume.py
has the hand-written cases; this draws many, one compile for the batch (see test_aot_diff.py).

The batch must really reach the feature, or the test would go on passing while covering nothing: a third of the
programs at least (usually two thirds or more) must have a function that gets a resume copy, and each unusual
transfer must be in the batch. Broken on purpose (unexpected targets sent to the trap, or the resume copy entered
without the registers stored), the translation failed this test in every run tried."""

from __future__ import annotations

from collections import Counter

from berm_aot.analysis import analyse
from berm_aot.emit import emit_program
from berm_aot.emit.sites import jump_targets
from berm_aot.program import Program
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests import progen
from tests.test_aot_diff import assert_same, collect, run_both

PROGRAMS = 30
#: seconds a run may take: every program ends in milliseconds; a translation that loops must fail, not hang
DEADLINE = 5.0
#: a switch is 6 times as likely as in the default programs: most programs get one
WEIGHT = 6


def _resumed(gen: progen.GenProgram) -> bool:
    """Whether some function of ``gen`` gets per-site expectations, so a resume copy."""
    program = Program.from_image(gen.image)
    analysis = analyse(program)
    return any(jump_targets(info, analysis.jump_tables, program.image) is not None for info in analysis.functions)


def test_random_switch_loops_match_the_interpreter():
    # one fixed batch: drawn afresh each run, about one in 200 fell short of the feature counts asserted below
    gens = collect(progen.programs(switches=WEIGHT), PROGRAMS, derandomize=True)
    assert len(gens) >= PROGRAMS // 2
    features = Counter(f for g in gens for f in g.features)
    assert min(features[f] for f in ("switch", "overrun", "forged return")) >= len(gens) // 10, features
    resumed = [g for g in gens if _resumed(g)]
    assert len(resumed) >= len(gens) // 3, f"{len(resumed)} of {len(gens)} programs get a resume copy"
    for gen in resumed[:3]:  # the emitted C really has one
        program = Program.from_image(gen.image)
        source = "".join(emit_program(program, windows=layout_for(program.image, progen.MEMORY_SIZE).windows()))
        assert "_r(berm_ctx" in source, gen.listing
    for gen, expected, results in run_both(gens, repeat=2, deadline=DEADLINE):
        assert expected.trap is None or expected.trap.kind != TrapKind.INTERRUPTED, f"no end{gen.listing}"
        for got in results:
            assert_same(gen, expected, got)
