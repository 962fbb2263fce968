"""Red team: a hostile guest tries to reach host memory, crash or hang the host, escape CFI or leak state into the
next invocation. Every attempt runs on both engines (translated code and interpreter) and must end in a trap or a
clear error with the host alive; where the run is bounded the two engines must agree exactly.

Attempts that could take the whole process down (native stack, re-entrancy, host-call buffers near 2^64) run in a
child process (``isolated``), so a crash is a failed test with the child's exit status, not a dead pytest.

A finding that is still open goes in tests/test_redteam_open.py (failing, as its regression test); once fixed its
test moves here. Every finding so far is fixed: the file is gone until the next one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path

import pytest

from berm_abi.names import core_number, fnv1a64
from berm_host.aot.runtime import lib
from berm_host.backend import RunRequest
from berm_host.engine import Engine, Image
from berm_host.layout import DEPTH_DETAIL, MAX_CALL_DEPTH, SP_BELOW_STACK
from berm_host.linker import Linker
from berm_host.traps import HostError, Trap, TrapKind
from tests.bounded import GRACE, ends_within
from tests.guests import raw_harness_elf

MEMORY = 1 << 20
DEADLINE = 0.3
ROOT = Path(__file__).resolve().parent.parent
ECHO = "redteam.echo"  # a test capability: replies with its request, doubled
M64 = 2**64

GUEST = r"""
static volatile u64 v;
u64 data_word = 5;
u64 bss_area[3 * 8192];       /* 192 KiB: spans page and 64-page (coarse) boundaries */


/* ---- host calls with a number only known at run time, and with every argument hostile ---- */
u64 hc(u64 n, u64 a0, u64 a1) { return ecall2(n, a0, a1); }
u64 hc_const_args_read(u64 a0, u64 a1) { return ecall2(ARGS_READ, a0, a1); }
u64 hc_const_log(u64 a0, u64 a1) { return ecall2(LOG, a0, a1); }
/* stage a capability reply from a sane request, then pull it into (ptr, cap) */
u64 stage_then_read(u64 capnum, u64 ptr, u64 cap) {
    ecall2(capnum, (u64)&data_word, 8);
    return ecall2(RESULT_READ, ptr, cap);
}

/* ---- every access size at any address ---- */
u64 ld1(u64 a) { return *(volatile unsigned char *)a; }
u64 ld2(u64 a) { return *(volatile unsigned short *)a; }
u64 ld4(u64 a) { return *(volatile unsigned int *)a; }
u64 ld8(u64 a) { return *(volatile u64 *)a; }
u64 st1(u64 a) { *(volatile unsigned char *)a = 0x11; return 1; }
u64 st2(u64 a) { *(volatile unsigned short *)a = 0x2222; return 2; }
u64 st4(u64 a) { *(volatile unsigned int *)a = 0x44444444; return 4; }
u64 st8(u64 a) { *(volatile u64 *)a = 0x8888888888888888ul; return 8; }

/* ---- recursion ---- */
__attribute__((noinline)) void touch(char *p, u64 n) { p[0] = (char)n; p[39999] = (char)n; }
__attribute__((noinline)) u64 big_frames(u64 n, u64 limit) {
    char frame[40000];
    touch(frame, n);
    if (n == limit) return 0;
    return big_frames(n + 1, limit) + frame[0] + frame[39999];
}
u64 mut_b(u64 n);
__attribute__((noinline)) u64 mut_a(u64 n) { return mut_b(n + 1) + v; }
__attribute__((noinline)) u64 mut_b(u64 n) { return mut_a(n + 1) + v; }
u64 ind_rec(u64 n);
u64 (*volatile ind_slot)(u64) = ind_rec;
__attribute__((noinline)) u64 ind_rec(u64 n) { return ind_slot(n + 1) + v; }
/* every level makes a host call (berm.log) before going deeper */
__attribute__((noinline)) u64 log_rec(u64 n) { ecall2(LOG, (u64)&data_word, 8); return log_rec(n + 1) + v; }
/* recursion to a given depth, one host call at the bottom */
__attribute__((noinline)) u64 rec_to(u64 n, u64 depth) {
    if (n >= depth) return ecall2(LOG, (u64)&data_word, 8) + 1;
    return rec_to(n + 1, depth) + v;
}
/* the same through two functions: each level is a native frame (a function calling itself shares one) */
u64 mrec_b(u64 n, u64 depth);
__attribute__((noinline)) u64 mrec_a(u64 n, u64 depth) {
    if (n >= depth) return ecall2(LOG, (u64)&data_word, 8) + 1;
    return mrec_b(n + 1, depth) + v;
}
__attribute__((noinline)) u64 mrec_b(u64 n, u64 depth) { return mrec_a(n + 1, depth) + v; }

/* ---- indirect calls ---- */
u64 plain(u64 x) { return x * 3 + v; }
u64 plain_addr(void) { return (u64)&plain; }
u64 call_at(u64 addr, u64 x) { return ((u64 (*)(u64))addr)(x); }  /* a tail call at -O1: an indirect jump */
u64 call_back_at(u64 addr, u64 x) { return ((u64 (*)(u64))addr)(x) + v; }  /* an indirect call (jalr ra) */

