"""Limits on what one invocation may cost the host: resident memory kept by pooled regions, the size of a tool's
result and of its berm.fail text (the same on both engines), and interrupts that belong to one invocation."""

from __future__ import annotations


import pytest

from berm_abi.names import fnv1a64
from berm_host.aot.runtime import lib
from berm_host.engine import Engine
from berm_host.layout import (LOG_DROPPED, LOG_LINE_CHARGE, MAX_CALL_DEPTH, MAX_FAIL_TEXT, MAX_LOG_BYTES,
                               MAX_LOG_LINE, budgeted_log)
from berm_host.linker import Linker
from berm_host.traps import HostError, ToolFailure, Trap, TrapKind
from tests.guests import raw_harness_elf

DIRTY_MIB = 32
SIGNAL = "limits.signal"  # a test capability: the guest calls it, the host acts on the running invocation

SOURCE = r"""
static char out[32];
static Pair text(const char *s, u64 n) { Pair p = { (u64)s, n }; return p; }
static u64 arg_number(void) {
    char buf[24]; u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf), v = 0;
    for (u64 i = 0; i < n && i < sizeof buf; i++) v = v * 10 + (buf[i] - '0');
    return v;
}

/* Write one byte in every page of DIRTY MiB of heap. */
Pair berm_tool_dirty(void) {
    volatile char *heap = (volatile char *)ecall2(HEAP_START, 0, 0);
    for (u64 a = 0; a < ((u64)DIRTY_MIB << 20); a += 4096) heap[a] = 1;
    return text("ok", 2);
}

/* How many of those bytes are not zero (an earlier invocation's writes showing through). */
Pair berm_tool_check(void) {
    volatile char *heap = (volatile char *)ecall2(HEAP_START, 0, 0);
    u64 seen = 0;
    for (u64 a = 0; a < ((u64)DIRTY_MIB << 20); a += 4096) seen += heap[a] != 0;
    out[0] = '0' + (seen > 9 ? 9 : seen);
    return text(out, 1);
}

/* A result of as many (zero) bytes as the arguments say, or all of the heap. */
Pair berm_tool_sized(void) {
    u64 heap = ecall2(HEAP_START, 0, 0), n = arg_number();
    return text((const char *)heap, n ? n : ecall2(HEAP_SIZE, 0, 0));
}

/* Host call `number` with a text of as many bytes as the arguments say (the alphabet over and over). */
static void long_text_call(u64 number) {
    char *heap = (char *)ecall2(HEAP_START, 0, 0);
    u64 n = arg_number();
    for (u64 i = 0; i < n; i++) heap[i] = 'a' + i % 26;
    ecall2(number, (u64)heap, n);
}
Pair berm_tool_longfail(void) { long_text_call(FAIL); return text("unreachable", 11); }
Pair berm_tool_longlog(void) { long_text_call(LOG); return text("logged", 6); }
/* As many berm.log lines of 1000 bytes as the arguments say. */
Pair berm_tool_floodlog(void) {
    char *heap = (char *)ecall2(HEAP_START, 0, 0);
    for (u64 i = 0; i < 1000; i++) heap[i] = 'a' + i % 26;
    for (u64 n = arg_number(); n; n--) ecall2(LOG, (u64)heap, 1000);
    return text("logged", 6);
}

/* Call the signal capability, then spin for a bounded while (long enough for an interrupt to be noticed). */
Pair berm_tool_signal(void) {
    ecall2(SIGNAL, 0, 0);
    volatile u64 x = 0;
    for (u64 i = 0; i < 3000000; i++) x += i;
    return text("done", 4);
}

"""

TOOLS = ("dirty", "check", "sized", "longfail", "longlog", "floodlog", "signal")


@pytest.fixture(scope="module")
def elf():
    return raw_harness_elf(SOURCE, TOOLS, {"SIGNAL": fnv1a64(SIGNAL), "DIRTY_MIB": DIRTY_MIB})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _harness(elf, cache_dir, kind="aot", linker=None, **options):
    return Engine(kind=kind, cache_dir=cache_dir, deadline=10.0, **options).load(elf).harness(linker)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS in /proc/self/status")


