"""What the queue carries: one request to start a guest, with its trigger and the caller's context.

The invocation running on the current thread is published through ``current_invocation()`` so capabilities that
enqueue further work (``berm.schedule.at``, ``berm.call``) can carry the chain depth and caller context: the
engine runs capability callbacks synchronously on the worker thread that entered the guest.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace


class Trigger(enum.Enum):
    CALL = "call"  # a tool invocation: berm_tool_<tool>
    WAKE = "wake"  # a due one-shot: the export on_wake
    NOTIFY = "notify"  # a subscribed event: the export on_notify


#: The guest export each non-tool trigger enters.
EXPORT_OF = {Trigger.WAKE: "on_wake", Trigger.NOTIFY: "on_notify"}


@dataclass(frozen=True)
class Context:
    """Who the work is for (RFC 0205: authority rides on the invocation) and how deep in a chain it sits.

    ``depth`` is 0 for work started from outside any harness and grows by one for each enqueue a harness causes.
    """

    agent: str = ""
    conversation: str = ""
    sender: str = ""
    depth: int = 0


@dataclass(frozen=True)
class Invocation:
    trigger: Trigger
    harness: str
    args: bytes | Callable[[], bytes] = b""  # a function: made as the invocation starts (``started``)
    tool: str | None = None  # CALL only
    context: Context = field(default_factory=Context)
    schedule_id: str | None = None  # WAKE only: the due-set id being delivered

    def started(self) -> Invocation:
        """This invocation as it starts: its arguments made, when a function makes them (a wake's carry the
        instant it is delivered)."""
        return replace(self, args=self.args()) if callable(self.args) else self

    @property
    def label(self) -> str:
        """Short text for logs: ``reminders.add`` / ``reminders.on_wake[daily-1]``."""
        if self.trigger is Trigger.CALL:
            return f"{self.harness}.{self.tool}"
        suffix = f"[{self.schedule_id}]" if self.schedule_id is not None else ""
        return f"{self.harness}.{EXPORT_OF[self.trigger]}{suffix}"


_local = threading.local()


def current_invocation() -> Invocation | None:
    """The invocation whose guest is running on this thread, or None outside any guest."""
    return getattr(_local, "invocation", None)


def set_current(inv: Invocation | None) -> Invocation | None:
    """Publish ``inv`` as this thread's current invocation; returns the one it replaces (to restore after)."""
    previous = getattr(_local, "invocation", None)
    _local.invocation = inv
    return previous
