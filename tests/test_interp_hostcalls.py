"""Host calls (``ecall``) on the reference interpreter and what a RunRequest/RunResult carries: argument blob,
integer arguments, result bytes, failure text, log lines, heap bounds, capabilities through the Linker, fresh
memory per run, concurrent runs."""

from __future__ import annotations

import threading
import time

import pytest

from berm_abi.names import ERROR_BIT, fnv1a64
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from berm_host.layout import MAX_FAIL_TEXT, MAX_LOG_LINE, layout_for
from berm_host.linker import CapabilityError, Linker
from berm_host.traps import HostError, TrapKind
from tests import progen
from tests.interp_helpers import run_snippet
from tests.rvenc import Op, li

A0, A1, A2, S0, S1 = 10, 11, 12, 8, 9
BUF = progen.DATA + 64


def call(name: str, a0: int = 0, a1: int = 0, keep: int | None = None) -> list[Op]:
    """``a0, a1 = …; a7 = number(name); ecall`` and, with ``keep``, copy the result into that register."""
    ops = [*li(A0, a0), *li(A1, a1), *li(17, fnv1a64(name)), Op("ecall")]
    return ops + ([Op("addi", rd=keep, rs1=A0)] if keep else [])


@pytest.mark.parametrize("name", ["berm.args.read", "berm.result.read"])
def test_a_copy_into_guest_memory_looks_at_the_clock(name):
    """Found by a review: a copy counted as one instruction however long, so a guest copying 64 MiB in a loop ran
    a thousand copies between the run loop's looks at the clock, 33 s past a 0.3 s deadline. Here the deadline has
    passed before the run starts: the first copy ends it, before the count in s0 goes up."""
    body = [*call(name, BUF, 8), Op("addi", rd=S0, rs1=S0, imm=1)]
    r = run_snippet([*body, Op("jal", rd=0, imm=-4 * len(body))], args=b"x" * 64, data=bytes(128),
                    deadline=time.monotonic() - 1)
    assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED and r.regs[S0] == 0


def test_args_len_and_read():
    ops = [*call("berm.args.len", keep=S0), *call("berm.args.read", BUF, 5, keep=S1)]
    r = run_snippet(ops, args=b"hello world", data=bytes(128), snapshot=((BUF, 8),))
    assert r.trap is None and (r.regs[S0], r.regs[S1]) == (11, 11)
    assert r.snapshot[0] == b"hello\0\0\0"  # min(len, cap) bytes, nothing more


def test_args_read_into_read_only_memory_traps_and_empty_reads_never_do():
    r = run_snippet(call("berm.args.read", progen.RODATA, 4), args=b"abcd")
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and r.trap.addr == progen.RODATA
    assert r.trap.detail == f"berm.args.read: the buffer at {progen.RODATA:#x} (4 bytes) is not writable guest memory"
    r = run_snippet(call("berm.args.read", 0, 0, keep=S0), args=b"abcd")
    assert r.trap is None and r.regs[S0] == 4


def test_fail_records_the_last_text():
    data = b"first\0second"
    ops = [*call("berm.fail", progen.DATA, 5), *call("berm.fail", progen.DATA + 6, 6)]
    r = run_snippet(ops, data=data)
    assert r.trap is None and r.failure == b"second" and r.regs[A0] == 0


def test_log_lines_reach_the_sink_and_bad_buffers_trap():
    lines = []
    r = run_snippet([*call("berm.log", progen.DATA, 3), *call("berm.log", progen.DATA + 1, 2)], data=b"abc",
                    log=lines.append)
    assert r.trap is None and lines == [b"abc", b"bc"]
    r = run_snippet(call("berm.log", 16, 3), log=lines.append)
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "berm.log" in r.trap.detail and "readable" in r.trap.detail


def test_heap_bounds_follow_the_layout():
    ops = [*call("berm.heap.start", keep=S0), *call("berm.heap.size", keep=S1)]
    r = run_snippet(ops)
    layout = layout_for(progen.build_image([progen.Function("f0", [])]), progen.MEMORY_SIZE)
    assert (r.regs[S0], r.regs[S1]) == (layout.heap_start, layout.heap_size)


def _capability_run(fn, request: bytes = b"ping"):
    linker = Linker()
    linker.define("berm.fs.read", fn)
    ops = [*call("berm.fs.read", progen.DATA, len(request), keep=S0), *call("berm.result.read", BUF, 64, keep=S1)]
    return run_snippet(ops, data=request.ljust(128, b"\0"), linker=linker, snapshot=((BUF, 64),))


