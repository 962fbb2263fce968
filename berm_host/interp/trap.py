"""How interpreter handlers stop execution. Handlers raise; the run loop catches, adds the pc and the symbol.

A handler raises *before* it changes anything, so "the instruction has no effect" holds for every trap.
"""

from __future__ import annotations

from berm_host.traps import TrapKind


class GuestTrap(Exception):
    """A trap raised by one instruction; the run loop turns it into a ``TrapInfo`` at the current pc."""

    def __init__(self, kind: TrapKind, addr: int = 0, detail: str = ""):
        super().__init__(kind, addr, detail)
        self.kind = kind
        self.addr = addr
        self.detail = detail


class MemoryFault(GuestTrap):
    def __init__(self, addr: int, detail: str):
        super().__init__(TrapKind.MEMORY_FAULT, addr, detail)


def deadline_passed() -> GuestTrap:
    """The interrupt: the run loop looks at the deadline every few thousand instructions, host calls served in
    Python after they return (a capability may block past it)."""
    return GuestTrap(TrapKind.INTERRUPTED, 0, "deadline passed")


class Returned(Exception):
    """The last shadow-stack frame was popped: the invocation ended normally."""
