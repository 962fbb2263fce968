"""The wire format of capability requests and replies (ABI.md §2).

A frame is a flat sequence of fields, each a u32 little-endian length followed by that many bytes. No count, no
terminator. Integers travel as decimal ASCII text.
"""

from __future__ import annotations

import re
import struct

from .errors import FrameError

#: ASCII digits only: str.isdigit() also takes '²' and other digits int() refuses (a ValueError, not a FrameError).
_DECIMAL = re.compile(r"-?[0-9]+")

_U32 = struct.Struct("<I")

#: Key/value pairs a request may end with (ABI.md §2): headers, environment variables, options. A guest's buffer of
#: zeros is 4 bytes per empty field, so without a bound 60 MiB of them decoded into 15 million fields for ~18 s,
#: before the capability's own deadline began.
MAX_PAIRS = 4096


class TooManyFields(FrameError):
    """A frame holds more fields than its reader takes."""


def encode_frame(fields: list[bytes | str | int]) -> bytes:
    """Encode ``fields`` as one frame. Strings become UTF-8, integers decimal text."""
    out = bytearray()
    for field in fields:
        if isinstance(field, int):
            data = str(field).encode("ascii")
        elif isinstance(field, str):
            data = field.encode("utf-8")
        else:
            data = bytes(field)
        if len(data) > 0xFFFFFFFF:
            raise FrameError(f"a field of {len(data)} bytes does not fit a frame")
        out += _U32.pack(len(data))
        out += data
    return bytes(out)


def decode_frame(data: bytes, max_fields: int | None = None) -> list[bytes]:
    """Split a frame into its fields; a length running past the end is a FrameError, and so is a field past the
    first ``max_fields`` (found as soon as it starts: the rest is never decoded)."""
    fields: list[bytes] = []
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if max_fields is not None and len(fields) == max_fields:
            raise TooManyFields(f"more than {max_fields} fields")
        if len(view) - pos < 4:
            raise FrameError(f"truncated field length at byte {pos}")
        (n,) = _U32.unpack_from(view, pos)
        pos += 4
        if n > len(view) - pos:
            raise FrameError(f"field at byte {pos - 4} claims {n} bytes, only {len(view) - pos} remain")
        fields.append(bytes(view[pos:pos + n]))
        pos += n
    return fields


def decode_request(data: bytes, names: tuple[str, ...], *, pairs: bool = False,
                   optional: tuple[str, ...] = ()) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
    """Decode a request with the named fixed fields, then (when ``pairs``) a flattened list of key/value pairs, or
    (``optional``) the fields that may follow the named ones, in order.

    Returns ``(fixed_fields, pairs)``, the optional fields present at the end of the first. A wrong field count,
    more than ``MAX_PAIRS`` pairs or an odd pair remainder is a FrameError naming it.
    """
    assert not (pairs and optional), "a request has key/value pairs or optional fields after its fixed ones"
    most = len(names) + len(optional) + (2 * MAX_PAIRS if pairs else 0)
    expected = f"expected fields {list(names)}" + (f" then optionally {list(optional)}" if optional else "")
    try:
        fields = decode_frame(data, most)
    except TooManyFields:
        raise FrameError(f"{expected}{f' then at most {MAX_PAIRS} key/value pairs' if pairs else ''}"
                         f", got more than {most} fields") from None
    if len(fields) < len(names):  # more than `most` was refused above
        raise FrameError(f"{expected}{' then key/value pairs' if pairs else ''}, got {len(fields)} fields")
    if optional:
        return fields, []
    rest = fields[len(names):]
    if len(rest) % 2:
        raise FrameError(f"the pair list after {list(names)} has a key with no value")
    return fields[:len(names)], [(rest[i], rest[i + 1]) for i in range(0, len(rest), 2)]


def field_text(value: bytes, what: str) -> str:
    """A field as UTF-8 text, or a FrameError naming the field."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(f"{what} is not valid UTF-8 (byte {exc.start})") from None


def field_int(value: bytes, what: str) -> int:
    """A field as a decimal integer, or a FrameError naming the field."""
    text = field_text(value, what)
    if len(text) > 40:  # not "not a decimal integer": a 41-digit one is (found by a review)
        raise FrameError(f"{what} is longer than 40 characters: {text[:40]!r}…")
    if not _DECIMAL.fullmatch(text):
        raise FrameError(f"{what} is not a decimal integer: {text!r}")
    return int(text)