# -- 1. pooled regions do not keep what a guest dirtied resident ----------------------------------------------------

def test_big_dirtying_invocations_leave_no_resident_memory_and_fresh_memory(elf, cache_dir):
    h = _harness(elf, cache_dir)
    assert h.call("check") == "0"
    baseline = _rss()
    for _ in range(4):
        assert h.call("dirty") == "ok"
        assert _rss() < baseline + (8 << 20)  # not the 32 MiB the guest wrote
        assert h.call("check") == "0"  # and released memory reads back as zero
    assert _rss() < baseline + (8 << 20)


def test_run_path_trims_too(elf, cache_dir):
    """``backend.run`` (the differential tests' path) trims as ``Harness.call`` does."""
    from berm_host.backend import RunRequest

    image = Engine(cache_dir=cache_dir, deadline=10.0).load(elf)
    dirty, check = (RunRequest(entry=image.program.symbol(f"berm_tool_{t}"), read_result=True)
                    for t in ("dirty", "check"))
    assert image.backend.run(check).result == b"0"
    baseline = _rss()
    for _ in range(3):
        assert image.backend.run(dirty).result == b"ok"
        assert image.backend.run(check).result == b"0"
    assert _rss() < baseline + (8 << 20)


STACK_SOURCE = r"""
typedef unsigned long u64;
/* Recursion whose frames are written only by the prologue's group of sp-relative stores (berm_code.h,
   BERM_GROUP_MARK: they lower the stack's low-water mark and mark no page). */
__asm__(".globl deep\n deep:\n addi sp, sp, -2032\n sd ra, 8(sp)\n sd s0, 0(sp)\n beqz a0, 1f\n"
        " addi a0, a0, -1\n call deep\n 1: ld ra, 8(sp)\n ld s0, 0(sp)\n addi sp, sp, 2032\n ret\n");
u64 deep(u64 n);
/* One byte in every page of `blocks` 256 KiB blocks of heap above the image, then `depth` frames of 2032 bytes. */
u64 fill(u64 heap, u64 blocks, u64 depth) {
    volatile char *p = (volatile char *)((heap + (1ul << 19)) & ~((1ul << 18) - 1));
    for (u64 a = 0; a < (blocks << 18); a += 4096) p[a] = 1;
    return deep(depth);
}
void _start(void) {}
"""


def test_stack_written_by_frame_saves_counts_as_resident(tmp_path):
    """A region that keeps more than BERM_RESIDENT_KEEP of written zero-initial memory is trimmed after the run; the
    stack a deep recursion wrote only through its frames' saves (which mark no page, only lower the stack's
    low-water mark) counts like any other: 14 blocks of heap plus ~900 KiB of frames are over the 4 MiB kept, 14
    blocks and a shallow recursion are not."""
    from tests.guests import guest_elf

    elf = guest_elf(STACK_SOURCE, keep=("fill", "deep"))
    backend = Engine(cache_dir=tmp_path).load(elf).backend
    entry = backend.program.symbol("fill")
    keep_blocks = lib.BERM_RESIDENT_KEEP >> 18
    assert keep_blocks == 16

    def trimmed(depth: int) -> bool:
        region = backend.memory.acquire()
        for i, v in enumerate((backend.layout.heap_start, 14, depth)):
            region.int_args[i] = v
        outcome = lib.berm_run(region.ptr, entry, b"", 0, 3, 0.0)
        assert outcome & ~lib.BERM_RUN_TRIM in (lib.BERM_RUN_OK, lib.BERM_RUN_BAD_RESULT)
        lib.berm_region_trim(region.ptr)
        backend.memory.release(region)
        return bool(outcome & lib.BERM_RUN_TRIM)

    assert not trimmed(4)
    assert trimmed(440)


# -- 2. result and failure-text caps, identical on both engines ----------------------------------------------------

