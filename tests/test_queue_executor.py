"""The executor: bounded pool, per-harness limits, deadlines, accounting, chain-depth refusal."""

import threading
import time

import pytest

from berm_host.queue import (ChainDepthError, Context, Executor, Invocation, LimitError, QueueClosed, Trigger,
                             current_invocation)
from berm_host.traps import ToolFailure, Trap

from .queue_helpers import RecordingTarget, wait_for


def _call(harness: str, args: bytes = b"x", depth: int = 0) -> Invocation:
    return Invocation(Trigger.CALL, harness, args, tool="echo", context=Context(depth=depth))


def _executor(targets: dict, **kw) -> Executor:
    return Executor(lambda inv, deadline: targets[inv.harness].invoke(inv, deadline), **kw)


def test_results_outcomes_and_accounting():
    t = RecordingTarget()
    ex = _executor({"a": t}, workers=2)
    try:
        assert ex.submit(_call("a", b"hello")).result(5) == "hello"
        with pytest.raises(Trap):
            ex.submit(_call("a", b"trap")).result(5)
        assert ex.submit(_call("a", b"after")).result(5) == "after"  # a trap costs one invocation, not the worker
        s = ex.stats()["a"]
        assert (s.invocations, s.ok, s.traps, s.failures, s.errors) == (3, 2, 1, 0, 0)
        assert s.run_time >= 0 and s.wait_time >= 0 and s.max_wait <= s.wait_time
    finally:
        ex.shutdown()


def test_host_exception_is_counted_and_reported():
    def invoke(inv, deadline):
        raise ValueError("host bug")

    ex = Executor(invoke, workers=1)
    try:
        with pytest.raises(ValueError, match="host bug"):
            ex.submit(_call("a")).result(5)
        assert ex.stats()["a"].errors == 1
    finally:
        ex.shutdown()


@pytest.mark.parametrize("escape", [SystemExit, KeyboardInterrupt])
def test_a_base_exception_from_an_invocation_does_not_end_the_worker(escape):
    """Translated code raises a capability's KeyboardInterrupt or SystemExit after the run, as the interpreter
    lets it through: in a worker it ended the thread, leaving its future unresolved and the pool one worker short."""
    def invoke(inv, deadline):
        if inv.args == b"escape":
            raise escape
        return "fine"

    ex = Executor(invoke, workers=1)
    try:
        with pytest.raises(escape):
            ex.submit(_call("a", b"escape")).result(5)
        assert ex.submit(_call("a")).result(5) == "fine"
        assert ex.stats()["a"].errors == 1
    finally:
        ex.shutdown()


def test_pool_is_bounded_and_per_harness_limit_holds():
    lock = threading.Lock()
    state = {"active": 0, "max": 0}
    targets = {name: RecordingTarget(work=0.03) for name in "abc"}

    def invoke(inv, deadline):
        with lock:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])
        try:
            return targets[inv.harness].invoke(inv, deadline)
        finally:
            with lock:
                state["active"] -= 1

    ex = Executor(invoke, workers=3, per_harness=1)
    try:
        futures = [ex.submit(_call(h)) for h in "aaaabbbbcc"]
        for f in futures:
            f.result(10)
        assert state["max"] <= 3
        assert all(t.max_active == 1 for t in targets.values())
        # round-robin across harnesses: while "a" is held to one at a time, the others still ran alongside it
        assert state["max"] >= 2
        assert sum(s.invocations for s in ex.stats().values()) == 10
    finally:
        ex.shutdown()


