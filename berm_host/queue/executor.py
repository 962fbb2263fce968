"""The executor: the one place a guest is started (RFC 0205, "Execution: one queue").

A fixed pool of worker threads (guest code releases the GIL, so they run in parallel) takes invocations from
per-harness queues, round-robin across harnesses, never running more than a harness's concurrency limit at once
(by default one fewer than the workers: with two or more, a harness alone never holds the whole pool).
Tool calls go first — before wakes and notifications queued earlier, in their harness and across harnesses: a
model is waiting on a call, a due instant is latency tolerant (RFC 0205); each kind is first in, first out. Each
invocation gets its deadline when it *starts* (queue wait does not eat its time budget); the engine's watchdog
interrupts the guest at that deadline. Every outcome is counted per harness.

The executor knows nothing about engines: it calls ``invoke(invocation, deadline)`` — a seam the daemon binds to
loaded harnesses — which returns the result text or raises (Trap, ToolFailure, HostError, …).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from berm_abi.errors import BermError
from berm_abi.text import escaped
from berm_host.backend import whole_number
from berm_host.declaration import MAX_TIMEOUT, is_timeout
from berm_host.traps import ToolFailure, Trap

from .errors import ChainDepthError, HarnessBusy, LimitError, QueueClosed
from .invocation import Invocation, Trigger, set_current

log = logging.getLogger("berm.queue")

#: Seconds between two warnings of one harness's chain-depth refusals (the rest are counted, and said in the next).
DEPTH_WARNING_INTERVAL = 60.0
#: Warnings of one harness's invocations that ended in a trap or an error: at most END_WARNINGS every
#: END_WARNING_INTERVAL seconds (the rest are counted, and said in the next), each cut to LOG_LINE_MAX characters. A
#: guest granted berm.call that calls a trapping callee in a loop wrote 50 MB of log in 2 s (found by a review).
END_WARNINGS = 10
END_WARNING_INTERVAL = 60.0
LOG_LINE_MAX = 4096

#: invoke(invocation, deadline as a time.monotonic() instant) -> result text; raises on trap/failure/error.
Invoke = Callable[[Invocation, float], str]

DEFAULT_WORKERS = 4
#: The most worker threads an executor starts (each is a thread with its own stack, all started up front).
MAX_WORKERS = 1024
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_DEPTH = 8


def default_per_harness(workers: int) -> int:
    """One fewer than the workers (one of one): with the whole pool as the limit, one harness's wakes could take
    every worker and leave the others' tool calls waiting (RFC 0205: "without it the first badly written harness
    pins the pool")."""
    return max(1, workers - 1)


def _check_limits(workers: int, per_harness: int | None, timeout: float, max_depth: int) -> None:
    """Raise LimitError for a limit no executor can run with (a per-harness limit of 0 or less started nothing,
    and each call waited for ever)."""
    if not whole_number(workers) or workers < 1:
        raise LimitError(f"the executor needs at least one worker, not {workers!r}")
    if workers > MAX_WORKERS:  # found by a review: --workers 100000000 ended in a MemoryError's traceback
        raise LimitError(f"the executor starts at most {MAX_WORKERS} workers, not {workers}")
    if per_harness is not None and (not whole_number(per_harness) or per_harness < 1):
        raise LimitError(f"the per-harness limit must be at least 1, not {per_harness!r}")
    if not is_timeout(timeout):
        raise LimitError(f"the timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], not {timeout!r}")
    if not whole_number(max_depth) or max_depth < 0:
        raise LimitError(f"the chain depth limit must be 0 or more, not {max_depth!r}")


@dataclass(frozen=True)
class HarnessStats:
    """Accounting for one harness. Times are seconds; ``wait`` is time spent queued before a worker took it."""

    invocations: int = 0  # finished, whatever the outcome
    ok: int = 0
    traps: int = 0
    failures: int = 0  # the guest called berm.fail
    errors: int = 0  # host errors and anything else that is not the guest's trap or failure
    refused: int = 0  # work refused (chain depth; a nested call at the concurrency limit)
    run_time: float = 0.0
    wait_time: float = 0.0
    max_wait: float = 0.0


class _Counters:
    """The mutable tally behind a HarnessStats snapshot (updated under the executor's lock)."""

    __slots__ = tuple(HarnessStats.__dataclass_fields__)

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def finished(self, outcome: str, run: float, wait: float) -> None:
        self.invocations += 1
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.run_time += run
        self.wait_time += wait
        self.max_wait = max(self.max_wait, wait)

    def snapshot(self) -> HarnessStats:
        return HarnessStats(*(getattr(self, name) for name in self.__slots__))


@dataclass
class _Job:
    inv: Invocation
    future: Future
    enqueued: float


