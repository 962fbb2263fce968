"""``berm.fs.glob`` and ``berm.fs.grep``: listing and searching files under a root.

Both walk with directory descriptors, never following a symlink (``dirwalk``: a subdirectory swapped for a
symlink, a FIFO or a file after its parent was listed is skipped, never opened), skip ``.git``, honour a per-call
time budget and cap what they return. Output is text, one root-relative path (or match) per line; when a cap, the
time budget or the depth a path may reach (``MAX_DEPTH``: deeper directories are not walked) cut it short, what was
found so far is returned and a last line starting with ``[truncated`` says why. A path is shown on one line whatever
its name holds: its control characters (a newline among them), bidirectional controls and line separators are
escaped as ``berm_abi.text.escaped`` writes them (``\\x0a``, ``\\u202e``), so is a byte that is not UTF-8
(``\\xff``), a backslash is doubled and a ``[`` that
starts it is shown as ``\\x5b``, so only the marker's line starts with ``[`` (such a path is not the file's name as
written; a matching line in grep's content mode is shown as it is). An absolute glob pattern is the root's (the
path does not apply), and one whose literal leading components lead nowhere matches nothing. Grep skips binary
files (a NUL byte in the first 8 KiB, read before the rest of the file), files over the read cap and symlinks, and
honours ``.gitignore`` files from the root down. Its patterns are the ``regex`` module's (VERSION0, multiline), less
what could hide their cost or crash the module: a pattern too large once its counted repeats are written out
(``MAX_UNROLLED``), the inline flags for verbose mode, versions and full case folding, recursion and subroutine
calls, and fuzzy matching are refused.

The pattern is compiled and the texts searched in a worker process (``grep_worker``, which says why), one per grep
at a time, kept idle for the next grep: the host walks, reads and filters the files and sends the worker their
bytes, kills it (SIGKILL) when the grep's wall-clock deadline passes, and the worker limits its own address space.
A pattern that needs more than that gets the memory note below, or an error reply if the worker dies of it; a
worker that dies of anything is an error reply, and the next grep starts another.

A backtracking pattern grows the ``regex`` module's stack to ~80 bytes per character of the text searched (up to a
worker's limit, ``grep_worker.MEMORY_LIMIT``, where it gives up with a MemoryError), so the searches of large files
(``BIG_TEXT`` and up) share one process-wide budget of text (``SEARCH_BUDGET``): however many greps run at once,
their workers together take about what one such search would. A search waits for its share within its time budget,
and a file larger than the whole budget is searched alone. The price: a pattern that backtracks for its whole time
budget holds its share that long, and other greps of large files wait meanwhile (and may time out).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import heapq
import json
import os
import select
import stat
import string
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import regex

from berm_abi.text import escaped
from berm_host.linker import CapabilityError, CapabilityFn

from . import dirwalk, grep_worker
from ._request import Deadline, capability, fields, naming, text
from .fs import READ_CAP, read_upto
from .gitignore import MAX_IGNORE_FILE, Ignore
from .patterns import MAX_PATTERN, Glob, literal_prefix
from .paths import MAX_DEPTH, Resolved, Root

#: At most this many paths (glob, grep files/count) or matching lines (grep content) per reply.
RESULT_CAP = 1000
#: At most this many bytes of them: a path may be 128 directories of 255 bytes, each byte shown as 4 (``\xNN``), and
#: RESULT_CAP of those made a glob's reply 130 MB and its host 430 MB (found by a review).
REPLY_BYTES = 1 << 20
#: A file whose first this many bytes hold a NUL is binary: grep skips it, having read only those.
BINARY_PROBE = 8192
MODES = ("files", "content", "count")
SEARCH_TIMEOUT = 10.0
#: How large a grep pattern may be once written out (``_unrolled_size``: its text, each counted repeat's item written
#: out n + 1 times and a ``+``'s twice, a group's parenthesis counting GROUP_WEIGHT and an escape ESCAPE_WEIGHT). The
#: regex module compiles in C with the GIL held, before any time budget applies, and copies a repeated item: its
#: smaller count + 1 times (this counts the larger), a ``+``'s twice, nested ones multiplied. Found by a hostile
#: review, when the counts' product was the only check: ``(){30000}`` froze the whole host process for 26.5 s (a run
#: of empty groups compiles in quadratic time: ``(){100000}`` > 290 s), ``(?:(a)``×300``){100000}`` took 16.6 GB,
#: and nested ``+`` need no count (``(?:`` ×18 ``a`` ``)+`` ×18: 165 MB). Measured with regex 2026.5.9, compiling
#: in child processes ~21,000 patterns scaled to this limit (~9,300 random shapes of groups, classes, escapes,
#: alternations, lookarounds, conditionals, inline flags and nested repeats; all 10,752 of an item in a group in a
#: sequence, 14 items, 6 kinds of group, 8 repeats inside and out; ~1,000 of families of every kind of item): the
#: worst accepted took 0.1 s and 27 MiB (``\R{16380}``: ~430 bytes a unit; a plain character takes ~300).
MAX_UNROLLED = 65_536
#: What a group's opening parenthesis counts for: a run of 2,000 empty groups compiles in 0.04 s, of 4,000 in 0.16 s,
#: of 8,000 in 0.67 s; this keeps a run within ~2,000.
GROUP_WEIGHT = 32
#: What an escape counts for: ``\R`` and ``\X`` compile to ~1.7 and ~1.4 KB, four times a character.
ESCAPE_WEIGHT = 4
#: Texts of at least this many bytes are searched within SEARCH_BUDGET (a smaller one's stack stays under ~20 MiB).
BIG_TEXT = 256 * 1024
#: How many bytes of text the searches of large files may hold at once, across every grep (and worker) of the
#: process: with the regex module's ~80 bytes of stack per character, ~320 MiB at most (a single larger file takes
#: the whole budget, and its search stops at its worker's grep_worker.MEMORY_LIMIT).
SEARCH_BUDGET = 4 * 1024 * 1024
#: How many idle grep workers the process keeps for the greps to come (more run while more greps do: one each).
IDLE_WORKERS = 2
#: How a grep worker is started: a new interpreter, never a fork of this multithreaded one; -P: not importing from
#: the working directory, which may be a root a guest writes to (its regex.py would run in the worker).
WORKER = [sys.executable, "-P", "-m", grep_worker.__name__]
#: How many requests a grep writes to its worker at once (or fewer, as many as BIG_TEXT bytes, or when it needs a
#: result): each write that finds the worker waiting wakes it, which costs a loaded machine more than a small search.
BATCH = 16
#: How many searches a grep may have sent its worker whose results it has not read.
PIPELINE = 2 * BATCH
#: The largest reply a worker may send: RESULT_CAP + 1 lines of grep_worker.LINE_CAP characters, each a 6-byte
#: escape in JSON, take ~3 MB.
REPLY_CAP = 16 << 20
#: A brace pair that is a counted repeat where it stands (``{,}`` and ``{}`` too: one counts as ``*``, the other is
#: text, and counting them only ever overestimates).
_COUNTED = regex.compile(r"\{([0-9]*)(?:,([0-9]*))?\}")
#: Inline flags (``(?i)``) and a comment (``(?#…)``, to its first unescaped ``)``, as the regex module reads it): no
#: item, so a count after one repeats the item before it (``(?:ab)(?#c){5}`` is ``(?:ab){5}``).
_NO_ITEM = regex.compile(r"\(\?(?:[\w^-]*|#(?:\\.|[^\\)])*)\)", regex.DOTALL)
#: What the regex module reads as a POSIX class's name (``[[:alpha:]]``) and, after ``:`` or ``=``, its value.
_POSIX_NAME = frozenset(string.ascii_letters + string.digits + " &_-.")
_POSIX_VALUE = _POSIX_NAME | {"/"}
#: An inline flag group, ``(?flags)`` or ``(?flags:…)``, whose parenthesis is not escaped (wherever it is: inside a
#: class it is only text, and refusing it there too only ever refuses more). Verbose mode (``x``) lets whitespace
#: and comments into a counted repeat (``(?x)a{1 000000}``, ``(?x)a{1#}`` newline ``000000}``), out of
#: ``_COUNTED``'s sight; a version flag (``V1``) contradicts the host's ``VERSION0`` (a KeyError inside the module);
#: full case folding (``f``) compiles a class to what its text does not show (``(?fi)[a\w]``: ~29 KB, where
#: ``(?i)[a\w]`` takes ~600 bytes; 170 of them alternated, with no repeat, took 0.44 s to compile).
_FLAG_GROUP = regex.compile(r"(?<!\\)(?:\\\\)*\(\?([\w^-]*)[:)]")
#: The regex module's recursion and subroutine calls (``(?R)``, ``(?1)``, ``(?+1)``, ``(?&name)``, ``(?P>name)``)
#: and fuzzy matching (``{e<=1}``, ``{i,d}``, ``{2i+1s<=3}``: braces holding only constraint characters and one of
#: e, i, d, s). Both are refused wherever they appear (escaped or in a class too: that only refuses more). Found by a
#: hostile review: together they crashed the host process (``(?R){e<=1}``: a SIGSEGV inside the module, on any
#: text), recursion alone took ~700 MiB of the module's stack on a 6-byte file (``(?R)*``, past the budget that
#: assumes a small text stays small), and fuzzy matching raised RuntimeError while matching (``2\G{e<=1}~~``).
_REFUSED = (
    (regex.compile(r"\(\?(?:R|[+-]?\d|&|P>)"), "recursion or a subroutine call ((?R), (?1), (?&name), (?P>name))"),
    (regex.compile(r"\{[\d\s<=>+,eids]*[eids][\d\s<=>+,eids]*\}"), "fuzzy matching ({e<=1}, {i,d}, …)"),
)


@dataclass(frozen=True)
class Entry:
    rel: str  # root-relative path
    sub: str  # path relative to the walk's base
    dir_fd: int  # descriptor of the directory holding it (valid while the walk is at this directory)
    name: str
    st: os.stat_result  # lstat


class _Budget:
    """A count of bytes that threads take shares of and give back, waiting for their share within a Deadline."""

    def __init__(self, total: int):
        self.total = total
        self.free = total
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def share(self, n: int, deadline: Deadline) -> Iterator[None]:
        """Hold ``n`` bytes of the budget (all of it when ``n`` is larger) for the ``with`` block; a TimeoutError
        when ``deadline`` passes first."""
        n = min(n, self.total)
        with self._cond:
            while self.free < n:
                self._cond.wait(deadline.check())
            self.free -= n
        try:
            yield
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()


_budget = _Budget(SEARCH_BUDGET)


class _Worker:
    """A grep_worker process, lent to one grep at a time. It answers requests in the order sent, and a grep sends
    texts in batches, before it has read the results of the last: a round trip per file took longer than most
    searches (a grep of 1,000 small files took 4.4 times as long as searching them in the host had, 2.2 times now).
    Every write and read is bounded by the grep's Deadline, past which the worker is killed (SIGKILL): the regex
    module's own time budget counts CPU time, not the clock's. A worker may be lent again once it owes no reply,
    unless it ran out of memory."""

    def __init__(self) -> None:
        # close_fds: the worker holds none of the host's descriptors (a granted root's directories among them), only
        # its pipes; its stderr is not the host's either.
        try:  # its failure is no path's (berm.fs.grep names its path in the OS errors of the rest)
            self.proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, close_fds=True, bufsize=0)
        except OSError as exc:
            raise CapabilityError(f"cannot start a search worker: {exc.strerror or exc}") from None
        self._stdin, self._stdout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._stdin, False)
        os.set_blocking(self._stdout, False)
        self._writing, self._reading = select.poll(), select.poll()
        self._writing.register(self._stdin, select.POLLOUT)
        self._writing.register(self._stdout, select.POLLIN)  # the worker may be waiting to write a reply
        self._reading.register(self._stdout, select.POLLIN)
        self._outbox: collections.deque[memoryview] = collections.deque()  # requests not written yet (or in part)
        self._outbox_requests = self._outbox_bytes = 0
        self._inbox = bytearray()  # what it has written that is not a whole reply yet
        self._replies: collections.deque[dict] = collections.deque()
        self.due = 0  # replies it owes for the requests sent, read or not
        self._compiling = False  # the reply to compile is not read yet
        self._spoiled = False  # killed, or out of memory

    @property
    def reusable(self) -> bool:
        return not (self._spoiled or self.due)

    def compile(self, pattern: str) -> None:
        """Have the worker compile ``pattern`` for the searches after, written with the first of them (a round trip
        less); ``compiled`` tells how it went."""
        self._queue({"pattern": pattern}, b"")
        self._compiling = True

    def compiled(self, deadline: Deadline) -> None:
        """A CapabilityError when the pattern did not compile (once, and before any result)."""
        if self._compiling:
            self._compiling = False
            if "memory" in self._reply(deadline):
                raise CapabilityError("bad regex: compiling it took too much memory (use smaller counts)")

    def search(self, data: bytes, mode: str, limit: int, deadline: Deadline) -> None:
        """Send ``data`` to be searched for up to ``limit`` matching lines (written in a BATCH); ``result`` tells
        how it went."""
        self._queue({"mode": mode, "limit": limit, "timeout": deadline.check()}, data)
        if self._outbox_requests >= BATCH or self._outbox_bytes >= BIG_TEXT:
            self._flush(deadline)

    def has_result(self) -> bool:
        """Whether the worker has finished a search whose result is not read yet (looked at without waiting)."""
        if not self._replies and self._reading.poll(0):
            with self._failing():
                self._read()
        return bool(self._replies)

    def result(self, deadline: Deadline) -> tuple[int, list[str]]:
        """How the oldest search not read yet went: how many lines matched, and in content mode those lines as
        ``number:line``. A MemoryError when it ran out of the worker's memory."""
        self.compiled(deadline)
        reply = self._reply(deadline)
        if "memory" in reply:
            raise MemoryError
        return reply["count"], reply["lines"]

    def _queue(self, request: dict, data: bytes) -> None:
        self._outbox += [memoryview(grep_worker.frame(request, len(data))), memoryview(data)]
        self._outbox_requests += 1
        self._outbox_bytes += len(data)
        self.due += 1

    def _flush(self, deadline: Deadline) -> None:
        """Write the requests queued, in one write when the pipe takes them."""
        if not self._outbox:
            return
        with self._failing():
            while self._outbox:
                self._wait(self._writing, deadline)
                with contextlib.suppress(BlockingIOError):
                    sent = os.writev(self._stdin, self._outbox)
                    while self._outbox and sent >= len(self._outbox[0]):
                        sent -= len(self._outbox.popleft())
                    if sent:
                        self._outbox[0] = self._outbox[0][sent:]
        self._outbox_requests = self._outbox_bytes = 0

    def _reply(self, deadline: Deadline) -> dict:
        self._flush(deadline)
        with self._failing():
            while not self._replies:
                self._wait(self._reading, deadline)
        reply = self._replies.popleft()
        self.due -= 1
        self._spoiled |= "memory" in reply
        if "error" in reply:
            raise CapabilityError(reply["error"])
        if "timeout" in reply:
            raise TimeoutError
        return reply

    def _wait(self, poll: select.poll, deadline: Deadline) -> None:
        while not poll.poll(deadline.check() * 1000):
            pass
        self._read()

    def _read(self) -> None:
        """Read what the worker has written, without waiting, and take the whole replies from it."""
        with contextlib.suppress(BlockingIOError):
            if not (chunk := os.read(self._stdout, 1 << 16)):
                raise EOFError
            self._inbox += chunk
        while len(self._inbox) >= grep_worker.HEAD.size:
            size, data_size = grep_worker.HEAD.unpack_from(self._inbox)
            if size > REPLY_CAP or data_size:
                raise ValueError("not a reply")
            end = grep_worker.HEAD.size + size
            if len(self._inbox) < end:
                break
            self._replies.append(json.loads(self._inbox[grep_worker.HEAD.size:end]))
            del self._inbox[:end]

    @contextlib.contextmanager
    def _failing(self) -> Iterator[None]:
        """Kill the worker when the block fails: past the deadline (a TimeoutError), or when the worker ended or
        wrote what is not a reply (a CapabilityError)."""
        try:
            yield
        except TimeoutError:
            self.stop()
            raise
        except (OSError, EOFError, ValueError):  # a broken pipe, the end of its output, or not a reply
            self.stop()
            code = self.proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            raise CapabilityError(f"the process matching the regex ended ({how}): the pattern may have needed more "
                                  f"memory than grep allows ({grep_worker.MEMORY_LIMIT >> 20} MiB)") from None

    def kill(self) -> None:
        """Kill the worker (SIGKILL) and reap it."""
        self._spoiled = True
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """Kill the worker, reap it and close its pipes."""
        self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


