"""Edges of the SDK's C that tests/test_sdk_native.py leaves open, built natively the same way: documented caps of
the formatter, the C library corners harness code leans on (memset of -1, strncmp past a NUL, strrchr, strchr of
the terminator, a needle as long as its haystack), JSON's whitespace and repeated keys, the argument checks and the
capability replies. Each test here was added because a small change to the SDK (a mutant) passed every other."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from berm_abi.frames import encode_frame
from berm_host.traps import ToolFailure
from berm_sdk.native import NativeHarness, NativePanic, build_native_library
from tests.test_sdk_native import HELPERS, roundtrip, snprintf, stand_in

EXTRA = r"""
static const char *const ARGS_KNOWN[] = {"path", "count", NULL};

/* {"path": a string (required), "count": an integer up to 100}: what the checked arguments hold, or the problem. */
BERM_TOOL(args_check) {
    berm_arg_set a = berm_args_object(ARGS_KNOWN);
    berm_str path = {"", 0};
    int64_t count = -1;
    berm_arg_string(&a, "path", true, &path);
    berm_arg_int(&a, "count", false, INT64_MIN, 100, &count);
    if (a.error) return berm_fail(a.error);
    return berm_ok_str(berm_aprintf("%.*s %lld", (int)path.len, path.ptr, (long long)count));
}

/* The arguments through berm_buf_printf (the formatter's stack buffer, then the heap when longer). */
BERM_TOOL(buf_echo) {
    berm_str args = berm_args();
    berm_buf b;
    berm_buf_init(&b, 0);
    berm_buf_printf(&b, "%.*s", (int)args.len, args.ptr);
    return berm_buf_finish(&b);
}