class _Waiting:
    """One harness's queued jobs: its tool calls, then its wakes and notifications, each first in, first out."""

    __slots__ = ("calls", "background")

    def __init__(self) -> None:
        self.calls: deque[_Job] = deque()
        self.background: deque[_Job] = deque()

    def __len__(self) -> int:
        return len(self.calls) + len(self.background)

    def append(self, job: _Job) -> None:
        (self.calls if job.inv.trigger is Trigger.CALL else self.background).append(job)

    def popleft(self) -> _Job:
        return (self.calls or self.background).popleft()

    def remove(self, future: Future) -> bool:
        """Take out the job whose future is ``future``; whether it was here."""
        for jobs in (self.calls, self.background):
            for i, job in enumerate(jobs):
                if job.future is future:
                    del jobs[i]
                    return True
        return False


def _log_line(what: str, exc: BaseException, *more: str) -> str:
    """One log line for an invocation's end: the guest's text in ``exc`` (a berm.fail reason, a symbol name) has its
    control characters escaped, so that it cannot start a log line of its own; at most LOG_LINE_MAX characters."""
    line = escaped("; ".join([f"{what}: {exc}", *more]), lines=False)
    if len(line) <= LOG_LINE_MAX:
        return line
    return f"{line[:LOG_LINE_MAX]}... ({len(line) - LOG_LINE_MAX} more characters)"


def _log_end(inv: Invocation, how: str, started: float) -> None:
    """An INFO line saying how ``inv`` ended and how long it ran (``berm serve -v``); nothing made when not logged."""
    if log.isEnabledFor(logging.INFO):
        log.info("%s %s in %.1f ms", escaped(inv.label, lines=False), how, (time.monotonic() - started) * 1e3)


class _Quota:
    """Log lines of one kind per harness: at most ``count`` every ``interval`` seconds. ``take`` says whether a line
    may be logged now, and how many were not since the last one logged."""

    def __init__(self):
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int, int]] = {}  # harness -> (window start, lines logged, not logged)

    def take(self, harness: str, count: int, interval: float) -> int | None:
        """None when the line is not to be logged (it is counted); else the lines not logged before it."""
        now = time.monotonic()
        with self._lock:
            start, logged, quiet = self._windows.get(harness, (None, 0, 0))
            if start is None or now - start >= interval:
                self._windows[harness] = (now, 1, 0)
                return quiet
            if logged < count:
                self._windows[harness] = (start, logged + 1, quiet)
                return 0
            self._windows[harness] = (start, logged, quiet + 1)
            return None


