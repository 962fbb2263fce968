"""Edges of the SDK's C that tests/test_sdk_native.py leaves open, built natively the same way: documented caps of
the formatter, the C library corners harness code leans on (memset of -1, strncmp past a NUL, strrchr, strchr of
the terminator, a needle as long as its haystack), JSON's whitespace and repeated keys, the argument checks and the
capability replies. Each test here was added because a small change to the SDK (a mutant) passed every other."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from berm_sdk.native import NativeHarness, build_native_library
from tests.test_sdk_native import HELPERS, snprintf


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdk-native-edges")
    (d / "helpers.c").write_text(HELPERS)
    return build_native_library([d / "helpers.c"], d / "sdk.so")


@pytest.fixture(scope="module")
def harness(lib_path):
    return NativeHarness(lib_path)


@pytest.fixture(scope="module")
def lib(harness):
    return harness.lib


# ---------------------------------------------------------------- formatter


@pytest.mark.parametrize("fmt, args, text", [
    # berm.h: "an integer at most 64 digits of precision" (past it the digits ran off a 96-byte stack buffer)
    (b"%.200d|", (ctypes.c_int(5),), b"0" * 63 + b"5|"),
    (b"%.100lx", (ctypes.c_ulong(0xAB),), b"0" * 62 + b"ab"),
    # a double's precision is capped at 17 places (past it %f read beyond its table of powers of ten)
    (b"%.25f %.30f", (ctypes.c_double(0.5), ctypes.c_double(1.25)), b"0.50000000000000000 1.25000000000000000"),
])
def test_snprintf_documented_caps(lib, fmt, args, text):
    assert snprintf(lib, 256, fmt, *args) == (len(text), text)


@pytest.mark.parametrize("fmt, args, text", [
    # %.0g is %.1g: one significant digit (without it the precision wrapped below zero, and %e showed 17 digits,
    # which only the tolerance of the hypothesis tests let pass)
    (b"%.0g %.0g %.0g %.0G", (ctypes.c_double(3.14159), ctypes.c_double(1234.5), ctypes.c_double(0.000123),
                             ctypes.c_double(2.6e-7)), b"3 1e+03 0.0001 3E-07"),
    # rounded to its precision, a value that carries into one more digit takes the exponent form by the new exponent
    (b"%.2g %.3g %g %.1g", (ctypes.c_double(99.9), ctypes.c_double(999.7), ctypes.c_double(999999.7),
                            ctypes.c_double(9.7)), b"1e+02 1e+03 1e+06 1e+01"),
    # '#' keeps the point of a precision of 0 (the hypothesis test below starts at precision 1)
    (b"%#.0f|%#.0e|%#.0g|%.0f", (ctypes.c_double(3.0), ctypes.c_double(3.0), ctypes.c_double(3.0),
                                 ctypes.c_double(3.0)), b"3.|3.e+00|3.|3"),
    # %e shows at most 17 significant digits (past 16 places it read beyond its table of powers of ten)
    (b"%.17e %.20e", (ctypes.c_double(0.1), ctypes.c_double(0.25)), b"1.0000000000000000e-01 2.5000000000000000e-01"),
    # a negative precision through * is no precision at all, as in C
    (b"[%.*d][%.*s][%.*f]", (ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_int(-1), b"abc", ctypes.c_int(-3),
                             ctypes.c_double(0.5)), b"[0][abc][0.500000]"),
    (b"%p %p", (ctypes.c_void_p(0x1234), ctypes.c_void_p(2**64 - 16)), b"0x1234 0xfffffffffffffff0"),
    # L: the argument is a long double (read as a double, the next %s took the wrong argument)
    (b"%Lf %Le %s", (ctypes.c_longdouble(2.5), ctypes.c_longdouble(-1e10), b"ok"), b"2.500000 -1.000000e+10 ok"),
    # a % at the very end is copied as it stands, the NUL after it is not read past
    (b"100%", (), b"100%"),
    (b"%-", (), b"%-"),
])
def test_snprintf_exact_shapes(lib, fmt, args, text):
    assert snprintf(lib, 256, fmt, *args) == (len(text), text)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 999999), st.integers(-15, 15), st.booleans(), st.sampled_from("eEgGf"), st.integers(1, 10),
       st.sampled_from(["", "#", "+", "-14", "014", "# "]))
def test_snprintf_short_decimals_exactly_as_c(lib, mantissa, exp10, negative, conv, precision, flags):
    """A value of a few significant digits, shown with room for all of them, has one right text (no digit is rounded
    away, so rounding in double arithmetic cannot show): the shape of %g (when it takes the exponent form, which
    zeros it strips, what # keeps) was checked by no test, only its value, to a tolerance."""
    digits = len(str(mantissa))
    if conv in "gG":
        assume(digits <= precision)
    elif conv in "eE":
        assume(digits <= precision + 1)
    else:
        assume(exp10 >= -precision and mantissa * 10.0 ** exp10 < 1e15)
    value = float(f"{'-' if negative else ''}{mantissa}e{exp10}")
    fmt = f"%{flags}.{precision}{conv}"
    text = (fmt % value).encode()
    assert snprintf(lib, 128, fmt.encode(), ctypes.c_double(value)) == (len(text), text)


# ---------------------------------------------------------------- mem* and str*


def test_memset_takes_its_byte_as_unsigned_char(lib):
    """memset(p, -1, n) is everyday C: the word-wide fill multiplied the int itself, not its low byte."""
    buf = ctypes.create_string_buffer(40)
    lib.memset(buf, ctypes.c_int(-1), ctypes.c_size_t(37))
    assert buf.raw == b"\xff" * 37 + bytes(3)
    lib.memset(buf, ctypes.c_int(0x1AB), ctypes.c_size_t(19))
    assert buf.raw == b"\xab" * 19 + b"\xff" * 18 + bytes(3)


def test_strncmp_stops_at_the_terminator_and_compares_unsigned(lib):
    assert lib.strncmp(b"ab\0x", b"ab\0y", ctypes.c_size_t(4)) == 0
    assert lib.strncmp(b"abc", b"abd", ctypes.c_size_t(2)) == 0
    assert lib.strncmp(b"abc", b"abd", ctypes.c_size_t(3)) < 0
    assert lib.strncmp(b"\xe9t\xe9", b"ete", ctypes.c_size_t(3)) > 0  # 0xe9 is past 'e', not below 0
    assert lib.strncmp(b"a", b"a\x80", ctypes.c_size_t(5)) < 0


def test_strchr_and_strrchr(lib):
    lib.strchr.restype = lib.strrchr.restype = ctypes.c_void_p
    text = ctypes.create_string_buffer(b"dir/sub/file.c")
    at = ctypes.addressof(text)
    assert lib.strchr(text, ctypes.c_int(ord("/"))) == at + 3
    assert lib.strrchr(text, ctypes.c_int(ord("/"))) == at + 7
    assert lib.strchr(text, ctypes.c_int(0)) == lib.strrchr(text, ctypes.c_int(0)) == at + 14  # the terminator
    assert lib.strchr(text, ctypes.c_int(ord("x"))) is None and lib.strrchr(text, ctypes.c_int(ord("x"))) is None


@pytest.mark.parametrize("haystack, needle, at", [
    (b"abcd", b"abcd", 0),        # the needle as long as the haystack
    (b"abcd", b"cd", 2),          # at the last place it fits
    (b"x" * 20 + b"ab", b"ab", 20),
    (b"abc", b"abcd", None),
    (b"abc", b"", None),          # berm_memmem: NULL for an empty needle (strstr: the haystack)
])
def test_berm_memmem(lib, haystack, needle, at):
    lib.berm_memmem.restype = lib.strstr.restype = ctypes.c_void_p
    hay = ctypes.create_string_buffer(haystack)
    got = lib.berm_memmem(hay, ctypes.c_size_t(len(haystack)), needle, ctypes.c_size_t(len(needle)))
    assert got == (None if at is None else ctypes.addressof(hay) + at)
    expected = ctypes.addressof(hay) if not needle else got
    assert lib.strstr(hay, needle) == expected


def test_memchr_finds_the_first_byte_in_any_word(lib):
    lib.memchr.restype = ctypes.c_void_p
    for size in (1, 7, 8, 9, 40):
        for where in range(size):
            for byte in (0x00, 0x01, 0x7F, 0x80, 0xFF):
                data = bytearray(((i * 37) % 251 + 2) & 0xFF or 2 for i in range(size))
                data = bytearray(b if b != byte else (byte ^ 0x40) for b in data)
                data[where] = byte
                if where + 1 < size:
                    data[-1] = byte  # a later one is not the answer
                buf = ctypes.create_string_buffer(bytes(data), size)
                assert lib.memchr(buf, ctypes.c_int(byte), ctypes.c_size_t(size)) == ctypes.addressof(buf) + where
                assert lib.memchr(buf, ctypes.c_int(byte), ctypes.c_size_t(where)) is None


def test_strndup_and_strdup(lib):
    lib.strndup.restype = lib.strdup.restype = ctypes.c_void_p
    lib.berm__heap_reset()
    assert ctypes.string_at(lib.strndup(b"abcdef", ctypes.c_size_t(3))) == b"abc"
    assert ctypes.string_at(lib.strndup(b"ab", ctypes.c_size_t(10))) == b"ab"
    assert ctypes.string_at(lib.strdup(b"hello")) == b"hello"
