"""Whole C programs on the reference interpreter give the same answers as the same C built natively with the
system cc: loops, recursion, switch jump tables, function pointers in code and in data, 64-bit arithmetic and
atomics. The guest is built at -O0 and -O2 (different code shapes: stack-heavy vs. register-allocated)."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
#define EXPORT __attribute__((noinline))

EXPORT u64 loop_mix(u64 n) {
    u64 s = 0;
    for (u64 i = 0; i < n; i++) s = (s * 31 + i) ^ (s >> 7);
    return s;
}

EXPORT u64 fib(u64 n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

EXPORT u64 collatz_steps(u64 n) {
    u64 steps = 0;
    while (n > 1) { n = (n & 1) ? 3 * n + 1 : n / 2; steps++; }
    return steps;
}

EXPORT u64 switch_table(u64 x) {
    u64 r = 0;
    for (u64 i = 0; i < 40; i++) {
        switch ((x + i) % 12) {
            case 0: r += 3; break;       case 1: r ^= 0x55; break;     case 2: r *= 7; break;
            case 3: r -= 11; break;      case 4: r = r << 3 | r >> 61; break;
            case 5: r += i * i; break;   case 6: r ^= r >> 5; break;   case 7: r |= 0x100; break;
            case 8: r &= ~(u64)0xF0; break; case 9: r += 0x12345; break; case 10: r = ~r; break;
            default: r = r * 3 + 1; break;
        }
    }
    return r;
}

static u64 op_add(u64 a, u64 b) { return a + b; }
static u64 op_sub(u64 a, u64 b) { return a - b; }
static u64 op_mul(u64 a, u64 b) { return a * b; }
static u64 op_xor(u64 a, u64 b) { return a ^ (b << 1); }
static u64 (*const ops_in_data[])(u64, u64) = { op_add, op_sub, op_mul, op_xor };

EXPORT u64 apply(u64 (*f)(u64, u64), u64 a, u64 b) { return f(a, b); }

EXPORT u64 pointers_in_data(u64 a, u64 b) {
    u64 r = 0;
    for (u64 i = 0; i < 8; i++) r += ops_in_data[(a + i) % 4](a + i, b);
    return r;
}

EXPORT u64 pointers_in_code(u64 sel, u64 a) {
    u64 (*f)(u64, u64) = (sel & 1) ? op_mul : op_sub;
    return apply(f, a, a + 3) + apply(op_xor, a, sel);
}

EXPORT u64 arith64(u64 a, u64 b) {
    i64 sa = (i64)a, sb = (i64)b;
    u64 r = 0;
    r += b ? a / b : 1;
    r ^= b ? a % b : 2;
    r += (sb && !(sa == (i64)0x8000000000000000ULL && sb == -1)) ? (u64)(sa / sb) : 3;
    r ^= (sb && !(sa == (i64)0x8000000000000000ULL && sb == -1)) ? (u64)(sa % sb) : 4;
    r += (u64)(((unsigned __int128)a * b) >> 64);
    r ^= (u64)(((__int128)sa * sb) >> 64);
    r += (u64)(sa >> (b & 63)) + (a << (a & 63)) + (a >> (b & 31));
    r ^= (u64)(i64)(int)((u32)a * (u32)b) + (u64)(i64)(int)((u32)a + (u32)b);
    r += (u32)b ? (u64)(i64)(int)((u32)a / (u32)b) : 5;
    r += ((int)b && !((int)a == (int)0x80000000 && (int)b == -1)) ? (u64)(i64)((int)a % (int)b) : 6;
    r += (sa < sb) + (a < b) * 2;
    return r;
}

static u64 cells[4];
static u32 words[4];

EXPORT u64 atomics(u64 a, u64 b) {
    cells[0] = a; cells[1] = b; words[0] = (u32)a; words[1] = (u32)b;
    u64 r = __atomic_fetch_add(&cells[0], b, __ATOMIC_SEQ_CST);
    r += __atomic_exchange_n(&cells[1], a, __ATOMIC_ACQ_REL);
    r ^= __atomic_fetch_xor(&cells[0], 0x5555, __ATOMIC_RELAXED);
    r += __atomic_fetch_or(&words[0], 0x80000000u, __ATOMIC_SEQ_CST);
    r += __atomic_fetch_and(&words[1], 0xF0F0F0F0u, __ATOMIC_SEQ_CST);
    u64 expected = cells[1];
    r += __atomic_compare_exchange_n(&cells[1], &expected, 77, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    u32 wexp = 12345;
    r += __atomic_compare_exchange_n(&words[1], &wexp, 9, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) * 100 + wexp;
    return r + cells[0] + cells[1] + words[0] + words[1];
}

EXPORT u64 sort_checksum(u64 seed) {
    u64 v[24];
    for (int i = 0; i < 24; i++) { seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; v[i] = seed >> 33; }
    for (int i = 1; i < 24; i++) { u64 x = v[i]; int j = i - 1; while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; j--; } v[j + 1] = x; }
    u64 h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < 24; i++) { h ^= v[i]; h *= 0x100000001b3ULL; }
    return h;
}

#ifndef NATIVE
void _start(void) {}
#endif
"""

