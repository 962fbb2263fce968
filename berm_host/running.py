"""How long the invocations running on this thread have left: what a host call served now may take.

A guest blocked in a host call cannot be interrupted (guest code reads the watchdog's flag), so a capability that
may take long — a command, a fetch, a search — bounds its own timeout by this (``capabilities._request.Deadline.
within_invocation``). Translated code's core keeps the deadline of its runs per thread (``berm_thread_deadline``);
interpreted runs keep theirs there too once the core is loaded, here before. A run nested in a host
call (a capability that calls a harness, on either engine) ends by the earliest of its own deadline and its
caller's. Runs nest at most ``MAX_NESTED_RUNS`` deep on a thread, whatever their engines (the core counts them).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_interpreted = threading.local()
_CORE = "berm_host.aot._core"
#: Runs nested in host calls on one thread, at most (the core's BERM_MAX_NESTED_RUNS): a run beyond traps, on either
#: engine, as the host thread's stack exhausted. Python's recursion limit came first at different depths (166 runs
#: interpreted, 245 translated: found by a review).
MAX_NESTED_RUNS = 64
NESTED_DETAIL = (f"runs nested in host calls are too deep for the host thread (more than {MAX_NESTED_RUNS}, or more "
                 "than its stack holds)")


def _core():
    """The translated engine's core module, imported if need be; None when it is not built."""
    try:
        return importlib.import_module(_CORE)
    except ImportError:
        return None


def time_left() -> float | None:
    """Seconds until the earliest deadline of the invocations running on this thread (0 or less: passed); None when
    none runs, or none has a deadline."""
    core = sys.modules.get(_CORE)  # not imported by anyone: no translated code can be running (nothing to import)
    translated = core.lib.berm_thread_deadline() if core is not None else 0.0
    ends = [d for d in (translated, getattr(_interpreted, "deadline", 0.0)) if d > 0]
    return min(ends) - time.monotonic() if ends else None


@contextmanager
def interpreting(deadline: float | None) -> Iterator[tuple[float | None, bool]]:
    """An interpreted run with ``deadline`` (a ``time.monotonic()`` instant, None for none) on this thread; yields
    the instant it must end by, ``deadline`` or its caller's, whichever is earlier (None: neither has one), and
    whether it is nested too deep to run (``MAX_NESTED_RUNS``, or the host stack's floor as translated runs have it).

    The thread's state is read before the run and set back to it whole, in one call made first in ``finally``: a
    KeyboardInterrupt raised between the steps of a run's start or end (as a call into the core returns) left a
    deadline on the thread that interrupted every later run on it, or a count that grew to "nested too deep" (found
    by a review). The interrupt can only come before the ``try`` while nothing has changed yet."""
    left = time_left()
    ends = [d for d in (deadline, time.monotonic() + left if left is not None else None) if d is not None]
    end = min(ends) if ends else None
    core = _core()  # imported now if need be: a host call may create the first translated engine of the process
    if core is None:  # no translated engine: interpreted runs only, counted here
        outer_deadline, outer_runs = getattr(_interpreted, "deadline", 0.0), getattr(_interpreted, "runs", 0)
        try:
            _interpreted.deadline, _interpreted.runs = end or 0.0, outer_runs + 1
            yield end, outer_runs >= MAX_NESTED_RUNS
        finally:
            _interpreted.deadline, _interpreted.runs = outer_deadline, outer_runs
        return
    outer_deadline, outer_runs = core.lib.berm_thread_deadline(), core.lib.berm_thread_runs()
    try:
        yield end, bool(core.lib.berm_thread_enter(end or 0.0))
    finally:
        core.lib.berm_thread_restore(outer_deadline, outer_runs)
