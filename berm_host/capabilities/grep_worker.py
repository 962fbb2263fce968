"""``berm.fs.grep``'s regex matching, in a process of its own: it compiles a guest's pattern and searches texts.

It exists because the ``regex`` module bounds neither the wall time nor the memory of a search. Its ``timeout``
counts the CPU time of the whole process (on a loaded machine a 10 s budget lasted 62-72 s, and greps in several
threads used up each other's), and nothing bounds what a search takes (200 nested groups repeated by ``+`` took the
host process to 880 MB over a 64 KiB file). A worker can take neither from the host: the host (``fs_search``) kills
it when the grep's wall-clock deadline passes, and it limits its own address space to ``MEMORY_LIMIT`` first thing.

The host starts it as ``python -m berm_host.capabilities.grep_worker`` holding no descriptor but its pipes (stdin,
stdout; stderr is /dev/null). It answers each request with a reply, in order; each is a frame (``frame``: a JSON
header, then for a search the text's bytes). ``{"pattern": p}`` compiles the pattern of the searches after it, and
the reply is ``{}``; ``{"mode": m, "limit": n, "timeout": s}`` and a text searches it, and the reply is
``{"count": c, "lines": [...]}`` (in content mode the matching lines as ``number:line``: the host puts the path
first). Either reply may instead be ``{"error": text}`` (the guest's error reply), ``{"memory": true}`` (a
MemoryError) or ``{"timeout": true}``: the search's time budget, which the regex module counts in CPU time, is only
a backstop here, which ends a search whose host died. A worker exits at the end of its stdin: the host closed it,
or died.
"""

from __future__ import annotations

import contextlib
import json
import resource
import struct
import sys
import time
from typing import BinaryIO

import regex

#: The address space a worker may take. An allowed text needs the most when it is a 50 MiB file (the read cap) with
#: one astral character, which makes Python store each of its characters in 4 bytes: its bytes and its decoded text
#: (~250 MiB), with the interpreter and the regex module, peaked at 320 MiB searched with a simple pattern. That
#: leaves ~190 MiB for what a search takes (more with most texts: a 50 MiB ASCII file peaked at 120 MiB): the regex
#: module's backtracking stack, ~80 bytes a character (a pattern backtracking through a line of ~2 MiB), or a
#: pattern's captures (the 200 nested groups over 64 KiB: a MemoryError after ~1 s). The module stops its stack at
#: ~600 MiB on its own, and under 1 GiB those 200 groups would still take their 880 MB.
MEMORY_LIMIT = 512 << 20
#: The length of a frame's header (JSON), then of its data.
HEAD = struct.Struct("<II")
#: A matching line longer than this is cut (and ends with "…") in content mode.
LINE_CAP = 500


def frame(header: dict, data_size: int = 0) -> bytes:
    """A frame's start: its lengths and its header; its ``data_size`` bytes of data follow."""
    body = json.dumps(header).encode()
    return HEAD.pack(len(body), data_size) + body


def _read(stream: BinaryIO, size: int) -> bytes:
    """The next ``size`` bytes of ``stream``; EOFError when it ends first."""
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def _scan(body: str, rx: regex.Pattern, mode: str, limit: int, end: float) -> tuple[int, list[str]]:
    """Count the lines of ``body`` matching ``rx``, up to ``limit``; in ``content`` mode also render them as
    ``number:line``. A TimeoutError past ``end`` (``time.monotonic``), or once a search has taken the CPU time left."""
    count, shown = 0, []
    pos = last = 0
    lineno = 1
    # No line starts after a final newline (nor in an empty file): a match there, such as `^$`'s, found a line that
    # no file has (found by a review). The search still runs to the end, so a match may take the last line's newline.
    no_line_at_end = not body or body.endswith("\n")
    while pos <= len(body) and count < limit:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        m = rx.search(body, pos, timeout=left)
        if m is None or (m.start() == len(body) and no_line_at_end):
            break
        start = body.rfind("\n", 0, m.start()) + 1
        stop = body.find("\n", m.start())
        stop = len(body) if stop < 0 else stop
        lineno += body.count("\n", last, start)
        last = start
        count += 1
        if mode == "content":
            line = body[start:stop]
            shown.append(f"{lineno}:{line[:LINE_CAP] + '…' if len(line) > LINE_CAP else line}")
        pos = stop + 1
    return count, shown


def _compile(pattern: str) -> tuple[regex.Pattern | None, dict]:
    """The compiled pattern (None when it does not compile), and the reply."""
    try:  # uncached: a compiled pattern may take 27 MiB, and the module would keep hundreds
        return regex.compile(pattern, regex.MULTILINE | regex.VERSION0, cache_pattern=False), {}
    except (regex.error, ValueError, OverflowError, RuntimeError) as exc:
        return None, {"error": f"bad regex: {exc}"}


def _search(rx: regex.Pattern | None, text: str, header: dict) -> dict:
    """The reply to a search of ``text`` with ``rx``."""
    if rx is None:  # the pattern did not compile: the host, told so first, reads no further
        return {"error": "bad regex: it did not compile"}
    try:
        count, lines = _scan(text, rx, header["mode"], header["limit"], time.monotonic() + header["timeout"])
    except RuntimeError as exc:  # the module's own failure ("invalid RE code"): the pattern's, not the host's
        return {"error": f"bad regex: the regex module failed while matching it ({exc})"}
    return {"count": count, "lines": lines}


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer each frame of ``requests`` with one on ``replies``; EOFError when ``requests`` ends."""
    rx = None
    while True:
        header_size, data_size = HEAD.unpack(_read(requests, HEAD.size))
        header = json.loads(_read(requests, header_size))
        try:
            if "pattern" in header:
                rx = None  # not the last pattern's, should compiling this one raise MemoryError
                rx, reply = _compile(header["pattern"])
            else:  # the bytes are gone once decoded, the text once searched
                reply = _search(rx, _read(requests, data_size).decode("utf-8", "replace"), header)
        except MemoryError:
            reply = {"memory": True}
        except TimeoutError:
            reply = {"timeout": True}
        replies.write(frame(reply))
        replies.flush()


def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MEMORY_LIMIT)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with contextlib.suppress(EOFError, BrokenPipeError):  # the host closed our stdin, or died
        serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
