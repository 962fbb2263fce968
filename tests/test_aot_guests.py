"""Whole C guests on translated code give the native answers: the same C compiled by the host's gcc and called
through ctypes is the oracle. Covers switch jump tables, function pointers in code and in data (vtables),
recursion, mutual recursion, 64-bit and 128-bit-high arithmetic, division edge cases, atomics, sorting through
a comparator, string hashing and a byte-level parser."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from berm_host.backend import RunRequest
from berm_host.engine import Engine
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long u64;
typedef long i64;
typedef unsigned char u8;

static u64 state[64];

__attribute__((noinline)) u64 fib(u64 n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__attribute__((noinline)) u64 is_even(u64 n);
__attribute__((noinline)) u64 is_odd(u64 n) { return n == 0 ? 0 : is_even(n - 1); }
__attribute__((noinline)) u64 is_even(u64 n) { return n == 0 ? 1 : is_odd(n - 1); }

__attribute__((noinline)) u64 sw(u64 x, u64 y) {
    switch (x % 13) {
    case 0: return y * 3 + 1;
    case 1: return y << 7;
    case 2: return y ^ 0x55;
    case 3: return y + 11;
    case 4: return y / 7;
    case 5: return y * y;
    case 6: return y - 99;
    case 7: return y | 0x100;
    case 8: return ~y;
    case 9: return y >> 3;
    case 10: return (i64)y >> 5;
    case 11: return y % 1000;
    default: return 42;
    }
}

typedef u64 (*op_fn)(u64, u64);
static u64 op_add(u64 a, u64 b) { return a + b; }
static u64 op_mul(u64 a, u64 b) { return a * b; }
static u64 op_xor(u64 a, u64 b) { return a ^ b; }
static u64 op_rot(u64 a, u64 b) { return (a << (b & 63)) | (a >> ((64 - (b & 63)) & 63)); }
op_fn table[] = { op_add, op_mul, op_xor, op_rot };     /* pointers in data: R_RISCV_64 */
struct vt { op_fn f; u64 bias; };
static const struct vt vts[] = { { op_add, 1 }, { op_xor, 7 }, { op_rot, 3 } };

u64 fold(u64 seed, u64 n) {
    u64 acc = seed;
    op_fn local = (seed & 1) ? op_mul : op_add;            /* pointers in code: PCREL_HI20 */
    for (u64 i = 0; i < n; i++) {
        acc = table[(acc >> 7) % 4](acc, i + 1);
        acc = local(acc, 0x9e3779b97f4a7c15ul);
        const struct vt *v = &vts[i % 3];
        acc = v->f(acc, v->bias);
    }
    return acc;
}

u64 arith(u64 a, u64 b) {
    i64 sa = (i64)a, sb = (i64)b;
    u64 r = 0;
    r ^= (u64)((unsigned __int128)a * b >> 64);
    r ^= (u64)((__int128)sa * sb >> 64);
    r ^= b ? a / b : 0x1111;
    r ^= b ? a % b : 0x2222;
    r ^= (sb && !(sa == (i64)0x8000000000000000ul && sb == -1)) ? (u64)(sa / sb) : 0x3333;
    r ^= (u64)(int)((unsigned)a * (unsigned)b);
    r ^= (u64)(i64)(int)((int)a >> (b & 31));
    r ^= ((unsigned)b ? (u64)((unsigned)a / (unsigned)b) : 0x4444);
    return r;
}

u64 atomics(u64 n) {
    static u64 counter;
    static unsigned word;
    counter = 0; word = 0;
    for (u64 i = 0; i < n; i++) {
        __atomic_fetch_add(&counter, i, __ATOMIC_SEQ_CST);
        __atomic_fetch_xor(&word, (unsigned)(i * 2654435761u), __ATOMIC_SEQ_CST);
        unsigned expected = word;
        __atomic_compare_exchange_n(&word, &expected, expected + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        u64 seen = __atomic_load_n(&counter, __ATOMIC_SEQ_CST);
        while (seen < i * 3 && !__atomic_compare_exchange_n(&counter, &seen, i * 3, 1, __ATOMIC_SEQ_CST,
                                                              __ATOMIC_SEQ_CST)) {}
    }
    return counter ^ ((u64)__atomic_exchange_n(&word, 5, __ATOMIC_SEQ_CST) << 32);
}

static int cmp(const void *a, const void *b) {
    u64 x = *(const u64 *)a, y = *(const u64 *)b;
    return x < y ? -1 : x > y;
}
static void sort(u64 *v, u64 n, int (*c)(const void *, const void *)) {
    for (u64 i = 1; i < n; i++)
        for (u64 j = i; j > 0 && c(&v[j - 1], &v[j]) > 0; j--) { u64 t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
}
u64 sorted_hash(u64 seed) {
    u64 x = seed | 1;
    for (int i = 0; i < 64; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; state[i] = x % 1000; }
    sort(state, 64, cmp);
    u64 h = 0xcbf29ce484222325ul;
    for (int i = 0; i < 64; i++) { h ^= state[i]; h *= 0x100000001b3ul; }
    return h;
}

u64 parse(u64 seed) {
    char text[128];
    u64 x = seed, n = 0;
    for (int i = 0; i < 100; i++) { x = x * 6364136223846793005ul + 1442695040888963407ul;
        text[i] = "0123456789 ,-+x"[(x >> 33) % 15]; }
    text[100] = 0;
    i64 total = 0, cur = 0; int sign = 1;
    for (const char *p = text; *p; p++) {
        switch (*p) {
        case '-': sign = -sign; break;
        case '+': sign = 1; break;
        case ' ': case ',': total += sign * cur; cur = 0; n++; break;
        case 'x': total *= 3; break;
        default: cur = cur * 10 + (*p - '0');
        }
    }
    return (u64)(total + sign * cur) ^ (n << 56);
}

void _start(void) {}
"""

FUNCS = {"fib": [(0,), (1,), (20,)], "is_even": [(0,), (7,), (1001,)],
         "sw": [(x, 0x123456789) for x in range(14)], "fold": [(1, 50), (2, 77), (0xdeadbeef, 200)],
         "arith": [(3, 0), (2**64 - 1, 2**64 - 1), (2**63, 2**64 - 1), (123456789123, 98765), (5, 2**32)],
         "atomics": [(10,), (300,)], "sorted_hash": [(1,), (99,)], "parse": [(1,), (2,), (12345,)]}


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return native_library(tmp_path_factory.mktemp("native"))


def native_library(d) -> ctypes.CDLL:
    """SOURCE built by the host's compiler in the directory ``d``, its FUNCS typed: the oracle."""
    src = d / "guest.c"
    src.write_text(SOURCE)
    so = d / "guest.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    for name in FUNCS:
        fn = getattr(lib, name)
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_uint64] * len(FUNCS[name][0])
    return lib


@pytest.fixture(scope="module", params=["-O2", "-O0"])
def guest(request, tmp_path_factory):
    elf = guest_elf(SOURCE, opt=request.param, keep=tuple(FUNCS))
    return Engine(cache_dir=tmp_path_factory.mktemp("cache")).load(elf)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_guest_matches_native(guest, native, name):
    entry = guest.program.symbol(name)
    for args in FUNCS[name]:
        got = guest.backend.run(RunRequest(entry=entry, int_args=args))
        assert got.trap is None, got.trap
        assert got.a0 == getattr(native, name)(*args), (name, args)
