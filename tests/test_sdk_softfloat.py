"""Harness C may use double, float and __int128: the guest links compiler-rt (berm_sdk.runtime) for the soft-float
and 128-bit helpers. One harness built by `berm build` computes with each type on both engines and natively
(host gcc + libgcc), and the answers are also checked against Python's own IEEE doubles and integers."""

from __future__ import annotations

import importlib.metadata
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berm_aot.elf import read_elf
from berm_cli.main import main
from berm_sdk.native import NativeHarness, build_native_library
from berm_sdk.runtime import runtime_key
from berm_sdk.toolchain import ToolchainError
from tests.sdk_engines import ENGINE_KINDS, NativeText, harness

TOML = """name = "numbers"
usage = "Floating point and 128-bit integers in harness C."
""" + "".join(f'\n[[tools]]\nname = "{t}"\ndescription = "{t}"\n' for t in ("dbl", "flt", "i128"))

# Each tool reads lines of hexadecimal operands and writes one line of results per input line. Doubles and floats
# come in and go out as bit patterns (any NaN prints as "nan": NaN payloads differ between implementations);
# conversions that C leaves undefined (out of range) print "-".
SOURCE = r"""
#include "berm.h"

typedef unsigned long u64;
typedef unsigned __int128 u128;
typedef __int128 i128;

static const char *cur, *stop;

static int next_line(void) {
    while (cur < stop && (*cur == '\n' || *cur == ' ')) cur++;
    return cur < stop;
}

static u128 hex(void) {
    u128 v = 0;
    while (cur < stop && *cur == ' ') cur++;
    for (; cur < stop && *cur != ' ' && *cur != '\n'; cur++)
        v = v << 4 | (u128)(*cur <= '9' ? *cur - '0' : *cur - 'a' + 10);
    return v;
}

static void put_hex(berm_buf *b, u128 v, int digits) {
    berm_buf_putc(b, ' ');
    for (int i = digits - 1; i >= 0; i--) berm_buf_putc(b, "0123456789abcdef"[(u64)(v >> (4 * i)) & 15]);
}

static void put_digits(berm_buf *b, u128 v) {  /* 128-bit division by hand: __udivti3 and __umodti3 */
    char text[40];
    int n = 0;
    do { text[n++] = (char)('0' + (int)(v % 10)); v /= 10; } while (v);
    while (n) berm_buf_putc(b, text[--n]);
}

static void put_dec(berm_buf *b, u128 v) { berm_buf_putc(b, ' '); put_digits(b, v); }

static void put_double(berm_buf *b, double d) {
    union { double d; u64 u; } c = {d};
    if (d != d) berm_buf_puts(b, " nan");
    else put_hex(b, c.u, 16);
}

static void put_float(berm_buf *b, float f) {
    union { float f; unsigned u; } c = {f};
    if (f != f) berm_buf_puts(b, " nan");
    else put_hex(b, c.u, 8);
}

/* Decimal digits of d (|d| < 1e18) by hand: the integer part, then six digits of the fraction. */
static void put_decimal(berm_buf *b, double d) {
    if (!(d > -1e18 && d < 1e18)) { berm_buf_puts(b, " -"); return; }
    int negative = d < 0;
    if (negative) d = -d;
    u64 whole = (u64)d;
    double frac = d - (double)whole;
    berm_buf_puts(b, negative ? " -" : " ");
    put_digits(b, whole);
    berm_buf_putc(b, '.');
    for (int i = 0; i < 6; i++) {
        frac = frac * 10;
        int digit = (int)frac;
        berm_buf_putc(b, (char)('0' + digit));
        frac = frac - digit;
    }
}

static void put_flag(berm_buf *b, int v) { berm_buf_puts(b, v ? " 1" : " 0"); }

static berm_result_t each_line(void (*one)(berm_buf *)) {
    berm_str args = berm_args();
    cur = args.ptr;
    stop = args.ptr + args.len;
    berm_buf b;
    berm_buf_init(&b, 0);
    while (next_line()) { one(&b); berm_buf_putc(&b, '\n'); }
    return berm_buf_finish(&b);
}

static void dbl_one(berm_buf *b) {
    union { u64 u; double d; } x = {(u64)hex()}, y = {(u64)hex()};
    double a = x.d, c = y.d;
    put_double(b, a + c); put_double(b, a - c); put_double(b, a * c); put_double(b, a / c);
    put_flag(b, a < c); put_flag(b, a <= c); put_flag(b, a == c); put_flag(b, a > c); put_flag(b, a != c);
    if (a > -9223372036854775808.0 && a < 9223372036854775808.0) put_hex(b, (u64)(long)a, 16);
    else berm_buf_puts(b, " -");
    if (a > -1.0 && a < 18446744073709551616.0) put_hex(b, (unsigned long)a, 16);
    else berm_buf_puts(b, " -");
    put_double(b, (double)(long)x.u); put_double(b, (double)y.u);
    put_double(b, (double)(int)x.u); put_double(b, (double)(unsigned)y.u);
    put_float(b, (float)a); put_double(b, (double)(float)c);
    put_decimal(b, a); put_decimal(b, a / c);
}

static void flt_one(berm_buf *b) {
    union { unsigned u; float f; } x = {(unsigned)hex()}, y = {(unsigned)hex()};
    float a = x.f, c = y.f;
    put_float(b, a + c); put_float(b, a - c); put_float(b, a * c); put_float(b, a / c);
    put_flag(b, a < c); put_flag(b, a >= c); put_flag(b, a == c);
    if (a > -2147483648.0f && a < 2147483648.0f) put_hex(b, (unsigned)(int)a, 8);
    else berm_buf_puts(b, " -");
    put_double(b, (double)a); put_float(b, (float)(int)x.u); put_float(b, (float)y.u);
    put_float(b, (float)(long)((u64)x.u << 32 | y.u));
}

static void i128_one(berm_buf *b) {
    u128 a = hex(), c = hex();
    unsigned s = (unsigned)hex();
    i128 sa = (i128)a, sc = (i128)c;
    put_hex(b, a * c, 32);
    if (c) { put_hex(b, a / c, 32); put_hex(b, a % c, 32); }
    else berm_buf_puts(b, " - -");
    if (c && !(sc == -1 && a == (u128)1 << 127)) { put_hex(b, (u128)(sa / sc), 32); put_hex(b, (u128)(sa % sc), 32); }
    else berm_buf_puts(b, " - -");
    put_hex(b, a << (s & 127), 32); put_hex(b, a >> (s & 127), 32); put_hex(b, (u128)(sa >> (s & 127)), 32);
    u64 w = (u64)a;
    put_hex(b, w << (s & 63), 16); put_hex(b, w >> (s & 63), 16); put_hex(b, (u64)((long)w >> (s & 63)), 16);
    put_dec(b, a);
}

BERM_TOOL(dbl) { return each_line(dbl_one); }
BERM_TOOL(flt) { return each_line(flt_one); }
BERM_TOOL(i128) { return each_line(i128_one); }
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("numbers")
    (d / "harness.toml").write_text(TOML)
    (d / "numbers.c").write_text(SOURCE)
    return d


@pytest.fixture(scope="module")
def elf(project, tmp_path_factory):
    """`berm build` of the project: it succeeds only when its own output check passes (manifest, relocations, no
    F/D/CSR instruction reachable)."""
    out = tmp_path_factory.mktemp("out") / "numbers.elf"
    assert main(["build", str(project), "-o", str(out)]) == 0
    return out.read_bytes()


@pytest.fixture(scope="module", params=[*ENGINE_KINDS, "native"])
def tools(request, elf, project):
    if request.param == "native":
        return NativeText(NativeHarness(build_native_library([project / "numbers.c"], project / "numbers.so")))
    return harness(request.param, elf, name="numbers")


# ---------------------------------------------------------------- the Python oracle


def f64(bits: int) -> float:
    return struct.unpack("<d", bits.to_bytes(8, "little"))[0]


def f64_bits(x: float) -> int:
    return int.from_bytes(struct.pack("<d", x), "little")


def f32_bits(x: float) -> int:
    return int.from_bytes(struct.pack("<f", x), "little")


def f32(bits: int) -> float:
    return struct.unpack("<f", bits.to_bytes(4, "little"))[0]


def to_f32(x: float) -> float:
    """x rounded to single precision (to nearest, ties to even), overflowing to infinity as IEEE does."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # struct refuses exactly when the rounded value is infinite
        return math.copysign(math.inf, x)


