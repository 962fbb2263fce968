"""What the queue invokes: a loaded harness behind the ``Target`` protocol.

The queue routes each invocation to the target registered under its harness name. ``exports`` tells which
triggers the harness takes part in (RFC 0205: the export table is the registration): a harness without
``on_wake`` cannot be scheduled, one without ``on_notify`` is never notified.
"""

from __future__ import annotations

from typing import Protocol

from .invocation import Invocation


class Target(Protocol):
    tools: frozenset[str]
    exports: frozenset[str]  # of "on_wake", "on_notify"

    def invoke(self, inv: Invocation, deadline: float) -> str:
        """Run ``inv`` in fresh guest memory, interrupted at ``deadline`` (time.monotonic()); the result text,
        or raise Trap / ToolFailure / HostError."""
        ...
