"""The interface every execution engine implements: run one entry of one loaded image in fresh guest memory.

Two engines implement it: the reference interpreter (``berm_host.interp``) and the translated code
(``berm_host.aot``). ``berm_host.engine`` builds harnesses on top of either. docs/SEMANTICS.md is the behaviour
both must share exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .linker import Linker
from .traps import HostError, TrapInfo

#: Receives each ``berm.log`` line's raw bytes.
LogSink = Callable[[bytes], None]


@dataclass(frozen=True)
class RunRequest:
    entry: int  # guest address of the function to call
    args: bytes = b""  # the blob berm.args.* serve
    int_args: tuple[int, ...] = ()  # up to 8 values for a0..a7
    linker: Linker = field(default_factory=Linker)
    deadline: float | None = None  # time.monotonic() instant after which the guest is interrupted
    log: LogSink | None = None
    read_result: bool = False  # copy the bytes at (a0, a1) out of guest memory after a normal return
    max_result: int | None = None  # with read_result: a result longer than this is not copied (result None)
    snapshot: tuple[tuple[int, int], ...] = ()  # (addr, length) ranges of guest memory to copy out at the end

    def __post_init__(self) -> None:
        """A HostError for what no guest could be run with, the same on either engine. Found by reviews: for more
        integer arguments than a0..a7 hold, translated code raised a ValueError; for an entry outside [0, 2**64) or
        args given as text, cffi's OverflowError or a TypeError (the interpreter trapped at the entry, or ran)."""
        entry, args, ints = self.entry, self.args, self.int_args  # (every invocation pays for these: cheap first)
        if type(entry) is not int and not isinstance(entry, int) or entry < 0 or entry >> 64:
            raise HostError(f"the entry must be a guest address, an int in [0, 2**64), not {entry!r:.60}")
        if type(args) is not bytes and not isinstance(args, (bytearray, memoryview)):
            raise HostError(f"the arguments must be bytes, not {type(args).__name__}")
        if type(args) is not bytes:  # a strided view broke the interpreter's copy; a bytearray could change mid-run
            object.__setattr__(self, "args", bytes(args))
        if ints:
            if len(ints) > 8:
                raise HostError(f"at most 8 integer arguments fit a0..a7, not {len(ints)}")
            if bad := [v for v in ints if not isinstance(v, int)]:
                raise HostError(f"the integer arguments must be ints, not {type(bad[0]).__name__}")
        if self.deadline is not None or self.max_result is not None or self.snapshot:
            self._check_options()

    def _check_options(self) -> None:
        """A HostError for a deadline that is no time.monotonic() instant, a result limit that is no whole number of 0
        or more, or a snapshot range that is no (address, length) in guest memory's reach. Found by a review: a
        deadline of 10**400 was an OverflowError, and a snapshot range of negative length a ValueError after the
        guest had run (its capability calls made)."""
        deadline, most = self.deadline, self.max_result
        if deadline is not None and (not (whole_number(deadline) or isinstance(deadline, float))
                                     or not -1e18 < deadline < 1e18):
            raise HostError(f"the deadline must be a time.monotonic() instant, not {deadline!r:.60}")
        if most is not None and (not whole_number(most) or most < 0):
            raise HostError(f"the most result bytes must be an int of 0 or more, not {most!r:.60}")
        for pair in self.snapshot:
            if not (isinstance(pair, tuple) and len(pair) == 2 and whole_number(pair[0]) and whole_number(pair[1])
                    and 0 <= pair[0] < 1 << 64 and 0 <= pair[1] <= MAX_SNAPSHOT):
                raise HostError(f"a snapshot range must be (address in [0, 2**64), length in [0, {MAX_SNAPSHOT}]), not "
                                f"{pair!r:.60}")


#: The longest range of guest memory a snapshot copies out: the largest guest memory.
MAX_SNAPSHOT = 1 << 32


def whole_number(value: object) -> bool:
    """An int, not a bool (which is an int to isinstance)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RunResult:
    regs: tuple[int, ...]  # x0..x31 at the end (at the trap, the state before the trapping instruction)
    pc: int  # the trapping instruction's address, or 0 after a normal return
    trap: TrapInfo | None
    failure: bytes | None  # the last berm.fail text
    result: bytes | None = None  # with read_result: the bytes at (a0, a1), None when they were not readable
    snapshot: tuple[bytes, ...] = ()  # with snapshot: each requested range (unreadable bytes as zero)

    @property
    def a0(self) -> int:
        return self.regs[10]

    @property
    def a1(self) -> int:
        return self.regs[11]


class Backend(Protocol):
    """An image loaded into one engine, ready to run any number of invocations, concurrently from threads."""

    def run(self, request: RunRequest) -> RunResult: ...
