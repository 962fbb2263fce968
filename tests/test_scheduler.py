"""The scheduler over the due-set and executor: exact wakes, idling at zero, missed occurrences, overrun,
backpressure, chain depth — observed through a recording target (the queue rules, not a guest)."""

import json
import logging
import sqlite3
import threading
import time

import pytest

from berm_abi.frames import encode_frame
from berm_host.linker import CapabilityError
from berm_host.queue import Cancel, DueSet, QueueClosed, QueueError, ScheduleError, Subscription, schedule_capabilities
from berm_host.queue import scheduler as scheduler_module

from .bounded import GRACE, ends_within
from .queue_helpers import RecordingTarget, queue_factory, wait_for


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def make_queue(tmp_path):
    with queue_factory(tmp_path / "due.db") as make:
        yield make


def test_a_wake_queued_behind_a_busy_worker_is_told_when_it_runs(make_queue):
    """A wake's ``now`` was the instant the scheduler queued it: behind a busy worker it waited (up to an
    invocation's timeout), and ran told it was on time (found by a review)."""
    slow, late = RecordingTarget(work=1.0), RecordingTarget()
    q = make_queue({"slow": slow, "late": late}, workers=1)
    q.call("slow", "echo", "x")
    wait_for(lambda: slow.active)
    q.schedule("late", "w", now_ms(), "p")  # queued for the only worker, which the call holds
    wait_for(lambda: late.wakes())
    (wake,) = late.wakes()
    assert wake["now"] >= int(slow.calls[0]["end"] * 1000)


def test_wake_200ms_ahead_fires_never_early_and_idle_makes_no_wakeups(make_queue):
    t = RecordingTarget()
    q = make_queue({"h": t})
    time.sleep(0.3)
    assert q.scheduler.stats().wakeups == 0  # nothing pending: the thread never woke
    when = now_ms() + 200
    q.schedule("h", "soon", when, "p")
    wait_for(lambda: t.wakes())
    (wake,) = t.wakes()
    assert wake["start"] * 1000 >= when
    assert (wake["id"], wake["payload"], wake["scheduled_at"]) == ("soon", "p", when)
    assert wake["now"] >= when
    wait_for(lambda: q.stats()["pending"] == 0)
    settled = q.scheduler.stats().wakeups
    q.schedule("h", "far", now_ms() + 3_600_000)  # one poke, then sleep for an hour
    time.sleep(0.3)
    assert q.scheduler.stats().wakeups <= settled + 1
    assert [e.id for e in q.list()] == ["far"]


def test_missed_occurrences_after_downtime_arrive_once_each(tmp_path, make_queue):
    ds = DueSet(tmp_path / "due.db")
    past = now_ms() - 3 * 3600_000
    for i in range(5):
        ds.put("h", f"m{i}", past + i * 60_000, f"p{i}")
    ds.close()  # "the daemon was down"
    t = RecordingTarget()
    q = make_queue({"h": t})
    wait_for(lambda: len(t.wakes()) == 5 and q.stats()["pending"] == 0)
    time.sleep(0.1)
    wakes = sorted(t.wakes(), key=lambda w: w["id"])
    assert [w["id"] for w in wakes] == [f"m{i}" for i in range(5)]
    assert [w["scheduled_at"] for w in wakes] == [past + i * 60_000 for i in range(5)]
    assert all(w["now"] - w["scheduled_at"] >= 3 * 3600_000 - 5 * 60_000 for w in wakes)


def test_overrun_defers_and_never_overlaps(make_queue):
    fired = []

    def rearm(inv):  # a recurring harness: re-arm 20 ms ahead, then run a body that takes 150 ms
        fired.append(inv)
        if len(fired) < 3:
            q.schedule("h", "tick", now_ms() + 20)

    t = RecordingTarget(work=0.15, on_wake=rearm)
    q = make_queue({"h": t}, workers=4)
    q.schedule("h", "tick", now_ms())
    wait_for(lambda: len(t.wakes()) == 3 and q.stats()["pending"] == 0)
    wakes = sorted(t.wakes(), key=lambda w: w["start"])
    assert t.max_active == 1
    assert all(a["end"] <= b["start"] for a, b in zip(wakes, wakes[1:]))
    assert q.scheduler.stats().deferred >= 1
    # deferred, not dropped: the late one still says when it was due
    assert all(w["now"] >= w["scheduled_at"] for w in wakes)


