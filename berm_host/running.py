"""How long the invocations running on this thread have left: what a host call served now may take.

A guest blocked in a host call cannot be interrupted (guest code reads the watchdog's flag), so a capability that
may take long — a command, a fetch, a search — bounds its own timeout by this (``capabilities._request.Deadline.
within_invocation``). Translated code's core keeps the deadline of its runs per thread (``berm_thread_deadline``);
the interpreter keeps its own here. A run nested in a host call (a capability that calls a harness) ends by the
earliest of its own deadline and its caller's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_interpreted = threading.local()
_CORE = "berm_host.aot._core"


def time_left() -> float | None:
    """Seconds until the earliest deadline of the invocations running on this thread (0 or less: passed); None when
    none runs, or none has a deadline."""
    core = sys.modules.get(_CORE)  # not imported by anyone: no translated code can be running (nothing to import)
    translated = core.lib.berm_thread_deadline() if core is not None else 0.0
    ends = [d for d in (translated, getattr(_interpreted, "deadline", 0.0)) if d > 0]
    return min(ends) - time.monotonic() if ends else None


@contextmanager
def interpreting(deadline: float | None) -> Iterator[None]:
    """An interpreted run with ``deadline`` (a ``time.monotonic()`` instant, None for none) on this thread."""
    outer = getattr(_interpreted, "deadline", 0.0)
    if deadline is not None:  # a nested run ends by its caller's deadline too
        _interpreted.deadline = min(deadline, outer) if outer > 0 else deadline
    try:
        yield
    finally:
        _interpreted.deadline = outer
