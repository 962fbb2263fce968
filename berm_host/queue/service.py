"""The queue: harness targets, the executor, the due-set, the scheduler and subscriptions behind one API.

Every way of starting a guest is a method here and ends in ``Executor.submit``: ``call`` (a tool), a due wake
(the scheduler), ``publish`` (``on_notify`` of each subscribed harness). Every way of scheduling — the
``berm.schedule.*`` capability, this host API, the CLI through the daemon — ends in ``schedule``/``cancel``.
"""

from __future__ import annotations

import enum
import logging
import threading
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path

from berm_host.capabilities._request import Deadline
from berm_host.engine import tool_args

from .dueset import DueSet, Entry, Key
from .errors import QueueError, ScheduleError, UnknownHarness
from .executor import DEFAULT_MAX_DEPTH, DEFAULT_TIMEOUT, DEFAULT_WORKERS, Executor
from .invocation import Context, Invocation, Trigger
from .scheduler import Scheduler
from .subscriptions import Subscription, Subscriptions, notify_args
from .target import Target

log = logging.getLogger("berm.queue")


class Cancel(enum.Enum):
    """What ``Queue.cancel`` did."""

    NOT_PENDING = "not pending"  # nothing was scheduled under that id
    CANCELLED = "cancelled"  # its wake will not run
    STARTED = "started"  # removed, but its wake had already started: it runs to its end


class Queue:
    def __init__(self, dueset: DueSet | str | Path, *, workers: int = DEFAULT_WORKERS,
                 timeout: float = DEFAULT_TIMEOUT, per_harness: int | None = None,
                 max_depth: int = DEFAULT_MAX_DEPTH):
        self.dueset = dueset if isinstance(dueset, DueSet) else DueSet(dueset)
        self._targets: dict[str, Target] = {}
        self.executor = Executor(self._invoke, workers=workers, timeout=timeout, per_harness=per_harness,
                                 max_depth=max_depth)
        self.scheduler = Scheduler(self.dueset, self.executor)
        self.subscriptions = Subscriptions()
        self._stop_lock = threading.Lock()
        self._stopped = False

    # --- harnesses ------------------------------------------------------------------------------------------

    def add(self, name: str, target: Target) -> None:
        """Register a loaded harness under ``name`` (before ``start``, or at least before its work arrives)."""
        self._targets[name] = target
        self.scheduler.deliver_to(frozenset(self._targets))

    def target(self, name: str) -> Target:
        try:
            return self._targets[name]
        except KeyError:
            raise UnknownHarness(f"no harness named {name[:80]!r} is loaded (loaded: {sorted(self._targets)})") from None

    def harnesses(self) -> list[str]:
        return sorted(self._targets)

    def _invoke(self, inv: Invocation, deadline: float) -> str:
        return self.target(inv.harness).invoke(inv, deadline)

    # --- triggers -------------------------------------------------------------------------------------------

    def call(self, harness: str, tool: str, args: bytes | str = b"", context: Context = Context()) -> Future:
        """Queue a tool invocation; the future resolves to its result text (or raises Trap/ToolFailure/…)."""
        self._with_tool(harness, tool)
        return self.executor.submit(Invocation(Trigger.CALL, harness, tool_args(args), tool=tool, context=context))

    def withdraw(self, future: Future) -> bool:
        """Drop a queued invocation (``call``'s or ``publish``'s future) before it starts; whether it had not."""
        return self.executor.withdraw(future)

    def _with_tool(self, harness: str, tool: str) -> Target:
        target = self.target(harness)
        if tool not in target.tools:
            has = ", ".join(sorted(target.tools))
            raise QueueError(f"harness {harness!r} has no tool {tool[:80]!r} (it has: {has})")
        return target

    def call_nested(self, harness: str, tool: str, args: bytes, context: Context) -> str:
        """Run ``harness``'s ``tool`` now, on this thread, as part of the invocation that asks (``berm.call``).

        Not through the workers: a caller waiting for a worker while it holds one would wait forever once every
        worker did. Through the executor all the same (``Executor.run_nested``): refused past the chain depth
        (``context.depth`` is the callee's) and when the callee is at its concurrency limit, counted in the
        callee's accounting. It ends within the caller's deadline, leaving the caller a fifth of its time (at most
        5 s) to handle the reply, as any capability that may take long does."""
        self._with_tool(harness, tool)
        inv = Invocation(Trigger.CALL, harness, args, tool=tool, context=context)
        return self.executor.run_nested(inv, Deadline.within_invocation(self.executor.timeout).end)

    def subscribe(self, topic: str, harness: str, *, once: bool = False) -> Subscription:
        if "on_notify" not in self.target(harness).exports:
            raise ScheduleError(f"harness {harness!r} does not export on_notify, so it cannot subscribe")
        sub = Subscription(topic, harness, once)
        self.subscriptions.add(sub)
        return sub

    def publish(self, topic: str, event: str, context: Context = Context()) -> list[Future]:
        """Deliver ``event`` to every harness subscribed to ``topic`` (one ``on_notify`` each)."""
        args = notify_args(topic, event)
        return self.subscriptions.deliver(
            topic, lambda harness: self.executor.submit(Invocation(Trigger.NOTIFY, harness, args, context=context)))

    # --- scheduling -----------------------------------------------------------------------------------------

    def schedule(self, harness: str, id: str, when_ms: int, payload: str = "", *, depth: int = 0,
                 wait: float | None = None) -> Entry:
        """Wake ``harness`` at ``when_ms`` (UTC ms) with ``payload``; replaces a pending ``id`` (whose wake then
        never runs unless it has already started). Durable on return. ``wait``: ``DueSet.put``'s."""
        if "on_wake" not in self.target(harness).exports:
            raise ScheduleError(f"harness {harness!r} does not export on_wake, so it cannot be scheduled")
        self.executor.check_depth(harness, depth)
        entry = self.dueset.put(harness, id, when_ms, payload, depth, wait=wait)
        self.scheduler.changed(harness, id, entry.gen)
        return entry

    def cancel(self, harness: str, id: str, *, wait: float | None = None) -> Cancel:
        """Remove a pending ``id``: its wake never runs unless it has already started (``Cancel.STARTED``).
        ``wait``: ``DueSet.put``'s."""
        if not self.dueset.cancel(harness, id, wait=wait):
            return Cancel.NOT_PENDING
        return Cancel.STARTED if self.scheduler.changed(harness, id) else Cancel.CANCELLED

    def list(self, harness: str | None = None, *, after: Key | None = None, limit: int = -1) -> list[Entry]:
        """Pending wakes, earliest first (``DueSet.list``: a page of them with ``after`` and ``limit``)."""
        return self.dueset.list(harness, after=after, limit=limit)

    # --- life -----------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()

    def stop(self, *, cancel_pending: bool = True) -> None:
        """Stop the scheduler, then the executor: queued work is dropped (``cancel_pending``) or finished;
        running guests finish or are interrupted at their deadline. The due-set keeps every pending wake. A queue
        stopped already (by another thread too, once it is done) is left as it is."""
        with self._stop_lock:
            if self._stopped:
                return
            self.scheduler.stop()
            self.executor.shutdown(wait=True, cancel_pending=cancel_pending)
            self.scheduler.flush()
            self.dueset.close()
            self._stopped = True

    def stats(self) -> dict:
        """Counters as plain data: per-harness accounting, executor load and the scheduler's own counters."""
        return {
            "harnesses": {name: asdict(s) for name, s in sorted(self.executor.stats().items())},
            "executor": self.executor.load(),
            "scheduler": asdict(self.scheduler.stats()),
            "pending": self.dueset.count(),
        }
