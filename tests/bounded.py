"""Runs that must end at their deadline, bounded in the test itself: a guest loop that never polls the interrupt
flag ignores every deadline, and would hang pytest (and CI) until it is killed instead of failing one test."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How long a run with a deadline a fraction of a second away may take before the test gives up on it.
GRACE = 10.0


def ends_within(seconds: float, run: Callable[[], T]) -> T:
    """``run()`` in a daemon thread: its result, or a test failure when it has not ended after ``seconds``
    (translated code releases the GIL while it runs; the interpreter shares it). An exception it raises is raised
    here, in the test's thread. A run that never ends is left spinning until the process exits."""
    outcome: list[T | BaseException] = []

    def target() -> None:
        try:
            outcome.append(run())
        except BaseException as e:  # re-raised below
            outcome.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the run ignored its deadline: still running after {seconds} s"
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