CASES = [
    ("loop_mix", (0,)), ("loop_mix", (1000,)),
    ("fib", (0,)), ("fib", (15,)),
    ("collatz_steps", (27,)), ("collatz_steps", (1,)),
    ("switch_table", (0,)), ("switch_table", (5,)), ("switch_table", (2 ** 64 - 1,)),
    ("pointers_in_data", (3, 9)), ("pointers_in_data", (2 ** 63, 2 ** 64 - 5)),
    ("pointers_in_code", (0, 11)), ("pointers_in_code", (1, 2 ** 40 + 7)),
    ("arith64", (0, 0)), ("arith64", (2 ** 63, 2 ** 64 - 1)), ("arith64", (2 ** 64 - 7, 2)),
    ("arith64", (123456789123, 2 ** 64 - 1000)), ("arith64", (0x80000000, 0xFFFFFFFF)), ("arith64", (7, 2 ** 32)),
    ("atomics", (1, 2)), ("atomics", (2 ** 64 - 1, 12345)), ("atomics", (0x7FFFFFFF, 0x80000001)),
    ("sort_checksum", (1,)), ("sort_checksum", (2 ** 64 - 3,)),
]
FUNCTIONS = sorted({name for name, _ in CASES})


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    (d / "prog.c").write_text(SOURCE)
    subprocess.run(["cc", "-O2", "-DNATIVE", "-shared", "-fPIC", "-o", str(d / "prog.so"), str(d / "prog.c")],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(d / "prog.so"))
    for name in FUNCTIONS:
        getattr(lib, name).restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module", params=["-O0", "-O2"])
def guest(request):
    program = Program.from_image(read_elf(guest_elf(SOURCE, opt=request.param, keep=tuple(FUNCTIONS))))
    return program, InterpBackend(program)


@pytest.mark.parametrize("name, args", CASES)
def test_guest_matches_native(guest, native, name, args):
    program, backend = guest
    expected = getattr(native, name)(*[ctypes.c_uint64(a) for a in args])
    result = backend.run(RunRequest(entry=program.symbol(name), int_args=args))
    assert result.trap is None, str(result.trap)
    assert result.a0 == expected


def test_the_guest_really_uses_jump_tables_function_pointers_and_atomics(guest):
    program, _ = guest
    ops = {insn.op for insn in program.code.values()}
    assert {"amoadd.d", "amoswap.d", "amoor.w", "amoand.w", "lr.d", "sc.d", "lr.w", "sc.w"} <= ops
    assert any(r.type_name == "R_RISCV_64" for r in program.image.relocations)  # the table and the switch
    assert any(insn.op == "jalr" and insn.rd == 0 and insn.rs1 != 1 for insn in program.code.values())
