"""The root of every error Berm raises on purpose.

Callers catch ``BermError`` to tell "the input or the guest was bad" from a bug in Berm itself. Each package
derives its own subclasses; nothing outside this hierarchy should escape a public entry point.
"""


class BermError(Exception):
    """Base class of every error Berm raises deliberately."""


class FrameError(BermError):
    """A request or reply frame is malformed (ABI.md §2)."""
