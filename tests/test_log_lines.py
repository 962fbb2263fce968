"""The daemon's log never carries a line a guest wrote: a trap's berm.fail reason, a symbol name in its call chain,
a schedule id are the guest's text, and a newline in one once started a forged record of its own ("loaded harness
admin"). What an invocation's end logs is one line, its call chain on it."""

from __future__ import annotations

import logging
import time

from berm_abi.errors import BermError
from berm_host.queue import Context, Executor, Invocation, Trigger
from berm_host.traps import Trap, TrapInfo, TrapKind
from tests.queue_helpers import RecordingTarget, queue_factory, wait_for

FORGED = "\nWARNING:berm.daemon:loaded harness admin"


def _logged(caplog, error: BaseException, inv: Invocation) -> list[str]:
    def invoke(_inv, _deadline):
        raise error

    ex = Executor(invoke, workers=1)
    try:
        with caplog.at_level(logging.WARNING, logger="berm.queue"):
            assert ex.submit(inv).exception(5) is error
    finally:
        ex.shutdown()
    return [r.getMessage() for r in caplog.records if r.name == "berm.queue"]


def test_a_trap_is_one_line_with_its_call_chain(caplog):
    info = TrapInfo(TrapKind.BREAKPOINT, pc=0x1000, where="panic" + FORGED,
                    callers=((0x2010, "parse+0x10" + FORGED), (0x3008, "tool+0x8")), unkept=3)
    inv = Invocation(Trigger.WAKE, "h", b"", context=Context(), schedule_id="daily" + FORGED)
    [line] = _logged(caplog, Trap(info, tool="on_wake", failure="why" + FORGED), inv)
    assert "\n" not in line
    assert line.startswith("h.on_wake[daily\\x0aWARNING:berm.daemon:loaded harness admin] trapped: harness trapped")
    assert "(after berm.fail: why\\x0aWARNING" in line
    assert line.endswith("; called from parse+0x10\\x0aWARNING:berm.daemon:loaded harness admin; "
                         "called from tool+0x8; ... and 3 more frames")


def test_a_host_error_is_one_line(caplog):
    inv = Invocation(Trigger.CALL, "h", b"", tool="t", context=Context())
    [line] = _logged(caplog, BermError("the result is not UTF-8" + FORGED), inv)
    assert line == "h.t failed: the result is not UTF-8\\x0aWARNING:berm.daemon:loaded harness admin"


def test_a_deferred_wake_is_logged_on_one_line(tmp_path, caplog):
    """A wake that comes due while its previous one still runs is logged as deferred, naming its id."""
    tick = "tick" + FORGED
    fired = []

    def rearm(inv):  # re-arm 20 ms ahead, then run a body that takes 150 ms
        fired.append(inv)
        if len(fired) < 2:
            q.schedule("h", tick, time.time_ns() // 1_000_000 + 20)

    t = RecordingTarget(work=0.15, on_wake=rearm)
    with caplog.at_level(logging.INFO, logger="berm.queue"), queue_factory(tmp_path / "due.db") as make:
        q = make({"h": t}, workers=4)
        q.schedule("h", tick, time.time_ns() // 1_000_000)
        wait_for(lambda: len(t.wakes()) == 2 and q.stats()["pending"] == 0)
    lines = [r.getMessage() for r in caplog.records if r.name == "berm.queue"]
    assert any("came due while its previous wake still ran" in line for line in lines)
    assert all("\n" not in line for line in lines)