class _Workers:
    """This process's grep workers: each lent to one grep at a time, then kept idle for the next (up to
    IDLE_WORKERS). When none is idle (the last one was killed, say), another is started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()  # idle and lent

    @contextlib.contextmanager
    def lend(self) -> Iterator[_Worker]:
        """A worker for the ``with`` block, idle or new; kept afterwards if it may be lent again, else stopped."""
        worker = self._take()
        try:
            yield worker
        finally:
            with self._lock:
                keep = worker.reusable and len(self._idle) < IDLE_WORKERS
                if keep:
                    self._idle.append(worker)
            if not keep:
                self._drop(worker)

    def _take(self) -> _Worker:
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                break
            if worker.proc.poll() is None:
                return worker
            self._drop(worker)  # it ended while idle
        worker = _Worker()
        with self._lock:
            self._live.add(worker)
        return worker

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._live.discard(worker)
        worker.stop()

    def close(self) -> None:
        """Stop every worker; kill lent ones too (their greps get an error reply, and close their pipes)."""
        with self._lock:
            idle, self._idle = self._idle, []
            lent = self._live.difference(idle)
            self._live.clear()
        for worker in idle:
            worker.stop()
        for worker in lent:
            worker.kill()

    def forget(self) -> None:
        """Close this process's copies of the workers' pipes, in a forked child, leaving the workers to the parent."""
        for worker in list(self._live):
            worker.proc.stdin.close()
            worker.proc.stdout.close()


_workers = _Workers()
atexit.register(lambda: _workers.close())  # whichever pool is this process's then (a forked child has its own)


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: shares other threads held would never come back, and the
    workers are the parent's (its children, maybe lent to its greps)."""
    global _budget, _workers
    _budget = _Budget(SEARCH_BUDGET)
    _workers.forget()
    _workers = _Workers()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _join(a: str, b: str) -> str:
    return b if a in ("", ".") else a if not b else f"{a}/{b}"


