"""Rust v0 symbol names in trap messages and listings (berm_aot.demangle): the names rustc 1.96 gave rust-probe's
functions read as their author wrote them, and any name the module cannot read whole is left exactly as it was —
garbage, truncation, punycode, back-references that loop, nesting that would recurse without end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from berm_aot import demangle as demangle_module
from berm_aot.demangle import demangle
from berm_aot.elf import read_elf
from tests.test_rust_guest import ELF

KNOWN = [
    ("_RNvCsfgHYwM92fyn_7___rustc17rust_begin_unwind", "__rustc::rust_begin_unwind"),
]


@pytest.mark.parametrize("mangled, plain", KNOWN)
def test_known_names(mangled, plain):
    assert demangle(mangled) == plain


def test_rust_probe_names_read_as_written():
    names = {s.name: demangle(s.name) for s in read_elf(ELF.read_bytes()).symbols if s.name.startswith("_R")}
    plain = set(names.values())
    for expected in ("__rustc::rust_begin_unwind", "core::panicking::panic_fmt",
                     "<rust_probe::Square as rust_probe::Shape>::area", "<u64 as core::fmt::Display>::fmt",
                     "core::ptr::drop_in_place::<alloc::string::String>",  # generic arguments of a value path
                     "<core::ops::range::Range<usize> as core::fmt::Debug>::fmt",  # ... and of a type
                     "<[u64; 3] as core::fmt::Debug>::fmt", "<&str as core::fmt::Display>::fmt",
                     "<alloc::raw_vec::RawVecInner<_>>::reserve::do_reserve_and_handle::<alloc::alloc::Global>"):
        assert expected in plain, expected
    assert sum(1 for m, p in names.items() if m != p) >= len(names) - 2  # all but dyn types


@pytest.mark.parametrize("name", [
    "main", "_ZN4core3fmt5write17h0123456789abcdefE", "_R", "_RNv", "_RNvC", "_RNvCs_3abc",
    "_RNvCs_3abc99xyz", "_RNvCs_3abcu3ab", "_RB_", "_RNvB0_3abc", "_RNvBz_3abc", "_R" + "N" * 5000 + "v",
    "_RINvCs_3abcDE", "_R0NvCs_3abc3def", "_RNvCs_3abc3def.llvm.123x",
])
def test_what_it_cannot_read_whole_is_left_as_it_is(name):
    out = demangle(name)
    assert out == name or name.startswith("_RNvCs_3abc3def.")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="_RNCsvMXYIBELKpabcdefhijlmnostuxyzRQPOSAT0123456789", max_size=80))
def test_never_raises(tail):
    assert isinstance(demangle("_R" + tail), str)


def _base62(value: int) -> str:
    if value == 0:
        return "_"
    digits, value = "", value - 1
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    while True:
        digits = alphabet[value % 62] + digits
        value //= 62
        if not value:
            return digits + "_"


def test_back_references_to_back_references_cannot_take_exponential_time():
    """Each tuple refers twice to the one before it: 40 of them expand to 2^40 nodes. A name from a hostile ELF is
    shown in trap messages, so the expansion is bounded; past it the name stays as it is."""
    name = _doubling(40)
    assert demangle(name) == name


def _doubling(levels: int) -> str:
    """A v0 name of ``levels`` tuples, each referring twice to the one before it: 2^levels nodes expanded."""
    text, previous = "YT", None
    for _ in range(levels):
        start = len(text)
        text += "TuuE" if previous is None else f"TB{_base62(previous)}B{_base62(previous)}E"
        previous = start
    return "_R" + text + "E" + "Cs_3abc"


def test_the_work_on_a_short_name_is_in_proportion_to_its_length():
    """Found by a review: distinct 190-character names of back-references to back-references took 9 ms each (10,000
    nodes) to give up on, for every function of an image the translator names in its comments."""
    name = _doubling(12)
    parser = demangle_module._Parser(name[2:])
    with pytest.raises(demangle_module._Unsupported):
        parser.path()
    assert len(name) < 200 and parser.nodes <= 64 + 4 * len(name) + 1
    assert demangle(name) == name


def test_back_references_to_a_long_identifier_cannot_make_a_name_thousands_of_times_its_size():
    """The node bound kept the work small but not the name: back-references to a 3,900-character identifier made a
    4,033-character name demangle to 10.8 million characters (kept by the cache). Past MAX_SHOWN characters of
    identifiers, the name stays as it is."""
    ident = "x" * 3900
    text, target = f"IC{len(ident)}{ident}", 1
    for fan in (8, 8, 6, 2, 2):  # each tuple refers ``fan`` times to the one before it, the first to the identifier
        start = len(text)
        text += "T" + f"B{_base62(target)}" * fan + "E"
        target = start
    name = "_R" + text + "E"
    assert len(name) <= 4096 and demangle(name) == name


def test_a_name_is_shown_on_one_line_and_cut():
    from berm_aot.demangle import MAX_NAME, shown_name

    assert shown_name("f\nforged: \u202eevil") == "f\\x0aforged: \\u202eevil"
    long = shown_name("g" * 100_000)
    assert long == "g" * MAX_NAME + "…"
    assert shown_name("_RNvCs_3std4main") == "std::main"


def test_a_constant_shown_again_through_back_references_counts_against_the_name():
    """Found by a review: constants were not counted against what a name may show, so a 3.9 KB name whose tuple
    refers back to a 3,300-digit constant 100 times, referred back to 32 times, demangled to 13.1 MB. A constant
    of more than 32 hex digits (u128's) is no name rustc writes, and what constants show counts as identifiers do."""
    body = "INvC1a1fKj" + "f" * 32 + "_"
    tup = "T" + ("AhB" + _base62(body.index("Kj") + 1)) * 100 + "E"
    name = "_R" + body + tup + ("B" + _base62(len(body))) * 32 + "E"
    out = demangle(name)
    assert out == name or len(out) < 4 * len(name)
    assert demangle("_RINvC1a1fKj" + "f" * 32 + "_E") == "a::f::<" + str(2 ** 128 - 1) + ">"
    long = "_RINvC1a1fKj" + "f" * 33 + "_E"
    assert demangle(long) == long


def test_a_base62_number_longer_than_64_bits_is_left_as_it_is():
    """Found by a review: a disambiguator of 2,300 base-62 digits, read again at every back-reference to it, took
    4.1 s for a 2.9 KB name (and the name came back undemangled). Positions, disambiguators and lifetimes fit 64
    bits, 11 digits."""
    assert demangle("_RNvCs" + "z" * 10 + "_1a1f") == "a::f"
    name = "_RNvCs" + "z" * 12 + "_1a1f"
    assert demangle(name) == name