BERM_TOOL(realloc_freed) {
    char *p = malloc(10);
    free(p);
    p = realloc(p, 5);
    return berm_ok_str("reallocated a freed block");
}
"""


@pytest.fixture(scope="module")
def lib_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdk-native-edges")
    (d / "helpers.c").write_text(HELPERS + EXTRA)
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
    # an exact tie that carries: rounded once, from the value itself (from its mantissa, five divisions away,
    # 999999.5 came out as 1000000, seven digits)
    (b"%g %.4g %.2g %.0e %.5e", (ctypes.c_double(999999.5), ctypes.c_double(9999.5), ctypes.c_double(99.5),
                                 ctypes.c_double(9.5), ctypes.c_double(999999.5)), b"1e+06 1e+04 1e+02 1e+01 1.00000e+06"),
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


# ---------------------------------------------------------------- JSON


@pytest.mark.parametrize("text, result", [
    (b'\r\n{\t"a"\r:\n[1\r,2 ]}\r\n', (0, '{"a":[1,2]}')),  # all four of JSON's whitespace characters
    (b'"a\x1fb"', (1, "control character in string at byte 2")),
    (b'"a\x7fb"', (0, '"a\x7fb"')),
    (b'"\xf0\x90\x80\x80\xf4\x8f\xbf\xbf"', (0, '"\U00010000\U0010ffff"')),
    (b'"\xf4\x90\x80\x80"', (1, "invalid UTF-8 in string at byte 1")),  # past U+10FFFF
    (b'"\xf0\x8f\xbf\xbf"', (1, "invalid UTF-8 in string at byte 1")),  # an overlong U+FFFF
    (b'"\xf5\x80\x80\x80"', (1, "invalid UTF-8 in string at byte 1")),
    (b'"\xed\x9f\xbf\xee\x80\x80"', (0, '"\ud7ff\ue000"')),  # either side of the surrogates
    (b'"\xed\xbf\xbf"', (1, "invalid UTF-8 in string at byte 1")),
    (rb'"\udbff\udfff"', (0, '"\U0010ffff"')),
    (rb'"\udc00"', (1, "lone low surrogate at byte 1")),
    (rb'"\ud800\ue000"', (1, "lone high surrogate at byte 1")),
    (rb'"\ud800\udbff"', (1, "lone high surrogate at byte 1")),
])
def test_json_whitespace_and_text_bounds(lib, text, result):
    assert roundtrip(lib, text) == result


def test_json_control_characters_are_written_as_escapes(lib):
    for c in range(0x20):
        out = ctypes.create_string_buffer(16)
        n = lib.t_json_string(bytes([c]), ctypes.c_size_t(1), out, ctypes.c_size_t(16))
        assert out.raw[:n] == {8: b'"\\b"', 9: b'"\\t"', 10: b'"\\n"', 12: b'"\\f"', 13: b'"\\r"'}.get(
            c, b'"\\u%04x"' % c)


def test_utf8_valid_checks_every_byte_of_every_word(lib):
    """berm_utf8_valid skips eight ASCII bytes at a time: a bad byte anywhere in such a word must still count."""
    lib.berm_utf8_valid.restype = ctypes.c_bool
    for size in (8, 16, 23):
        for at in range(size):
            for bad in (b"\xff", b"\x80", b"\xc3"):
                data = bytearray(b"a" * size)
                data[at:at + 1] = bad
                assert not lib.berm_utf8_valid(bytes(data), ctypes.c_size_t(size)), (size, at, bad)
            data = b"a" * at + "é".encode() + b"a" * (size - at)
            assert lib.berm_utf8_valid(data, ctypes.c_size_t(len(data)))


def test_json_get_takes_the_last_of_repeated_keys(harness):
    """berm.h: "the last one when repeated", as the round trip (which writes every member) could not show."""
    assert harness.call("json_get", '{"key":"first","other":0,"key":"second"}') == b"string:second"


@pytest.mark.parametrize("number, shown", [
    ("9223372036854775807", b"integer:9223372036854775807"),
    ("9223372036854775808", b"number:"),  # one past INT64_MAX: not an integer (it read as INT64_MIN)
    ("-9223372036854775808", b"integer:-9223372036854775808"),
    ("-9223372036854775809", b"number:"),
])
def test_json_integers_are_those_an_int64_holds(harness, number, shown):
    assert harness.call("json_get", f'{{"key":{number}}}') == shown


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("args, result", [
    ('{"path":"a","count":100}', "a 100"),
    ('{"path":"a","count":-9223372036854775808}', "a -9223372036854775808"),
    ('{"path":"a","count":-9223372036854775808.0}', "a -9223372036854775808"),
    ('{"path":"a","count":-92233720368547758.08e2}', "a -9223372036854775808"),
    ('{"path":"a","count":101}', "invalid arguments: 'count' must be between -9223372036854775808 and 100, not 101"),
    ('{"path":"a","count":-9223372036854775809.0}',
     "invalid arguments: 'count' must be an integer between -9223372036854775808 and 100, not -9223372036854775809.0"),
    # a key that is a prefix of a known one is not that one
    ('{"pat":"a"}', "invalid arguments: unknown field 'pat' (expected: path, count)"),
    ('{"path":"a","countx":1}', "invalid arguments: unknown field 'countx' (expected: path, count)"),
    ("", "invalid arguments: missing required field 'path'"),
])
def test_checked_arguments(harness, args, result):
    if result.startswith("invalid arguments"):
        with pytest.raises(ToolFailure) as info:
            harness.call("args_check", args)
        assert info.value.message == result
    else:
        assert harness.call("args_check", args) == result.encode()


# ---------------------------------------------------------------- the tool boundary and the allocator


@pytest.mark.parametrize("size", [255, 256, 257, 5000])
def test_buf_printf_of_any_length_is_whole(harness, size):
    """berm_buf_printf formats into 256 bytes of stack, then the heap: a text of exactly 256 bytes is the edge."""
    text = bytes(b"abcdefghij"[i % 10] for i in range(size))
    assert harness.call("buf_echo", text) == text


def test_realloc_of_a_freed_block_panics(harness):
    with pytest.raises(NativePanic, match=r"panicked: realloc\(\): pointer not allocated or already freed"):
        harness.call("realloc_freed")


# ---------------------------------------------------------------- capability replies


@pytest.mark.parametrize("reply, message", [
    (encode_frame(["", "", ""]), "malformed reply from berm.http.fetch: status  is not a number"),
    (encode_frame(["-", "", ""]), "malformed reply from berm.http.fetch: status - is not a number"),
    (encode_frame(["9223372036854775808", "", ""]),
     "malformed reply from berm.http.fetch: status 9223372036854775808 is not a number"),
    (encode_frame(["200", "", "", "extra"]), "malformed reply from berm.http.fetch: expected 3 fields"),
    (encode_frame(["200", "", ""]) + b"\0\0\0", "malformed reply from berm.http.fetch: expected 3 fields"),
])
def test_http_fetch_refuses_malformed_replies(lib_path, reply, message):
    h = stand_in(lib_path, "berm.http.fetch", reply=reply)
    with pytest.raises(ToolFailure) as info:
        h.call("http_fetch", "u")
    assert info.value.message == message


def test_clock_refuses_a_third_field(lib_path):
    h = stand_in(lib_path, "berm.clock.now", reply=encode_frame([1, 2, 3]))
    with pytest.raises(ToolFailure, match="^malformed reply from berm.clock.now: expected 2 fields$"):
        h.call("clock_now")


@pytest.mark.parametrize("reply", [b"\0", b"\0\0\0", encode_frame(["a"]) + b"\x01\0\0", encode_frame(["a"]) + b"\x02\0\0\0x"])
def test_kv_list_refuses_a_truncated_frame(lib_path, reply):
    h = stand_in(lib_path, "berm.kv.list", reply=reply)
    with pytest.raises(ToolFailure, match="^malformed reply from berm.kv.list$"):
        h.call("kv_list")


def test_kv_list_of_many_keys(lib_path):
    keys = [f"p{i:03}" for i in range(100)]
    h = stand_in(lib_path, "berm.kv.list", reply=encode_frame(keys))
    assert h.call("kv_list") == "".join(f"[{k}]" for k in keys).encode()


class _FrameReader(ctypes.Structure):
    _fields_ = [("pos", ctypes.c_void_p), ("end", ctypes.c_void_p), ("malformed", ctypes.c_bool)]


@pytest.mark.parametrize("data, fields", [
    (encode_frame(["ab", "", "c"]), [b"ab", b"", b"c"]),
    (b"\0\0\0", []),                          # a length cut short
    (encode_frame(["a"]) + b"\x01\0\0", [b"a"]),
    (b"\x02\0\0\0x", []),                     # a field longer than what is left
    (b"\x04\0\0\0abc", []),
])
def test_frame_reader_never_yields_a_field_past_the_end(lib, data, fields):
    """Bytes after the data (here the NUL ctypes adds, in a reply the SDK's own) must not be read as a length or a
    field: the first call past the good fields says malformed, whatever follows in memory."""
    buf = ctypes.create_string_buffer(data + b"\x7f" * 8, len(data) + 8)  # what lies past the end is not zeros
    lib.berm_frame_reader_init.restype = _FrameReader
    lib.berm_frame_next.restype = ctypes.c_bool
    reader = lib.berm_frame_reader_init(buf, ctypes.c_size_t(len(data)))
    field = (ctypes.c_void_p * 2)()
    got = []
    while lib.berm_frame_next(ctypes.byref(reader), ctypes.byref(field)):
        start, size = field[0] - ctypes.addressof(buf), field[1] or 0
        got.append(data[start:start + size] if start + size <= len(data) else ("past the end", start, size))
    assert got == fields
    assert reader.malformed == (fields == [] or data != encode_frame([f.decode() for f in fields]))