def int_to_f32(n: int) -> float:
    """n rounded straight to single precision (float(n) first would round twice)."""
    shift = max(abs(n).bit_length() - 24, 0)
    q, r = divmod(abs(n), 1 << shift)
    half = (1 << shift) >> 1
    if shift and (r > half or (r == half and q & 1)):
        q += 1
    return math.copysign(float(q << shift), n)


def signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


def hexs(v: int, digits: int) -> str:
    return f"{v % (1 << (4 * digits)):0{digits}x}"


def show64(x: float) -> str:
    return "nan" if math.isnan(x) else hexs(f64_bits(x), 16)


def show32(x: float) -> str:
    return "nan" if math.isnan(x) else hexs(f32_bits(x), 8)


def divide(a: float, c: float) -> float:
    if c != 0:
        return a / c
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, c)


def decimal(d: float) -> str:
    """put_decimal's digits, computed with the same double operations."""
    if not -1e18 < d < 1e18:
        return "-"
    sign = "-" if d < 0 else ""
    d = abs(d)
    whole = int(d)
    frac = d - float(whole)
    digits = ""
    for _ in range(6):
        frac = frac * 10
        digits += str(int(frac))
        frac = frac - int(frac)
    return f"{sign}{whole}.{digits}"


def flags(*values: bool) -> list[str]:
    return ["1" if v else "0" for v in values]


