"""``ecall``: the core host calls (ABI.md §1), served here, and capabilities, served through the Linker.

Buffers a core call reads must be readable guest memory and buffers it writes writable; otherwise the call traps
as "host call failed" naming the call and the buffer, before anything is written. A zero-length buffer is never
checked (nothing is read or written).
"""

from __future__ import annotations

import time

from berm_abi.names import ERROR_BIT, core_number
from berm_host.layout import MAX_FAIL_TEXT, MAX_LOG_LINE, budgeted_log, failure_text, log_text
from berm_host.linker import CapabilityError, exception_text, failed_detail, unknown_call_detail
from berm_host.traps import TrapKind

from .trap import GuestTrap, deadline_passed

LOG = core_number("berm.log")
ARGS_LEN = core_number("berm.args.len")
ARGS_READ = core_number("berm.args.read")
FAIL = core_number("berm.fail")
RESULT_READ = core_number("berm.result.read")
HEAP_START = core_number("berm.heap.start")
HEAP_SIZE = core_number("berm.heap.size")


def _buffer_error(call: str, ptr: int, n: int, access: str) -> GuestTrap:
    return GuestTrap(TrapKind.HOST_CALL_FAILED, ptr,
                     f"{call}: the buffer at {ptr:#x} ({n} bytes) is not {access} guest memory")


def _read(st, call: str, ptr: int, n: int, keep: int | None = None) -> bytes:
    """The buffer ``[ptr, ptr+n)``, which must be readable; only its first ``keep`` bytes when ``keep`` is given."""
    if n == 0:
        return b""
    if not st.mem.layout.readable(ptr, n):
        raise _buffer_error(call, ptr, n, "readable")
    return st.mem.buf[ptr:ptr + (n if keep is None else min(n, keep))]


def _write(st, call: str, ptr: int, data: bytes) -> None:
    if not data:
        return
    if not st.mem.layout.writable(ptr, len(data)):
        raise _buffer_error(call, ptr, len(data), "writable")
    st.mem.buf[ptr:ptr + len(data)] = data


def host_call(st, number: int, a0: int, a1: int) -> int:
    """Serve call ``number`` with arguments ``a0``, ``a1``; the value for ``a0`` (a GuestTrap on failure)."""
    if number == ARGS_LEN:
        return len(st.args)
    # A copy counts as one instruction however long it is: found by a review, a guest copying 64 MiB in a loop ran
    # a thousand copies between the run loop's looks at the clock, 33 s past a 0.3 s deadline.
    if number == ARGS_READ:
        _write(st, "berm.args.read", a0, st.args[:a1])
        _check_deadline(st)
        return len(st.args)
    if number == RESULT_READ:
        _write(st, "berm.result.read", a0, st.staged[:a1])
        _check_deadline(st)
        return len(st.staged)
    if number == LOG:
        line = log_text(_read(st, "berm.log", a0, a1, MAX_LOG_LINE), a1)
        if st.log is not None:
            line, st.logged = budgeted_log(st.logged, line)
            try:
                if line is not None:
                    st.log(line)
            except Exception as exc:  # the sink is host code: its bug is reported like a capability's
                raise GuestTrap(TrapKind.HOST_CALL_FAILED, number, failed_detail("berm.log", exc)) from None
        _check_deadline(st)  # berm.log is served in Python on translated code too, with or without a sink
        return 0
    if number == FAIL:
        st.failure = failure_text(_read(st, "berm.fail", a0, a1, MAX_FAIL_TEXT), a1)
        return 0
    if number == HEAP_START:
        return st.mem.layout.heap_start
    if number == HEAP_SIZE:
        return st.mem.layout.heap_size
    try:  # a Linker's lookup is host code (a subclass may override it): its bug is a trap, as on translated code
        cap = st.linker.lookup(number)
        name = None if cap is None else cap.name
    except Exception as exc:  # found by a review: it escaped Harness.call here, a trap on translated code
        raise GuestTrap(TrapKind.HOST_CALL_FAILED, number, f"{type(exc).__name__}: {exception_text(exc)}") from None
    if cap is None:
        raise GuestTrap(TrapKind.UNKNOWN_HOST_CALL, number, unknown_call_detail(number))
    request = _read(st, name, a0, a1)
    try:
        reply = cap.fn(request)
        if not isinstance(reply, (bytes, bytearray, memoryview)):
            raise TypeError(f"returned {type(reply).__name__}, not bytes")
        st.staged = bytes(reply)
        ret = len(st.staged)
    except CapabilityError as exc:
        st.staged = exception_text(exc).encode("utf-8", "replace")
        ret = len(st.staged) | ERROR_BIT
    except Exception as exc:  # a capability bug must never escape into (or out of) guest code
        raise GuestTrap(TrapKind.HOST_CALL_FAILED, number, failed_detail(cap.name, exc)) from None
    _check_deadline(st)
    return ret


def _check_deadline(st) -> None:
    """After a call served in Python: it may have blocked past the deadline, where translated code's next poll
    would trap (the run loop itself looks only every few thousand instructions)."""
    if st.deadline is not None and time.monotonic() > st.deadline:
        raise deadline_passed()
