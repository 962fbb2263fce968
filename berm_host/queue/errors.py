"""Errors of the queue: refused enqueues and bad schedules. All derive from ``berm_abi.errors.BermError``."""

from berm_abi.errors import BermError


class QueueError(BermError):
    """The queue refused or could not carry out a request (the message says which and why)."""


class ChainDepthError(QueueError):
    """Work caused by a harness would exceed the chain-depth limit (RFC 0205, "Bounding invocation chains")."""

    def __init__(self, harness: str, depth: int, limit: int):
        self.harness = harness
        self.depth = depth
        self.limit = limit
        super().__init__(f"chain depth {depth} exceeds the limit of {limit}: refusing work for {harness!r} "
                         f"caused by a harness (a harness re-triggering itself in a tight chain?)")


class LimitError(QueueError):
    """A queue limit (workers, per-harness concurrency, timeout, chain depth) is out of range."""


class QueueClosed(QueueError):
    """The queue is stopping or has stopped: its executor takes no new work, its due-set is closed."""


class HarnessBusy(QueueError):
    """A nested call (``berm.call``) found its harness at its concurrency limit."""


class UnknownHarness(QueueError):
    """No harness of that name is loaded in this queue."""


class ScheduleError(QueueError):
    """A schedule request is malformed or not allowed (no ``on_wake`` export, bad id, payload too large, …)."""
