"""The queue's capabilities: ``berm.schedule.at`` / ``berm.schedule.cancel`` for one harness, and ``berm.call``.

A harness schedules only itself (the capability is bound to its name). Requests (ABI.md §2 frames):
``berm.schedule.at [when_utc_millis, id, payload] -> empty`` and ``berm.schedule.cancel [id] -> empty``.

Chain depth. A wake armed by a running invocation is work caused by a harness, so it runs at the caller's depth
+ 1 and is refused past the limit — which stops a harness re-scheduling itself in a tight chain. But recurrence
*is* a harness re-arming itself, and a daily reminder must not die on its ninth day. The line between the two
is time: a wake armed at least ``horizon_ms`` (default 1 s) in the future starts a fresh chain (depth 0);
anything sooner continues the chain. A recurring schedule therefore runs at most once per horizon forever,
and a tight loop is cut after ``max_depth`` links. So is a harness that catches up after downtime by re-arming
each missed occurrence in the past, one wake each (a review's hourly schedule stopped after 12 hours down): a
wake knows its ``scheduled_at`` and ``now``, so it catches up by handling what it missed in that one wake, then
re-arms in the future. Resetting the chain for instants past the occurrence's own would let a wake armed at
-2^62 ms re-arm itself a second later for ever.
"""

from __future__ import annotations

from dataclasses import replace

from berm_abi.errors import BermError
from berm_abi.frames import decode_request, field_int, field_text
from berm_host.capabilities._request import Deadline
from berm_host.linker import Capability, CapabilityError
from berm_host.traps import ToolFailure, Trap

from .dueset import BUSY_TIMEOUT
from .invocation import Context, current_invocation
from .scheduler import now_ms
from .service import Queue

DEFAULT_HORIZON_MS = 1000


def schedule_capabilities(queue: Queue, harness_name: str, *,
                          horizon_ms: int = DEFAULT_HORIZON_MS) -> list[Capability]:
    """The ``berm.schedule.*`` capabilities for ``harness_name``, landing in ``queue``'s due-set."""

    def at(request: bytes) -> bytes:
        try:
            (when, id_, payload), _ = decode_request(request, ("when_utc_millis", "id", "payload"))
            when_ms = field_int(when, "when_utc_millis")
            now = now_ms()
            inv = current_invocation()
            depth = 0 if inv is None or when_ms - now >= horizon_ms else inv.context.depth + 1
            queue.schedule(harness_name, field_text(id_, "id"), when_ms, field_text(payload, "payload"),
                           depth=depth, wait=_busy_wait())
        except BermError as exc:
            raise CapabilityError(str(exc)) from None
        return b""

    def cancel(request: bytes) -> bytes:
        try:
            (id_,), _ = decode_request(request, ("id",))
            queue.cancel(harness_name, field_text(id_, "id"), wait=_busy_wait())
        except BermError as exc:
            raise CapabilityError(str(exc)) from None
        return b""

    return [Capability("berm.schedule.at", at), Capability("berm.schedule.cancel", cancel)]


def _busy_wait() -> float:
    """How long a guest's write may wait for a due-set that another connection (a backup, a ``sqlite3`` shell) is
    writing: what its invocation has left for a host call, at most BUSY_TIMEOUT. A guest in a host call cannot be
    interrupted, so waiting SQLite's 30 s overran its deadline."""
    return Deadline.within_invocation(BUSY_TIMEOUT).seconds


def call_capabilities(queue: Queue) -> list[Capability]:
    """``berm.call [harness, tool, args] -> that harness's result``: a tool of any harness loaded in ``queue`` (the
    declaring agent's own harnesses, resolved by name per call; the caller's own too, held like any other to the
    chain depth and its concurrency limit), run inside the calling invocation one link deeper in its chain
    (``Queue.call_nested``). The callee's failure, trap or refusal is an error reply the caller handles, never a
    trap of the caller, and its text is the same on either engine."""

    def call(request: bytes) -> bytes:
        try:
            (harness, tool, args), _ = decode_request(request, ("harness", "tool", "args"))
            name, tool_name = field_text(harness, "harness"), field_text(tool, "tool")
            inv = current_invocation()
            context = replace(inv.context, depth=inv.context.depth + 1) if inv is not None else Context(depth=1)
            return queue.call_nested(name, tool_name, bytes(args), context).encode("utf-8")
        except ToolFailure as exc:
            raise CapabilityError(f"{name}.{tool_name} failed: {exc.message}") from None
        except Trap as exc:  # the caller reads this: the same whatever engine either runs on
            raise CapabilityError(f"{name}.{tool_name} trapped: {exc.engine_neutral()}") from None
        except BermError as exc:
            raise CapabilityError(str(exc)) from None

    return [Capability("berm.call", call)]
