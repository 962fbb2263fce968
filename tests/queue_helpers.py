"""A Python-level queue target for the executor/scheduler tests: records what it was invoked with, so the
queue's own rules (limits, deferral, spill, depth) can be observed without a guest; and queues made for a test and
stopped after it. Real-harness tests live in test_queue_harness.py and test_reminders.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from berm_host.queue import Invocation, Queue, Trigger
from berm_host.traps import Trap, TrapInfo, TrapKind


class RecordingTarget:
    """Each invocation sleeps ``work`` seconds, records (trigger, args, start, end) and returns ``"ok"``; an
    args blob containing ``trap`` raises a Trap, as a guest would. ``on_wake`` / ``on_call`` run first."""

    def __init__(self, work: float = 0.0, on_wake=None, on_call=None):
        self.tools = frozenset({"echo"})
        self.exports = frozenset({"on_wake", "on_notify"})
        self.work = work
        self.on_wake = on_wake
        self.on_call = on_call
        self.lock = threading.Lock()
        self.calls: list[dict] = []
        self.active = 0
        self.max_active = 0

    def invoke(self, inv: Invocation, deadline: float) -> str:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        start = time.time()
        try:
            if inv.trigger is Trigger.WAKE and self.on_wake is not None:
                self.on_wake(inv)  # first, as the SDK's recurring wrapper re-arms before the body
            if inv.trigger is Trigger.CALL and self.on_call is not None:
                self.on_call(inv)
            if self.work:
                time.sleep(self.work)
            if b"trap" in inv.args:
                raise Trap(TrapInfo(TrapKind.BREAKPOINT, pc=0x1000))
            return "ok" if inv.trigger is not Trigger.CALL else inv.args.decode()
        finally:
            with self.lock:
                self.active -= 1
                self.calls.append({"trigger": inv.trigger, "args": inv.args, "start": start, "end": time.time(),
                                   "depth": inv.context.depth, "deadline": deadline})

    def wakes(self) -> list[dict]:
        with self.lock:
            return [dict(json.loads(c["args"]), start=c["start"], end=c["end"], depth=c["depth"])
                    for c in self.calls if c["trigger"] is Trigger.WAKE]


def wait_for(predicate, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until true (tests only: the queue itself never polls)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


@contextmanager
def queue_factory(dueset: Path) -> Iterator:
    """``make(targets, *, start=True, **queue_options)``: a Queue over ``dueset`` with ``targets`` added (started
    unless asked not to); every queue made is stopped on exit."""
    queues = []

    def make(targets: dict, *, start: bool = True, **kw) -> Queue:
        q = Queue(dueset, **kw)
        for name, t in targets.items():
            q.add(name, t)
        if start:
            q.start()
        queues.append(q)
        return q

    try:
        yield make
    finally:
        for q in queues:
            q.stop()


def connections(path, n: int, line: bytes = b"") -> list[socket.socket]:
    """``n`` connections to the daemon's socket at ``path``, each having sent ``line`` (none: just connected)."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(path))
        if line:
            s.sendall(line)
        held.append(s)
    return held
