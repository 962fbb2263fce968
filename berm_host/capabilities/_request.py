"""Request decoding shared by every capability: frame errors and OS errors become ``CapabilityError``.

A capability's failure reaches the guest as an ERROR-bit reply (ABI.md §1), so nothing a guest sends — a
truncated frame, a wrong field count, invalid UTF-8 — may escape as any other exception.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator

from berm_abi.errors import FrameError
from berm_abi.frames import decode_request, field_text
from berm_host.linker import CapabilityError, CapabilityFn
from berm_host.running import time_left


def fields(data: bytes, names: tuple[str, ...], *, pairs: bool = False,
           optional: tuple[str, ...] = ()) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """``decode_request`` with a FrameError turned into the guest-facing CapabilityError."""
    try:
        return decode_request(data, names, pairs=pairs, optional=optional)
    except FrameError as exc:
        raise CapabilityError(f"malformed request: {exc}") from None


def text(value: bytes, what: str) -> str:
    try:
        return field_text(value, what)
    except FrameError as exc:
        raise CapabilityError(str(exc)) from None


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """OS errors as CapabilityError naming the guest's path, as the refusals of paths do. Found by reviews: the
    guest was told "berm.fs.write: File name too long" (and glob's likewise), without the path."""
    try:
        yield
    except TimeoutError:  # an OSError too, but no path's: the capability says it timed out
        raise
    except OSError as exc:
        raise CapabilityError(f"{path}: {exc.strerror or exc}") from None


def capability(name: str) -> Callable[[CapabilityFn], CapabilityFn]:
    """Wrap a capability body so its own OS-level failures and timeouts reach the guest as CapabilityError
    prefixed with the capability's name; CapabilityError passes through with the same prefix."""

    def wrap(fn: CapabilityFn) -> CapabilityFn:
        @functools.wraps(fn)
        def run(request: bytes) -> bytes:
            try:
                return fn(request)
            except CapabilityError as exc:
                raise CapabilityError(f"{name}: {exc}") from None
            except TimeoutError as exc:
                raise CapabilityError(f"{name}: timed out ({exc or 'deadline passed'})") from None
            except OSError as exc:
                raise CapabilityError(f"{name}: {exc.strerror or exc}") from None

        return run

    return wrap


class Deadline:
    """A monotonic time budget for one capability call; ``check()`` raises TimeoutError once it has passed."""

    __slots__ = ("seconds", "end")

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    @classmethod
    def within_invocation(cls, seconds: float) -> "Deadline":
        """``seconds``, or less: what the invocation being served has left, minus a fifth of that (at most 5 s)
        for the guest to handle the reply — a guest blocked in a host call cannot be interrupted."""
        left = time_left()
        if left is not None:
            seconds = min(seconds, max(0.0, left - min(5.0, left / 5)))
        return cls(seconds)

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def check(self) -> float:
        left = self.remaining()
        if left <= 0:
            raise TimeoutError(f"took longer than {self.seconds:g} s")
        return left