def test_backpressure_spills_to_the_next_drain_and_is_counted(make_queue, caplog):
    caplog.set_level(logging.WARNING, logger="berm.queue")
    t = RecordingTarget(work=0.03)
    q = make_queue({"h": t}, workers=2, start=False)
    when = now_ms() - 1
    for i in range(10):  # all due before the scheduler starts, so its first drain sees ten for two workers
        q.schedule("h", f"w{i}", when)
    q.start()
    wait_for(lambda: len(t.wakes()) == 10 and q.stats()["pending"] == 0)
    s = q.scheduler.stats()
    assert s.spill_events >= 1 and s.spilled >= 6 and s.fired == 10 and s.backlog == 0
    assert sorted(w["id"] for w in t.wakes()) == [f"w{i}" for i in range(10)]
    assert any("backpressure" in r.message for r in caplog.records)


def test_trap_costs_one_occurrence_not_the_schedule(make_queue):
    def rearm_then_trap(inv):
        if json.loads(inv.args)["payload"] == "trap":
            q.schedule("h", "r", now_ms() + 30, "fine")  # re-armed before the body traps

    t = RecordingTarget(on_wake=rearm_then_trap)
    q = make_queue({"h": t})
    q.schedule("h", "r", now_ms(), "trap")
    wait_for(lambda: len(t.wakes()) == 2 and q.stats()["pending"] == 0)
    assert [w["payload"] for w in sorted(t.wakes(), key=lambda w: w["start"])] == ["trap", "fine"]
    assert q.stats()["harnesses"]["h"]["traps"] == 1


def test_a_wake_waiting_behind_its_harnesss_running_one_is_counted_in_the_backpressure_warning(make_queue, caplog):
    """The warning subtracted the running wakes from the due rows, and a running wake that had re-armed itself into
    the future left nothing to subtract from: "backpressure: 0 due wakes wait" for a wake that waited."""
    caplog.set_level(logging.WARNING, logger="berm.queue")
    running = threading.Event()

    def rearm_then_run(inv):
        if inv.schedule_id == "a":
            q.schedule("h", "a", now_ms() + 60_000)
            running.set()
            time.sleep(0.5)

    q = make_queue({"h": RecordingTarget(on_wake=rearm_then_run)}, workers=2, per_harness=1)
    q.schedule("h", "a", now_ms())
    assert running.wait(10)
    q.schedule("h", "b", now_ms())  # due now, behind "a" (one at a time for h)
    wait_for(lambda: any("backpressure:" in r.message for r in caplog.records))
    assert [r.message.split(" due wakes")[0] for r in caplog.records if "backpressure:" in r.message] == \
        ["backpressure: 1"]


def test_chain_depth_stops_a_tight_self_rescheduling_chain(make_queue):
    errors = []

    def again(inv):
        try:
            at(encode_frame([now_ms(), "loop", "again"]))
        except CapabilityError as exc:
            errors.append(str(exc))

    t = RecordingTarget(on_wake=again)
    q = make_queue({"h": t}, max_depth=8)
    at, _cancel = (c.fn for c in schedule_capabilities(q, "h"))
    q.schedule("h", "loop", now_ms())
    wait_for(lambda: errors and q.stats()["pending"] == 0)
    time.sleep(0.05)
    assert [w["depth"] for w in sorted(t.wakes(), key=lambda w: w["start"])] == list(range(9))
    assert errors == ["chain depth 9 exceeds the limit of 8: refusing work for 'h' caused by a harness "
                      "(a harness re-triggering itself in a tight chain?)"]
    assert q.stats()["harnesses"]["h"]["refused"] == 1


def test_rearm_beyond_the_horizon_starts_a_fresh_chain(make_queue):
    t = RecordingTarget()
    q = make_queue({"h": t})
    at, cancel = (c.fn for c in schedule_capabilities(q, "h", horizon_ms=1000))
    at(encode_frame([now_ms() + 5000, "later", ""]))
    assert q.dueset.get("h", "later").depth == 0
    cancel(encode_frame(["later"]))
    assert q.list() == []
    with pytest.raises(CapabilityError, match="expected fields"):
        at(encode_frame(["1"]))


def test_a_harness_without_on_wake_cannot_be_scheduled(make_queue):
    t = RecordingTarget()
    t.exports = frozenset()
    q = make_queue({"h": t})
    with pytest.raises(ScheduleError, match="does not export on_wake"):
        q.schedule("h", "x", now_ms())


def test_notify_reaches_subscribed_harnesses(make_queue):
    a, b = RecordingTarget(), RecordingTarget()
    q = make_queue({"a": a, "b": b})
    q.subscribe("agent:x:done", "a")
    q.subscribe("agent:x:done", "b", once=True)
    for f in q.publish("agent:x:done", "{}") + q.publish("agent:x:done", "second"):
        f.result(5)
    assert [json.loads(c["args"])["event"] for c in a.calls] == ["{}", "second"]
    assert [json.loads(c["args"]) for c in b.calls] == [{"topic": "agent:x:done", "event": "{}"}]


