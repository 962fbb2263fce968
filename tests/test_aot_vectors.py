"""The hand-written vectors of tests/test_interp_insns.py (every operation at the edges the ISA manual spells out) on
translated code: each must end exactly as on the interpreter, which that file checks against the written-out
values. Random programs meet each operation a few times per run, mostly with small values: a signed ``sltu``, an
unsigned ``mulhsu`` operand, ``rem`` of INT64_MIN by -1, ``remw`` by zero not sign-extended and an atomic allowed at
some misaligned addresses all got past them (a mutation review)."""

from __future__ import annotations

from tests import progen
from tests.interp_helpers import snippet_image
from tests.test_aot_diff import assert_same, run_both
from tests.test_interp_insns import vectors


def test_every_vector_runs_on_translated_code_as_on_the_interpreter():
    gens = []
    for k, snippet in enumerate(vectors()):
        image = snippet_image(**snippet)
        gens.append(progen.GenProgram(image, image.entry, f"vector {k}: {snippet}"))
    for gen, expected, (got,) in run_both(gens):
        assert_same(gen, expected, got)
