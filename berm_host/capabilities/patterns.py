"""Glob patterns over '/'-separated relative paths, compiled to RE2 regular expressions.

Syntax: ``*`` (within one component), ``?``, ``[abc]``/``[!abc]``, ``{a,b}`` (within one component), ``\\x``
(a literal x), and ``**`` as a whole component (any number of components, including none). (``.gitignore`` rules
are git's wildmatch: gitignore.py translates them.)

Why RE2 and not the ``regex`` module: patterns come from guests, and a backtracking matcher takes time exponential
in the pattern. Found by a hostile review: ``*a`` ×200 then ``b`` took the ``regex`` module 1.7 s of CPU for each
file name of 250 ``a``s, and its timeout counts CPU time, so on a starved machine a glob with a 2 s budget held the
host thread 5.4 s (67.8 s at nice 10). RE2 matches in time linear in the path (times the pattern, at worst), so
one match costs microseconds whatever the pattern, and the walk's checks of the deadline bound the whole glob.
Paths are matched as UTF-8 bytes, a name's undecodable bytes (lone surrogates, from ``surrogateescape``) encoded
as such: RE2 reads each as one character, as ``?`` should.
"""

from __future__ import annotations

import functools

from berm_host.linker import CapabilityError

MAX_PATTERN = 1024


@functools.cache
def re2_module(*, latin1: bool = False):
    """The re2 module and the options patterns compile with, imported at the first use (5 ms a process start need
    not pay: ``berm call`` links fs without globbing). ``latin1``: patterns and texts are bytes, each byte one
    character (gitignore.py matches wildmatch's way, on a name's bytes)."""
    import re2

    options = re2.Options()
    options.dot_nl = True  # "**" spans any characters, a newline in a name included
    options.log_errors = False  # RE2 would log a pattern's errors (and its DFA running out of memory) to stderr
    if latin1:
        options.encoding = re2.Options.Encoding.LATIN1
    return re2, options


def _class(seg: str, i: int) -> tuple[str, int] | None:
    """The character class starting at ``seg[i] == '['``: (regex, index after it), or None when unclosed."""
    j = i + 1
    negate = j < len(seg) and seg[j] in "!^"
    if negate:
        j += 1
    start = j
    if j < len(seg) and seg[j] == "]":
        j += 1
    while j < len(seg) and seg[j] != "]":
        j += 1
    if j >= len(seg):
        return None
    # a "]" first in the class is one of its characters (found by a review: "[!]a]" became "[^/]a]", whose "]"
    # closed the class)
    return ("[^/" if negate else "[") + _class_body(seg[start:j]) + "]", j + 1


def _class_body(body: str) -> str:
    """A class's characters and ranges as RE2 reads them, each character escaped, and '/' left out of every range:
    the separator is no character of a component, and a range such as ``.-0`` holds it (found by a review:
    ``a[.-0]b`` matched ``a/b``). A range that runs backwards stays one, for RE2 to refuse."""
    items, k = [], 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            lo, hi = body[k], body[k + 2]
            k += 3
            if lo <= "/" <= hi:  # the two ranges either side of it, either maybe empty
                items += [(a, b) for a, b in ((lo, "."), ("0", hi)) if a <= b]
            else:
                items.append((lo, hi))
        else:
            items.append((body[k], body[k]))
            k += 1
    return "".join(_class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}" for lo, hi in items)


def _class_char(c: str) -> str:
    return "\\" + c if c in "\\[]^-" else c


def _braces(seg: str, i: int) -> tuple[list[str], int] | None:
    """The alternatives of the ``{a,b}`` group at ``seg[i] == '{'`` (not nested), or None when unclosed."""
    j = seg.find("}", i)
    if j < 0:
        return None
    return seg[i + 1:j].split(","), j + 1


def _segment(seg: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            while i < len(seg) and seg[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < len(seg):
            i += 1
            out.append(re2_module()[0].escape(seg[i]))
        elif c == "[" and (cls := _class(seg, i)):
            out.append(cls[0])
            i = cls[1]
            continue
        elif c == "{" and (alts := _braces(seg, i)):
            out.append("(?:" + "|".join(_segment(a) for a in alts[0]) + ")")
            i = alts[1]
            continue
        else:
            out.append(re2_module()[0].escape(c))
        i += 1
    return "".join(out)


def glob_source(pattern: str) -> str:
    """The regex source matching exactly the relative paths ``pattern`` matches."""
    parts = pattern.split("/")
    out: list[str] = []
    for idx, seg in enumerate(parts):
        last = idx == len(parts) - 1
        if seg == "**":
            out.append(".*" if last else "(?:.*/)?")
        else:
            out.append(_segment(seg) + ("" if last else "/"))
    return "".join(out)


def literal_prefix(pattern: str) -> tuple[str, str]:
    """Split off the leading components without wildcards: ``("src/a", "**/*.c")`` for ``src/a/**/*.c``. Lets a
    walk start where the pattern can first differ instead of at the root."""
    parts = pattern.split("/")
    n = 0
    while n < len(parts) - 1 and parts[n] and not any(ch in parts[n] for ch in "*?[{\\"):
        n += 1
    return "/".join(parts[:n]), "/".join(parts[n:])


class Glob:
    """A compiled glob. ``basename`` (no '/' in the pattern) makes it match a path's last component, the way
    ``.gitignore`` and ``--include`` patterns do."""

    def __init__(self, pattern: str, *, basename_if_no_slash: bool = False):
        if len(pattern) > MAX_PATTERN:
            raise CapabilityError(f"glob pattern is longer than {MAX_PATTERN} characters")
        if "\0" in pattern:
            raise CapabilityError("glob pattern contains a NUL byte")
        self.pattern = pattern
        self.basename = basename_if_no_slash and "/" not in pattern
        re2, options = re2_module()
        try:
            self._rx = re2.compile(_utf8(glob_source(pattern)), options)
        except re2.error as exc:  # e.g. a range like [z-a]
            reason = exc.args[0].decode("utf-8", "replace")  # RE2's message, as bytes
            raise CapabilityError(f"bad glob pattern {pattern[:80]!r}: {reason}") from None

    def match(self, path: str) -> bool:
        if self.basename:
            path = path.rsplit("/", 1)[-1]
        return self._rx.fullmatch(_utf8(path)) is not None


def _utf8(text: str) -> bytes:
    """``text`` as RE2 reads it: UTF-8, a lone surrogate (an undecodable byte of a file name) one character."""
    return text.encode("utf-8", "surrogatepass")
