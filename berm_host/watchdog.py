"""One watchdog thread for every invocation with a deadline: it sets the invocation's interrupt flag once the
deadline has passed, and translated code traps ("guest was interrupted") at its next function entry or
back-edge.

Registering is a dict store (no lock, usually no wake-up): the thread polls the registered invocations every
``POLL_INTERVAL`` seconds, and only after ``IDLE_AFTER`` seconds without any does it sleep on an event, so it
costs nothing when idle and little per invocation (waking a sleeping thread per call costs microseconds of GIL
hand-over). A deadline is honoured within ``POLL_INTERVAL``.
"""

from __future__ import annotations

import threading
import time

POLL_INTERVAL = 0.01
IDLE_AFTER = 2.0


class Interruptible:
    """What the watchdog needs of an invocation: a ``ctx`` whose ``interrupt`` field it may set."""

    ctx: object


_active: dict[Interruptible, float] = {}
_wake = threading.Event()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch(target: Interruptible, deadline: float) -> None:
    """Interrupt ``target`` once ``time.monotonic()`` passes ``deadline`` (until ``unwatch``)."""
    _active[target] = deadline
    if _thread is None:
        _start()
    if not _wake.is_set():
        _wake.set()


def unwatch(target: Interruptible) -> None:
    _active.pop(target, None)


def _start() -> None:
    global _thread
    with _start_lock:
        if _thread is None:
            t = threading.Thread(target=_loop, name="berm-watchdog", daemon=True)
            t.start()
            _thread = t


def _loop() -> None:
    last_busy = time.monotonic()
    while True:
        now = time.monotonic()
        if _active:
            last_busy = now
        elif now - last_busy > IDLE_AFTER:
            _wake.clear()
            if not _active:  # re-check: watch() may have run between the test and the clear
                _wake.wait()
            now = last_busy = time.monotonic()
        for target, deadline in list(_active.items()):
            if now >= deadline:
                target.ctx.interrupt = 1
        time.sleep(POLL_INTERVAL)