def test_a_harness_subscribed_once_and_for_good_gets_each_event_once(make_queue):
    """Found by a review: a harness subscribed to a topic both once and for good got two on_notify of the first
    event."""
    a = RecordingTarget()
    q = make_queue({"a": a})
    q.subscribe("t", "a", once=True)
    q.subscribe("t", "a")
    for f in q.publish("t", "first") + q.publish("t", "second"):
        f.result(5)
    assert [json.loads(c["args"])["event"] for c in a.calls] == ["first", "second"]


def test_a_once_subscription_an_event_could_not_reach_waits_for_the_next(make_queue, monkeypatch):
    """Found by a review: publish consumed every once subscription of the topic first, so when a submit was refused
    part way (the queue closing), the harnesses after it lost theirs without an event."""
    a, b = RecordingTarget(), RecordingTarget()
    q = make_queue({"a": a, "b": b})
    q.subscribe("t", "a", once=True)
    q.subscribe("t", "b", once=True)
    submit = q.executor.submit
    refusals = iter([False, True])

    def closing_midway(inv):
        if next(refusals):
            raise QueueClosed("closing")
        return submit(inv)

    monkeypatch.setattr(q.executor, "submit", closing_midway)
    with pytest.raises(QueueClosed):
        q.publish("t", "first")
    assert q.subscriptions.list() == [Subscription("t", "b", once=True)]
    monkeypatch.setattr(q.executor, "submit", submit)
    for f in q.publish("t", "second"):
        f.result(5)
    assert [json.loads(c["args"])["event"] for c in a.calls] == ["first"]
    assert [json.loads(c["args"])["event"] for c in b.calls] == ["second"]


def test_wakes_of_a_harness_that_is_not_loaded_stay_pending_and_block_nobody(tmp_path, make_queue):
    ds = DueSet(tmp_path / "due.db")
    ds.put("gone", "old", now_ms() - 5000, "kept")  # its harness was dropped from the declarations
    ds.close()
    t = RecordingTarget()
    q = make_queue({"h": t})
    q.schedule("h", "x", now_ms())
    wait_for(lambda: t.wakes() and q.stats()["pending"] == 1)  # h's delivered wake deleted, not the other
    assert [(e.harness, e.id, e.payload) for e in q.list()] == [("gone", "old", "kept")]
    assert q.scheduler.stats().fired == 1


def test_a_wake_centuries_away_leaves_the_scheduler_running(make_queue):
    """A harness could arm a wake at 2**62 - 1 ms: the sleep until it overflowed Condition.wait and the scheduler
    thread died, so no harness's wake was delivered again, even after a restart (the entry is durable)."""
    evil, victim = RecordingTarget(), RecordingTarget()
    q = make_queue({"evil": evil, "victim": victim})
    at = {c.name: c.fn for c in schedule_capabilities(q, "evil")}["berm.schedule.at"]
    at(encode_frame([str((1 << 62) - 1), "far", ""]))
    time.sleep(0.2)
    q.schedule("victim", "soon", now_ms() + 100)
    wait_for(lambda: victim.wakes())
    assert q.scheduler._thread.is_alive()


@pytest.mark.parametrize("when", ["--5", "\u00b2", "\u0661\u0662"])
def test_an_instant_with_other_digits_than_ascii_is_an_error_reply(make_queue, when):
    """str.isdigit() let '--5' (after lstrip('-')), '²' and Arabic-Indic digits through; int() then raised a
    ValueError out of the capability: a host-call-failed trap instead of an error the guest can handle."""
    q = make_queue({"h": RecordingTarget()})
    at = {c.name: c.fn for c in schedule_capabilities(q, "h")}["berm.schedule.at"]
    with pytest.raises(CapabilityError, match="not a decimal integer"):
        at(encode_frame([when, "x", ""]))


@pytest.mark.parametrize("per_harness", [None, 1])
def test_one_harness_flood_of_due_wakes_does_not_keep_another_waiting(make_queue, per_harness):
    """Drained in time order, twelve due wakes of one harness all went before another's wake due just after them:
    with 2 workers busy 0.1 s each, it started ~0.6 s late (and 9 s late behind twenty 1 s wakes). Now every
    harness's earliest goes first, and no harness is handed more than its concurrency limit lets start."""
    flood, other = RecordingTarget(work=0.1), RecordingTarget()
    q = make_queue({"flood": flood, "other": other}, workers=2, per_harness=per_harness, start=False)
    when = now_ms() - 50
    for i in range(12):
        q.schedule("flood", f"w{i:02}", when)
    q.schedule("other", "v", when + 10)
    q.start()
    wait_for(lambda: len(other.wakes()) == 1 and len(flood.wakes()) == 12 and q.stats()["pending"] == 0)
    (woke,) = other.wakes()
    assert len([w for w in flood.wakes() if w["start"] < woke["start"]]) <= 2
    assert flood.max_active <= (per_harness or 2)


