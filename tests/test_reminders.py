"""The reminders harness and the SDK's recurring wrapper, built natively (berm_sdk.native) and driven through the
real queue, due-set, kv store and schedule capability; the guest build runs in test_queue_harness.py."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest

from berm_abi.frames import encode_frame
from berm_host.capabilities import clock, kv
from berm_host.queue import Invocation, Queue, Trigger, schedule_capabilities
from berm_host.linker import CapabilityError
from berm_host.traps import ToolFailure
from berm_sdk.native import NativeHarness, build_native_library

from .queue_helpers import wait_for

REMINDERS = Path(__file__).resolve().parent.parent / "harnesses" / "reminders"

# Test-only entry points into the same library: the wake export as a tool, and the SDK's time arithmetic.
HELPERS = r"""
#include "berm.h"
#include "berm_recurring.h"

BERM_TOOL(wake) { return on_wake(); }

BERM_TOOL(next_local) {  /* "after offset hour minute" -> next UTC ms */
    berm_str a = berm_args();
    long long after = 0, offset = 0, hour = 0, minute = 0, *v[4] = {&after, &offset, &hour, &minute};
    const char *p = a.ptr;
    for (int i = 0; i < 4; i++) {
        int neg = *p == '-';
        if (neg) p++;
        while (*p >= '0' && *p <= '9') *v[i] = *v[i] * 10 + (*p++ - '0');
        if (neg) *v[i] = -*v[i];
        while (*p == ' ') p++;
    }
    char *out = berm_aprintf("%lld", (long long)berm_next_local_time(after, offset, (int)hour, (int)minute));
    return berm_ok_str(out);
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("reminders-native")
    (d / "helpers.c").write_text(HELPERS)
    return build_native_library([REMINDERS / "reminders.c", d / "helpers.c"], d / "reminders.so")


class NativeTarget:
    """The native build of a harness as a queue target (one worker: the native library is single-threaded)."""

    exports = frozenset({"on_wake"})

    def __init__(self, harness: NativeHarness):
        self.harness = harness
        self.tools = frozenset({"add", "list", "cancel", "outbox"})

    def invoke(self, inv: Invocation, deadline: float) -> str:
        tool = "wake" if inv.trigger is Trigger.WAKE else inv.tool
        return self.harness.call(tool, inv.args).decode("utf-8")


class FixedClock:
    """berm.clock.now standing in for a host at a chosen instant and UTC offset."""

    def __init__(self, utc_ms: int, offset: int):
        self.utc_ms, self.offset = utc_ms, offset

    def __call__(self, request: bytes) -> bytes:
        return encode_frame([self.utc_ms, self.offset])


@pytest.fixture
def setup(library, tmp_path):
    def make(clock_fn=None):
        q = Queue(tmp_path / "due.db", workers=1)
        caps = {c.name: c.fn for c in schedule_capabilities(q, "reminders")}
        caps |= kv.capabilities(kv.KvStore(tmp_path / "kv.sqlite3"), "reminders")
        caps |= {"berm.clock.now": clock_fn} if clock_fn else clock.capabilities()
        harness = NativeHarness(library, caps)
        q.add("reminders", NativeTarget(harness))
        made.append(q)
        return q, harness

    made: list[Queue] = []
    yield make
    for q in made:
        q.stop()


def call(q: Queue, tool: str, args: dict | None = None):
    return json.loads(q.call("reminders", tool, json.dumps(args or {})).result(10))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize("after, offset, hm, expected", [
    ("2026-03-10T06:00:00+00:00", 0, (8, 0), "2026-03-10T08:00:00+00:00"),
    ("2026-03-10T09:00:00+00:00", 0, (8, 0), "2026-03-11T08:00:00+00:00"),
    ("2026-03-10T08:00:00+00:00", 0, (8, 0), "2026-03-11T08:00:00+00:00"),  # strictly after
    ("2026-03-10T06:00:00+00:00", 3600, (8, 0), "2026-03-10T07:00:00+00:00"),  # 08:00 at UTC+1
    ("2026-03-10T23:30:00+00:00", -5 * 3600, (20, 15), "2026-03-11T01:15:00+00:00"),  # 20:15 at UTC-5
    ("1969-12-31T22:00:00+00:00", 0, (23, 0), "1969-12-31T23:00:00+00:00"),  # before the epoch
])
def test_next_local_time(library, after, offset, hm, expected):
    ms = lambda iso: int(dt.datetime.fromisoformat(iso).timestamp() * 1000)
    got = NativeHarness(library).call("next_local", f"{ms(after)} {offset} {hm[0]} {hm[1]}")
    assert int(got) == ms(expected)


def test_add_list_cancel(setup):
    q, _ = setup()
    one = call(q, "add", {"text": "dentist", "at": "2099-01-02T08:30:00Z"})
    assert one == {"id": "r1", "text": "dentist", "when": 4071025800000}
    daily = call(q, "add", {"text": "stand up", "daily": "09:15"})
    assert daily["id"] == "r2" and daily["daily"] == "09:15" and daily["when"] > now_ms()
    assert [e.id for e in q.list()] == ["r2", "r1"]  # both armed in the host's due-set
    listed = call(q, "list")
    assert [r["id"] for r in listed] == ["r2", "r1"] and listed[1]["text"] == "dentist"
    assert call(q, "cancel", {"id": "r1"}) == {"cancelled": "r1"}
    assert [e.id for e in q.list()] == ["r2"]
    with pytest.raises(ToolFailure, match="no reminder with id r1"):
        q.call("reminders", "cancel", json.dumps({"id": "r1"})).result(10)


@pytest.mark.parametrize("args, message", [
    ({"at": "08:00"}, "`text` must be a string"),
    ({"text": "x"}, "exactly one of `at` or `daily`"),
    ({"text": "x", "at": "08:00", "daily": "08:00"}, "exactly one"),
    ({"text": "x", "daily": "25:00"}, "`daily` must be HH:MM"),
    ({"text": "x", "at": "2026-02-30T08:00"}, "`at` must be an ISO-8601"),
    ({"text": "x", "at": "tomorrow"}, "`at` must be an ISO-8601"),
])
def test_add_refuses_bad_arguments(setup, args, message):
    q, _ = setup()
    with pytest.raises(ToolFailure, match=message):
        q.call("reminders", "add", json.dumps(args)).result(10)
    assert q.list() == []


def test_local_and_offset_instants(setup):
    q, _ = setup(FixedClock(1_700_000_000_000, 3600))  # the host is at UTC+1
    local = call(q, "add", {"text": "a", "at": "2030-01-02T09:30"})  # no zone: local time
    zoned = call(q, "add", {"text": "b", "at": "2030-01-02T09:30:00.250-02:00"})
    assert local["when"] == 1893573000000  # 08:30Z
    assert zoned["when"] == 1893573000000 + 3 * 3600_000 + 250


def test_one_shot_fires_through_the_queue_into_the_outbox(setup):
    q, harness = setup()
    q.start()
    due = now_ms() + 300
    iso = dt.datetime.fromtimestamp(due / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
    call(q, "add", {"text": "tea is ready", "at": iso})
    wait_for(lambda: q.stats()["harnesses"]["reminders"]["invocations"] >= 2 and not q.list())
    (entry,) = call(q, "outbox")
    assert entry["text"] == "tea is ready" and entry["scheduled_at"] == due and entry["now"] >= due
    assert any(b"reminder r1: tea is ready" in line for line in harness.logs)
    assert call(q, "list") == []  # a one-shot is gone once delivered


def test_daily_rearms_before_delivering_with_the_offset_of_the_moment(setup):
    march_29 = int(dt.datetime(2026, 3, 29, 6, 0, tzinfo=dt.timezone.utc).timestamp() * 1000)
    clock_fn = FixedClock(march_29, 3600)  # 07:00 at UTC+1, the morning clocks go forward
    q, harness = setup(clock_fn)
    r = call(q, "add", {"text": "water plants", "daily": "08:00"})
    assert r["when"] == march_29 + 3600_000  # 08:00 at UTC+1 = 07:00Z
    # the wake arrives; by now the host's offset is UTC+2, so the re-arm resolves 08:00 local with it
    clock_fn.utc_ms, clock_fn.offset = r["when"], 7200
    wake = {"id": "r1", "payload": "", "scheduled_at": r["when"], "now": r["when"] + 5}
    assert harness.call("wake", json.dumps(wake)) == b"delivered"
    (armed,) = q.list()
    assert armed.id == "r1" and armed.when_ms == march_29 + 24 * 3600_000  # 08:00 at UTC+2 = 06:00Z next day
    (out,) = call(q, "outbox")
    assert out["scheduled_at"] == r["when"]


def test_the_day_local_time_goes_back_delivers_its_occurrence_once(setup):
    """Found by a review: on the day clocks go back an hour, the occurrence armed at the summer offset wakes at 07:00
    local, and the next 08:00 after the clock was that same day's: the reminder went out twice. The re-arm looks
    at least half a day past the occurrence it runs."""
    october_24 = int(dt.datetime(2026, 10, 24, 6, 0, tzinfo=dt.timezone.utc).timestamp() * 1000)
    clock_fn = FixedClock(october_24 - 3600_000, 7200)  # 07:00 at UTC+2
    q, harness = setup(clock_fn)
    r = call(q, "add", {"text": "pills", "daily": "08:00"})
    assert r["when"] == october_24  # 08:00 at UTC+2
    clock_fn.utc_ms = october_24
    harness.call("wake", json.dumps({"id": "r1", "payload": "", "scheduled_at": october_24, "now": october_24}))
    (armed,) = q.list()
    assert armed.when_ms == october_24 + 86400_000  # 08:00 at UTC+2 the next day: 07:00 at UTC+1, as it turns out
    clock_fn.utc_ms, clock_fn.offset = armed.when_ms, 3600  # it wakes; the host is at UTC+1 now
    harness.call("wake", json.dumps({"id": "r1", "payload": "", "scheduled_at": armed.when_ms,
                                     "now": armed.when_ms}))
    (armed,) = q.list()
    assert armed.when_ms == october_24 + 2 * 86400_000 + 3600_000  # 08:00 at UTC+1 the day after, not 08:00 that day
    clock_fn.utc_ms -= 120_000  # a clock stepped back two minutes during a wake re-arms ahead too
    harness.call("wake", json.dumps({"id": "r1", "payload": "", "scheduled_at": armed.when_ms,
                                     "now": clock_fn.utc_ms}))
    assert q.list()[0].when_ms > armed.when_ms


def test_a_store_that_fails_at_a_wake_retries_and_keeps_the_reminder(setup, monkeypatch):
    """Found by a review: any error reading the reminder was taken for a cancelled one, so a busy store at the wake
    stopped a daily reminder for good (still listed, never woken). Only a key the store does not hold is gone."""
    q, harness = setup()
    call(q, "add", {"text": "pills", "daily": "08:00"})

    def busy(self, ns, key):
        raise CapabilityError("storage is busy: waited 5 s")

    monkeypatch.setattr(kv.KvStore, "get", busy)
    now = now_ms()
    with pytest.raises(ToolFailure, match="on_wake: reading reminder r1 failed: .*storage is busy.*again in a minute"):
        harness.call("wake", json.dumps({"id": "r1", "payload": "", "scheduled_at": now, "now": now}))
    (armed,) = q.list()
    assert armed.id == "r1" and armed.when_ms == now + 60_000


def test_an_id_the_store_cannot_be_asked_about_is_not_given_away(setup, tmp_path, monkeypatch):
    """Found by a review: choosing an id took any error reading a reminder's key for a free id, so with the counter
    lost and the store failing, `add` wrote over a reminder. Only a key the store does not hold is free."""
    import sqlite3

    q, harness = setup()
    call(q, "add", {"text": "keep me", "at": "2099-01-01T00:00:00Z"})
    with sqlite3.connect(tmp_path / "kv.sqlite3") as db:
        db.execute("DELETE FROM kv WHERE key = ?", (b"next_id",))
    real = kv.KvStore.get

    def failing_on_r1(self, ns, key):
        if key == b"reminder/r1":
            raise CapabilityError("storage is busy: waited 5 s")
        return real(self, ns, key)

    monkeypatch.setattr(kv.KvStore, "get", failing_on_r1)
    with pytest.raises(ToolFailure, match="add: choosing an id failed: reading reminder r1 failed: .*busy"):
        q.call("reminders", "add", json.dumps({"text": "new", "at": "2099-01-01T00:00:00Z"})).result(10)
    monkeypatch.undo()
    assert [r["text"] for r in call(q, "list")] == ["keep me"]


def test_an_id_holding_a_nul_names_no_reminder(setup):
    """Found by a review: the key was written as C text, so "r1\\u0000junk" named r1 there: cancel deleted r1's
    record and then cancelled a wake under the whole id, which left r1's own wake armed."""
    q, _ = setup()
    call(q, "add", {"text": "keep me", "at": "2099-01-01T00:00:00Z"})
    with pytest.raises(ToolFailure, match="cancel: no such reminder"):
        q.call("reminders", "cancel", json.dumps({"id": "r1\u0000junk"})).result(10)
    assert [r["id"] for r in call(q, "list")] == ["r1"] and [e.id for e in q.list()] == ["r1"]


def test_the_outbox_lists_past_a_page_of_keys(setup, tmp_path):
    """Found by a review: the outbox grows by one a delivery and was listed in one piece, which the store refuses
    past 10,000 keys, so the tool failed for good after 10,000 deliveries. It reads a page at a time."""
    import sqlite3

    q, harness = setup()
    call(q, "outbox")  # the store exists
    with sqlite3.connect(tmp_path / "kv.sqlite3") as db:
        db.executemany("INSERT INTO kv VALUES ('reminders', ?, ?)",
                       ((b"outbox/%020d/r1" % i, b'{"n":%d}' % i) for i in range(10_001)))
    assert [entry["n"] for entry in call(q, "outbox")] == list(range(10_001))


def test_list_reads_past_a_page_of_keys_soonest_first(setup, tmp_path):
    """Found by a review: `list` read every reminder in one listing, refused past 10,000 keys, and ordered them by
    insertion sort (quadratic). It reads a page at a time and sorts by next instant, ties in key order."""
    import sqlite3

    q, harness = setup()
    call(q, "list")  # the store exists
    ids = [f"r{i}" for i in range(10_003)]
    when = {rid: 4_000_000_000_000 + (i * 7919) % 5003 * 1000 for i, rid in enumerate(ids)}  # with ties
    with sqlite3.connect(tmp_path / "kv.sqlite3") as db:
        db.executemany("INSERT INTO kv VALUES ('reminders', ?, ?)",
                       ((f"reminder/{rid}".encode(), json.dumps({"id": rid, "text": "t", "when": when[rid]}).encode())
                        for rid in ids))
    in_key_order = sorted(ids, key=lambda rid: rid.encode())
    expected = sorted(in_key_order, key=when.__getitem__)  # stable: ties stay in key order
    assert [(r["id"], r["when"]) for r in call(q, "list")] == [(rid, when[rid]) for rid in expected]


def test_a_missed_daily_occurrence_is_delivered_late_once_and_rearmed_ahead(setup):
    q, harness = setup()
    call(q, "add", {"text": "vitamins", "daily": "07:00"})
    past = now_ms() - 3 * 86400_000  # the daemon was down for three days
    wake = {"id": "r1", "payload": "", "scheduled_at": past, "now": now_ms()}
    harness.call("wake", json.dumps(wake))
    (armed,) = q.list()
    assert now_ms() < armed.when_ms <= now_ms() + 86400_000
    assert len(call(q, "outbox")) == 1
    assert any(b"(delivered late)" in line for line in harness.logs)


def test_add_arms_the_wake_before_it_stores_the_reminder(setup, monkeypatch):
    """Found by a review: `add` stored the reminder, then armed its wake, and a host killed between the two left a
    reminder listed for ever that no wake would deliver. Between the writes now, only the wake is there (a wake
    that finds no reminder is gone)."""
    q, _ = setup()
    real, seen = kv.KvStore.set, []

    def set_seeing_the_due_set(self, ns, key, value):
        if key.startswith(b"reminder/"):
            seen.append([(e.id, e.payload) for e in q.list()])
        real(self, ns, key, value)

    monkeypatch.setattr(kv.KvStore, "set", set_seeing_the_due_set)
    call(q, "add", {"text": "pills", "at": "2099-01-01T00:00:00Z"})
    assert seen == [[("r1", "new")]]


def test_a_reminder_that_cannot_be_stored_takes_its_wake_back(setup, monkeypatch):
    q, _ = setup()
    _failing_writes(monkeypatch, "set", b"reminder/")
    with pytest.raises(ToolFailure, match="add: storing the reminder failed: berm.kv.set: database or disk is full"):
        q.call("reminders", "add", json.dumps({"text": "pills", "at": "2099-01-01T00:00:00Z"})).result(10)
    assert q.list() == [] and call(q, "list") == []


def test_a_new_wake_that_finds_no_reminder_looks_once_more(setup):
    """A wake `add` armed may run beside it, before the reminder is stored: it looks again 30 s later, and then a
    reminder still missing (its `add` was killed) is gone."""
    q, harness = setup()
    wake = {"id": "r7", "payload": "new", "scheduled_at": 1, "now": 2}
    assert harness.call("wake", json.dumps(wake)) == b"not stored yet: woken again in 30 s"
    (again,) = q.list()
    assert (again.id, again.when_ms, again.payload) == ("r7", 2 + 30_000, "")
    assert harness.call("wake", json.dumps({**wake, "payload": ""})) == b"gone"


def test_cancel_takes_the_reminder_before_its_wake(setup, monkeypatch):
    """As add arms first: between cancel's two writes only the wake is left, which finds nothing (found by a review:
    it took the wake first, and a host killed between left a reminder listed for ever with no wake)."""
    q, _ = setup()
    call(q, "add", {"text": "pills", "at": "2099-01-01T00:00:00Z"})
    real, seen = kv.KvStore.delete, []

    def delete_seeing_the_due_set(self, ns, key):
        seen.append([e.id for e in q.list()])
        real(self, ns, key)

    monkeypatch.setattr(kv.KvStore, "delete", delete_seeing_the_due_set)
    assert call(q, "cancel", {"id": "r1"}) == {"cancelled": "r1"}
    assert seen == [["r1"]] and q.list() == [] and call(q, "list") == []


def _failing_writes(monkeypatch, method: str, prefix: bytes) -> None:
    """kv's ``method`` (set or delete) fails for keys starting with ``prefix``, as a full disk makes it."""
    real = getattr(kv.KvStore, method)

    def failing(self, ns, key, *value):
        if key.startswith(prefix):
            raise CapabilityError("database or disk is full")
        return real(self, ns, key, *value)

    monkeypatch.setattr(kv.KvStore, method, failing)


def test_a_delivered_reminder_the_store_cannot_remove_is_removed_by_a_later_wake(setup, monkeypatch):
    """Found by a review: the record of a delivered one-shot whose deletion failed stayed listed for ever."""
    q, harness = setup()
    call(q, "add", {"text": "pills", "at": "2099-01-01T00:00:00Z"})
    wake = {"id": "r1", "payload": "new", "scheduled_at": 5, "now": 6}
    _failing_writes(monkeypatch, "delete", b"reminder/")
    with pytest.raises(ToolFailure, match="delivered, but removing it failed: .*full \\(tried again in a minute\\)"):
        harness.call("wake", json.dumps(wake))
    monkeypatch.undo()
    (again,) = q.list()
    assert (again.id, again.when_ms, again.payload) == ("r1", 6 + 60_000, "delivered")
    assert harness.call("wake", json.dumps({**wake, "payload": "delivered"})) == b"delivered"
    assert call(q, "list") == [] and len(call(q, "outbox")) == 1  # removed, not delivered twice


def test_a_reminder_that_cannot_be_delivered_is_kept_and_woken_again(setup, monkeypatch):
    q, harness = setup()
    call(q, "add", {"text": "pills", "at": "2099-01-01T00:00:00Z"})
    _failing_writes(monkeypatch, "set", b"outbox/")
    with pytest.raises(ToolFailure, match="writing the outbox failed"):
        harness.call("wake", json.dumps({"id": "r1", "payload": "new", "scheduled_at": 5, "now": 6}))
    (again,) = q.list()
    assert (again.id, again.when_ms, again.payload) == ("r1", 6 + 60_000, "new")
    assert [r["id"] for r in call(q, "list")] == ["r1"]


def test_a_cancelled_reminder_wakes_to_nothing(setup):
    q, harness = setup()
    wake = {"id": "r7", "payload": "", "scheduled_at": 1, "now": 2}
    assert harness.call("wake", json.dumps(wake)) == b"gone"
    assert call(q, "outbox") == []
    with pytest.raises(ToolFailure, match="not \\{id, payload, scheduled_at, now\\}"):
        harness.call("wake", json.dumps({"id": 1}))
