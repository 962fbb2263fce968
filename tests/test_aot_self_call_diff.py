"""Random programs whose functions call themselves (tests/progen.py ``self_call``) on the translated code against the
interpreter. A direct call of a function by itself runs the new frame in the caller's C frame, returns resume after
the call that made the frame, and a back-edge whose every cycle passes such a call does not poll
(berm_aot/emit/function.py): everything the random programs do around that — loops, switches, calls of other
functions, faults deep in a recursion, forged returns — must end exactly as on the interpreter. One compile for the
batch (see test_aot_diff.py).

The batch must really reach the feature: a third of its programs must make a self-call, and a third must have a
function translated with self-calls in its own C frame."""

from __future__ import annotations

from collections import Counter

from berm_aot.emit import emit_program
from berm_aot.program import Program
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests import progen
from tests.test_aot_diff import assert_same, collect, run_both

PROGRAMS = 30
#: seconds a run may take: every program ends in well under a second; a translation that loops must fail, not hang
DEADLINE = 10.0


def _nests_frames(gen: progen.GenProgram) -> bool:
    """Whether some function of ``gen`` is translated with its calls of itself run in its own C frame."""
    program = Program.from_image(gen.image)
    return "BERM_SELF_CALL(" in "".join(emit_program(program, windows=layout_for(program.image,
                                                                                 progen.MEMORY_SIZE).windows()))


def test_random_recursion_matches_the_interpreter():
    gens = collect(progen.programs(self_calls=True), PROGRAMS, derandomize=True)  # one fixed batch, as switches'
    assert len(gens) >= PROGRAMS // 2
    # the self-calls' depth bound counts frames from where the host starts sp
    assert layout_for(gens[0].image, progen.MEMORY_SIZE).initial_sp == progen.INITIAL_SP
    features = Counter(f for g in gens for f in g.features)
    # a third, not half: the batch moves with the constants of the modules imported before it (collect), and run
    # alone (or after other tests than the suite's) it held 13 self calls in 30 programs
    assert features["self call"] >= len(gens) // 3, features
    nested = [g for g in gens if _nests_frames(g)]
    assert len(nested) >= len(gens) // 3, f"{len(nested)} of {len(gens)} programs nest frames in one C frame"
    for gen, expected, results in run_both(gens, repeat=2, deadline=DEADLINE):
        assert expected.trap is None or expected.trap.kind != TrapKind.INTERRUPTED, f"no end{gen.listing}"
        for got in results:
            assert_same(gen, expected, got)