def _read_small(dir_fd: int, name: str, cap: int, *, text_only: bool = False) -> bytes | None:
    """A regular file's first ``cap`` bytes, not following a symlink; None when it is not one (or, with
    ``text_only``, when it is binary: see ``_read_text``)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _read_text(fd, cap) if text_only else read_upto(fd, cap)
    finally:
        os.close(fd)


def _read_text(fd: int, cap: int) -> bytes | None:
    """The first ``cap`` bytes of the open file ``fd``; None, having read only its first BINARY_PROBE bytes, when
    those hold a NUL. Found by a hostile review: grep read every file under the read cap whole before looking at its
    first 8 KiB, and a tree of 50 MiB binary files was read through to the end."""
    head = read_upto(fd, min(BINARY_PROBE, cap))
    if b"\0" in head:
        return None
    if len(head) < BINARY_PROBE or len(head) >= cap:  # the whole file, or all that was asked for
        return head
    return head + read_upto(fd, cap - len(head))


def _ignore_file(dir_fd: int) -> str:
    """A directory's .gitignore, bytes that are not UTF-8 kept as they are (surrogateescape), as the names they
    match are: replaced, a rule naming a Latin-1 file never matched it (found by a review)."""
    data = _read_small(dir_fd, ".gitignore", MAX_IGNORE_FILE)
    return data.decode("utf-8", "surrogateescape") if data else ""


def _ancestor_ignores(r: Resolved, deadline: Deadline) -> Ignore:
    """The .gitignore rules of the root and every directory down to (not including) the directory ``r``, read
    through the descriptors its resolution holds. Found by a review: each was opened again by its real path from the
    root, which refused one longer than a guest path may be (reached through links), and raised UnicodeEncodeError
    (a host bug) for one holding a name that is not UTF-8 (a link's target)."""
    ignore = Ignore()
    parts = [] if r.rel == "." else r.rel.split("/")
    for n, fd in enumerate(r.path_fds[:-1]):
        ignore = ignore.extended(_ignore_file(fd), "/".join(parts[:n]), deadline)
    return ignore


def walk(root: Root, base: str, deadline: Deadline, *, gitignore: bool,
         too_deep: list[str] | None = None) -> Iterator[Entry]:
    """Every non-directory entry under directory ``base`` (sorted per directory), pruning ``.git`` and, with
    ``gitignore``, what the .gitignore files in force exclude. A directory as deep as a path may reach (MAX_DEPTH)
    is listed but not walked below: its root-relative path is added to ``too_deep``. A subdirectory swapped for
    something else after its parent was listed is skipped (``dirwalk``)."""
    with root.open_dir(base) as r:
        ignores = {"": _ancestor_ignores(r, deadline)} if gitignore else {}
        for sub_dir, dirnames, leaves, dfd in dirwalk.walk(r.dir_fd, deadline):
            rel_dir = _join(r.rel, sub_dir)
            ignore = None
            if gitignore:
                ignore = ignores.pop(sub_dir).extended(_ignore_file(dfd), "" if rel_dir == "." else rel_dir,
                                                       deadline)
            dirnames[:] = [d for d in dirnames if d != ".git"
                           and not (ignore and ignore.ignored(_join(rel_dir, d), True, deadline))]
            if dirnames and rel_dir != "." and rel_dir.count("/") + 1 >= MAX_DEPTH:  # as deep as a path may reach
                if too_deep is not None:
                    too_deep.append(rel_dir)
                dirnames.clear()
            if ignore is not None:
                for d in dirnames:
                    ignores[_join(sub_dir, d)] = ignore
            for leaf in leaves:
                # Every entry, yielded or skipped: one directory of many files took a 1 s grep past 34 s and a
                # 0.2 s glob past 3 s, 22 s on a busy machine (two reviews).
                deadline.check()
                rel = _join(rel_dir, leaf.name)
                if ignore and ignore.ignored(rel, False, deadline):
                    continue
                try:
                    st = leaf.stat(follow_symlinks=False)
                except OSError:
                    continue
                yield Entry(rel, _join(sub_dir, leaf.name), dfd, leaf.name, st)


def _shown(rel: str) -> str:
    """A root-relative path as a listing shows it, on one line of its own (see the module docstring). A byte of a
    name that is not UTF-8 (os.scandir reads names with surrogateescape) is shown as ``\\xNN`` by ``escaped``: the
    reply stays UTF-8, as ABI.md has every string (found by a review: such names went out as their raw bytes)."""
    shown = escaped(rel.replace("\\", "\\\\"), lines=False)
    return "\\x5b" + shown[1:] if shown.startswith("[") else shown


def _render(lines: Iterable[str], note: str | None) -> bytes:
    """The reply: ``lines`` (made as they are taken) up to REPLY_BYTES, and a last line for ``note`` and a cut."""
    kept, size = [], 0
    for line in lines:
        size += len(line.encode("utf-8")) + 1  # a name's bytes that are not UTF-8 are escaped (_shown)
        if size > REPLY_BYTES:
            note = _notes(note, f"the reply is cut at {REPLY_BYTES >> 10} KiB, after {len(kept)} lines")
            break
        kept.append(line)
    if note:
        kept.append(f"[truncated: {note}]")
    return "\n".join(kept).encode("utf-8")


def _notes(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None


def _depth_note(too_deep: list[str]) -> str | None:
    return f"directories more than {MAX_DEPTH} levels deep were not walked" if too_deep else None


def _timed_out(deadline: Deadline) -> str:
    return f"timed out after {deadline.seconds:g} s, the results so far"


def glob(root: Root, pattern: str, base: str, deadline: Deadline, cap: int = RESULT_CAP) -> bytes:
    """Files under ``base`` whose base-relative path matches ``pattern``, as root-relative paths, newest first; an
    absolute pattern is the root's (``base`` does not apply), and one whose literal prefix leads nowhere matches
    nothing. Past the time budget, the newest of those found so far, marked."""
    if not pattern:
        raise CapabilityError("empty glob pattern")
    if pattern.startswith("/"):
        pattern = "/".join(root.components(pattern)).lstrip("/")
        base = ""
    prefix, rest = literal_prefix(pattern)
    matcher = Glob(rest)
    newest: list[tuple[int, str]] = []  # a min-heap of (mtime, path): the newest `cap` matches so far
    total = 0
    note = None
    too_deep: list[str] = []
    try:
        for e in walk(root, _join(base or ".", prefix) or ".", deadline, gitignore=False, too_deep=too_deep):
            if matcher.match(e.sub):
                total += 1
                (heapq.heappush if len(newest) < cap else heapq.heappushpop)(newest, (e.st.st_mtime_ns, e.rel))
    except TimeoutError:
        note = _timed_out(deadline)
    except CapabilityError:
        if not prefix or not _leads_nowhere(root, base, prefix, deadline):
            raise
    if note is None and total > cap:
        note = f"{total} matches, showing the newest {cap}"
    return _render((_shown(rel) for _, rel in sorted(newest, key=lambda t: (-t[0], t[1]))),
                   _notes(note, _depth_note(too_deep)))


def _leads_nowhere(root: Root, base: str, prefix: str, deadline: Deadline) -> bool:
    """Whether a component of ``prefix`` (literal glob components below directory ``base``) does not exist or is
    not a directory, as a wildcard there would match nothing. An error when ``base`` is no directory. Each prefix
    is resolved from the root, so the deadline is checked before each (a prefix of 900 "a/.." took a 0.5 s glob
    past 3 s: found by a review)."""
    path = base or "."
    with root.open_dir(path):
        pass
    for comp in prefix.split("/"):
        deadline.check()
        path = _join(path, comp)
        with root.resolve(path) as r:
            if r.leaf is None:
                continue
            try:
                if not stat.S_ISDIR(os.stat(r.leaf, dir_fd=r.dir_fd, follow_symlinks=False).st_mode):
                    return True
            except FileNotFoundError:
                return True
    return False


def _files_to_search(root: Root, base: str, include: Glob | None, deadline: Deadline,
                     too_deep: list[str]) -> Iterator[tuple[Entry, bytes]]:
    with root.resolve(base) as r:
        leaf = os.stat(r.leaf, dir_fd=r.dir_fd, follow_symlinks=False) if r.leaf is not None else None
        single = leaf is not None and not stat.S_ISDIR(leaf.st_mode)
        name = r.rel.rsplit("/", 1)[-1]
    if single:
        if include is not None and not include.match(name):  # relative to the path searched: its name
            return
        fd, rel = root.open_file(base)
        try:
            st = os.fstat(fd)
            data = _read_text(fd, READ_CAP + 1) if st.st_size <= READ_CAP else None
        finally:
            os.close(fd)
        name = rel.rsplit("/", 1)[-1]
        if data is not None:
            yield Entry(rel, name, -1, name, st), data
        return
    for e in walk(root, base or ".", deadline, gitignore=True, too_deep=too_deep):
        if not stat.S_ISREG(e.st.st_mode) or e.st.st_size > READ_CAP:
            continue
        if include is not None and not include.match(e.sub):
            continue
        data = _read_small(e.dir_fd, e.name, READ_CAP + 1, text_only=True)
        if data is not None:
            yield e, data


def _skip(pattern: str, i: int, chars: frozenset[str]) -> int:
    while i < len(pattern) and pattern[i] in chars:
        i += 1
    return i


def _posix_class_end(pattern: str, i: int) -> int | None:
    """Where the POSIX class (``[:alpha:]``, ``[:^digit:]``, ``[:script=latin:]``) at ``pattern[i]`` ends, read as
    the regex module reads one; None when it reads ``[`` there as a character."""
    k = _skip(pattern, i + 2 + pattern.startswith("^", i + 2), _POSIX_NAME)
    if pattern[k:k + 1] in (":", "="):
        value = _skip(pattern, k + 1, _POSIX_VALUE)
        if pattern[k + 1:value].strip():
            k = value
    return k + 2 if pattern.startswith(":]", k) else None


def _class_end(pattern: str, i: int) -> int:
    """Where the character class at ``pattern[i] == "["`` ends, read as the regex module (VERSION0) reads one: a
    ``]`` first (after any ``^``) is a member, a backslash escapes the next character, a POSIX class is one member.
    A class read too short would let what follows it in (a ``(`` there would shrink what a count repeats)."""
    j = i + 1 + pattern.startswith("^", i + 1)
    first = True
    while j < len(pattern):
        if pattern[j] == "]" and not first:
            return j + 1
        first = False
        if pattern[j] == "\\":
            j += 2
        elif pattern.startswith("[:", j) and (end := _posix_class_end(pattern, j)):
            j = end
        else:
            j += 1
    return len(pattern)


def _unrolled_size(pattern: str) -> int:
    """An overestimate of how large the regex module compiles ``pattern`` to, in units of about one character of
    text: its text with each counted repeat's item written out n + 1 times (n the repeat's larger count) and a
    ``+``'s twice, as the module copies them, a group's parenthesis counting GROUP_WEIGHT and an escape
    ESCAPE_WEIGHT. Read as the module reads a pattern (classes, escapes, inline flags and comments, which are no
    item); it stops once past MAX_UNROLLED (each group's size so far is part of the whole)."""
    levels = [0]  # the size so far of each group open here, the pattern's own first
    last = 0  # the size of the item a count here would repeat
    i = 0
    while i < len(pattern) and levels[-1] <= MAX_UNROLLED:
        c = pattern[i]
        m = _COUNTED.match(pattern, i) if c == "{" else None
        if m or c in "*+?":  # a repeat of the last item
            times = max([1, *(int(g) for g in m.groups() if g)]) + 1 if m else 2 if c == "+" else 1
            end = m.end() if m else i + 1
            grown = last * times + end - i
            levels[-1] += grown - last
            last, i = grown, end
            continue
        if c == "(":
            if m := _NO_ITEM.match(pattern, i):
                levels[-1] += m.end() - i
                i = m.end()
            else:
                levels.append(GROUP_WEIGHT)
                i += 1
            continue
        if c == ")" and len(levels) > 1:
            size, i = levels.pop() + 1, i + 1
        elif c == "\\":
            size, i = ESCAPE_WEIGHT, i + 2
        elif c == "[":
            end = _class_end(pattern, i)
            size, i = end - i, end
        else:
            size, i = 1, i + 1
        levels[-1] += size
        last = size
    return sum(levels)


def _check_pattern(pattern: str) -> None:
    """Refuse a pattern that uses what grep leaves out (``_REFUSED``), that turns on a flag that would hide its cost
    from this check (``_FLAG_GROUP``), or that would compile to too much (``_unrolled_size``)."""
    for construct, what in _REFUSED:
        if construct.search(pattern):
            raise CapabilityError(f"bad regex: grep does not support {what}")
    for m in _FLAG_GROUP.finditer(pattern):
        on = m.group(1).split("-", 1)[0]
        if "x" in on or "V" in on:
            raise CapabilityError(f"bad regex: its inline flags (?{m.group(1)} turn on verbose mode (x) or a version "
                                  "(V0, V1), which grep does not support")
        if "f" in on:
            raise CapabilityError(f"bad regex: its inline flags (?{m.group(1)} turn on full case folding (f), which "
                                  "grep does not support (use (?i))")
        if "r" in on:  # the search runs forward: it found each line's last match only (found by a review)
            raise CapabilityError(f"bad regex: its inline flags (?{m.group(1)} turn on reverse searching (r), which "
                                  "grep does not support")
    if _unrolled_size(pattern) > MAX_UNROLLED:
        raise CapabilityError(f"bad regex: its counted repeats ({{n}}, {{n,m}}) and + would have it compile to more "
                              f"than grep allows ({MAX_UNROLLED} characters written out, a group counting "
                              f"{GROUP_WEIGHT}): use *, smaller counts or fewer groups")


def grep(root: Root, pattern: str, base: str, include: str, mode: str, deadline: Deadline,
         cap: int = RESULT_CAP) -> bytes:
    """Search the files under ``base`` (or the file ``base``) for ``pattern`` (see the module docstring).
    Past the cap or the time budget, what was found so far, marked."""
    mode = mode or "files"
    if mode not in MODES:
        raise CapabilityError(f"mode must be one of {', '.join(MODES)}, not {mode[:40]!r}")
    if len(pattern) > MAX_PATTERN:
        raise CapabilityError(f"regex is longer than {MAX_PATTERN} characters")
    _check_pattern(pattern)
    matcher = Glob(include, basename_if_no_slash=True) if include else None
    lines: list[str] = []  # content and count modes: up to cap + 1, the extra one saying there is more
    size = 0  # ... and their characters, which past REPLY_BYTES _render would only drop
    hits: list[tuple[int, str]] = []  # files mode: every matching file, sorted newest first at the end
    note = None
    too_deep: list[str] = []  # the directories the walk did not walk below (MAX_DEPTH)

    def full() -> bool:
        return len(lines) > cap or size > REPLY_BYTES

    def record(entry: Entry, count: int, shown: list[str]) -> None:
        nonlocal size
        if count and mode == "files":
            hits.append((entry.st.st_mtime_ns, entry.rel))
        elif count and not full():
            rel = _shown(entry.rel)
            new = [f"{rel}:{line}" for line in shown] if mode == "content" else [f"{rel}:{count}"]
            lines.extend(new)
            size += sum(map(len, new))

    try:
        deadline.check()
        with _workers.lend() as worker:
            worker.compile(pattern)
            sent: collections.deque[Entry] = collections.deque()  # searched, in order, the results not read yet
            for entry, data in _files_to_search(root, base, matcher, deadline, too_deep):
                if full():
                    break
                if len(data) > READ_CAP:  # grown past the cap since its size was looked at
                    continue
                # In content mode, the lines still wanted as far as is known: those of searches sent are not.
                limit = cap + 1 - len(lines) if mode == "content" else 1 if mode == "files" else len(data) + 1
                big = len(data) >= BIG_TEXT
                with _budget.share(len(data), deadline) if big else contextlib.nullcontext():
                    worker.search(data, mode, limit, deadline)
                    sent.append(entry)
                    while sent and (big or len(sent) > PIPELINE or worker.has_result()):  # big: within its share
                        record(sent.popleft(), *worker.result(deadline))
            while sent and not full():
                record(sent.popleft(), *worker.result(deadline))
            worker.compiled(deadline)  # with nothing searched, a pattern that does not compile is still an error
    except TimeoutError:
        note = _timed_out(deadline)
    except MemoryError:  # the worker's: the regex module's backtracking stack (~100 times the text), or captures
        note = "the pattern needed too much memory (it backtracks too much: simplify it), the results so far"
    if mode == "files":
        hits.sort(key=lambda t: (-t[0], t[1]))
        if len(hits) > cap:
            note = note or f"{len(hits)} matching files, showing the newest {cap}"
        return _render((_shown(rel) for _, rel in hits[:cap]), _notes(note, _depth_note(too_deep)))
    if len(lines) > cap:
        note = note or f"more than {cap} matching {'lines' if mode == 'content' else 'files'}"
        lines = lines[:cap]
    return _render(lines, _notes(note, _depth_note(too_deep)))


def capabilities(root: Root, *, timeout: float = SEARCH_TIMEOUT) -> dict[str, CapabilityFn]:
    """``berm.fs.glob`` and ``berm.fs.grep`` over ``root``, each call bounded by ``timeout`` seconds."""

    @capability("berm.fs.glob")
    def fs_glob(request: bytes) -> bytes:
        (pattern, path), _ = fields(request, ("pattern", "path"))
        pattern, path = text(pattern, "pattern"), text(path, "path")
        with naming(path or pattern):
            return glob(root, pattern, path, Deadline.within_invocation(timeout))

    @capability("berm.fs.grep")
    def fs_grep(request: bytes) -> bytes:
        (pattern, path, include, mode), _ = fields(request, ("pattern", "path", "include", "mode"))
        path = text(path, "path")
        with naming(path or "."):
            return grep(root, text(pattern, "pattern"), path, text(include, "include"), text(mode, "mode"),
                        Deadline.within_invocation(timeout))

    return {"berm.fs.glob": fs_glob, "berm.fs.grep": fs_grep}