@pytest.mark.parametrize("workers, limit", [(1, 1), (2, 1), (4, 3)])
def test_by_default_one_harness_never_holds_every_worker(workers, limit):
    """The default per-harness limit was the worker count: four 5 s wakes of one harness took the daemon's four
    workers, and another harness's tool call waited for them."""
    release = threading.Event()

    def invoke(inv, deadline):
        if inv.harness == "hog":
            assert release.wait(10)
        return "done"

    ex = Executor(invoke, workers=workers)
    try:
        assert ex.per_harness == limit
        hog = [ex.submit(Invocation(Trigger.WAKE, "hog", schedule_id=f"w{i}")) for i in range(workers)]
        wait_for(lambda: ex.load()["busy"] == limit)
        if workers > 1:
            assert ex.submit(_call("other")).result(10) == "done"  # a worker was left for it
    finally:
        release.set()
        ex.shutdown()
    assert [f.result(0) for f in hog] == ["done"] * workers


@pytest.mark.parametrize("limits, message", [
    ({"workers": 0}, "at least one worker, not 0"),
    ({"workers": 10 ** 8}, "at most 1024 workers, not 100000000"),  # a MemoryError's traceback (a review)
    ({"per_harness": 0}, "per-harness limit must be at least 1, not 0"),
    ({"per_harness": -1}, "per-harness limit must be at least 1, not -1"),
    ({"timeout": float("nan")}, r"timeout must be a number of seconds in \(0, 86400\], not nan"),
    ({"timeout": 0}, "not 0"),
    ({"timeout": 1e300}, "not 1e\\+300"),
    ({"max_depth": -1}, "chain depth limit must be 0 or more, not -1"),
])
def test_limits_no_executor_can_run_with_are_refused(limits, message):
    """A per-harness limit of -1 started nothing (every call waited for ever), 0 silently meant the worker count,
    and a worker count of 0 or a NaN timeout were bare ValueErrors (a traceback from berm serve)."""
    with pytest.raises(LimitError, match=message):
        Executor(lambda inv, deadline: "", **limits)


def test_worker_threads_that_cannot_start_are_a_limit_error_and_leave_none_running(monkeypatch):
    """Found by a review: a worker thread that could not start ("can't start new thread") was a RuntimeError's
    traceback from berm serve, the workers already started left waiting."""
    started = []
    real_start = threading.Thread.start

    def start(thread):
        if len(started) == 3:
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(LimitError, match="cannot start 8 worker threads \\(started 3\\): can't start new thread"):
        Executor(lambda inv, deadline: "", workers=8)
    for t in started:
        t.join(5)
        assert not t.is_alive()


def test_tool_calls_go_before_wakes_and_notifications_queued_earlier():
    """RFC 0205: a model waits on a tool call, a due instant is latency tolerant. Background work queued ahead of
    a call (the scheduler queues wakes ahead of free workers) delayed it: one worker, four wakes queued, a call
    ran fifth (a spec review's finding)."""
    order, release = [], threading.Event()

    def invoke(inv, deadline):
        if inv.args == b"hold":
            assert release.wait(10)
        order.append(inv.label)
        return ""

    ex = Executor(invoke, workers=1, per_harness=1)
    try:
        held = ex.submit(Invocation(Trigger.WAKE, "h0", b"hold", schedule_id="held"))
        wait_for(lambda: ex.load()["busy"] == 1)
        background = [ex.submit(Invocation(trigger, harness, schedule_id="w" if trigger is Trigger.WAKE else None))
                      for harness, trigger in (("h1", Trigger.WAKE), ("h2", Trigger.NOTIFY), ("h3", Trigger.WAKE),
                                               ("h0", Trigger.WAKE))]
        calls = [ex.submit(_call(h)) for h in ("h3", "h0", "h4")]
        release.set()
        for f in [held, *background, *calls]:
            f.result(10)
        assert order[0] == "h0.on_wake[held]"
        assert set(order[1:4]) == {"h3.echo", "h0.echo", "h4.echo"}  # round-robin across harnesses, as ever
        assert set(order[4:]) == {"h1.on_wake[w]", "h2.on_notify", "h3.on_wake[w]", "h0.on_wake[w]"}
    finally:
        ex.shutdown()