def test_harnesses_at_their_limit_neither_hide_another_due_wake_nor_spin_the_scheduler(make_queue):
    """Held harnesses filled the window of due rows a drain reads; another harness's due wake outside it was then
    the 'earliest' at 0 s, forever: the scheduler thread re-drained in a loop (17,775 wakeups in 2 s, a core busy)
    and never fired it."""
    gate = threading.Event()
    busy = {n: RecordingTarget(on_call=lambda inv: gate.wait(10)) for n in ("h1", "h2", "h3")}
    b = RecordingTarget()
    q = make_queue({**busy, "b": b}, workers=2, per_harness=1)
    try:
        calls = [q.call(n, "echo", "x") for n in ("h1", "h2", "h3")]  # two run, h3's waits for a worker
        wait_for(lambda: q.executor.load()["busy"] == 2)
        q.schedule("h1", "x", now_ms() - 300)
        q.schedule("h2", "x", now_ms() - 200)
        q.schedule("b", "x", now_ms() - 100)
        wait_for(lambda: q.scheduler.stats().fired == 1)  # b's: handed to the executor, behind h3's call
        before = q.scheduler.stats().wakeups
        time.sleep(0.5)
        assert q.scheduler.stats().wakeups - before <= 2
    finally:
        gate.set()
    for c in calls:
        c.result(10)
    wait_for(lambda: len(b.wakes()) == 1 and q.stats()["pending"] == 0)


def _queued_wake(make_queue, **kw):
    """A queue whose only worker a tool call of ``h`` holds until ``gate`` is set, and ``g``'s due wake ``w``
    (payload ``old``) handed to the executor behind it: (queue, g, gate, the call's future)."""
    gate = threading.Event()
    h, g = RecordingTarget(on_call=lambda inv: gate.wait(10)), RecordingTarget()
    q = make_queue({"h": h, "g": g}, workers=1, **kw)
    call = q.call("h", "echo", "x")
    wait_for(lambda: q.executor.load()["busy"] == 1)
    q.schedule("g", "w", now_ms() - 1, "old")
    wait_for(lambda: q.executor.load()["queued"] == 1)
    return q, g, gate, call


def test_a_wake_cancelled_while_it_waits_for_a_worker_never_runs(make_queue):
    """The scheduler hands due wakes to the executor ahead of a free worker; cancel() deleted the due-set row and
    said True, and the queued wake ran all the same."""
    q, g, gate, call = _queued_wake(make_queue)
    try:
        assert q.cancel("g", "w") is Cancel.CANCELLED
    finally:
        gate.set()
    call.result(10)
    wait_for(lambda: q.executor.load() == {"workers": 1, "busy": 0, "queued": 0})
    assert g.calls == [] and q.list() == []


def test_cancelling_a_wake_that_has_started_says_it_runs_on(make_queue):
    """cancel() said True, as for a wake it had stopped, when the wake was already running: the reader of
    `berm schedule cancel` was told "cancelled" and then saw the wake's work done."""
    started, gate = threading.Event(), threading.Event()
    g = RecordingTarget(on_wake=lambda inv: (started.set(), gate.wait(10)))
    q = make_queue({"g": g})
    q.schedule("g", "w", now_ms() - 1)
    try:
        assert started.wait(10)
        assert q.cancel("g", "w") is Cancel.STARTED
        assert q.cancel("g", "w") is Cancel.NOT_PENDING
    finally:
        gate.set()
    wait_for(lambda: len(g.wakes()) == 1 and q.executor.load()["busy"] == 0)
    assert q.list() == []


@pytest.mark.parametrize("cancel_first", [True, False])
def test_a_wake_replaced_while_it_waits_for_a_worker_runs_once_as_replaced(make_queue, cancel_first):
    """Cancelling then re-adding the id (or scheduling it again) while its wake was queued ran it twice: the old
    occurrence, then the new one."""
    q, g, gate, call = _queued_wake(make_queue)
    try:
        if cancel_first:
            q.cancel("g", "w")
        q.schedule("g", "w", now_ms() - 1, "new")
    finally:
        gate.set()
    call.result(10)
    wait_for(lambda: g.wakes() and q.stats()["pending"] == 0)
    assert [w["payload"] for w in g.wakes()] == ["new"]