def expect_dbl(x: int, y: int) -> str:
    a, c = f64(x), f64(y)
    out = [show64(a + c), show64(a - c), show64(a * c), show64(divide(a, c)),
           *flags(a < c, a <= c, a == c, a > c, a != c),
           hexs(int(a), 16) if -2.0**63 < a < 2.0**63 else "-",
           hexs(int(a), 16) if -1.0 < a < 2.0**64 else "-",
           show64(float(signed(x, 64))), show64(float(y)), show64(float(signed(x % 2**32, 32))),
           show64(float(y % 2**32)), show32(to_f32(a)), show64(to_f32(c)), decimal(a), decimal(divide(a, c))]
    return " ".join(out)


def expect_flt(x: int, y: int) -> str:
    a, c = f32(x), f32(y)
    out = [show32(to_f32(a + c)), show32(to_f32(a - c)), show32(to_f32(a * c)), show32(to_f32(divide(a, c))),
           *flags(a < c, a >= c, a == c),
           hexs(int(a), 8) if -2.0**31 < a < 2.0**31 else "-",
           show64(a), show32(to_f32(float(signed(x, 32)))), show32(to_f32(float(y))),
           show32(int_to_f32(signed(x << 32 | y, 64)))]
    return " ".join(out)


def trunc_div(a: int, c: int) -> tuple[int, int]:
    q = abs(a) // abs(c) * (1 if (a < 0) == (c < 0) else -1)
    return q, a - q * c


