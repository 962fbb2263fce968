"""The scheduler: sleeps until the earliest due instant, then drains due wakes into the executor.

No polling tick. The thread waits on a Condition with a timeout equal to the distance to the earliest entry, or
with no timeout at all when nothing is pending — an idle scheduler never wakes (``stats().wakeups`` proves it).
It is woken early only by events: a schedule was written or cancelled, a wake it started finished, or capacity
freed while a backlog waits.

Rules (RFC 0205, "Scheduling"):
- a wake receives ``{"id", "payload", "scheduled_at", "now"}`` (UTC ms), so missed occurrences after downtime
  arrive once each and the harness decides what lateness means;
- one in-flight wake per (harness, id): an entry that comes due while its key is running is *deferred* until
  that invocation ends, never run alongside it;
- a drain starts at most as many wakes as the executor has free workers (plus one queued ahead per worker); the
  rest *spill* to the next drain, logged once per episode and counted per drain;
- a delivered occurrence is deleted when its invocation ends, whatever the outcome (a trap costs that occurrence
  only); deleting by generation keeps a re-arm the wake itself wrote under the same id. After a crash mid-wake
  the occurrence is delivered again: at-least-once across crashes, exactly once otherwise — unless the wake had
  re-armed its id before the crash, which replaced the occurrence (a recurring schedule re-arms first, so a crash
  costs it that occurrence, as a trap does, never the schedule: berm_recurring.h);
- a wake handed to the executor but not started yet is withdrawn when its entry is cancelled or replaced: it
  never runs (the replacement comes due on its own). One that has started runs on. A wake still queued when the
  daemon stops stays in the due-set and is delivered after the next start.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from berm_abi.text import escaped

from .dueset import DueSet, Entry
from .errors import QueueClosed, QueueError
from .executor import Executor
from .invocation import Context, Invocation, Trigger

log = logging.getLogger("berm.queue")

#: The longest the thread sleeps without looking again while anything is pending: a wake centuries away is a
#: timeout Condition.wait cannot take (an OverflowError killed the thread, and with it every harness's wakes), and
#: the sleep is timed on the monotonic clock, so a wall clock set forward (or a suspend) is noticed within this (it
#: was an hour, and a wake due after a 10-minute step waited for it: found by a review).
MAX_SLEEP = 60.0
#: After an unexpected error in a drain: how long before the next (logged, and retried, never a dead thread).
RETRY_AFTER = 1.0
#: Deleting delivered occurrences failed (a full disk, a database another process locks): the first retry after
#: this many seconds, doubling up to ``MAX_DELETE_RETRY``. Until deleted they are not delivered again.
DELETE_RETRY = 1.0
MAX_DELETE_RETRY = 60.0
#: Seconds a deletion waits for the due-set while another connection writes it, before it is left to the retry.
#: (It waited SQLite's whole busy timeout, 30 s, and the scheduler with it: found by a review.)
DELETE_WAIT = 0.25


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wake_args(entry: Entry) -> Callable[[], bytes]:
    """The argument blob ``on_wake`` pulls with ``berm.args.*``, made now but for its ``now``, which the function
    returned adds as the wake starts (``Invocation.started``): a wake queued behind a busy worker waits up to an
    invocation's timeout, and was told the time it was queued, so it could not see how late it ran (found by a
    review). Made now, a row that cannot be rendered is dropped at once (``Scheduler._fire``)."""
    head = json.dumps({"id": entry.id, "payload": entry.payload, "scheduled_at": entry.when_ms},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return lambda: b'%s,"now":%d}' % (head[:-1], now_ms())


@dataclass(frozen=True)
class SchedulerStats:
    wakeups: int = 0  # returns from the condition wait: timer expiries and pokes
    drains: int = 0  # drains that found due work
    fired: int = 0  # wakes handed to the executor
    deferred: int = 0  # occurrences that came due while the previous wake of their key still ran
    spill_events: int = 0  # drains that could not start everything due
    spilled: int = 0  # due entries left for a later drain, summed over spill events
    backlog: int = 0  # due entries waiting for a worker right now (approximate; 0 when none)
    dropped: int = 0  # due entries the executor refused (chain depth): consumed, logged


class Scheduler:
    def __init__(self, dueset: DueSet, executor: Executor):
        self._dueset = dueset
        self._executor = executor
        self._cond = threading.Condition()
        self._inflight: dict[tuple[str, str], tuple[Entry, Future]] = {}  # handed to the executor, not ended
        self._finished: list[Entry] = []
        # delivered, their deletion failed: not delivered again while it is retried (else a full disk re-ran every
        # delivered wake thousands of times a second: found by a review)
        self._undeleted: dict[tuple[str, str], Entry] = {}
        self._delete_retry = (0.0, DELETE_RETRY)  # (monotonic time of the next attempt, the backoff after it)
        self._ended: dict[tuple[str, str], int] = {}  # keys whose wake ended since the last drain: when
        self._n = dict.fromkeys(SchedulerStats.__dataclass_fields__, 0)  # the counters behind stats()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._harnesses: frozenset[str] = frozenset()
        self._held: frozenset[str] = frozenset()  # harnesses not drained until one of their invocations ends
        executor.add_listener(self._on_finished)

    def deliver_to(self, harnesses: frozenset[str]) -> None:
        """Wake only these harnesses (the loaded ones). Entries of others stay in the due-set untouched — a
        harness dropped from the declarations for a while keeps its schedules for when it returns."""
        with self._cond:
            self._harnesses = frozenset(harnesses)
            self._cond.notify()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="berm-scheduler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop draining; wakes already started run on in the executor. The occurrences of wakes that ended before
        are deleted now, as those that end later are (``_on_finished``): the loop may stop before its next flush
        (found by a review)."""
        with self._cond:
            self._stopping = True
            self._flush()
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def flush(self) -> None:
        """Delete the occurrences of wakes that finished since the last drain (used at shutdown): a deletion being
        retried is tried once more now, whatever its backoff (else the next start delivered it again)."""
        with self._cond:
            self._delete_retry = (0.0, self._delete_retry[1])
            self._flush()

    def changed(self, harness: str, id: str, gen: int | None = None) -> bool:
        """``(harness, id)`` was written as generation ``gen``, or cancelled (None): a wake of an older write
        still queued in the executor is withdrawn, and the earliest instant is recomputed. (A wake withdrawn by a
        cancel racing a later write is not lost: the row it was for stays, and fires at the next drain.) True
        when such a wake could not be withdrawn: it has started, and runs on."""
        with self._cond:
            fired = self._inflight.get((harness, id))
            started = fired is not None and (gen is None or fired[0].gen < gen) and not fired[1].cancel()
            self._cond.notify()
            return started

    def stats(self) -> SchedulerStats:
        with self._cond:
            return SchedulerStats(**self._n)

    # --- the thread -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        with self._cond:
            while not self._stopping:
                try:
                    self._flush()
                    timeout = self._drain()
                except Exception:  # noqa: BLE001 - one bad drain must not end every harness's wakes
                    log.exception("the scheduler's drain failed; retrying in %.0f s", RETRY_AFTER)
                    self._pause(RETRY_AFTER)
                    continue
                if self._stopping:
                    break
                if self._finished:  # dropped by this drain: deleted at once
                    continue
                self._cond.wait(timeout)
                self._count(wakeups=1)

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (holding the condition) unless stopping, whatever else wakes the condition: after a failed
        drain, every wake ending meanwhile retried it at once (a damaged due-set: ~240 tracebacks a second, found by
        a review)."""
        end = time.monotonic() + seconds
        while not self._stopping and (left := end - time.monotonic()) > 0:
            self._cond.wait(left)

    def _count(self, **delta: int) -> None:
        for k, v in delta.items():
            self._n[k] += v

    def _flush(self) -> None:
        """Delete the occurrences of the wakes that ended; those whose deletion fails are kept from delivery and
        retried with a backoff. Called holding the condition, which the deletion itself does not hold: every
        worker takes it to tell of an invocation's end, and waited as long as the deletion did (found by a
        review). Until deleted, occurrences stay in ``_undeleted``, where no drain delivers them again: those
        whose wakes ended meanwhile too (the next pass deletes them)."""
        self._keep_ended()
        at, backoff = self._delete_retry
        if not self._undeleted or time.monotonic() < at:
            return
        batch = list(self._undeleted.values())
        self._cond.release()
        try:
            self._dueset.remove_fired(batch, wait=DELETE_WAIT)
        except QueueError as exc:
            failed: QueueError | None = exc
        else:
            failed = None
        finally:
            self._cond.acquire()
            self._keep_ended()
        if failed is not None:
            log.error("could not delete %d delivered wakes (retrying in %.0f s; delivered again only after a "
                      "restart): %s", len(batch), backoff, failed)
            self._delete_retry = (time.monotonic() + backoff, min(backoff * 2, MAX_DELETE_RETRY))
            return
        for e in batch:
            if self._undeleted.get(e.key) is e:
                del self._undeleted[e.key]
        self._delete_retry = (0.0, DELETE_RETRY)

    def _keep_ended(self) -> None:
        """Move the occurrences of wakes that ended (and dropped ones) to those awaiting deletion."""
        self._undeleted.update((e.key, e) for e in self._finished)
        self._finished = []

    def _pending(self, entry: Entry) -> bool:
        """Whether ``entry`` still waits for delivery: not running, and not a delivered occurrence whose deletion
        is being retried (a re-arm written since has another generation, and is pending)."""
        undeleted = self._undeleted.get(entry.key)
        return entry.key not in self._inflight and (undeleted is None or undeleted.gen != entry.gen)

    def _drain(self) -> float | None:
        """Start what is due within the budget; return how long to sleep (None: until poked)."""
        now = now_ms()
        budget = self._executor.free_slots(ahead=self._executor.workers)
        only = self._harnesses
        # Harnesses at their concurrency limit are not drained (their wakes would only queue in the executor, taking
        # worker budget from every other harness's): each is drained again when one of its invocations ends.
        full = frozenset(h for h in only if not self._executor.room(h))
        rows = self._dueset.due(now, budget + self._settling() + 1, only=only - full)
        ready = [e for e in rows if self._pending(e)]
        for e in ready:
            ended = self._ended.get(e.key)
            if ended is not None and e.when_ms < ended:
                self._count(deferred=1)
                log.info("%s[%s] came due while its previous wake still ran: deferred, not overlapped",
                         e.harness, escaped(e.id, lines=False))
        self._ended.clear()
        ready, trimmed = self._within_harness_limits(ready)
        self._held = full | trimmed
        for entry in ready[:budget]:
            self._fire(entry)
        if ready:
            self._count(drains=1)
        if len(ready) > budget or trimmed or self._waiting(now, full):  # a wait for their harness is a spill too
            self._spill(now, only, min(len(ready), budget), len(ready) - budget)
            if len(ready) > budget:
                return None
        elif self._n["backlog"]:
            log.warning("backpressure cleared: the due wakes all have a worker")
            self._n["backlog"] = 0
        head = next((e for e in self._dueset.earliest(self._settling() + 1, only=only - self._held)
                     if self._pending(e)), None)
        if head is not None and not isinstance(head.when_ms, (int, float)):  # text or a blob: sorted after every
            # number (all left are so), never due, so never dropped by _fire; every drain failed on it (a review)
            self._drop(head, f"the due-set's entry has no instant ({type(head.when_ms).__name__}): {head!r}")
            return 0.0
        retry = self._delete_retry[0] - time.monotonic() if self._undeleted else None
        if head is None:
            return None if retry is None else max(0.0, retry)
        return min(max(0.0, (head.when_ms - now_ms()) / 1000), MAX_SLEEP, MAX_SLEEP if retry is None else retry)

    def _settling(self) -> int:
        """How many due-set rows a read may find that are not pending: running, or delivered and not deleted."""
        return len(self._inflight) + len(self._undeleted)

    def _spill(self, now: int, only: frozenset[str], started: int, unstarted: int) -> None:
        """Due wakes wait for a later drain: for a worker (``unstarted`` of this drain's, at least), or for their
        harness's running ones (its concurrency limit). Counted, and said once per episode."""
        if self._n["backlog"]:  # the episode goes on: no count per drain (it scans the due range)
            backlog = max(0, self._n["backlog"] - started)
        else:  # approximately (in-flight keys re-armed into the future by their own wake count as due), and at
            # least one: this drain found one waiting, which that subtraction could hide ("0 due wakes wait")
            backlog = max(1, unstarted, self._dueset.count(due_at=now, only=only) - len(self._inflight))
            log.warning("backpressure: %d due wakes wait for a worker (%d workers, at most %d per harness); they "
                        "spill to later drains", backlog, self._executor.workers, self._executor.per_harness)
        self._count(spill_events=1, spilled=backlog)
        self._n["backlog"] = max(backlog, 1)

    def _waiting(self, now: int, harnesses: frozenset[str]) -> bool:
        """Whether any of ``harnesses`` has a due wake that is not running."""
        return bool(harnesses) and any(self._pending(e)
                                       for e in self._dueset.due(now, self._settling() + 1, only=harnesses))

    def _within_harness_limits(self, ready: list[Entry]) -> tuple[list[Entry], frozenset[str]]:
        """The due entries whose harness has room for them in the executor (its concurrency limit), and the
        harnesses some were held back for."""
        room: dict[str, int] = {}
        startable, held = [], set()
        for e in ready:
            left = room[e.harness] if e.harness in room else self._executor.room(e.harness)
            if left > 0:
                startable.append(e)
                room[e.harness] = left - 1
            else:
                room[e.harness] = 0
                held.add(e.harness)
        return startable, frozenset(held)

    def _fire(self, entry: Entry) -> None:
        try:
            inv = Invocation(Trigger.WAKE, entry.harness, wake_args(entry), context=Context(depth=entry.depth),
                             schedule_id=entry.id)
            future = self._executor.submit(inv)
        except QueueClosed:
            self._stopping = True
            return
        except QueueError as exc:
            self._drop(entry, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a damaged row (a column of the wrong type) ends only its wake
            self._drop(entry, f"the due-set's entry is unreadable ({type(exc).__name__}: {exc}): {entry!r}")
            return
        self._inflight[entry.key] = (entry, future)
        self._count(fired=1)

    def _drop(self, entry: Entry, why: str) -> None:
        """Consume ``entry`` without running it (its occurrence is deleted), logged."""
        log.error("dropping the wake %s[%s]: %s", entry.harness, escaped(str(entry.id), lines=False), why)
        self._finished.append(entry)
        self._count(dropped=1)

    def _on_finished(self, inv: Invocation) -> None:
        with self._cond:
            if inv.trigger is Trigger.WAKE:
                fired = self._inflight.pop((inv.harness, inv.schedule_id), None)
                if fired is not None:
                    entry, future = fired
                    if not future.cancelled():  # a withdrawn wake never ran: its entry is gone or replaced
                        self._finished.append(entry)
                        self._ended[entry.key] = now_ms()
                        if self._stopping:
                            # no drain deletes it now, and the stop's flush waits for every other invocation: a
                            # second signal before then ran it again at the next start (found by a review)
                            self._flush()
                    self._cond.notify()
            elif self._n["backlog"] or inv.harness in self._held:
                self._cond.notify()
