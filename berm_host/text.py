"""Text a guest chose (log lines, failure and trap messages, symbol and manifest names), made safe to show: control
characters become ``\\xNN`` escapes, so an image cannot move a terminal's cursor, rewrite the screen or set its
clipboard (OSC 52), and, with ``lines=False``, cannot start a line of its own in a log (a forged "loaded harness
admin" record)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but newline and tab
_CONTROL_OR_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escaped(text: str, *, lines: bool = True) -> str:
    """``text`` with its control characters escaped; newline and tab kept when ``lines``."""
    return (_CONTROL if lines else _CONTROL_OR_LINE).sub(lambda m: f"\\x{ord(m[0]):02x}", text)
