"""Text a guest chose (log lines, failure and trap messages, symbol and manifest names), made safe to show: control
characters become ``\\xNN`` escapes, so an image cannot move a terminal's cursor, rewrite the screen or set its
clipboard (OSC 52); the bidirectional controls (the "Trojan Source" set) and the Unicode line and paragraph
separators become ``\\uNNNN``, so it cannot reorder what a reader sees (U+202E shows the rest of a line reversed);
and with ``lines=False`` it cannot start a line of its own in a log (a forged "loaded harness admin" record). A lone
surrogate, which no UTF-8 text holds, is escaped too: U+DC80..U+DCFF stand for a byte that was not UTF-8 (a file
name's, as ``os.fsdecode`` reads it) and are shown as that byte, ``\\xNN``, any other as ``\\uNNNN``; so what
``escaped`` returns can always be written as UTF-8 (found by a review: a path that is not UTF-8 crashed ``berm build``
and ``berm inspect`` as they printed it)."""

from __future__ import annotations

_BIDI_AND_SEPARATORS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_SURROGATES = {c: f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c < 0xDD00 else f"\\u{c:04x}" for c in range(0xD800, 0xE000)}
_CONTROL_OR_LINE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\u{c:04x}" for c in _BIDI_AND_SEPARATORS} | _SURROGATES
_CONTROL = {c: e for c, e in _CONTROL_OR_LINE.items() if chr(c) not in "\n\t"}


def escaped(text: str, *, lines: bool = True) -> str:
    """``text`` with its control characters escaped; newline and tab kept when ``lines``. A translation table, not
    a regular expression calling back per match: a 16 MiB line of NULs took 11.6 s and 1.3 GB that way."""
    return text.translate(_CONTROL if lines else _CONTROL_OR_LINE)
