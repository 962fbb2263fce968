"""The watchdog: one thread for every invocation, which sets an invocation's interrupt flag once its deadline
has passed; translated code then traps ("guest was interrupted") at its next function entry or back-edge.

The thread lives in the runtime core (C, no GIL): each invocation hands its deadline to ``berm_run`` and the
thread scans the running invocations every ``POLL_INTERVAL`` seconds. Registering therefore costs nothing in
Python — a Python thread would cost microseconds of GIL hand-over per invocation. A deadline is honoured within
``POLL_INTERVAL``. Deadlines are ``time.monotonic()`` instants (CLOCK_MONOTONIC, as the core reads it).
"""

from __future__ import annotations

from berm_host.traps import HostError

POLL_INTERVAL = 0.01
_started = False


def ensure_started() -> None:
    """Start the watchdog thread once per process."""
    global _started
    if not _started:
        from berm_host.aot.runtime import lib

        if not lib.berm_watchdog_start(POLL_INTERVAL):
            raise HostError("cannot start the watchdog thread")
        _started = True