def expect_i128(a: int, c: int, s: int) -> str:
    m, k, w = 2**128, s & 127, a % 2**64
    out = [hexs(a * c, 32)]
    out += [hexs(a // c, 32), hexs(a % c, 32)] if c else ["-", "-"]
    sa, sc = signed(a, 128), signed(c, 128)
    out += [hexs(v, 32) for v in trunc_div(sa, sc)] if c and not (sc == -1 and sa == -(2**127)) else ["-", "-"]
    out += [hexs((a << k) % m, 32), hexs(a >> k, 32), hexs(sa >> k, 32),
            hexs(w << (s & 63), 16), hexs(w >> (s & 63), 16), hexs(signed(w, 64) >> (s & 63), 16), str(a)]
    return " ".join(out)


#: Each tool's operand widths in hex digits and its oracle.
TOOLS = {"dbl": ((16, 16), expect_dbl), "flt": ((8, 8), expect_flt), "i128": ((32, 32, 2), expect_i128)}


def run(tools, tool: str, rows: list[tuple[int, ...]]) -> list[str]:
    args = "\n".join(" ".join(hexs(v, w) for v, w in zip(row, TOOLS[tool][0])) for row in rows)
    return [line.strip() for line in tools.call(tool, args).splitlines()]


def check(tools, tool: str, rows: list[tuple[int, ...]]) -> None:
    assert run(tools, tool, rows) == [TOOLS[tool][1](*row) for row in rows]


# ---------------------------------------------------------------- operands

SPECIAL_DOUBLES = [0.0, -0.0, 1.0, -1.0, 0.1, 3.0, -2.5, 1e300, -1e-300, 5e-324, 2.2250738585072014e-308,
                   1.7976931348623157e308, math.inf, -math.inf, math.nan, 2.0**63, -(2.0**63), 2.0**64 - 2048,
                   123456789.125, 9007199254740993.0, 0.5, 1e18, -999999.999999]
SPECIAL_FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 3.4028234663852886e38, 1.401298464324817e-45, 1.1754943508222875e-38,
                  math.inf, -math.inf, math.nan, 2.0**31, -(2.0**31), 16777217.0, 1e10, 7.0]
INT128_EDGES = [0, 1, 2, 3, 10, 2**64 - 1, 2**64, 2**63, 2**127, 2**128 - 1, 2**127 - 1, 10**30 + 7]

doubles = st.one_of(st.floats().map(f64_bits), st.integers(0, 2**64 - 1),
                    st.sampled_from(SPECIAL_DOUBLES).map(f64_bits))
floats = st.one_of(st.floats(width=32).map(f32_bits), st.integers(0, 2**32 - 1))
int128s = st.one_of(st.integers(0, 2**128 - 1), st.integers(0, 2**64), st.sampled_from(INT128_EDGES),
                    st.integers(-(2**64), -1).map(lambda v: v % 2**128))


# ---------------------------------------------------------------- tests


EDGE_ROWS = {
    "dbl": [(f64_bits(a), f64_bits(c)) for a in SPECIAL_DOUBLES for c in SPECIAL_DOUBLES[::3]],
    "flt": [(f32_bits(a), f32_bits(c)) for a in SPECIAL_FLOATS for c in SPECIAL_FLOATS[::2]],
    "i128": [(a, c, (0, 1, 63, 64, 127)[(a + c) % 5]) for a in INT128_EDGES for c in INT128_EDGES[::2]],
}


@pytest.mark.parametrize("tool", sorted(EDGE_ROWS))
def test_edge_cases(tools, tool):
    check(tools, tool, EDGE_ROWS[tool])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(doubles, doubles), min_size=1, max_size=12))
def test_double_arithmetic_conversions_and_comparisons(tools, rows):
    check(tools, "dbl", rows)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(floats, floats), min_size=1, max_size=12))
def test_float_arithmetic_and_conversions(tools, rows):
    check(tools, "flt", rows)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(int128s, int128s, st.integers(0, 255)), min_size=1, max_size=12))
def test_int128_multiply_divide_and_shifts(tools, rows):
    check(tools, "i128", rows)


def test_subnormal_quotients_are_rounded_once(tools):
    """zig's compiler-rt gets these one ulp low (it rounds, then shifts into the subnormal range);
    harnesses/sdk/runtime/divide.c replaces its __divdf3 and __divsf3."""
    assert run(tools, "dbl", [(0x00244EF7E8E5B461, 0xC1001762BAB9F87F)])[0].split()[3] == "8000001431743745"
    assert run(tools, "flt", [(0x0144ECDF, 0x45BAA48D)])[0].split()[3] == "000010e2"


def test_decimal_printing_by_hand(tools):
    rows = [(f64_bits(3.25), f64_bits(1.0)), (f64_bits(-0.1), f64_bits(3.0))]
    assert [line.split()[-2:] for line in run(tools, "dbl", rows)] == \
        [["3.250000", "3.250000"], ["-0.100000", "-0.033333"]]


# ---------------------------------------------------------------- the build


def test_only_the_helpers_used_are_linked(elf):
    names = {s.name for s in read_elf(elf).symbols}
    assert {"__adddf3", "__divdf3", "__divsf3", "__udivti3", "__divti3", "__floatundidf", "__truncdfsf2"} <= names
    assert not {"__addtf3", "__divxf3", "cos", "__mulodi4"} & names  # compiler-rt has them; nothing calls them


def test_a_missing_ziglang_is_a_toolchain_error(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(ToolchainError, match="pip install ziglang"):
        runtime_key()