def test_the_notice_of_the_write_a_queued_wake_is_for_leaves_it_queued(make_queue):
    """The scheduler may drain a new entry before schedule() tells it of the write: that notice withdrew the wake
    it had just queued for that very write, which then fired a second time."""
    q, g, gate, call = _queued_wake(make_queue)
    try:
        q.scheduler.changed("g", "w", q.dueset.get("g", "w").gen)  # as a schedule() that lost the race would
    finally:
        gate.set()
    call.result(10)
    wait_for(lambda: g.wakes() and q.stats()["pending"] == 0)
    assert [w["payload"] for w in g.wakes()] == ["old"] and q.scheduler.stats().fired == 1


def test_a_wake_queued_when_the_queue_stops_stays_for_the_next_start(tmp_path, make_queue):
    q, g, gate, call = _queued_wake(make_queue)
    stopping = threading.Thread(target=q.stop)
    stopping.start()
    wait_for(lambda: q.executor.load()["queued"] == 0)  # dropped by the stop, while the call still runs
    gate.set()
    stopping.join(10)
    assert not stopping.is_alive() and g.calls == []
    ds = DueSet(tmp_path / "due.db")
    try:
        assert [(e.harness, e.id, e.payload) for e in ds.list()] == [("g", "w", "old")]
    finally:
        ds.close()


def test_a_wake_that_ends_while_the_queue_stops_is_deleted_at_once(tmp_path, make_queue):
    """Found by a review: a wake that ended after the stop began stayed due until every other invocation had ended
    (up to their timeout), and a second signal in that time (the daemon exits at once) ran it again at the next
    start. Here a tool call holds the stop while ``g``'s wake, started before it, ends."""
    gate, woke, ending = threading.Event(), threading.Event(), threading.Event()
    h = RecordingTarget(on_call=lambda inv: gate.wait(10))
    g = RecordingTarget(on_wake=lambda inv: (woke.set(), ending.wait(10)))
    q = make_queue({"h": h, "g": g}, workers=2)
    call = q.call("h", "echo", "x")
    q.schedule("g", "w", now_ms() - 1, "p")
    woke.wait(10)

    def wake_ends() -> None:
        wait_for(lambda: q.scheduler._stopping)
        ending.set()
        wait_for(lambda: g.wakes())

    _deleted_while_a_call_holds_the_stop(tmp_path, q, gate, call, wake_ends)


def test_a_wake_that_ended_before_the_stop_is_deleted_by_it(tmp_path, make_queue, monkeypatch):
    """Found by a review of the fix above: a wake that ended just before the stop, its occurrence not yet deleted by
    the scheduler's loop (here the loop only notes it, never deletes), stayed due while the stop waited for the
    other invocations. The stop deletes it."""
    from berm_host.queue.scheduler import Scheduler

    flush = Scheduler._flush
    monkeypatch.setattr(Scheduler, "_flush", lambda self: self._keep_ended() if threading.current_thread().name ==
                        "berm-scheduler" else flush(self))
    gate = threading.Event()
    h, g = RecordingTarget(on_call=lambda inv: gate.wait(10)), RecordingTarget()
    q = make_queue({"h": h, "g": g}, workers=2)
    call = q.call("h", "echo", "x")
    q.schedule("g", "w", now_ms() - 1, "p")
    wait_for(lambda: g.wakes() and q.scheduler._undeleted)
    _deleted_while_a_call_holds_the_stop(tmp_path, q, gate, call)


def _deleted_while_a_call_holds_the_stop(tmp_path, q, gate, call, meanwhile=lambda: None) -> None:
    """Stop ``q`` while ``call`` (which waits for ``gate``) holds the stop, run ``meanwhile``, and see the due-set
    emptied before the stop ends; then let the call end."""
    stopping = threading.Thread(target=q.stop)
    stopping.start()
    try:
        meanwhile()
        ds = DueSet(tmp_path / "due.db")
        try:
            wait_for(lambda: ds.list() == [])  # while the call still holds the stop
        finally:
            ds.close()
        assert stopping.is_alive()
    finally:
        gate.set()
        stopping.join(10)
    assert call.result(10) == "x"


def test_a_wake_withdrawn_by_a_stale_cancel_notice_still_runs(make_queue):
    """Found by a review: a cancel's notice can arrive after a later write re-created the row (the two race): the
    queued wake it withdraws is not lost, since a withdrawn wake leaves its row for the next drain — had it been
    counted as delivered, its row would have been deleted and the wake never run."""
    q, g, gate, call = _queued_wake(make_queue)
    try:
        q.scheduler.changed("g", "w")  # as Queue.cancel's notice, while the row (payload "old") is still there
    finally:
        gate.set()
    call.result(10)
    wait_for(lambda: [w["payload"] for w in g.wakes()] == ["old"])
    wait_for(lambda: q.list() == [])