def test_deadline_starts_when_the_invocation_starts():
    t = RecordingTarget()
    ex = _executor({"a": t}, workers=1, timeout=7.5)
    try:
        before = time.monotonic()
        ex.submit(_call("a")).result(5)
        deadline = t.calls[0]["deadline"]
        assert before + 7.5 <= deadline <= time.monotonic() + 7.5
    finally:
        ex.shutdown()


def test_chain_depth_refused_past_limit():
    t = RecordingTarget()
    ex = _executor({"a": t}, workers=1, max_depth=8)
    try:
        assert ex.submit(_call("a", depth=8)).result(5) == "x"
        with pytest.raises(ChainDepthError, match="chain depth 9 exceeds the limit of 8"):
            ex.submit(_call("a", depth=9))
        assert ex.stats()["a"].refused == 1
        assert len(t.calls) == 1
    finally:
        ex.shutdown()


def test_chain_depth_refusals_are_warned_of_once_an_interval(caplog, monkeypatch):
    """Found by a review: a guest at the depth limit is refused once per host call, and each refusal was a
    warning line (50 MB of log a minute). One warning an interval per harness; the rest are counted in the next."""
    from berm_host.queue import executor as executor_module

    ex = _executor({"a": RecordingTarget(), "b": RecordingTarget()}, workers=1, max_depth=8)
    try:
        with caplog.at_level("WARNING", logger="berm.queue"):
            for _ in range(1000):
                for harness in ("a", "b"):
                    with pytest.raises(ChainDepthError):
                        ex.submit(_call(harness, depth=9))
            monkeypatch.setattr(executor_module, "DEPTH_WARNING_INTERVAL", 0.0)
            with pytest.raises(ChainDepthError):
                ex.submit(_call("a", depth=9))
        lines = [r.getMessage() for r in caplog.records if "chain depth" in r.getMessage()]
        refused = "refused work for {} at chain depth 9 (limit 8)"
        assert lines == [refused.format("a"), refused.format("b"),
                         refused.format("a") + "; 999 more refused since the last such warning"]
        assert ex.stats()["a"].refused == 1001 and ex.stats()["b"].refused == 1000
    finally:
        ex.shutdown()


def test_traps_are_warned_of_at_most_a_few_an_interval(caplog, monkeypatch):
    """Found by a review: a guest granted berm.call that called a trapping callee in a loop wrote a warning per
    trap, each up to 256 KiB (its berm.fail text escaped, its call chain): 50 MB of log in 2 s. At most END_WARNINGS
    an interval per harness; the rest are counted, and said in the next; a line is cut to LOG_LINE_MAX."""
    from berm_host.queue import executor as executor_module
    from berm_host.traps import HostError

    ex = _executor({"a": RecordingTarget(), "b": RecordingTarget()}, workers=1)
    try:
        with caplog.at_level("WARNING", logger="berm.queue"):
            for _ in range(100):
                for harness in ("a", "b"):
                    with pytest.raises(Trap):
                        ex.submit(_call(harness, b"trap")).result(5)
            monkeypatch.setattr(executor_module, "END_WARNING_INTERVAL", 0.0)
            with pytest.raises(Trap):
                ex.submit(_call("a", b"trap")).result(5)
        lines = [r.getMessage() for r in caplog.records]
        assert sorted(line.split(" ")[0] for line in lines) == ["a.echo"] * 11 + ["b.echo"] * 10
        assert lines[-1].endswith("; 90 more traps and errors of a not logged before it")
        assert ex.stats()["a"].traps == 101
    finally:
        ex.shutdown()
    line = executor_module._log_line("a.echo failed", HostError("\x01" * 5000))
    assert line.startswith("a.echo failed: \\x01") and line.endswith("... (15919 more characters)")
    assert len(line) == executor_module.LOG_LINE_MAX + len("... (15919 more characters)")


