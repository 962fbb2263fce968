"""The disassembler against llvm-objdump (LLVM 14): every 16-bit encoding, a sample of 32-bit ones, and every
reachable instruction of real guests built at -O0 and -O2."""

from __future__ import annotations

import random
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from berm_aot.decode import decode
from berm_aot.disasm import disassemble
from berm_aot.elf import read_elf
from berm_aot.isa import Instruction
from berm_aot.program import Program
from tests.guests import guest_elf
from tests.test_decode import LLVM_ACCEPTS_RESERVED, _llvm_rejects_ignored_fence_fields, _sample_words

_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(.*?)\s*$")
_SYMBOLIC = re.compile(r"(0x[0-9a-f]+) <[^<>]*>$")  # "j 0x111f0 <.L0 +0x4>": the target's symbol


def objdump(elf: bytes) -> dict[int, str]:
    """llvm-objdump's text per instruction address, whitespace normalised, target symbols dropped."""
    with tempfile.NamedTemporaryFile(suffix=".elf") as f:
        f.write(elf)
        f.flush()
        out = subprocess.run(["llvm-objdump", "-d", "--no-show-raw-insn", f.name], capture_output=True, text=True,
                             check=True).stdout
    lines = {}
    for line in out.splitlines():
        m = _LINE.match(line)
        if m and not m.group(2).startswith("file format"):
            lines[int(m.group(1), 16)] = " ".join(_SYMBOLIC.sub(r"\1", m.group(2)).split())
    return lines


def _words_elf(words: list[tuple[int, int]]) -> bytes:
    """An image whose code is ``la`` (so that it carries the relocation read_elf insists on) then ``words``, which
    start at the symbol ``words``."""
    directives = "\n".join(f".{n}byte {w:#x}" for w, n in words)
    return guest_elf(f".text\n.globl _start\n_start:\nla t0, anchor\nwords:\n{directives}\n"
                     ".data\nanchor: .quad _start\n", suffix=".S")


def _words_start(elf: bytes) -> tuple[int, bytes]:
    """The address of the first word, and the code bytes from there."""
    image = read_elf(elf)
    (addr,) = [s.value for s in image.symbols if s.name == "words"]
    (sec,) = image.executable_sections()
    return addr, image.read(addr, sec.end - addr)


def _expect_llvm_text(insn: Instruction) -> bool:
    """Whether LLVM's text must equal ours (see berm_aot.disasm for the deliberate differences)."""
    if insn.op == "illegal":
        return insn.note == "c.unimp"
    if insn.op == "fence" and not (insn.imm >> 4 & 0xF and insn.imm & 0xF):
        return False  # an empty predecessor or successor set: ours prints 0, LLVM "unknown"
    return insn.op != "unsupported" and not _llvm_rejects_ignored_fence_fields(insn)


def _compare_words(words: list[tuple[int, int]]) -> int:
    elf = _words_elf(words)
    base, data = _words_start(elf)
    theirs = objdump(elf)
    compared, off = 0, 0
    for _, n in words:
        insn = decode(data[off:off + n], 0, base + off)
        off += n
        text = theirs[insn.addr]
        if insn.op == "illegal" and insn.note not in LLVM_ACCEPTS_RESERVED:
            assert text == "<unknown>", (hex(insn.raw), insn.note, text)
        if _expect_llvm_text(insn):
            assert disassemble(insn) == text, (hex(insn.raw), insn, text)
            compared += 1
    return compared


def test_every_compressed_word_prints_as_llvm_prints_it():
    assert _compare_words([(v, 2) for v in range(1 << 16) if v & 3 != 3]) > 30000


def test_32bit_words_print_as_llvm_prints_them():
    rng = random.Random(5)
    words = _sample_words(rng, 12000)
    # Every alias LLVM knows for the base instructions, with x0 in each operand position.
    for rd, rs1, rs2 in ((0, 0, 0), (10, 0, 11), (10, 11, 0), (0, 1, 0), (1, 10, 0), (5, 10, 0)):
        r = rd << 7 | rs1 << 15 | rs2 << 20
        words += [r | 0x13, r | 0x00100013, r | 0xFFF04013, r | 0x00103013, r | 0x1B, r | 0x40000033,
                  r | 0x4000003B, r | 0x3033, r | 0x2033, r | 0x67, r | 0x00800067, r | 0x63, r | 0x1063,
                  r | 0x5063, r | 0x4063, r | 0x6063, r | 0x6F, r | 0x80000EF, r | 0xFFF00037, r | 0x80000017]
    words += [0x0FF0000F, 0x0330000F, 0x8330000F, 0x0120000F, 0x0000100F, 0x00000073, 0x00100073, 0xC0001073,
              0x0010000F, 0x0100000F]  # empty successor / predecessor sets (0x0100000F is PAUSE)
    assert _compare_words([(w, 4) for w in words]) > 3000