def test_a_running_wake_is_not_started_again_while_its_row_waits_for_its_end(make_queue):
    """A delivered occurrence's row stays until its wake ends: a drain another write causes meanwhile sees it due
    again, and must not start it a second time alongside the first (one in-flight wake per key)."""
    release = threading.Event()
    t = RecordingTarget(on_wake=lambda inv: json.loads(inv.args)["id"] == "a" and release.wait(10))
    q = make_queue({"h": t}, workers=4)
    try:
        q.schedule("h", "a", now_ms())
        wait_for(lambda: q.scheduler.stats().fired == 1)
        q.schedule("h", "b", now_ms())  # a drain while a runs, its row still due
        wait_for(lambda: [w["id"] for w in t.wakes()] == ["b"])
    finally:
        release.set()
    wait_for(lambda: q.stats()["pending"] == 0)
    time.sleep(0.1)
    assert sorted(w["id"] for w in t.wakes()) == ["a", "b"] and q.scheduler.stats().fired == 2


def test_a_drain_hands_the_executor_no_more_than_its_budget(make_queue):
    """Eight harnesses' due wakes, two workers held by tool calls: the drain queues at most one wake ahead per
    worker (a wake queued in the executor can no longer wait in the due-set for a worker); the rest spill."""
    gate = threading.Event()
    holders = {n: RecordingTarget(on_call=lambda inv: gate.wait(10)) for n in ("c1", "c2")}
    sleepers = {f"h{i}": RecordingTarget() for i in range(8)}
    q = make_queue({**holders, **sleepers}, workers=2, start=False)
    try:
        calls = [q.call(n, "echo", "x") for n in holders]
        wait_for(lambda: q.executor.load()["busy"] == 2)
        for name in sleepers:
            q.schedule(name, "w", now_ms() - 1)
        q.start()
        wait_for(lambda: q.scheduler.stats().fired >= 2)
        time.sleep(0.2)
        assert q.executor.load()["queued"] == 2 and q.scheduler.stats().fired == 2
        assert q.scheduler.stats().spill_events >= 1
    finally:
        gate.set()
    for c in calls:
        c.result(10)
    wait_for(lambda: all(t.wakes() for t in sleepers.values()) and q.stats()["pending"] == 0)


def test_a_wake_the_executor_refuses_is_consumed_not_retried(tmp_path, make_queue):
    """A persisted wake past the chain depth limit (written under a higher limit) is dropped at its drain and
    its row deleted: kept, it came due again at every drain, the scheduler re-draining it in a loop."""
    ds = DueSet(tmp_path / "due.db")
    ds.put("h", "deep", now_ms() - 1, "", depth=9)
    ds.close()
    t = RecordingTarget()
    q = make_queue({"h": t}, max_depth=8)
    wait_for(lambda: q.stats()["pending"] == 0)
    time.sleep(0.2)
    s = q.scheduler.stats()
    assert t.calls == [] and s.dropped == 1 and s.fired == 0 and s.wakeups <= 3
    assert q.stats()["harnesses"]["h"]["refused"] == 1


def test_a_drain_hands_a_harness_no_more_wakes_than_its_concurrency_limit_has_room_for(make_queue):
    """Four due wakes of a harness limited to one at a time: one is handed to the executor, the others wait in
    the due-set (queued in the executor, they would hold worker budget every other harness could use)."""
    gate = threading.Event()
    t = RecordingTarget(on_wake=lambda inv: gate.wait(10))
    q = make_queue({"h": t}, workers=4, per_harness=1, start=False)
    try:
        for i in range(4):
            q.schedule("h", f"w{i}", now_ms() - 1)
        q.start()
        wait_for(lambda: q.executor.load()["busy"] == 1)
        time.sleep(0.2)
        assert q.executor.load() == {"workers": 4, "busy": 1, "queued": 0} and q.scheduler.stats().fired == 1
    finally:
        gate.set()
    wait_for(lambda: len(t.wakes()) == 4 and q.stats()["pending"] == 0)
    assert t.max_active == 1