@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_result_cap(elf, cache_dir, kind):
    h = _harness(elf, cache_dir, kind, max_result=1000)
    assert h.call("sized", "1000") == "\0" * 1000
    with pytest.raises(HostError, match="result of 1001 bytes, over the cap of 1000 bytes"):
        h.call("sized", "1001")


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_default_result_cap_refuses_a_result_spanning_the_heap(elf, cache_dir, kind):
    h = _harness(elf, cache_dir, kind)
    with pytest.raises(HostError, match=f"over the cap of {16 << 20} bytes"):
        h.call("sized", "0")


def test_result_cap_must_be_a_byte_count(cache_dir):
    with pytest.raises(ValueError, match="result cap"):
        Engine(cache_dir=cache_dir, max_result=-1)


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_failure_text_is_cut_with_a_marker(elf, cache_dir, kind):
    h = _harness(elf, cache_dir, kind)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    with pytest.raises(ToolFailure) as info:
        h.call("longfail", str(MAX_FAIL_TEXT))
    whole = (alphabet * (MAX_FAIL_TEXT // 26 + 1))[:MAX_FAIL_TEXT]
    assert whole in str(info.value) and "truncated" not in str(info.value)
    with pytest.raises(ToolFailure) as info:
        h.call("longfail", str(3 * MAX_FAIL_TEXT))
    message = str(info.value)
    assert whole + f" [... berm.fail text truncated: {MAX_FAIL_TEXT} of {3 * MAX_FAIL_TEXT} bytes kept]" in message
    assert len(message) < MAX_FAIL_TEXT + 200


def test_both_engines_record_the_same_cut_failure_text(elf, cache_dir):
    from berm_host.backend import RunRequest

    texts = []
    for kind in ("aot", "interp"):
        image = Engine(kind=kind, cache_dir=cache_dir, deadline=10.0).load(elf)
        request = RunRequest(entry=image.program.symbol("berm_tool_longfail"), args=str(MAX_FAIL_TEXT + 1).encode())
        texts.append(image.backend.run(request).failure)
    assert texts[0] == texts[1] and texts[0].endswith(b"truncated: 65536 of 65537 bytes kept]")


def test_core_and_interpreter_keep_the_same_failure_text_length():
    assert lib.BERM_FAIL_KEEP == MAX_FAIL_TEXT


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_log_line_is_cut_with_a_marker(elf, cache_dir, kind):
    """berm.log had no cap: one line the size of guest memory took the daemon 72 s and 4.9 GB in its sink. The
    sink gets at most MAX_LOG_LINE bytes and a marker, the same bytes on both engines."""
    lines = []
    h = Engine(kind=kind, cache_dir=cache_dir, deadline=10.0, log=lambda name, line: lines.append(line)).load(
        elf).harness(None, name="limits")
    assert h.call("longlog", str(MAX_LOG_LINE)) == "logged"
    whole = (b"abcdefghijklmnopqrstuvwxyz" * (MAX_LOG_LINE // 26 + 1))[:MAX_LOG_LINE]
    assert h.call("longlog", str(3 * MAX_LOG_LINE)) == "logged"
    marker = b" [... berm.log line truncated: %d of %d bytes kept]" % (MAX_LOG_LINE, 3 * MAX_LOG_LINE)
    assert lines == [whole, whole + marker]


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_an_invocation_logs_at_most_its_budget(elf, cache_dir, kind):
    """A guest logging in a loop until its deadline filled a daemon's log at ~19 MB a second: the sink gets an
    invocation's lines up to MAX_LOG_BYTES, then one marker, then nothing — and the next invocation starts afresh."""
    lines = []
    h = Engine(kind=kind, cache_dir=cache_dir, deadline=30.0, log=lambda name, line: lines.append(line)).load(
        elf).harness(None, name="limits")
    line = (b"abcdefghijklmnopqrstuvwxyz" * 39)[:1000]
    fit = MAX_LOG_BYTES // (len(line) + LOG_LINE_CHARGE)
    for _ in range(2):
        lines.clear()
        assert h.call("floodlog", str(fit + 500)) == "logged"
        assert lines == [line] * fit + [LOG_DROPPED]
    lines.clear()
    assert h.call("floodlog", str(fit)) == "logged"  # exactly at the budget: nothing dropped
    assert lines == [line] * fit


def test_empty_log_lines_count_against_the_budget():
    """Found by a review: an empty line counted as nothing, so a guest logging empty lines in a loop reached the
    sink 300,000 times in one invocation (both engines share budgeted_log)."""
    logged, delivered = 0, []
    for _ in range(MAX_LOG_BYTES):
        line, logged = budgeted_log(logged, b"")
        if line is None:
            break
        delivered.append(line)
    assert delivered == [b""] * (MAX_LOG_BYTES // LOG_LINE_CHARGE) + [LOG_DROPPED]


@pytest.mark.parametrize("sink", [True, False], ids=["sink", "no sink"])
def test_a_guest_logging_until_its_deadline_traps_at_an_ecall_on_both_engines(elf, cache_dir, sink):
    """Both engines look at the deadline after every berm.log (it is served in Python): the interpreter skipped
    that for a line over the budget and with no log sink, and trapped at the instructions around the ecall, every
    time. Where the guest spends most of its time, a run mostly ends at the ecall; the loop's own poll (or the
    interpreter's periodic look) may notice the deadline first now and then, more often on a loaded machine (a
    review saw it once), so each engine must end at the ecall in some of four runs, not in all."""
    for kind in ("aot", "interp"):
        image = Engine(kind=kind, cache_dir=cache_dir, deadline=0.2,
                       log=(lambda name, line: None) if sink else None).load(elf)
        ops = []
        for _ in range(4):
            with pytest.raises(Trap) as info:
                image.harness(None, name="limits").call("floodlog", str(10**12))
            assert info.value.kind is TrapKind.INTERRUPTED
            ops.append(image.program.instruction(info.value.info.pc).op)
        assert "ecall" in ops, (kind, ops)


def test_core_and_interpreter_keep_the_same_log_line_length():
    assert lib.BERM_LOG_KEEP == MAX_LOG_LINE


# -- 3. an interrupt belongs to one invocation --------------------------------------------------------------------

def _signalled(elf, cache_dir, act):
    """A harness whose signal capability calls ``act(region)`` while the invocation runs, and its one region."""
    linker = Linker()
    h = _harness(elf, cache_dir, linker=linker)
    assert h.call("check") == "0"
    region = h.image.backend.memory.pool[-1]  # sequential calls run in this one region
    linker.define(SIGNAL, lambda request: act(region) or b"")
    return h, region


def test_interrupt_for_the_running_invocation_interrupts_it(elf, cache_dir):
    results = []
    h, _ = _signalled(elf, cache_dir, lambda r: results.append(lib.berm_interrupt(r.ptr, r.ptr.generation)))
    with pytest.raises(Trap) as info:
        h.call("signal")
    assert info.value.info.kind is TrapKind.INTERRUPTED and results == [1]


def test_interrupt_for_an_ended_invocation_affects_no_later_one(elf, cache_dir):
    generations, results = [], []

    def act(region):
        if generations:  # the second invocation asks to interrupt the first, which has ended
            results.append(lib.berm_interrupt(region.ptr, generations[0]))
        generations.append(region.ptr.generation)

    h, region = _signalled(elf, cache_dir, act)
    assert h.call("signal") == "done"
    assert lib.berm_interrupt(region.ptr, generations[0]) == 0  # idle region: the run has ended
    assert region.ptr.ctx.interrupt[0] == 0
    assert h.call("signal") == "done"
    assert results == [0] and generations[1] == generations[0] + 1


def test_interrupt_flag_left_on_an_idle_region_is_cleared_at_the_next_start(elf, cache_dir):
    h, region = _signalled(elf, cache_dir, lambda r: None)
    # as a watchdog scan racing the end of the last run could leave it: the flag and the two limits it drops
    region.ptr.ctx.interrupt[0] = 1
    region.ptr.ctx.native_limit = 2**64 - 1
    region.ptr.ctx.depth_limit = 0
    assert h.call("signal") == "done"
    # and the limits are back, or every call would take the slow path of its check
    assert region.ptr.ctx.native_limit < 2**64 - 1 and region.ptr.ctx.depth_limit == MAX_CALL_DEPTH
