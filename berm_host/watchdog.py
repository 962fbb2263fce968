"""The watchdog: one thread for every invocation, which sets an invocation's interrupt flag once its deadline
has passed; translated code then traps ("guest was interrupted") at its next function entry or back-edge.

The thread lives in the runtime core (C, no GIL): each invocation hands its deadline to ``berm_run`` and the
thread scans the running invocations every ``POLL_INTERVAL`` seconds. Registering therefore costs nothing in
Python — a Python thread would cost microseconds of GIL hand-over per invocation. A deadline is honoured within
``POLL_INTERVAL``. Deadlines are ``time.monotonic()`` instants (CLOCK_MONOTONIC, as the core reads it).
The thread interrupts through ``berm_interrupt(region, generation)``, which only reaches the run it names while
that run is going (a run starts, bumping the generation and clearing the flag, under the same lock as the scan).
"""

from __future__ import annotations

import os

from berm_host.traps import HostError

POLL_INTERVAL = 0.01
_started_pid = 0


def ensure_started() -> None:
    """Start the watchdog thread once per process (again in a forked child, which inherits no threads)."""
    global _started_pid
    if _started_pid != os.getpid():
        from berm_host.aot.runtime import lib

        if not lib.berm_watchdog_start(POLL_INTERVAL):
            raise HostError("cannot start the watchdog thread")
        if not _started_pid:
            os.register_at_fork(after_in_child=_restart_in_child)
        _started_pid = os.getpid()


def _restart_in_child() -> None:
    try:
        ensure_started()
    except HostError:  # nothing to raise into from a fork hook; invocations then run without deadlines
        pass