def test_clear_text_for_what_llvm_would_print_differently():
    assert disassemble(decode(bytes(2), 0, 0)) == "unimp"
    assert disassemble(decode(bytes.fromhex("ffffffff"), 0, 0)) == "<illegal: instruction longer than 32 bits>"
    assert disassemble(decode((0x34011173).to_bytes(4, "little"), 0, 0)) == "<unsupported: csrrw (Zicsr)>"
    assert disassemble(decode(b"\x13", 0, 0)) == "<illegal: truncated>"
    assert disassemble(decode((0x0010000F).to_bytes(4, "little"), 0, 0)) == "fence 0, w"
    assert disassemble(decode((0xF315878F).to_bytes(4, "little"), 0, 0)) == "fence rw, w"  # fm, rd, rs1 ignored
    # fm = 8 (TSO) is fence.tso only with pred = succ = rw; otherwise reserved, executed (and printed) as a fence
    assert disassemble(decode((0x8FF0000F).to_bytes(4, "little"), 0, 0)) == "fence"
    assert disassemble(decode((0x8310000F).to_bytes(4, "little"), 0, 0)) == "fence rw, w"


# ---------------------------------------------------------------------------------------------------------------
# Real guests

GUESTS = {
    "loops": r"""
        unsigned long berm_tool_run(unsigned long n) {
            unsigned long s = 0;
            for (unsigned long i = 0; i < n; i++) for (unsigned long j = i; j < n; j += 3) s += i * j ^ (s >> 3);
            while (n > 1) n = (n & 1) ? 3 * n + 1 : n / 2;
            return s + n;
        }
        void *volatile anchor;
        void _start(void) { anchor = (void *)berm_tool_run; }
    """,
    "switch": r"""
        static volatile int sink;
        __attribute__((noinline)) int pick(int k, int v) {
            switch (k) {
            case 0: return v + 1; case 1: sink = v; return 3; case 2: return v - 7; case 3: return v ^ 5;
            case 4: return v << 2; case 5: return v >> 1; case 6: return sink * v; case 7: return -v;
            default: return 0;
            }
        }
        int berm_tool_run(void) { int s = 0; for (int i = 0; i < 10; i++) s += pick(i, s); return s; }
        void _start(void) { berm_tool_run(); }
    """,
    "fptrs": r"""
        typedef long (*op)(long, long);
        static long add(long a, long b) { return a + b; }
        static long sub(long a, long b) { return a - b; }
        static long mul(long a, long b) { return a * b; }
        op table[3] = { add, sub, mul };
        op volatile chosen;
        long berm_tool_run(long x) {
            long s = 0;
            for (int i = 0; i < 3; i++) s = table[i](s, x);
            chosen = x & 1 ? add : mul;
            return chosen(s, 3);
        }
        void _start(void) { berm_tool_run(1); }
    """,
    "math64": r"""
        typedef unsigned long u64; typedef long i64;
        u64 berm_tool_run(u64 a, u64 b, i64 c, i64 d) {
            u64 q = b ? a / b : 0, r = b ? a % b : 0;
            i64 sq = d ? c / d : 0, sr = d ? c % d : 0;
            unsigned __int128 wide = (unsigned __int128)a * b;
            __int128 swide = (__int128)c * d;
            unsigned int w = (unsigned int)a * (unsigned int)b, wq = (unsigned int)b ? (unsigned int)a / (unsigned int)b : 0;
            int sw = (int)c >> 3, sh = (int)d << 5;
            return q ^ r ^ (u64)sq ^ (u64)sr ^ (u64)(wide >> 64) ^ (u64)(swide >> 70) ^ w ^ wq ^ (u64)(sw + sh)
                ^ (a >> 17) ^ (u64)(c >> 40) ^ (a << 33) ^ (u64)(c < d) ^ (a < b) ^ (u64)(a == 0);
        }
        void *volatile anchor;
        void _start(void) { anchor = (void *)berm_tool_run; }
    """,
    "atomics": r"""
        long counter; int small; long flag; unsigned long ucounter;
        long berm_tool_run(long v) {
            long old = __atomic_fetch_add(&counter, v, __ATOMIC_SEQ_CST);
            __atomic_fetch_or(&small, (int)v, __ATOMIC_ACQUIRE);
            __atomic_fetch_and(&counter, ~v, __ATOMIC_RELEASE);
            __atomic_fetch_xor(&small, 3, __ATOMIC_RELAXED);
            long expected = 0;
            __atomic_compare_exchange_n(&flag, &expected, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            __atomic_exchange_n(&counter, old, __ATOMIC_SEQ_CST);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            __atomic_fetch_max(&small, 9, __ATOMIC_SEQ_CST);
            __atomic_fetch_min(&ucounter, 9, __ATOMIC_SEQ_CST);
            return __atomic_load_n(&counter, __ATOMIC_ACQUIRE) + __atomic_load_n(&small, __ATOMIC_SEQ_CST);
        }
        void _start(void) { berm_tool_run(1); }
    """,
}


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("name", sorted(GUESTS))
def test_real_guests_print_as_llvm_objdump_prints_them(name, opt):
    elf = guest_elf(GUESTS[name], opt=opt, keep=("berm_tool_run",))
    program = Program.from_image(read_elf(elf))
    theirs = objdump(elf)
    assert len(program.code) > 10
    mismatches = [(hex(a), disassemble(i), theirs.get(a)) for a, i in sorted(program.code.items())
                  if disassemble(i) != theirs.get(a)]
    assert not mismatches


def test_rust_harness_prints_as_llvm_objdump_prints_it():
    """The committed rustc-built harness: what a third-party toolchain emits."""
    elf = (Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-probe.elf").read_bytes()
    program = Program.from_image(read_elf(elf))
    theirs = objdump(elf)
    assert len(program.code) > 1000
    assert [(hex(a), disassemble(i)) for a, i in sorted(program.code.items()) if disassemble(i) != theirs.get(a)] == []
