"""One queue (RFC 0205): every start of a guest — tool call, timed wake, subscribed event — passes through one
executor; timed wakes come from a persisted due-set drained by a scheduler that sleeps until the earliest."""

from .capability import call_capabilities, schedule_capabilities
from .dueset import DueSet, Entry
from .errors import (ChainDepthError, HarnessBusy, LimitError, QueueClosed, QueueError, ScheduleError,
                     UnknownHarness)
from .executor import Executor, HarnessStats
from .invocation import Context, Invocation, Trigger, current_invocation
from .scheduler import Scheduler, SchedulerStats
from .service import Cancel, Queue
from .subscriptions import Subscription, Subscriptions
from .target import Target

__all__ = [
    "Cancel", "ChainDepthError", "Context", "DueSet", "Entry", "Executor", "HarnessBusy", "HarnessStats", "Invocation",
    "LimitError", "Queue", "QueueClosed", "QueueError", "ScheduleError", "Scheduler", "SchedulerStats", "Subscription",
    "Subscriptions", "Target", "Trigger", "UnknownHarness", "call_capabilities", "current_invocation",
    "schedule_capabilities",
]
