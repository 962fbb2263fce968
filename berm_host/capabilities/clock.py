"""``berm.clock.now``: UTC time in milliseconds and the host's current local UTC offset in seconds.

The offset, not a zone name: a harness re-resolving "08:00 local" to UTC at each re-arm handles DST itself.
"""

from __future__ import annotations

import time

from berm_abi.frames import encode_frame
from berm_host.linker import CapabilityFn

from ._request import capability, fields


def now() -> tuple[int, int]:
    """``(utc_millis, local_offset_seconds)`` at this instant."""
    ns = time.time_ns()
    return ns // 1_000_000, time.localtime(ns // 1_000_000_000).tm_gmtoff


def capabilities() -> dict[str, CapabilityFn]:
    @capability("berm.clock.now")
    def clock_now(request: bytes) -> bytes:
        fields(request, ())
        return encode_frame(list(now()))

    return {"berm.clock.now": clock_now}