/* ---- memory writes by every mechanism, for dirty-page tracking; trap afterwards when asked ---- */
u64 scribble(u64 addr, u64 how, u64 then_trap) {
    u64 val = 0xa5a5a5a5a5a5a5a5ul, old = 0;
    switch (how) {
    case 0: *(volatile u64 *)addr = val; break;
    case 1: *(volatile unsigned char *)addr = 0x5a; break;
    case 2: __asm__ volatile("amoswap.d %0, %1, (%2)" : "=r"(old) : "r"(val), "r"(addr) : "memory"); break;
    case 3: __asm__ volatile("amoadd.w %0, %1, (%2)" : "=r"(old) : "r"(val), "r"(addr) : "memory"); break;
    case 4: __asm__ volatile("lr.d %0, (%2)\n\tsc.d %0, %1, (%2)" : "=&r"(old) : "r"(val), "r"(addr) : "memory"); break;
    case 5: ecall2(ARGS_READ, addr, ~0ul); break;
    case 6: ecall2(RESULT_READ, addr, ~0ul); break;
    }
    if (then_trap) __asm__ volatile("ebreak");
    return old;
}
u64 stage(u64 capnum, u64 len) { return ecall2(capnum, (u64)bss_area, len); }
u64 nothing(void) { return 0; }

/* ---- a tool for concurrency: the arguments must arrive into zeroed .bss, come back reversed ---- */
Pair berm_tool_reverse(void) {
    u64 n = ecall2(ARGS_LEN, 0, 0);
    unsigned char *in = (unsigned char *)bss_area, *out = in + 65536;
    if (n > 1024) n = 1024;
    for (u64 i = 0; i < 1024; i++)
        if (in[i] | out[i]) { static char msg[] = "dirty bss"; ecall2(FAIL, (u64)msg, 9); break; }
    ecall2(ARGS_READ, (u64)in, n);
    for (u64 i = 0; i < n; i++) out[i] = in[n - 1 - i];
    for (u64 i = 0; i < 200; i++) data_word += i;
    if (data_word != 5 + 199 * 100) { static char msg[] = "dirty data"; ecall2(FAIL, (u64)msg, 10); }
    Pair p = {(u64)out, n}; return p;
}
/* empty results at addresses outside guest memory */
Pair berm_tool_empty_null(void) { Pair p = {0, 0}; return p; }
Pair berm_tool_empty_wild(void) { Pair p = {~0ul, 0}; return p; }
Pair berm_tool_empty_dangling(void) { Pair p = {1, 0}; return p; }
/* a tool whose berm.log re-enters the host */
Pair berm_tool_reenter(void) {
    static char s[] = "again";
    ecall2(LOG, (u64)s, 5);
    Pair p = {(u64)s, 5}; return p;
}

/* ---- control flow in assembly: loops without a back-edge, jump tables, overlapping instructions ---- */
__asm__(
    ".text\n"
    /* an indirect jump to its own entry: a tail call to itself, forever */
    ".globl self_tail\n.type self_tail,@function\n"
    "self_tail:\n  la t0, self_tail\n  jr t0\n"
    /* two functions that tail-jump to each other directly */
    ".globl ping\n.type ping,@function\nping:\n  addi a0, a0, 1\n  j pong\n"
    ".globl pong\n.type pong,@function\npong:\n  addi a0, a0, 1\n  j ping\n"
    /* a loop through a legal local jump-table target */
    ".globl jt_spin\n.type jt_spin,@function\n"
    "jt_spin:\n  la t0, spin_table\n.Lspin:\n  ld t1, 0(t0)\n  addi a0, a0, 1\n  jr t1\n"
    /* a function with a jump table (a0 = 0 or 1) */
    ".globl jt_owner\n.type jt_owner,@function\n"
    "jt_owner:\n  la t0, owner_table\n  slli a0, a0, 3\n  add t0, t0, a0\n  ld t0, 0(t0)\n  jr t0\n"
    ".Lcase0:\n  li a0, 100\n  ret\n"
    ".Lcase1:\n  li a0, 200\n  ret\n"
    /* another function jumping into jt_owner's table targets: by jump, by call, by forged return */
    ".globl jt_thief_jump\n.type jt_thief_jump,@function\n"
    "jt_thief_jump:\n  la t0, owner_table\n  ld t0, 8(t0)\n  jr t0\n"
    ".globl jt_thief_call\n.type jt_thief_call,@function\n"
    "jt_thief_call:\n  addi sp, sp, -16\n  sd ra, 8(sp)\n  la t0, owner_table\n  ld t0, 8(t0)\n  jalr t0\n"
    "  ld ra, 8(sp)\n  addi sp, sp, 16\n  ret\n"
    ".globl jt_thief_ret\n.type jt_thief_ret,@function\n"
    "jt_thief_ret:\n  la t0, owner_table\n  ld ra, 8(t0)\n  ret\n"
    /* a0 = 0: jump into the middle of the next 4-byte instruction, whose upper half is c.li a0, 5 */
    ".globl overlap\n.type overlap,@function\n"
    "overlap:\n  beqz a0, .Lmid\n.Lwhole:\n  .4byte 0x45150513\n  ret\n"
    ".globl overlap_mid\n.type overlap_mid,@function\n"
    "overlap_mid:\n  j .Lwhole + 2\n"
    ".Lmid = .Lwhole + 2\n"
    /* jalr ra, 0(ra): the target is read before the link is written; the ret after it then jumps to the link */
    ".globl jalr_same\n.type jalr_same,@function\n"
    "jalr_same:\n  la ra, plain\n  jalr ra, 0(ra)\n  ret\n"
    /* an auipc whose upper half is c.nop (0x0001), followed by jalr: the pair names far_fn, but a branch into
     * the auipc's upper half reaches the jalr with t1 = plain; the call must follow t1, not the pair */
    ".option push\n.option norelax\n"
    ".globl pair_call\n.type pair_call,@function\n"
    "pair_call:\n  addi sp, sp, -16\n  sd ra, 8(sp)\n  la t2, far_table\n  la t1, plain\n  beqz a0, .Lpair_mid\n"
    ".Lpair:\n  auipc t1, 0x10\n  jalr ra, 0(t1)\n  ld ra, 8(sp)\n  addi sp, sp, 16\n  ret\n"
    ".Lpair_mid = .Lpair + 2\n"
    ".skip 0x10000 - (. - .Lpair)\n"
    ".globl far_fn\n.type far_fn,@function\nfar_fn:\n  li a0, 0x77\n  ret\n"
    ".option pop\n"
    ".section .rodata\n.p2align 3\n"
    "far_table:\n  .quad far_fn\n"
    "spin_table:\n  .quad .Lspin\n"
    "owner_table:\n  .quad .Lcase0, .Lcase1\n"
    ".text\n"
);