def test_a_delivered_wake_whose_deletion_fails_is_not_delivered_again(make_queue, monkeypatch):
    """Found by a review: on a full disk the deletion of a delivered occurrence failed, its row stayed due, and the
    next drain delivered it again, thousands of times a second. It is now kept from delivery and its deletion
    retried with a backoff, until it succeeds."""
    monkeypatch.setattr(scheduler_module, "DELETE_RETRY", 0.05)
    t = RecordingTarget()
    q = make_queue({"h": t}, start=False)
    real_remove = q.dueset.remove_fired
    attempts = []

    def full_disk(entries, wait):
        attempts.append(len(entries))
        if len(attempts) < 4:
            raise QueueError("writing the due-set failed: database or disk is full")
        real_remove(entries, wait=wait)

    monkeypatch.setattr(q.dueset, "remove_fired", full_disk)
    q.schedule("h", "once", now_ms() - 1, "p")
    q.start()
    wait_for(lambda: q.stats()["pending"] == 0)
    time.sleep(0.2)
    assert [w["id"] for w in t.wakes()] == ["once"]
    assert len(attempts) == 4  # three failures, each retried after its backoff, then the deletion


def test_another_connection_writing_the_due_set_holds_up_no_tool_call_and_no_stop(tmp_path, make_queue):
    """Found by a review: while another connection held the due-set's write lock (a sqlite3 shell, a backup), the
    scheduler's deletion of a delivered wake waited out SQLite's 30 s busy timeout holding the scheduler's
    condition, which every worker takes to tell of an invocation's end: calls to an unrelated harness stalled, and
    stopping took a minute. The deletion now waits a moment outside it and is retried."""
    gate = threading.Event()
    t, other = RecordingTarget(on_wake=lambda inv: gate.wait(10)), RecordingTarget()
    q = make_queue({"h": t, "other": other}, workers=2, per_harness=1)
    q.schedule("h", "w", now_ms() - 1)
    wait_for(lambda: t.active)
    writer = sqlite3.connect(tmp_path / "due.db", isolation_level=None, check_same_thread=False)
    try:
        writer.execute("BEGIN IMMEDIATE")
        gate.set()  # the wake ends, and its deletion finds the due-set locked
        wait_for(lambda: t.wakes())
        assert ends_within(GRACE, lambda: [q.call("other", "echo", f"{i}").result(GRACE) for i in range(3)]) == [
            "0", "1", "2"]
        ends_within(GRACE, q.stop)
    finally:
        writer.rollback()
        writer.close()
    assert [e.id for e in DueSet(tmp_path / "due.db").list()] == ["w"]  # delivered again after a restart


def test_a_deletion_waiting_for_its_backoff_is_tried_again_at_stop(tmp_path, make_queue, monkeypatch):
    """Stopping tries the deletion once more: left to its backoff, the next start delivered the wake again."""
    monkeypatch.setattr(scheduler_module, "DELETE_RETRY", 600.0)
    t = RecordingTarget()
    q = make_queue({"h": t}, start=False)
    real_remove, failures = q.dueset.remove_fired, [QueueError("disk full")]

    def fails_once(entries, wait):
        if failures:
            raise failures.pop()
        real_remove(entries, wait=wait)

    monkeypatch.setattr(q.dueset, "remove_fired", fails_once)
    q.schedule("h", "once", now_ms() - 1, "p")
    q.start()
    wait_for(lambda: t.wakes() and not failures)
    q.stop()
    assert DueSet(tmp_path / "due.db").list() == []


def test_a_rearm_written_while_the_deletion_fails_still_comes_due(make_queue, monkeypatch):
    """A delivered occurrence kept from delivery is that write only: its wake's re-arm (a new generation) runs."""
    monkeypatch.setattr(scheduler_module, "DELETE_RETRY", 0.05)
    t = RecordingTarget()
    q = make_queue({"h": t}, start=False)
    monkeypatch.setattr(q.dueset, "remove_fired", lambda entries, wait: (_ for _ in ()).throw(QueueError("disk full")))
    q.schedule("h", "tick", now_ms() - 1, "first")
    q.start()
    wait_for(lambda: t.wakes())
    q.schedule("h", "tick", now_ms() + 50, "second")
    wait_for(lambda: len(t.wakes()) == 2)
    time.sleep(0.3)
    assert [w["payload"] for w in t.wakes()] == ["first", "second"]


def test_a_failed_drain_is_retried_after_its_pause_whatever_wakes_the_scheduler(make_queue, monkeypatch, caplog):
    """Found by a review: on a damaged due-set every wake ending while the drain failed retried it at once (~240
    tracebacks a second); a failure waits RETRY_AFTER whatever else wakes the scheduler, and a stop ends the wait."""
    monkeypatch.setattr(scheduler_module, "RETRY_AFTER", 600.0)
    q = make_queue({"h": RecordingTarget()}, start=False)
    reads = []

    def unreadable(*args, **kwargs):
        reads.append(1)
        raise QueueError("the due-set is damaged")

    monkeypatch.setattr(q.dueset, "due", unreadable)
    q.start()
    wait_for(lambda: reads)
    for _ in range(20):  # what an ending wake does: wake the scheduler
        with q.scheduler._cond:
            q.scheduler._cond.notify()
        time.sleep(0.01)
    assert len(reads) == 1
    ends_within(GRACE, q.scheduler.stop)  # a stop ends the pause
    assert "the scheduler's drain failed; retrying in 600 s" in caplog.text


