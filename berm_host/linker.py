"""The linker: the set of host functions an image is instantiated with. It *is* the capability set.

Core host calls (``berm_abi.names.CORE_CALLS``) are served by the engines themselves and never appear here. A
capability is a name plus a Python callable over the request frame; a number nobody defined traps as an
unknown host call. There is no permission flag anywhere: an ungranted capability is simply absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from berm_abi.errors import BermError
from berm_abi.names import CORE_BY_NAME, CORE_NUMBERS, KNOWN_NAMES, fnv1a64

from .traps import Trap

#: A capability: request frame bytes in, reply bytes out. It raises CapabilityError for its own failures
#: (file not found, host not allowed, timeout…), which reach the guest as an ERROR-bit reply, never a trap.
CapabilityFn = Callable[[bytes], bytes]


class CapabilityError(BermError):
    """A capability failed; the message is staged for the guest with the ERROR bit set."""


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when that raises: host code's exception, described for a trap or an error reply
    the same way on both engines (one whose ``__str__`` raised escaped the interpreter and was a trap of another
    text on translated code). A lone surrogate (a name read with surrogateescape) is written ``\\udcff``: a trap
    message must encode as UTF-8 wherever an embedder writes it (found by a review). The encoding is inside the
    ``try`` too: a ``__str__`` returning a str subclass whose ``encode`` raised escaped the interpreter's host calls
    raw (found by a review)."""
    try:
        return str.encode(str(exc), "utf-8", "backslashreplace").decode("utf-8")
    except Exception:  # noqa: BLE001 - anything its __str__ raises (a KeyboardInterrupt still goes through)
        return "(its message could not be read)"


def failed_detail(what: str, exc: BaseException) -> str:
    """The detail of the host-call-failed trap for ``exc`` raised by host code serving ``what``. A trap of a run the
    host code started is told without where an interrupt struck (``Trap.engine_neutral``): that pc is an engine's,
    and the failed call is a trap the engines agree on (found by a review)."""
    text = exc.engine_neutral() if isinstance(exc, Trap) else exception_text(exc)
    return f"{what}: {type(exc).__name__}: {text}"


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    fn: CapabilityFn

    @property
    def number(self) -> int:
        return fnv1a64(self.name)


class Linker:
    """Capabilities by number. Build one per declaration; share it across invocations (it is read-only once
    built, so concurrent invocations may use it)."""

    def __init__(self, capabilities: list[Capability] | tuple[Capability, ...] = ()):
        self._by_number: dict[int, Capability] = {}
        for cap in capabilities:
            self.define(cap.name, cap.fn)

    def define(self, name: str, fn: CapabilityFn) -> None:
        if name in CORE_BY_NAME:
            raise ValueError(f"{name} is a core host call, served by the engine; it cannot be redefined")
        number = fnv1a64(name)
        existing = self._by_number.get(number)
        if existing is not None and existing.name != name:
            raise ValueError(f"{name} and {existing.name} hash to the same call number {number}")
        self._by_number[number] = Capability(name, fn)

    def lookup(self, number: int) -> Capability | None:
        return self._by_number.get(number)

    @property
    def lookup_fn(self) -> Callable[[int], Capability | None]:
        """``lookup`` as the table's own ``dict.get`` (no Python frame, ~80 ns less per call), for host-call
        paths that bind it once per linker; it sees later ``define``s like ``lookup`` does. A subclass that
        overrides ``lookup`` (to revoke a capability at run time) is asked through it: translated code took the
        table behind its back and served what the interpreter refused. Such a ``lookup`` is never asked for a core
        call's number (translated code brings berm.log here): the interpreter serves those before any linker,
        and one that answered every number had berm.log's line taken from the log on translated code only."""
        if type(self).lookup is Linker.lookup:
            return self._by_number.get
        lookup = self.lookup
        return lambda number: None if number in CORE_NUMBERS else lookup(number)

    def names(self) -> list[str]:
        return sorted(c.name for c in self._by_number.values())

    def __iter__(self) -> Iterator[Capability]:
        return iter(sorted(self._by_number.values(), key=lambda c: c.name))

    def __contains__(self, name: str) -> bool:
        return fnv1a64(name) in self._by_number


def unknown_call_detail(number: int) -> str:
    """The extra words for an unknown-host-call trap: the name, when this host knows it."""
    name = KNOWN_NAMES.get(number)
    return f"{name}, not granted to this harness" if name else ""