def test_each_invocations_end_is_logged_at_info(caplog):
    """Found by a review: `berm serve -v` said it logs every invocation-level event, and an invocation that did not
    trap logged nothing."""
    class Fails(RecordingTarget):
        def invoke(self, inv, deadline):
            raise ToolFailure("echo", "no")

    ex = _executor({"a": RecordingTarget(), "b": Fails()}, workers=1)
    try:
        with caplog.at_level("INFO", logger="berm.queue"):
            assert ex.submit(_call("a", b"hello")).result(5) == "hello"
            with pytest.raises(ToolFailure):
                ex.submit(_call("b")).result(5)
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and lines[0].startswith("a.echo ended in ") and lines[0].endswith(" ms")
        assert lines[1].startswith("b.echo failed (berm.fail) in ")
    finally:
        ex.shutdown()


def test_current_invocation_is_published_on_the_worker():
    seen = []
    ex = Executor(lambda inv, deadline: seen.append(current_invocation()) or "", workers=1)
    try:
        inv = _call("a", depth=3)
        ex.submit(inv).result(5)
        assert seen == [inv] and current_invocation() is None
    finally:
        ex.shutdown()


def test_shutdown_refuses_new_work_and_finishes_in_flight():
    t = RecordingTarget(work=0.05)
    ex = _executor({"a": t}, workers=1)
    running = ex.submit(_call("a", b"first"))
    wait_for(lambda: t.active == 1)
    queued = ex.submit(_call("a", b"second"))
    ex.shutdown(cancel_pending=True)
    assert running.result(0) == "first"
    assert queued.cancelled()
    with pytest.raises(QueueClosed):
        ex.submit(_call("a"))


def test_a_withdrawn_invocation_leaves_the_queue_at_once_and_the_rest_still_run():
    """Found by a review: a queued job whose future was cancelled stayed in its queue, arguments and all, until a
    worker reached it (a daemon's clients hanging up on calls queued behind a busy harness piled up gigabytes).
    Withdrawn here: a job held behind its harness's limit (a2) and the only job of a harness waiting for a worker
    (b), which must leave the ready list too, or the worker that next takes work finds b's queue empty."""
    gate, ran = threading.Event(), []

    def invoke(inv, deadline):
        if inv.args == b"hold":
            assert gate.wait(10)
        ran.append(inv.args)
        return inv.args.decode()

    ex = Executor(invoke, workers=1, per_harness=1)
    try:
        held = ex.submit(_call("a", b"hold"))
        wait_for(lambda: ex.load()["busy"] == 1)
        a2, b, a3 = ex.submit(_call("a", b"a2")), ex.submit(_call("b", b"b")), ex.submit(_call("a", b"a3"))
        assert ex.load()["queued"] == 3
        assert ex.withdraw(a2) and ex.withdraw(b)
        assert a2.cancelled() and b.cancelled() and ex.load()["queued"] == 1
        assert not ex.withdraw(a2) and not ex.withdraw(held)  # once only; never one that has started
        gate.set()
        assert held.result(10) == "hold" and a3.result(10) == "a3"
        assert ran == [b"hold", b"a3"]
        assert ex.submit(_call("b", b"again")).result(10) == "again"
    finally:
        ex.shutdown()


def test_a_queued_invocation_gets_its_whole_timeout_from_when_it_starts():
    """Time spent waiting for a worker is not taken from the deadline (b waits behind a, which holds the only
    worker until the gate opens, at least 0.3 s after b was queued)."""
    gate, seen = threading.Event(), {}

    def invoke(inv, deadline):
        if inv.harness == "a":
            gate.wait(10)
        else:
            seen["deadline"] = deadline
        return "x"

    ex = Executor(invoke, workers=1, timeout=7.5)
    try:
        ex.submit(_call("a"))
        queued = time.monotonic()
        b = ex.submit(_call("b"))
        time.sleep(0.3)
        gate.set()
        b.result(5)
        assert seen["deadline"] >= queued + 0.3 + 7.5
    finally:
        ex.shutdown()