def test_capability_reply_is_staged_for_result_read():
    r = _capability_run(lambda req: req[::-1] + b"!")
    assert r.trap is None and r.regs[S0] == 5 and r.regs[S1] == 5
    assert r.snapshot[0][:6] == b"gnip!\0"


def test_capability_error_comes_back_with_the_error_bit():
    def refuse(req):
        raise CapabilityError("no such file")
    r = _capability_run(refuse)
    assert r.trap is None and r.regs[S0] == len("no such file") | ERROR_BIT
    assert r.snapshot[0][:12] == b"no such file"


def test_a_capability_bug_is_a_host_call_failed_trap():
    def broken(req):
        raise KeyError("oops")
    r = _capability_run(broken)
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "berm.fs.read" in r.trap.detail and "oops" in r.trap.detail
    r = _capability_run(lambda req: "not bytes")
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "str" in r.trap.detail


def test_result_read_before_any_capability_is_empty():
    r = run_snippet(call("berm.result.read", BUF, 8, keep=S0), data=bytes(128))
    assert r.trap is None and r.regs[S0] == 0


def test_integer_arguments_and_result_bytes():
    ops = [Op("add", rd=A0, rs1=A0, rs2=A1), Op("addi", rd=A0, rs1=A0, imm=0), *li(S0, progen.DATA),
           Op("sd", rs1=S0, rs2=A0), Op("addi", rd=S1, rs1=17, imm=0), Op("addi", rd=A0, rs1=S0, imm=0),
           Op("addi", rd=A1, imm=8)]
    r = run_snippet(ops, int_args=(40, 2, 0, 0, 0, 0, 0, -1), read_result=True, data=bytes(8))
    assert r.trap is None and r.result == (42).to_bytes(8, "little") and r.regs[S1] == (1 << 64) - 1
    r = run_snippet([*li(A0, 16), *li(A1, 4)], read_result=True)
    assert r.trap is None and r.result is None  # (a0, a1) outside readable memory


def test_every_run_gets_fresh_memory_and_registers():
    image = progen.build_image([progen.Function("f0", [
        *li(S0, progen.DATA), Op("ld", rd=A0, rs1=S0), Op("addi", rd=A1, rs1=A0, imm=1), Op("sd", rs1=S0, rs2=A1),
        Op("ld", rd=A2, rs1=2, imm=-8), Op("sd", rs1=2, rs2=A1, imm=-8), Op("add", rd=A0, rs1=A0, rs2=A2),
        Op("add", rd=A0, rs1=A0, rs2=S1), Op("addi", rd=S1, imm=9), Op("jalr", rs1=1)])], data=(5).to_bytes(8, "little"))
    backend = InterpBackend(Program.from_image(image), progen.MEMORY_SIZE)
    for _ in range(3):
        r = backend.run(RunRequest(entry=image.entry))
        assert r.trap is None and r.regs[A0] == 5  # .data reset, stack zero, s1 zero at entry


def test_concurrent_runs_share_nothing():
    image = progen.build_image([progen.Function("f0", [
        *li(S0, progen.DATA), Op("sd", rs1=S0, rs2=A0), Op("addi", rd=S1, imm=2000), Op("addi", rd=A2, rs1=A0, imm=0),
        Op("ld", rd=A1, rs1=S0), Op("add", rd=A2, rs1=A2, rs2=A1), Op("addi", rd=S1, rs1=S1, imm=-1),
        Op("bne", rs1=S1, rs2=0, imm=-12), Op("addi", rd=A0, rs1=A2, imm=0), Op("jalr", rs1=1)])], data=bytes(8))
    backend = InterpBackend(Program.from_image(image), progen.MEMORY_SIZE)
    results: dict[int, int] = {}

    def worker(k: int):
        for _ in range(5):
            r = backend.run(RunRequest(entry=image.entry, int_args=(k,)))
            results[k] = r.regs[A0] if r.trap is None else -1
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: k * 2001 for k in range(1, 7)}


@pytest.mark.parametrize("size", [512 << 10, 64 << 20, 4 << 30])
def test_memory_sizes_up_to_4_gib(size):
    ops = [*call("berm.heap.size", keep=S0), Op("addi", rd=A0, imm=77), Op("sd", rs1=2, rs2=A0, imm=8),
           Op("ld", rd=A1, rs1=2, imm=8)]
    r = run_snippet(ops, memory_size=size)
    assert r.trap is None and r.regs[A1] == 77 and r.regs[2] == size - 16 and r.regs[S0] > 0