def test_a_damaged_row_is_dropped_and_the_other_wakes_run(tmp_path, make_queue):
    """Found by a review: a row with a column of the wrong type (a text depth) raised a TypeError out of the drain,
    which retried every second and never delivered any wake again."""
    ds = DueSet(tmp_path / "due.db")
    ds.put("h", "fine", now_ms() - 2, "p")
    ds.close()
    with sqlite3.connect(tmp_path / "due.db") as db:
        db.execute("INSERT INTO due VALUES ('h', 'damaged', ?, '', 'deep', 99)", (now_ms() - 1,))
    t = RecordingTarget()
    q = make_queue({"h": t})
    wait_for(lambda: q.stats()["pending"] == 0)
    assert [w["id"] for w in t.wakes()] == ["fine"]
    assert q.scheduler.stats().dropped == 1


@pytest.mark.parametrize("when", ["'soon'", "x'00'"], ids=["text", "blob"])
def test_a_row_with_no_instant_is_dropped_and_the_other_wakes_run(tmp_path, make_queue, when):
    """Found by a review: a row whose instant is text (another program's edit) is never due, but every drain took
    it for the earliest instant to sleep until, and failed with a TypeError: a logged traceback a second, for ever,
    and every wake up to a second late. It is dropped once it is the earliest (until then it is never read)."""
    ds = DueSet(tmp_path / "due.db")
    ds.put("h", "fine", now_ms() - 2, "p")
    ds.close()
    with sqlite3.connect(tmp_path / "due.db") as db:
        db.execute(f"INSERT INTO due VALUES ('h', 'damaged', {when}, '', 0, 99)")
    t = RecordingTarget()
    q = make_queue({"h": t})
    wait_for(lambda: q.stats()["pending"] == 0)
    q.schedule("h", "next", now_ms() + 50, "p")
    wait_for(lambda: len(t.wakes()) == 2)
    assert [w["id"] for w in t.wakes()] == ["fine", "next"] and q.scheduler.stats().dropped == 1


def test_calls_queued_behind_their_harness_limit_hold_no_worker_from_another_harness_wake(make_queue):
    """Found by a review: a drain's budget subtracted every queued call, including those that can only wait for
    their own harness's running ones, so a backlog of calls to one slow harness held every other harness's wakes
    while a worker sat idle (31.6 s late in the review's run)."""
    gate = threading.Event()
    slow, other = RecordingTarget(on_call=lambda inv: gate.wait(10)), RecordingTarget()
    q = make_queue({"slow": slow, "other": other}, workers=2, per_harness=1, start=False)
    try:
        calls = [q.call("slow", "echo", "x") for _ in range(6)]
        wait_for(lambda: q.executor.load() == {"workers": 2, "busy": 1, "queued": 5})
        q.schedule("other", "w", now_ms() - 1)
        q.start()
        wait_for(lambda: other.wakes())
        assert not gate.is_set() and q.executor.load()["queued"] == 5
    finally:
        gate.set()
    for c in calls:
        c.result(10)


def test_a_guests_schedule_waits_for_a_due_set_locked_elsewhere_no_longer_than_its_invocation_has_left(make_queue):
    """Another connection writing the due-set (a backup, a sqlite3 shell) made berm.schedule.at wait SQLite's 30 s,
    past the invocation's deadline, and a guest in a host call cannot be interrupted."""
    from berm_host.running import interpreting
    from tests.bounded import GRACE, ends_within

    q = make_queue({"h": RecordingTarget()})
    at, cancel = (c.fn for c in schedule_capabilities(q, "h"))
    other = sqlite3.connect(q.dueset.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the due-set's write lock
    try:
        def within_one_second(fn, request):
            with interpreting(time.monotonic() + 1.0):
                fn(encode_frame(request))

        for fn, request in ((at, [now_ms() + 60_000, "later", ""]), (cancel, ["later"])):
            with pytest.raises(CapabilityError, match="busy"):  # at the invocation's 1 s, not SQLite's 30 s
                ends_within(GRACE, lambda: within_one_second(fn, request))
    finally:
        other.rollback()
        other.close()
    at(encode_frame([now_ms() + 60_000, "later", ""]))  # and the lock's ordinary wait is back
    assert [e.id for e in q.list()] == ["later"]
    assert q.dueset._db.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