"""

NAMES = ("ld1", "ld2", "ld4", "ld8", "st1", "st2", "st4", "st8", "hc", "hc_const_args_read", "hc_const_log",
         "stage_then_read", "big_frames", "mut_a", "ind_rec", "log_rec", "rec_to", "mrec_a", "mrec_b", "plain",
         "plain_addr", "call_at", "call_back_at", "scribble", "stage", "nothing", "self_tail", "ping", "jt_spin",
         "jt_owner", "jalr_same", "pair_call", "jt_thief_jump", "jt_thief_call", "jt_thief_ret", "overlap",
         "overlap_mid")
TOOLS = ("reverse", "reenter", "empty_null", "empty_wild", "empty_dangling")


@cache
def guest() -> bytes:
    return raw_harness_elf(GUEST, TOOLS, opt="-O1", keep=NAMES)


def echo(request: bytes) -> bytes:
    return request * 2


def linker() -> Linker:
    lk = Linker()
    lk.define(ECHO, echo)
    return lk


def load(kind: str, cache_dir: Path | str, memory_size: int = MEMORY, **engine_args) -> Image:
    return Engine(kind=kind, memory_size=memory_size, cache_dir=Path(cache_dir), deadline=DEADLINE,
                  **engine_args).load(guest())


def run(image: Image, name: str, *args: int, deadline: float | None = None, blob: bytes = b"",
        snapshot: tuple = (), log=None):
    entry = image.program.symbol(name)
    assert entry is not None, name
    return image.backend.run(RunRequest(entry=entry, int_args=tuple(a % M64 for a in args), args=blob,
                                        linker=linker(), deadline=deadline, snapshot=snapshot, log=log))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("redteam-cache")


@pytest.fixture(scope="module")
def images(cache_dir):
    return load("aot", cache_dir), load("interp", cache_dir)


def both(images, name, *args, **kw):
    """Run on both engines; they must agree exactly (trap, registers, pc). Returns the translated run."""
    aot, interp = images
    got, expected = run(aot, name, *args, **kw), run(interp, name, *args, **kw)
    assert got.trap == expected.trap
    assert got.regs == expected.regs
    assert got.pc == expected.pc
    assert got.failure == expected.failure
    assert got.snapshot == expected.snapshot
    return got


# ---------------------------------------------------------------- child processes for the risky attempts


def child_main(cache_dir: str, attack: str, kind: str) -> None:
    """Entry point of ``isolated``: run ``attack`` on a ``kind`` engine and print its outcome as JSON."""
    print(json.dumps(ATTACKS[attack](kind, cache_dir)))


def isolated(cache_dir: Path, attack: str, kind: str, timeout: float = 60) -> dict:
    """Run ``ATTACKS[attack]`` in a child process; its exit must be clean (a crash fails the test here)."""
    code = f"from tests.test_redteam_guests import child_main; child_main({str(cache_dir)!r}, {attack!r}, {kind!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert proc.returncode == 0, f"the host died (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _trap(r) -> dict:
    t = r.trap
    return {"trap": t and t.kind.name, "addr": t and t.addr, "detail": t and t.detail, "pc": r.pc,
            "regs": list(r.regs)}


def _buffers(kind: str, cache_dir: str) -> dict:
    """Every core call and a capability with buffers at each layout edge and lengths that wrap 2^64."""
    image = load(kind, cache_dir)
    lay = image.backend.layout
    ptrs = [1, lay.image_lo - 1, lay.image_lo, lay.writable_lo - 1, lay.writable_lo, lay.guard_lo - 8,
            lay.guard_lo, lay.stack_lo - 1, lay.stack_lo, lay.size - 8, lay.size, M64 - 1, M64 - 8, M64 - lay.size]
    lens = [0, 1, 8, 9, 1 << 32, 1 << 63, M64 - 1, M64 - 8, M64 - lay.size + 16, lay.size,
            lay.guard_lo - lay.writable_lo]
    blob = bytes(range(64))
    calls = {name: core_number(name) for name in ("berm.args.read", "berm.log", "berm.fail")}
    calls[ECHO] = fnv1a64(ECHO)
    out = {}
    for name, number in calls.items():
        for p in ptrs:
            for n in lens:
                r = run(image, "hc", number, p, n, blob=blob, snapshot=((lay.writable_lo, 256), (lay.size - 256, 256)))
                out[f"{name} {p:#x} {n:#x}"] = {**_trap(r), "failure": None if r.failure is None else r.failure.hex(),
                                                   "snapshot": [s.hex() for s in r.snapshot]}
        for p in ptrs:
            for n in lens:
                r = run(image, "stage_then_read", calls[ECHO], p, n)
                out[f"result.read {p:#x} {n:#x}"] = _trap(r)
    for p in ptrs:
        for n in lens:
            # the call number a constant in the code: the translator passes it to the core as a literal
            out[f"const berm.args.read {p:#x} {n:#x}"] = _trap(run(image, "hc_const_args_read", p, n, blob=blob))
            out[f"const berm.log {p:#x} {n:#x}"] = _trap(run(image, "hc_const_log", p, n))
    return out


def _recursion(kind: str, cache_dir: str) -> dict:
    image = load(kind, cache_dir)
    out = {name: _trap(run(image, name, 0, M64 - 1)) for name in ("big_frames", "mut_a", "ind_rec")}
    lines = []
    out["log_rec"] = _trap(run(image, "log_rec", 0, log=lines.append))
    out["log_rec_lines"] = len(lines)
    out["rec_to"] = _trap(run(image, "rec_to", 0, MAX_CALL_DEPTH - 1, log=lines.append))
    return out


def _on_a_small_thread(fn, out: dict) -> None:
    """fn(out) on a thread with a 256 KiB stack, waited for."""
    old = threading.stack_size(256 << 10)
    try:
        t = threading.Thread(target=fn, args=(out,))
        t.start()
        t.join()
    finally:
        threading.stack_size(old)


def _reenter(kind: str, cache_dir: str) -> dict:
    """A log sink that calls the harness again from inside its host call, without end: on the main thread; on a
    256 KiB thread; and (translated code only) on the main thread with Python's recursion limit raised far past
    what its stack holds, so that the host stack, not Python's count, runs out first. The interpreter is Python
    code, and like any Python code relies on that limit: with it raised, it overflows the stack (SIGSEGV)."""
    def attempt(out: dict) -> None:
        box = {}

        def sink(name, line):
            box["harness"].call("reenter")

        harness = load(kind, cache_dir, log=sink).harness(name="reenter")
        box["harness"] = harness
        try:
            harness.call("reenter")
            out["error"] = None
        except Exception as exc:  # noqa: BLE001 - the point is which exception it is
            out.update(error=type(exc).__name__, berm=isinstance(exc, Trap))

    main, small, unlimited = {}, {}, {}
    attempt(main)
    _on_a_small_thread(attempt, small)
    if kind == "interp":
        return {"main thread": main, "256 KiB thread": small}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        attempt(unlimited)
    finally:
        sys.setrecursionlimit(limit)
    return {"main thread": main, "256 KiB thread": small, "recursion limit 100000": unlimited}


def _same_region(kind: str, cache_dir: str) -> dict:
    """A log sink that starts a run on the region its own run is using (the core's API, below the pool)."""
    image = load(kind, cache_dir)
    memory = image.backend.memory
    region = memory.acquire()
    memory.release(region)  # the next run takes it
    inner = []

    def sink(line: bytes) -> None:
        inner.append(lib.berm_run(region.ptr, image.program.symbol("nothing"), b"", 0, 0, 0.0))
        inner.append(lib.berm_region_trim(region.ptr))

    outer = _trap(run(image, "mrec_a", 0, 3000, log=sink))
    assert memory.pool[-1] is region
    return {"inner": inner, "outer": outer, "again": _trap(run(image, "mrec_a", 0, 50, log=lambda line: None))}


def _stack_pointer() -> int:
    """This thread's stack pointer (Linux: the second-to-last field of the syscall it is in, the read of that
    very file)."""
    with open("/proc/thread-self/syscall") as f:
        return int(f.read().split()[-2], 16)


def _on_a_native_stack(image: Image):
    """Whether an address is on the native stack of one of the image's regions (idle after a run: in the pool)."""
    if image.engine.kind != "aot":
        return lambda sp: False
    stacks = [(r.ctx.native_floor - lib.BERM_NATIVE_MARGIN, r.ctx.native_floor - lib.BERM_NATIVE_MARGIN
               + lib.BERM_NATIVE_STACK) for r in image.backend.memory.pool]
    assert stacks
    return lambda sp: any(lo <= sp < hi for lo, hi in stacks)


def _small_stack(kind: str, cache_dir: str) -> dict:
    """Recursion through native frames (two functions calling each other) as deep as the guest may go, on a
    256 KiB host thread and on the main thread, then a host call at the very bottom whose Python code recurses
    deeply in C (json parsing 900 levels of nesting)."""
    image = load(kind, cache_dir)
    nested = "[" * 900 + "]" * 900

    def deepest(out: dict) -> None:
        lo, hi = 0, MAX_CALL_DEPTH  # the deepest run without a trap, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if run(image, "mrec_a", 0, mid, log=lambda line: None).trap is None:
                lo = mid
            else:
                hi = mid - 1
        seen, sps = [], []

        def sink(line: bytes) -> None:
            sps.append(_stack_pointer())
            seen.append(json.loads(nested))

        bottom = run(image, "mrec_a", 0, lo, log=sink)
        beyond = run(image, "mrec_a", 0, lo + 1, log=seen.append)
        out.update(depth=lo, deepest=_trap(bottom), lines=len(seen), beyond=_trap(beyond),
                   python_on_native_stack=any(map(_on_a_native_stack(image), sps)))

    small, main = {}, {}
    _on_a_small_thread(deepest, small)
    deepest(main)
    return {"small thread": small, "main thread": main}


ATTACKS = {"buffers": _buffers, "recursion": _recursion, "reenter": _reenter, "small_stack": _small_stack,
           "same_region": _same_region}


# ---------------------------------------------------------------- plain loads and stores at every edge


def test_every_access_size_at_every_layout_edge_and_near_2_64(images):
    """The translated code's bounds windows depend on the access size: each size, at each offset around each
    edge of the layout (and around 0 and 2^64), must fault exactly when the layout oracle says so."""
    lay = images[0].backend.layout
    edges = [0, lay.image_lo, lay.writable_lo, lay.heap_start, lay.guard_lo, lay.stack_lo, lay.size, M64]
    for edge in edges:
        for off in range(-9, 9):
            addr = (edge + off) % M64
            for n in (1, 2, 4, 8):
                for store in (False, True):
                    r = both(images, f"{'st' if store else 'ld'}{n}", addr)
                    ok = lay.writable(addr, n) if store else lay.readable(addr, n)
                    assert (r.trap is None) == ok, (hex(addr), n, store, r.trap)
                    if not ok:
                        assert r.trap.kind is TrapKind.MEMORY_FAULT and r.trap.addr == addr
                        assert r.trap.detail == f"{'store' if store else 'load'} {n} bytes"


# ---------------------------------------------------------------- host-call buffers


def _expected_buffer_outcome(lay, call: str, p: int, n: int, blob_len: int) -> bool:
    """True when the call may touch (ptr, n) per the layout oracle (ABI §1, SEMANTICS "Host calls")."""
    if call == "berm.args.read":
        k = min(n, blob_len)
        return k == 0 or lay.writable(p, k)
    return n == 0 or lay.readable(p, n)


def test_host_call_buffers_at_every_edge_and_wrapping_length(cache_dir):
    aot = isolated(cache_dir, "buffers", "aot")
    interp = isolated(cache_dir, "buffers", "interp")
    lay = load("interp", cache_dir).backend.layout
    assert aot.keys() == interp.keys()
    for key, got in aot.items():
        assert got == interp[key], key
        name, p, n = key.rsplit(" ", 2)
        p, n = int(p, 16), int(n, 16)
        name = name.removeprefix("const ")
        if name in ("berm.args.read", "berm.log", "berm.fail", ECHO):
            ok = _expected_buffer_outcome(lay, name, p, n, 64)
            assert (got["trap"] is None) == ok, key
            if not ok:
                assert got["trap"] == "HOST_CALL_FAILED" and got["addr"] == p, key
                if "snapshot" in got:
                    assert got["snapshot"] == aot[f"{name} {lay.writable_lo:#x} 0x0"]["snapshot"], key
        elif name == "result.read":  # 16 bytes are staged (the echo of 8 bytes, doubled)
            ok = min(n, 16) == 0 or lay.writable(p, min(n, 16))
            assert (got["trap"] is None) == ok, key
            assert got["regs"][10] == (16 if ok else p), key  # a trap leaves a0 as it was


def test_buffer_trap_details_agree_at_address_zero(images):
    """Both engines word a buffer at address 0 as "0x0" (found by the red team: the C core printed "0")."""
    for call in ("berm.args.read", "berm.fail"):
        r = both(images, "hc", core_number(call), 0, 8, blob=b"12345678")
        assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "at 0x0 (8 bytes)" in r.trap.detail
    r = both(images, "stage_then_read", fnv1a64(ECHO), 0, 8)
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "at 0x0 (8 bytes)" in r.trap.detail


def test_tool_arguments_that_are_not_utf8_text_are_a_clear_error(cache_dir):
    """A str with a lone surrogate (what json.loads makes of "\\udcff") as tool arguments is a HostError, not a
    raw UnicodeEncodeError (found by the red team)."""
    for kind in ("aot", "interp"):
        harness = load(kind, cache_dir).harness(name="args")
        with pytest.raises(HostError):
            harness.call("reverse", '"\udcff"')


# ---------------------------------------------------------------- recursion and the host's stack


def test_recursion_of_every_shape_ends_in_a_trap_in_a_live_host(cache_dir):
    aot, interp = isolated(cache_dir, "recursion", "aot"), isolated(cache_dir, "recursion", "interp")
    assert aot == interp
    # 40 KB frames stop where sp would leave the stack (they marched on through the heap once, faulting only below)
    assert aot["big_frames"]["trap"] == "STACK_EXHAUSTED" and aot["big_frames"]["detail"] == SP_BELOW_STACK
    for name in ("mut_a", "ind_rec", "log_rec"):
        assert aot[name]["trap"] == "STACK_EXHAUSTED", name
        assert aot[name]["detail"] == DEPTH_DETAIL
    assert aot["log_rec_lines"] == MAX_CALL_DEPTH
    assert aot["rec_to"]["trap"] is None and aot["rec_to"]["regs"][10] == 1


def test_deep_recursion_then_a_host_call_on_a_small_host_thread(cache_dir):
    """Translated code runs on a native stack of its own: the host thread's size changes nothing, and the Python
    code a host call runs at the bottom of the recursion has the host thread's stack to itself (on the 256 KiB
    thread, the old design left it 64 KiB: the json parse crashed the process)."""
    aot, interp = isolated(cache_dir, "small_stack", "aot"), isolated(cache_dir, "small_stack", "interp")
    assert aot == interp
    assert aot["small thread"] == aot["main thread"]
    out = aot["main thread"]
    assert out["depth"] == MAX_CALL_DEPTH - 2  # mrec_a's own frame and the host call's
    assert out["deepest"]["trap"] is None and out["lines"] == 1
    assert not out["python_on_native_stack"]  # the host call switched back to the thread's own stack
    assert out["beyond"]["trap"] == "STACK_EXHAUSTED"
    assert out["beyond"]["detail"] == DEPTH_DETAIL


def test_recursion_that_reaches_the_bottom_of_the_native_stack_is_a_trap(images):
    """Translated frames larger than BERM_NATIVE_STACK / MAX_CALL_DEPTH bytes would reach the bottom of the native
    stack before the depth limit: the entry check traps there, and the region runs normally afterwards. This guest's
    frames are small, so the test raises one region's floor to leave it 256 KiB of the stack."""
    aot = images[0]
    memory = aot.backend.memory
    region = memory.acquire()
    floor = region.ctx.native_floor
    region.ctx.native_floor = floor + lib.BERM_NATIVE_STACK - lib.BERM_NATIVE_MARGIN - (256 << 10)
    memory.release(region)  # the next run takes it from the pool
    try:
        r = run(aot, "mrec_a", 0, MAX_CALL_DEPTH - 2, log=lambda line: None)
    finally:
        region.ctx.native_floor = floor
    assert memory.pool[-1] is region
    assert r.trap is not None and r.trap.kind is TrapKind.STACK_EXHAUSTED
    assert r.trap.detail == "the native stack translated code runs on is exhausted"
    lines = []
    assert run(aot, "mrec_a", 0, MAX_CALL_DEPTH - 2, log=lines.append).trap is None and len(lines) == 1


def test_a_run_on_a_region_that_is_running_is_refused(cache_dir):
    """The pool gives a region to one run at a time; the core does not trust that: a second berm_run on a running
    region (here from the first run's own log sink, on the same thread), or a trim, does nothing and says so. Run,
    it would reset the first run's memory and overwrite its native stack; trimmed, the native stack's pages under
    the run's frames would be gone (SIGSEGV, both found by reviews)."""
    out = isolated(cache_dir, "same_region", "aot")
    assert out["inner"] == [lib.BERM_RUN_BUSY, 0]
    assert out["outer"]["trap"] is None and out["outer"]["regs"][10] == 1  # the outer run went on undisturbed
    assert out["again"]["trap"] is None


def test_a_log_sink_that_raises_is_a_trap_on_both_engines(images):
    """The sink is host code: its exception is the host-call-failed trap, never an escape from Backend.run."""
    def sink(line: bytes) -> None:
        raise OSError("log disk full")

    for image in images:
        r = run(image, "hc_const_log", image.program.symbol("data_word"), 8, log=sink)
        assert r.trap is not None and r.trap.kind is TrapKind.HOST_CALL_FAILED, image.engine.kind
        assert r.trap.detail == "berm.log: OSError: log disk full"


def test_a_log_sink_that_reenters_the_harness_ends_in_a_trap(cache_dir):
    """Recursion across host calls: the log sink calls the same harness again from inside berm.log, forever. It
    ends in a Trap (the innermost RecursionError or stack trap is host-call-failed), in a live host: the core starts
    no run below a floor of the host thread's stack (the old core crashed on a 256 KiB thread and with a raised
    recursion limit once translated code left the host stack; found by a review)."""
    for kind in ("aot", "interp"):
        for where, out in isolated(cache_dir, "reenter", kind).items():
            assert out["error"] == "Trap" and out["berm"], (kind, where, out)


# ---------------------------------------------------------------- loops the translated code must still poll


@pytest.mark.parametrize("name", ["self_tail", "ping", "jt_spin"])
def test_loops_without_a_backward_branch_hit_the_deadline(images, name):
    for image in images:
        r = ends_within(GRACE, lambda: run(image, name, 0, deadline=time.monotonic() + 0.1))
        assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED, (image.engine.kind, r.trap)
    r = both(images, "nothing")  # the region the loop ran in is fine afterwards (interrupt flag reset)
    assert r.trap is None


# ---------------------------------------------------------------- CFI


def test_a_jump_table_works_for_its_own_function(images):
    assert both(images, "jt_owner", 0).a0 == 100
    assert both(images, "jt_owner", 1).a0 == 200


@pytest.mark.parametrize("name", ["jt_thief_jump", "jt_thief_call", "jt_thief_ret"])
def test_another_functions_jump_table_target_is_not_reachable(images, name):
    table_target = both(images, "jt_owner", 1)  # find the target: the address jt_owner's table names for case 1
    r = both(images, name)
    assert table_target.trap is None
    assert r.trap is not None and r.trap.kind is TrapKind.BAD_INDIRECT_TARGET, r.trap
    assert images[0].program.function_at(r.trap.addr).name == "jt_owner"
    assert r.trap.addr != images[0].program.symbol("jt_owner")


@pytest.mark.parametrize("how", ["call_at", "call_back_at"])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_odd_and_unaligned_indirect_call_targets(images, offset, how):
    base = both(images, "plain_addr").a0
    r = both(images, how, base + offset, 7)
    if offset < 2:  # jalr clears bit 0: plain's own entry
        assert r.trap is None and r.a0 == 21
    else:
        assert r.trap.kind is TrapKind.BAD_INDIRECT_TARGET and r.trap.addr == base + 2


def test_an_auipc_jalr_pair_reached_through_the_auipcs_upper_half_calls_what_the_register_says(images):
    """Translated code resolves ``auipc r; jalr r`` pairs at translation time; a path that reaches the jalr through
    an overlapping instruction (the auipc's upper half) must still call the function the register names."""
    assert both(images, "pair_call", 1).a0 == 0x77
    assert both(images, "pair_call", 0).a0 == 0  # plain(0) = 0 * 3 + v, not far_fn's 0x77


def test_jalr_reading_and_writing_the_same_register(images):
    r = both(images, "jalr_same", 4)
    assert r.trap is not None and r.trap.kind is TrapKind.BAD_INDIRECT_TARGET
    assert r.trap.addr == r.regs[1]  # the link jalr wrote, which no relocation names


@pytest.mark.parametrize("how", [2, 3, 4], ids=["amoswap.d", "amoadd.w", "lr/sc"])
@pytest.mark.parametrize("where", ["rodata", "misaligned", "guard", "wrap"])
def test_atomics_outside_writable_memory_fault_without_effect(images, how, where):
    lay = images[0].backend.layout
    data = images[0].program.symbol("data_word")
    addr = {"rodata": lay.image_lo, "misaligned": data + 4 * (how != 3) + 2, "guard": lay.guard_lo,
            "wrap": M64 - 8}[where]
    r = both(images, "scribble", addr, how, 0, snapshot=((data, 8),))
    assert r.trap is not None and r.trap.kind is TrapKind.MEMORY_FAULT and r.trap.addr == addr, r.trap
    assert r.snapshot == ((5).to_bytes(8, "little"),)


def test_a_direct_jump_into_the_middle_of_an_instruction(images):
    assert both(images, "overlap_mid").a0 == 5
    assert both(images, "overlap", 0).a0 == 5


def test_falling_through_into_the_middle_of_the_next_function(images):
    """``overlap`` (a0 = 1) runs a 4-byte instruction that straddles the start of the next function (a start
    because ``overlap_mid`` jumps there), so it falls through into the middle of that function (found by the red
    team: translated code trapped "illegal instruction" there; fixed in 8b0d1c7, the fall-through address is a
    function start now)."""
    r = both(images, "overlap", 1)
    assert r.trap is None and r.a0 == 1 + 0x451  # the straddling addi a0, a0, 0x451, then the ret after it


@pytest.mark.parametrize("tool", ["empty_null", "empty_wild", "empty_dangling"])
def test_an_empty_result_is_empty_text_wherever_it_points(images, tool):
    """Zero bytes are read from nowhere, as every host call's empty buffer: a Rust tool returning an empty String
    (its pointer is the dangling 0x1) was a host error "not inside guest memory" (a spec review's finding)."""
    for image in images:
        assert image.harness(name="empty").call(tool) == ""


# ---------------------------------------------------------------- nothing survives an invocation


def _writable_addresses(lay, image) -> list[int]:
    data = image.program.symbol("data_word")
    bss = image.program.symbol("bss_area")
    coarse = (bss + (1 << 18)) & ~((1 << 18) - 1)
    page = (bss + 8192) & ~4095
    out = [data, bss, page - 4, page - 8, lay.heap_start, lay.guard_lo - 8, lay.stack_lo, lay.size - 8]
    return out + ([coarse - 4] if coarse - 4 + 16 <= lay.guard_lo else [])


@pytest.mark.parametrize("how", range(7), ids=["sd", "sb", "amoswap.d", "amoadd.w", "lr/sc", "args.read",
                                               "result.read"])
@pytest.mark.parametrize("then_trap", [0, 1], ids=["return", "trap"])
def test_every_write_is_undone_before_the_next_invocation(images, how, then_trap):
    for image in images:
        lay = image.backend.layout
        whole = ((lay.image_lo, lay.guard_lo - lay.image_lo), (lay.stack_lo, lay.size - lay.stack_lo))
        pristine = run(image, "nothing", snapshot=whole).snapshot
        for addr in _writable_addresses(lay, image):
            if how >= 3:
                addr &= ~7  # atomics need natural alignment
            if how == 6:
                run(image, "stage", fnv1a64(ECHO), 4096)  # the stage itself dirties memory and is undone too
            r = run(image, "scribble", addr, how, then_trap, blob=b"\xee" * 9000)
            if how == 6:
                assert r.trap is None or r.trap.kind is TrapKind.BREAKPOINT
            after = run(image, "nothing", snapshot=whole).snapshot
            assert after == pristine, (image.engine.kind, hex(addr), how)


@pytest.mark.parametrize("how", range(7), ids=["sd", "sb", "amoswap.d", "amoadd.w", "lr/sc", "args.read",
                                               "result.read"])
def test_every_write_is_undone_in_the_largest_memory(cache_dir, how):
    """As above in 4 GiB of guest memory, the most ABI.md §5 allows (the stack above 2**31: found untested by a
    review), each write's surroundings compared rather than the whole memory."""
    for kind in ("aot", "interp"):
        image = load(kind, cache_dir, memory_size=4 << 30)
        lay = image.backend.layout
        assert lay.stack_lo > 1 << 31
        for addr in _writable_addresses(lay, image):
            if how >= 3:
                addr &= ~7
            lo, hi = (lay.image_lo, lay.guard_lo) if addr < lay.guard_lo else (lay.stack_lo, lay.size)
            around = ((max(lo, addr - 4096), min(hi, addr + 12288) - max(lo, addr - 4096)),)
            pristine = run(image, "nothing", snapshot=around).snapshot
            if how == 6:
                run(image, "stage", fnv1a64(ECHO), 4096)
            r = run(image, "scribble", addr, how, 0, blob=b"\xee" * 9000, snapshot=around)
            # it wrote, or trapped (result.read reads no reply here: the stage's own run dirtied its memory)
            assert r.trap is not None or how == 6 or r.snapshot != pristine, (kind, hex(addr), how)
            assert run(image, "nothing", snapshot=around).snapshot == pristine, (kind, hex(addr), how)


def test_failure_and_staged_reply_do_not_survive(images):
    for image in images:
        r = run(image, "stage_then_read", fnv1a64(ECHO), image.program.symbol("bss_area"), 64)
        assert r.a0 == 16
        fresh = run(image, "hc", core_number("berm.result.read"), image.program.symbol("bss_area"), 64)
        assert fresh.trap is None and fresh.a0 == 0, image.engine.kind
        msg = image.program.symbol("data_word")
        assert run(image, "hc", core_number("berm.fail"), msg, 8).failure == (5).to_bytes(8, "little")
        assert run(image, "nothing").failure is None


def test_concurrent_invocations_see_only_their_own_memory(images):
    for image in images:
        harness = image.harness(name="concurrent")
        errors: list[str] = []

        def worker(k: int) -> None:
            for i in range(12 if image.engine.kind == "aot" else 2):
                blob = f"{k}:{i}:".encode() + bytes([65 + k]) * (100 * k + i)
                try:
                    got = harness.call("reverse", blob)
                except Exception as exc:  # noqa: BLE001 - collected and reported below
                    errors.append(f"{k}/{i}: {exc}")
                    continue
                if got.encode() != blob[::-1]:
                    errors.append(f"{k}/{i}: got {got[:40]!r}")

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], (image.engine.kind, errors[:5])