def test_more_than_eight_integer_arguments_is_a_host_error():
    with pytest.raises(HostError, match="at most 8 integer arguments"):
        run_snippet([], int_args=tuple(range(9)))


def test_a_log_sink_that_raises_is_a_host_call_failed_trap():
    def sink(line):
        raise OSError("disk full")
    r = run_snippet(call("berm.log", progen.DATA, 3), data=b"abc", log=sink)
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "disk full" in r.trap.detail


def test_the_dispatch_table_covers_every_operation():
    from berm_aot.isa import OPS
    from berm_host.interp.backend import BUILDERS
    assert set(BUILDERS) == OPS


def test_a_memory_size_that_is_not_a_power_of_two_is_a_host_error():
    image = progen.build_image([progen.Function("f0", [Op("jalr", rs1=1)])])
    with pytest.raises(HostError, match="power of two"):
        InterpBackend(Program.from_image(image), 3 << 20)


def test_result_read_copies_at_most_the_buffer_size():
    linker = Linker()
    linker.define("berm.fs.read", lambda req: b"reply!")
    ops = [*call("berm.fs.read", progen.DATA, 4), *call("berm.result.read", BUF, 3, keep=S1)]
    r = run_snippet(ops, data=bytes(128), linker=linker, snapshot=((BUF, 8),))
    assert r.trap is None and r.regs[S1] == 6  # the whole reply's length...
    assert r.snapshot[0] == b"rep" + bytes(5)  # ...but only a1 bytes written


def test_zero_length_buffers_are_never_checked():
    """ABI: a zero-length buffer may point anywhere (null, past the end): nothing is read or written."""
    lines = []
    linker = Linker()
    linker.define("berm.fs.read", lambda req: b"[" + req + b"]")
    ops = [*call("berm.log", 0, 0), *call("berm.fail", (1 << 64) - 1, 0), *call("berm.fs.read", 16, 0, keep=S0),
           *call("berm.result.read", 0, 0, keep=S1)]
    r = run_snippet(ops, log=lines.append, linker=linker)
    assert r.trap is None and lines == [b""] and r.failure == b""
    assert (r.regs[S0], r.regs[S1]) == (2, 2)


@pytest.mark.parametrize("name, limit, what", [("berm.log", MAX_LOG_LINE, b"berm.log line"),
                                               ("berm.fail", MAX_FAIL_TEXT, b"berm.fail text")])
def test_overlong_log_line_and_fail_text_are_cut_with_a_marker(name, limit, what):
    lay = layout_for(progen.build_image([progen.Function("f0", [])]), progen.MEMORY_SIZE)
    n = limit + 16  # a buffer in the (zeroed, readable) stack
    lines = []
    r = run_snippet(call(name, lay.stack_lo, n), log=lines.append)
    text = bytes(limit) + b" [... %s truncated: %d of %d bytes kept]" % (what, limit, n)
    assert r.trap is None
    assert (lines if name == "berm.log" else [r.failure]) == [text]


def test_integer_arguments_are_taken_modulo_2_to_the_64():
    r = run_snippet([Op("srli", rd=A2, rs1=A0, imm=60)], int_args=(-1, -(1 << 63)))
    assert r.trap is None and r.regs[A0] == (1 << 64) - 1 and r.regs[A1] == 1 << 63 and r.regs[A2] == 0xF


def test_a_result_exactly_max_result_bytes_long_is_returned():
    ops = [*li(A0, progen.DATA), *li(A1, 8)]
    data = b"12345678"
    assert run_snippet(ops, data=data, read_result=True, max_result=8).result == data
    assert run_snippet(ops, data=data, read_result=True, max_result=7).result is None


def test_snapshots_past_the_end_of_memory_read_as_zero():
    lay = layout_for(progen.build_image([progen.Function("f0", [])]), progen.MEMORY_SIZE)
    ops = [*li(A0, lay.size - 4), *li(A1, 0x44332211), Op("sw", rs1=A0, rs2=A1)]
    r = run_snippet(ops, snapshot=((lay.size - 4, 8), (lay.size, 4)))
    assert r.trap is None and r.snapshot == (bytes.fromhex("11223344") + bytes(4), bytes(4))
