"""Text a guest chose (symbol and section names, manifest text, log lines, failure and trap messages) made safe to
print (berm_host.text: control characters other than newline and tab become escapes). A tool's result is printed
as it is: it is the tool's output, as ``cat`` prints a file."""

from __future__ import annotations

from berm_host.text import escaped


def shown(text: str) -> str:
    return escaped(text)
