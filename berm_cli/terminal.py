"""Text a guest chose (symbol and section names, manifest text, log lines, failure and trap messages) made safe to
print: control characters other than newline and tab become escapes, so an image cannot move the cursor, rewrite
the screen or set the clipboard (OSC 52) of whoever inspects or calls it. A tool's result is printed as it is: it
is the tool's output, as ``cat`` prints a file."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)
