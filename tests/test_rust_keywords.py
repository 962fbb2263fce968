"""The committed Rust harness with one huge function (harnesses/rust-probe's rust-keywords, rebuilt by its
build.sh): rustc makes a `match` of 1,000 byte-string arms into a single function of more than CHUNKED_ABOVE
instructions, a trie of jump tables, which the translator cuts into chunks. Its lookups must give the model's
answers on every engine, at the real thresholds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berm_aot.analysis import analyse
from berm_aot.elf import read_elf_file
from berm_aot.emit import chunks
from berm_aot.program import Program
from berm_host.engine import KINDS, Engine
from berm_host.traps import ToolFailure

ELF = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-keywords.elf"
M64 = (1 << 64) - 1


def _keywords() -> dict[bytes, int]:
    """The words and values build.rs writes into the match, computed the same way: a 64-bit LCG, 3 to 10 letters
    (three top bits), the letters from base-26 digits; the k-th new word (from 1) is worth 1 + k * 2654435761 mod
    1,000,003."""
    words: dict[bytes, int] = {}
    state = 0x2545_F491_4F6C_DD1D
    while len(words) < 1000:
        state = (state * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) & M64
        digits, word = state, bytearray()
        for _ in range(3 + (state >> 61)):
            word.append(ord("a") + digits % 26)
            digits //= 26
        if bytes(word) not in words:
            words[bytes(word)] = 1 + (len(words) + 1) * 2_654_435_761 % 1_000_003
    return words


KEYWORDS = _keywords()
WORDS = sorted(KEYWORDS)


def _lookup(text: bytes) -> str:
    """A Python model of the `lookup` tool."""
    words = [w for w in text.split(b" ") if w]
    total = 0
    for word in words:
        total = (total * 31 + KEYWORDS.get(word, 0)) & M64
    return f"{sum(w in KEYWORDS for w in words)} of {len(words)} words known, checksum {total}"


@pytest.fixture(scope="module")
def program():
    return Program.from_image(read_elf_file(ELF))


@pytest.fixture(scope="module", params=KINDS)
def keywords(request):
    return Engine(kind=request.param).load(ELF).harness(name="keywords")


def test_the_match_is_one_function_cut_into_chunks(program):
    (info,) = [f for f in analyse(program).functions if f.func.name.endswith("7keyword")]
    assert len(info.insns) > chunks.CHUNKED_ABOVE
    plan = chunks.chunk_plan(info, program)
    # the function's C function picks a chunk by address range: each chunk's entries lie in its own range
    starts, ends = [p.start for p in plan.parts], [p.end for p in plan.parts]
    assert len(plan.parts) > 1 and starts == [info.start, *ends[:-1]] and ends[-1] == info.end
    assert all(part.start <= t < part.end for part in plan.parts for t in part.local_targets)
    # the trie's jump tables: hundreds of local targets, named by relocations, in several chunks
    targets = info.local_targets
    assert len(targets) >= 500
    assert len({plan.home[t] for t in targets}) > 1


def test_every_keyword_is_known_and_near_misses_are_not(keywords):
    text = b" ".join(WORDS)
    assert keywords.call("lookup", b'"' + text + b'"') == _lookup(text)
    assert _lookup(text).startswith("1000 of 1000 words known")
    misses = b" ".join(w[:-1] + b"{" for w in WORDS) + b" " + b" ".join(w + b"a" for w in WORDS)
    assert keywords.call("lookup", b'"' + misses + b'"') == _lookup(misses)
    assert _lookup(misses).startswith("0 of 2000 words")


_WORD = st.one_of(st.sampled_from(WORDS),
                  st.sampled_from(WORDS).map(lambda w: w[:-1]),
                  st.sampled_from(WORDS).flatmap(lambda w: st.integers(0, len(w) - 1).map(
                      lambda i: w[:i] + bytes([(w[i] - 96) % 26 + 97]) + w[i + 1:])),  # the next letter
                  st.binary(max_size=11).filter(lambda w: b" " not in w and b'"' not in w))


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_WORD, max_size=40))
def test_lookups_match_the_model(keywords, words):
    text = b" ".join(words)
    assert keywords.call("lookup", b'"' + text + b'"') == _lookup(text)


def test_a_bare_argument_is_a_tool_failure(keywords):
    with pytest.raises(ToolFailure, match="lookup: the argument is not a JSON string"):
        keywords.call("lookup", b"plain")
