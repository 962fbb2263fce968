"""Glob patterns are matched by RE2 (linear time), their sources written for the syntax both RE2 and the ``regex``
module read. Differential: for any pattern and path, RE2's answer is the ``regex`` module's on the same source, the
matcher globs used before RE2 (a pattern one refuses, the other refuses too)."""

from __future__ import annotations

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from berm_host.capabilities.patterns import Glob, glob_source
from berm_host.linker import CapabilityError

#: Glob syntax and the characters that need care in a regex source or in UTF-8: a newline, a non-ASCII letter, a
#: lone surrogate (an undecodable byte of a file name, from surrogateescape), regex metacharacters.
_PATTERN_PIECES = ["*", "**", "?", "/", "[", "]", "!", "^", "-", "{", "}", ",", "\\", "a", "b", ".", "é", "\n",
                   "$", "(", "|", "+", " "]
_PATH_CHARS = "ab./é\n\udcff$(|+ ]-\\"


def _regex_answer(pattern: str, path: str, basename: bool) -> bool | None:
    """What the regex module makes of the same source (None: it refuses it)."""
    try:
        rx = regex.compile(glob_source(pattern), regex.DOTALL)
    except regex.error:
        return None
    if basename and "/" not in pattern:
        path = path.rsplit("/", 1)[-1]
    return rx.fullmatch(path) is not None


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(_PATTERN_PIECES), min_size=1, max_size=10),
       paths=st.lists(st.text(_PATH_CHARS, max_size=12), min_size=1, max_size=6),
       basename=st.booleans())
def test_re2_answers_as_the_regex_module_did(pieces, paths, basename):
    pattern = "".join(pieces)
    expected = {path: _regex_answer(pattern, path, basename) for path in paths}
    try:
        glob = Glob(pattern, basename_if_no_slash=basename)
    except CapabilityError:
        assert set(expected.values()) == {None}
        return
    assert {path: glob.match(path) for path in paths} == expected


def test_undecodable_bytes_and_newlines_are_characters_of_a_name():
    assert Glob("?.txt").match("\udcff.txt") and Glob("x*").match("x\udcfe\udcff")
    assert Glob("?").match("\n") and Glob("**").match("a\n/b")
    assert not Glob("?").match("\udcc3\udca9")  # two undecodable bytes are two characters, not one é
    assert Glob("?").match("é")


def test_a_closing_bracket_first_in_a_class_is_one_of_its_characters():
    """Found by a review: negated, it closed the class ("[!]a]" matched "xa]", not "b")."""
    assert Glob("[!]a]").match("b") and not Glob("[!]a]").match("]") and not Glob("[!]a]").match("xa]")
    assert Glob("[]a]").match("]") and Glob("[]a]").match("a") and not Glob("[]a]").match("b")
    assert Glob("[^]]x").match("ax") and not Glob("[^]]x").match("]x")


def test_a_pattern_neither_reads_is_a_clear_error():
    with pytest.raises(CapabilityError) as refused:
        Glob("[z-a]")
    assert str(refused.value) == "bad glob pattern '[z-a]': invalid character class range: z-a"