class Executor:
    """A bounded worker pool with per-harness concurrency limits, deadlines and accounting."""

    def __init__(self, invoke: Invoke, *, workers: int = DEFAULT_WORKERS, timeout: float = DEFAULT_TIMEOUT,
                 per_harness: int | None = None, max_depth: int = DEFAULT_MAX_DEPTH):
        _check_limits(workers, per_harness, timeout, max_depth)
        self._invoke = invoke
        self.workers = workers
        self.timeout = timeout
        self.per_harness = default_per_harness(workers) if per_harness is None else per_harness
        self.max_depth = max_depth
        self._cond = threading.Condition()
        self._pending: dict[str, _Waiting] = {}
        self._ready: deque[str] = deque()  # harnesses with pending work and a free concurrency slot, once each
        self._running: dict[str, int] = {}
        self._queued = 0
        self._busy = 0
        self._closed = False
        self._stats: dict[str, _Counters] = {}
        self._depth_warnings = _Quota()
        self._end_warnings = _Quota()
        self._listeners: list[Callable[[Invocation], None]] = []
        self._threads = [threading.Thread(target=self._work, name=f"berm-worker-{i}", daemon=True)
                         for i in range(workers)]
        for i, t in enumerate(self._threads):
            try:
                t.start()
            except RuntimeError as exc:  # "can't start new thread": a limit on threads or memory
                del self._threads[i:]
                self.shutdown()
                raise LimitError(f"cannot start {workers} worker threads (started {i}): {exc}") from None

    # --- submitting ---------------------------------------------------------------------------------------

    def check_depth(self, harness: str, depth: int) -> None:
        """Raise ChainDepthError (and count the refusal) when ``depth`` is past the limit. Warned of at most once a
        DEPTH_WARNING_INTERVAL per harness: a guest at the limit can be refused once per host call, tens of
        thousands of times a second (a log line each filled 50 MB a minute: found by a review)."""
        if depth <= self.max_depth:
            return
        with self._cond:
            self._counters(harness).refused += 1
        quiet = self._depth_warnings.take(harness, 1, DEPTH_WARNING_INTERVAL)
        if quiet is not None:
            log.warning("refused work for %s at chain depth %d (limit %d)%s", harness, depth, self.max_depth,
                        f"; {quiet} more refused since the last such warning" if quiet else "")
        raise ChainDepthError(harness, depth, self.max_depth)

    def submit(self, inv: Invocation) -> Future:
        """Queue ``inv``; the future resolves to the result text or raises what the guest ended in."""
        self.check_depth(inv.harness, inv.context.depth)
        job = _Job(inv, Future(), time.monotonic())
        with self._cond:
            if self._closed:
                raise QueueClosed("the executor is shut down and takes no new work")
            queue = self._pending.setdefault(inv.harness, _Waiting())
            queue.append(job)
            self._queued += 1
            if len(queue) == 1 and self._running.get(inv.harness, 0) < self.per_harness:
                self._ready.append(inv.harness)
                self._cond.notify()
        return job.future

    def withdraw(self, future: Future) -> bool:
        """Take the job of ``future`` out of its queue and cancel it, if it has not started; whether it had not.
        A future cancelled alone kept its job queued, arguments and all, until a worker reached it: clients that hung
        up on calls queued behind a busy harness piled up gigabytes (found by a review)."""
        with self._cond:
            for harness, queue in self._pending.items():
                if queue.remove(future):
                    self._queued -= 1
                    if not queue and harness in self._ready:  # a ready harness always has work to take
                        self._ready.remove(harness)
                    return future.cancel()
        return False

    def free_slots(self, ahead: int = 0) -> int:
        """Workers neither busy nor spoken for by queued work that could start, plus ``ahead`` more queued places:
        the budget of a scheduler drain (queueing a little ahead keeps workers from idling between drains). Work
        queued behind its own harness's concurrency limit speaks for no worker: counted, a backlog of calls to one
        slow harness held every other harness's wakes while a worker sat idle (found by a review)."""
        with self._cond:
            startable = sum(min(len(queue), max(0, self.per_harness - self._running.get(harness, 0)))
                            for harness, queue in self._pending.items())
            return max(0, self.workers + ahead - self._busy - startable)

    def room(self, harness: str) -> int:
        """How many more invocations of ``harness`` could start now, within its concurrency limit (queued ones
        count as started)."""
        with self._cond:
            return max(0, self.per_harness - self._running.get(harness, 0) - len(self._pending.get(harness, ())))

    def add_listener(self, fn: Callable[[Invocation], None]) -> None:
        """Call ``fn(invocation)`` on the worker thread after every invocation finishes (whatever its outcome)."""
        self._listeners.append(fn)

    # --- accounting -----------------------------------------------------------------------------------------

    def stats(self) -> dict[str, HarnessStats]:
        with self._cond:
            return {name: c.snapshot() for name, c in self._stats.items()}

    def load(self) -> dict[str, int]:
        with self._cond:
            return {"workers": self.workers, "busy": self._busy, "queued": self._queued}

    def _counters(self, harness: str) -> _Counters:
        c = self._stats.get(harness)
        if c is None:
            c = self._stats[harness] = _Counters()
        return c

    # --- the workers ----------------------------------------------------------------------------------------

    def _take(self) -> _Job | None:
        with self._cond:
            while not self._ready:
                if self._closed and not self._queued:
                    return None
                self._cond.wait()
            harness = self._next_ready()
            queue = self._pending[harness]
            job = queue.popleft()
            self._queued -= 1
            self._busy += 1
            self._running[harness] = running_now = self._running.get(harness, 0) + 1
            if queue and running_now < self.per_harness:
                self._ready.append(harness)
                self._cond.notify()
            return job

    def _next_ready(self) -> str:
        """Take the harness to serve next from the ready ones: the first with a tool call waiting, else the first
        (called holding the lock, with some harness ready)."""
        ready, pending = self._ready, self._pending
        for i, harness in enumerate(ready):
            if pending[harness].calls:
                del ready[i]
                return harness
        return ready.popleft()

    def _finish(self, harness: str) -> None:
        with self._cond:
            self._busy -= 1
            self._running[harness] -= 1
            self._slot_freed(harness)

    def _slot_freed(self, harness: str) -> None:
        """One of ``harness``'s invocations ended (called holding the lock): it is ready again if it has queued
        work and was held at its limit."""
        queue = self._pending.get(harness)
        if queue and self._running[harness] == self.per_harness - 1:
            self._ready.append(harness)
        self._cond.notify_all()

    def _work(self) -> None:
        while (job := self._take()) is not None:
            if job.future.set_running_or_notify_cancel():
                self._run(job)
            self._finish(job.inv.harness)
            self._tell_listeners(job.inv)

    def _tell_listeners(self, inv: Invocation) -> None:
        for fn in self._listeners:
            try:
                fn(inv)
            except Exception:
                log.exception("a queue listener failed after %s", escaped(inv.label, lines=False))

    def _run(self, job: _Job) -> None:
        """Run one invocation and count it; the counts are updated before the future resolves."""
        inv = job.inv
        started = time.monotonic()
        outcome, result, error = self._outcome(inv, started + self.timeout)
        wait = started - job.enqueued
        with self._cond:
            self._counters(inv.harness).finished(outcome, time.monotonic() - started, wait)
        if error is None:
            job.future.set_result(result)
        else:
            job.future.set_exception(error)

    def run_nested(self, inv: Invocation, deadline: float) -> str:
        """Run ``inv`` now, on this thread, as part of the invocation that asks (``berm.call``): past the chain
        depth and within its harness's concurrency limit like any invocation (HarnessBusy when the harness is at
        it — waiting for a slot while holding a worker could wait forever), counted in its harness's accounting,
        but never waiting for a worker, which the caller already holds. Work queued for the harness counts as
        started (``room``): a freed slot goes to it first, else callers that re-called at once took every slot
        and a client's call waited as long as they kept calling (found by a review). The listeners hear of its
        end like any invocation's (the scheduler drains a harness held at its limit when a slot frees). Returns
        the result text or raises what the guest ended in."""
        harness = inv.harness
        self.check_depth(harness, inv.context.depth)
        with self._cond:
            if self._closed:
                raise QueueClosed("the executor is shut down and takes no new work")
            running = self._running.get(harness, 0)
            queued = len(self._pending.get(harness, ()))
            if running + queued >= self.per_harness:
                self._counters(harness).refused += 1
                raise HarnessBusy(f"harness {harness!r} is at its concurrency limit ({self.per_harness} "
                                  "running or queued): try again later")
            self._running[harness] = running + 1  # nothing queued, so not on the ready list
        started = time.monotonic()
        outcome, result, error = "errors", None, None
        try:
            outcome, result, error = self._outcome(inv, deadline)
        finally:
            with self._cond:
                self._running[harness] -= 1
                self._counters(harness).finished(outcome, time.monotonic() - started, 0.0)
                self._slot_freed(harness)
            self._tell_listeners(inv)
        if error is not None:
            raise error
        return result

    def _outcome(self, inv: Invocation, deadline: float) -> tuple[str, str | None, BaseException | None]:
        """Run ``inv`` as this thread's current invocation: (outcome counter, result text, what it raised)."""
        result: str | None = None
        error: BaseException | None = None
        inv = inv.started()
        previous = set_current(inv)
        started = time.monotonic()
        try:
            result = self._invoke(inv, deadline)
            outcome = "ok"
            _log_end(inv, "ended", started)
        except Trap as exc:
            outcome, error = "traps", exc
            self._warn_of_end(inv, "trapped", exc)
        except ToolFailure as exc:
            outcome, error = "failures", exc
            _log_end(inv, "failed (berm.fail)", started)
        except BermError as exc:
            outcome, error = "errors", exc
            self._warn_of_end(inv, "failed", exc)
        except BaseException as exc:  # noqa: BLE001 - a host bug (or a capability's SystemExit or
            # KeyboardInterrupt, which translated code raises after the run as the interpreter lets it through):
            # counted, logged with its traceback, handed to the caller; it never kills the worker
            outcome, error = "errors", exc
            log.exception("%s raised a host error", escaped(inv.label, lines=False))
        finally:
            set_current(previous)
        return outcome, result, error

    def _warn_of_end(self, inv: Invocation, how: str, exc: BermError) -> None:
        """A warning that ``inv`` ended so, within its harness's quota: its line (a trap's with its call chain) is
        made only when it is logged."""
        quiet = self._end_warnings.take(inv.harness, END_WARNINGS, END_WARNING_INTERVAL)
        if quiet is None:
            return
        line = _log_line(f"{inv.label} {how}", exc, *(exc.info.chain_lines() if isinstance(exc, Trap) else ()))
        if quiet:
            line += f"; {quiet} more traps and errors of {escaped(inv.harness, lines=False)} not logged before it"
        log.warning("%s", line)

    # --- shutdown -------------------------------------------------------------------------------------------

    def shutdown(self, *, wait: bool = True, cancel_pending: bool = False) -> None:
        """Take no new work; with ``cancel_pending`` drop what has not started; with ``wait`` join the workers
        (in-flight guests finish or are interrupted at their deadline)."""
        with self._cond:
            self._closed = True
            if cancel_pending:
                for queue in self._pending.values():
                    while queue:
                        job = queue.popleft()
                        self._queued -= 1
                        job.future.cancel()
                self._ready.clear()
            self._cond.notify_all()
        if wait:
            for t in self._threads:
                t.join()
