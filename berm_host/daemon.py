"""The long-running host (``berm serve``): declarations → loaded harnesses → one queue + scheduler → a control
socket.

The control socket is a Unix domain socket created with permission 0600 (only its owner may talk to the
daemon). Beside it, ``<socket>.lock`` (0600) is held (flock) by the daemon starting or serving on that socket, and
left in place when it stops (removing a lock file another process may be opening races). The protocol is JSON
lines: one request object per line, one reply object per line, any number per connection; a connection silent for
``idle_timeout`` seconds (60) is closed. Requests (``op``):

    {"op": "call", "harness": H, "tool": T, "args": "<text>", "context": {agent, conversation, sender}}
    {"op": "schedule.add", "harness": H, "id": I, "when_ms": N, "payload": "<text>"}
    {"op": "schedule.list", "harness": H?, "after": {"when_ms": N, "harness": H, "id": I}?}
    {"op": "schedule.cancel", "harness": H, "id": I}
    {"op": "publish", "topic": T, "event": "<text>"}   (to Queue.subscribe's subscribers: declarations make none)
    {"op": "stats"}        {"op": "harnesses"}

A field an op does not take is a protocol error (a misspelt ``"arg"`` was a call with no arguments). A request
line is at most MAX_LINE bytes and must arrive whole within the idle timeout; the bytes of lines past each
connection's first LINE_ALLOWANCE come out of one budget of LINE_BUDGET bytes, and a line that finds it spent is
refused (``refused``, "busy"), the connection closed.

Replies are ``{"ok": true, ...}`` or ``{"ok": false, "error": KIND, "message": TEXT}`` where KIND is ``trap``,
``failure`` (the guest's berm.fail), ``refused`` (a BermError: unknown harness, bad schedule, chain depth, …),
``protocol`` (a malformed request) or ``host`` (a bug in the host, logged; the daemon stays up). A ``trap`` reply
also has ``"chain"``: its call chain, a list of lines ("called from parse+0x1c", innermost first). A
``schedule.cancel`` reply says ``"cancelled"`` (the id was pending) and ``"started"`` (but its wake had already
started, and runs to its end).

A call still queued when its client closes the connection is withdrawn (one that has started runs to its end).

A ``schedule.list`` reply is one page, ``{"entries": [...], "next": CURSOR}``, of at most LIST_PAGE entries
(what a harness may hold would not fit one line), earliest first: while ``next`` is not null, ask again with it
as ``after`` (``DaemonClient.schedules`` does).

Shutdown (``stop``, SIGTERM in ``berm serve``) closes the socket, stops the scheduler, drops queued work and lets
running guests finish or be interrupted at their deadline; every pending wake stays in the due-set for the next
start. A second SIGTERM or SIGINT ends ``berm serve`` at once, cutting running guests short (a wake cut short
stays due, and runs again).

Besides the host's grants, a declaration may grant ``schedule`` (``berm.schedule.*`` for itself) and ``call``
(``berm.call``: the tools of the harnesses declared beside it, its own included).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import socket
import socketserver
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from pathlib import Path

from berm_abi.errors import BermError
from berm_abi.json_objects import LongInteger, RepeatedKey, bounded_int, text_nesting_depth, unique_object
from berm_abi.text import escaped
from berm_host.capabilities.kv import data_dir
from berm_host.declaration import load_declarations
from berm_host.grants import linker_for
from berm_host.layout import DEFAULT_MAX_RESULT
from berm_host.private_files import private_directory
from berm_host.queue import Cancel, Context, Queue, QueueClosed, call_capabilities, schedule_capabilities
from berm_host.queue.dueset import MAX_ID, MAX_PAYLOAD
from berm_host.queue.target import Target
from berm_host.traps import ToolFailure, Trap

log = logging.getLogger("berm.daemon")
guest_log = logging.getLogger("berm.guest")

DUE_DB = "due.sqlite3"
#: Held (flock) by the daemon serving a state directory, for as long as it runs: two daemons on one due-set both ran
#: every wake, and each one's generations could delete the other's re-arms (found by a review).
STATE_LOCK = "daemon.lock"
#: Seconds a start waits to connect to a socket found at its path, to tell a live daemon from one a kill left: a
#: daemon that does not accept (stopped) with a full backlog held `berm serve` in connect for ever, silently.
ALIVE_TIMEOUT = 1.0
#: The size of a Unix socket address's path on Linux (``sun_path``), its terminating NUL included.
SOCKET_PATH_MAX = 108
#: Seconds a client waits for a connection and for the answer to a request other than a call's (whose answer comes
#: once it has run: up to its harness's timeout, a day at most): a daemon that accepts and never answers (stopped,
#: stuck) held `berm schedule` and `berm call --daemon` for ever, in silence (found by a review).
ANSWER_TIMEOUT = 60.0
#: Seconds between connects while a listening socket's backlog is full.
CONNECT_RETRY = 0.01
MAX_LINE = 16 << 20
#: Bytes of a request line a connection may hold without drawing on LINE_BUDGET.
LINE_ALLOWANCE = 1 << 20
#: Bytes of the request lines past their LINE_ALLOWANCE held at once, all connections together, from the first
#: byte read until the request is served (the line and the request are dropped before the reply is written): 64
#: clients sending 16 MiB lines held a GiB (a review). Room for 4 whole lines.
LINE_BUDGET = 4 * MAX_LINE
#: The longest reply a client reads: a call's result (at most DEFAULT_MAX_RESULT bytes) with every character JSON's
#: six-byte escape. Read to MAX_LINE, a result of 3 MiB of control characters was "no valid reply".
MAX_REPLY = 6 * DEFAULT_MAX_RESULT + (1 << 20)
#: How deeply a request's arrays and objects may nest (they nest 2 deep: a call's context, a listing's cursor).
MAX_REQUEST_NESTING = 16
#: Characters of a long text in a reply escaped and written at once (``_reply_chunks``).
REPLY_SLICE = 1 << 20
#: Bytes asked of a connection at once.
RECV_CHUNK = 64 << 10
#: Connections served at once (a thread each); a local client holding many open cost a thread and a buffer each.
MAX_CLIENTS = 64
#: Calls its clients may have in progress at once (each holds its connection until its result): the rest of the
#: MAX_CLIENTS connections stay free for other requests. One client keeping 64 calls queued held every connection,
#: and `berm schedule` and calls to idle harnesses were refused (found by a review).
MAX_CALLS = MAX_CLIENTS - 8
#: Seconds a connection may stay silent (or leave a reply unread, or take to send the whole of a request line) before
#: it is closed: idle clients that were never closed held every slot, locking out every other client for good; and
#: while the timeout was per read, a client sending a byte a second held its slot for good.
IDLE_TIMEOUT = 60.0
#: Seconds between a waiting call's looks at whether its client has hung up (``_result``).
HANGUP_POLL = 0.5
#: How long stop() waits for handler threads to write the replies of requests that were in flight.
REPLY_GRACE = 5.0
#: Entries in one schedule.list reply: as many as fit a line whatever they hold (JSON escapes a control character
#: in 6 bytes; a harness name is at most 64 bytes, the rest of an entry far less than 1 KiB). One harness's
#: entries alone may hold 16 MiB of payload, so a listing comes in pages.
LIST_PAGE = MAX_LINE // (6 * (MAX_PAYLOAD + MAX_ID) + 1024)


class DaemonError(BermError):
    """The daemon cannot start (socket in use, unreadable declarations), or cannot be reached by a client."""


class RemoteError(BermError):
    """A request the daemon answered with an error; ``kind`` is trap / failure / refused / protocol / host. A trap's
    ``chain`` is its call chain, one line per caller (``TrapInfo.chain_lines``)."""

    def __init__(self, kind: str, message: str, chain: tuple[str, ...] = ()):
        self.kind = kind
        self.chain = chain
        super().__init__(message)


@dataclass(frozen=True)
class DaemonConfig:
    declarations: Path
    socket: Path
    state_dir: Path | None = None  # the due-set and the kv store; None: $BERM_DATA_DIR, else the user data directory
    harnesses_dir: Path | None = None  # None: berm_host.declaration.harnesses_dir()
    engine: str = "aot"
    workers: int = 4
    per_harness: int | None = None  # None: one fewer than the workers (executor.default_per_harness)
    max_depth: int = 8
    timeout: float = 60.0
    idle_timeout: float = IDLE_TIMEOUT  # of a control connection

    def __post_init__(self) -> None:
        # One path for all the state, resolved as the kv store resolves its directory (kv.data_dir): found by a
        # review, a config of "~/state" put the due-set and the lock under ./~/state and the kv store under
        # $HOME/state, unless the CLI had resolved it first. "" is no directory (kv.data_dir took it for none).
        if self.state_dir is not None and not os.fspath(self.state_dir):
            raise ValueError("the state directory is empty: name one, or pass None for the user data directory")
        object.__setattr__(self, "state_dir", data_dir(self.state_dir))


def load_targets(config: DaemonConfig, queue: Queue, until: Callable[[], bool] = lambda: False) -> dict[str, Target]:
    """Load every declared harness (its image verified, its linker built from its grants) as a queue target; those
    loaded so far once ``until()`` is true (a load may compile for minutes)."""
    from berm_host.queue.harness import Loader  # the engine: heavy imports, only when something is declared

    loader = Loader(config.engine, timeout=config.timeout, log=_guest_log)
    targets = {}
    declarations = load_declarations(config.declarations)
    if not declarations:  # (a "[harness]" typo is another table of the agent's: found by a review)
        log.warning("%s declares no harnesses ([[harnesses]] tables): serving none", config.declarations)
    for i, decl in enumerate(declarations):
        if until():
            break
        try:
            linker = linker_for(decl, data_dir=config.state_dir, extra=_queue_grants(queue))
            targets[decl.name] = loader.load(decl, decl.load_image(config.harnesses_dir), linker)
        except BermError as exc:  # which file declares it (found by a review: "unknown capability 'fsx'" alone)
            raise DaemonError(f"{config.declarations}: harnesses[{i}]: {exc}") from None
        log.info("loaded harness %s (%s)", decl.name, ", ".join(linker.names()) or "no capabilities")
    return targets


def _guest_log(harness: str, line: bytes) -> None:
    """A guest's ``berm.log`` line, as one log line whatever it holds (a newline in it forged records of its own);
    not even decoded when the daemon does not log at INFO."""
    if guest_log.isEnabledFor(logging.INFO):
        guest_log.info("[%s] %s", harness, escaped(line.decode("utf-8", "replace"), lines=False))


def _queue_grants(queue: Queue) -> dict:
    """The grants the daemon serves beside the host's own (``grants.DAEMON_GRANTS``): ``schedule``
    (``berm.schedule.*`` bound to the declared harness, landing in this queue) and ``call`` (``berm.call``: the other
    harnesses loaded in this queue)."""
    return {"schedule": lambda decl: {c.name: c.fn for c in schedule_capabilities(queue, decl.name)},
            "call": lambda decl: {c.name: c.fn for c in call_capabilities(queue)}}


class _StopRequested(Exception):
    """Raised inside Daemon.start once request_stop has been called: the start is undone."""


class Daemon:
    def __init__(self, config: DaemonConfig):
        self.config = config
        self.queue = Queue(config.state_dir / DUE_DB, workers=config.workers, timeout=config.timeout,
                           per_harness=config.per_harness, max_depth=config.max_depth)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # set as stop() begins: connections still open are refused from then
        self._stop_requested = threading.Event()  # request_stop(): a start() in progress serves nothing
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()  # one stop() at a time: a second waits for the first to end
        self._locks: list[int] = []  # flock descriptors: the state directory's, the socket's
        self._calls = threading.BoundedSemaphore(MAX_CALLS)
        self._started = threading.Lock()  # held from a start() that serves on

    def start(self) -> bool:
        """Take the state directory and the socket's lock, load the harnesses, start the scheduler (due wakes from
        before the restart drain now) and listen; whether it serves (not when ``request_stop`` came first). The
        socket's lock comes before the harnesses: a second daemon on the socket compiled every image it declared,
        or stopped at one it could not load, before it was refused.

        A daemon that serves is not started again: a second start() was refused by the first's lock, and undoing
        it closed the serving socket, stopped the queue and released the locks (found by a review). One whose start
        failed may try again."""
        if not self._started.acquire(blocking=False):
            raise DaemonError("this daemon has already been started")
        try:
            self._locks.append(_lock_state(self.config.state_dir))
            self._locks.append(_lock_socket(Path(self.config.socket)))
            for name, target in load_targets(self.config, self.queue, until=self._stop_requested.is_set).items():
                self.queue.add(name, target)
            if self._stop_requested.is_set():
                raise _StopRequested
            self._server = _listen(Path(self.config.socket), self)
            if self._stop_requested.is_set():
                raise _StopRequested
            self.queue.start()
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="berm-control", daemon=True)
            self._thread.start()
        except BaseException as exc:
            # Found by a review: a thread that could not start left the socket bound and both locks held (every
            # later daemon refused, nothing serving), and stop() then waited for ever on a server never started.
            if self._server is not None:
                self._server.server_close()
                self._server.unlink()
                self._server = None
            self.queue.stop()
            self._release_locks()
            self._started.release()  # undone: it may be tried again
            if isinstance(exc, _StopRequested):
                self._stopped.set()
                log.info("stopped before serving: asked to stop while it started")
                return False
            raise
        log.info("serving %d harnesses on %s", len(self.queue.harnesses()), self.config.socket)
        return True

    def request_stop(self) -> None:
        """Ask the daemon to stop (berm serve's signal handler does): a start() in progress stops loading and
        returns False, listening on nothing and starting no scheduler (found by a review: a SIGTERM while harnesses
        compiled was put off until the start ended, and wakes that had come due ran meanwhile); whoever waits in
        ``stop_requested(wait=True)`` goes on, to call stop()."""
        self._stop_requested.set()

    def stop_requested(self, wait: bool = False) -> bool:
        """Whether request_stop has been called (with ``wait``, once it has: berm serve's main thread waits so)."""
        if wait:
            self._stop_requested.wait()
        return self._stop_requested.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def stop(self) -> None:
        """Stop serving, once: a call from a second thread while one stops waits for that stop to end (both ran
        every step, raced to release the locks, and one could return before the daemon had stopped)."""
        with self._stop_lock:
            if not self._stopped.is_set():
                self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        self.queue.scheduler.stop()  # first: no wake starts while the socket winds down
        if self._server is not None:
            self._server.shutdown()  # no new connection; open ones may still be answering
            # and none waits in the listening socket's backlog until the guests end (a client hung, then was reset)
            self._server.socket.close()
            self._server.unlink()
        self.queue.stop(cancel_pending=True)
        if self._server is not None:
            # Every request the executor just finished or interrupted still owes its caller a reply: let the
            # handler threads write them before the process may exit (they are daemon threads).
            if not self._server.replies.wait_idle(REPLY_GRACE):
                log.warning("stopping with control replies still unwritten after %.0f s", REPLY_GRACE)
            self._server.server_close()
        self._release_locks()
        self._stopped.set()
        log.info("stopped")

    def _release_locks(self) -> None:
        while self._locks:
            os.close(self._locks.pop())

    # --- requests -------------------------------------------------------------------------------------------

    def handle(self, request: object, client_gone: Callable[[], bool] = lambda: False) -> dict:
        """One control request → one reply (never raises). ``client_gone`` says whether the client has hung up: a
        call still queued then is withdrawn."""
        try:
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise _Protocol("a request is a JSON object with a string \"op\"")
            op = request["op"]
            if op not in _FIELDS:
                raise _Protocol(f"unknown op {op[:80]!r}")
            _only(request, _FIELDS[op] | {"op"}, f"a {op} request")
            if self._stopping.is_set():
                # a connection opened before stop() still reads requests: they met a closed due-set and were
                # answered as host errors, each logged with a traceback (found by a review)
                raise QueueClosed("the daemon is stopping")
            reply = self._dispatch(op, request, client_gone)
            return {"ok": True, **reply}
        except _Protocol as exc:
            return {"ok": False, "error": "protocol", "message": str(exc)}
        except Trap as exc:
            return {"ok": False, "error": "trap", "message": str(exc),
                    "chain": exc.info.chain_lines()}
        except ToolFailure as exc:
            return {"ok": False, "error": "failure", "message": exc.message}
        except BermError as exc:
            return {"ok": False, "error": "refused", "message": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - a host bug (or a capability's SystemExit, which the executor
            # hands to the future): reported to the caller and logged, the daemon stays up
            log.exception("control request %r failed", request)
            return {"ok": False, "error": "host", "message": f"{type(exc).__name__}: {exc}"}

    def _dispatch(self, op: str, r: dict, client_gone: Callable[[], bool]) -> dict:
        q = self.queue
        if op == "call":
            ctx = _only(_field(r, "context", dict, {}), _CONTEXT, "a call's context")
            context = Context(**{k: _field(ctx, k, str, "") for k in _CONTEXT})
            if not self._calls.acquire(blocking=False):
                raise DaemonError(f"the daemon is busy: its clients have {MAX_CALLS} calls in progress, the most it "
                                  "takes at once (try again later)")
            try:
                future = q.call(_field(r, "harness", str), _field(r, "tool", str), _field(r, "args", str, ""),
                                context)
                return {"result": _result(future, client_gone, q.withdraw)}
            finally:
                self._calls.release()
        if op == "schedule.add":
            entry = q.schedule(_field(r, "harness", str), _field(r, "id", str), _field(r, "when_ms", int),
                               _field(r, "payload", str, ""))
            return {"entry": entry.as_dict()}
        if op == "schedule.list":
            return self._list_page(_field(r, "harness", str, None), _field(r, "after", dict, None))
        if op == "schedule.cancel":
            outcome = q.cancel(_field(r, "harness", str), _field(r, "id", str))
            return {"cancelled": outcome is not Cancel.NOT_PENDING, "started": outcome is Cancel.STARTED}
        if op == "publish":
            futures = q.publish(_field(r, "topic", str), _field(r, "event", str, ""))
            return {"delivered": len(futures)}
        if op == "stats":
            return {"stats": q.stats()}
        if op == "harnesses":
            return {"harnesses": q.harnesses()}
        raise AssertionError(f"_FIELDS names an op _dispatch does not serve: {op!r}")

    def _list_page(self, harness: str | None, after: dict | None) -> dict:
        """One page of pending wakes past the cursor ``after``, and the cursor of the next page (None: none)."""
        rows = self.queue.list(harness, after=None if after is None else _cursor(after), limit=LIST_PAGE + 1)
        page = [e.as_dict() for e in rows[:LIST_PAGE]]
        return {"entries": page, "next": {k: page[-1][k] for k in _CURSOR} if len(rows) > LIST_PAGE else None}


def _result(future: Future, client_gone: Callable[[], bool], withdraw: Callable[[Future], bool]) -> str:
    """A call's result. Every HANGUP_POLL seconds it waits, whether its client is still there: a call still queued
    when its client has hung up is withdrawn (taken out of the queue), as nobody would read its result (it ran all
    the same: found by a review); one that has started runs to its end."""
    while True:
        try:
            return future.result(timeout=HANGUP_POLL)
        except TimeoutError:
            if client_gone() and withdraw(future):
                log.info("withdrew a queued call: its client hung up")
                raise QueueClosed("the client hung up before the call started") from None
        except CancelledError:  # still queued when stop() dropped the queued work
            raise QueueClosed("the daemon is stopping") from None


class _Protocol(Exception):
    """A malformed control request."""


#: The fields each op takes besides "op".
_FIELDS = {"call": {"harness", "tool", "args", "context"},
           "schedule.add": {"harness", "id", "when_ms", "payload"},
           "schedule.list": {"harness", "after"},
           "schedule.cancel": {"harness", "id"},
           "publish": {"topic", "event"},
           "stats": set(), "harnesses": set()}
_CONTEXT = ("agent", "conversation", "sender")
_CURSOR = ("when_ms", "harness", "id")

_MISSING = object()


def _only(r: dict, fields: set[str] | tuple[str, ...], what: str) -> dict:
    """``r``, when it has none but ``fields``."""
    if unknown := sorted(r.keys() - set(fields)):
        raise _Protocol(f"{what} takes no {', '.join(repr(key[:80]) for key in unknown[:5])}"
                        f"{f' (nor {len(unknown) - 5} more)' if len(unknown) > 5 else ''}: its fields are "
                        f"{', '.join(sorted(fields))}")
    return r


def _field(r: dict, key: str, kind: type, default: object = _MISSING):
    value = r.get(key, _MISSING)
    if value is _MISSING or (value is None and default is None):
        if default is _MISSING:
            raise _Protocol(f"the request needs {key!r}")
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Protocol(f"{key!r} must be {kind.__name__}, not {type(value).__name__}")
    if kind is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # JSON's "\ud800": no key, name or text holds one
            raise _Protocol(f"{key!r} must be Unicode text, not a lone surrogate") from None
    return value


def _cursor(after: dict) -> tuple[int, str, str]:
    """A schedule.list cursor as the due-set key it names."""
    _only(after, _CURSOR, "a schedule.list cursor")
    when, harness, id = (_field(after, k, kind) for k, kind in zip(_CURSOR, (int, str, str)))
    if not -(1 << 63) <= when < 1 << 63:
        raise _Protocol("'after' is not a cursor of schedule.list: its when_ms is out of range")
    return when, harness, id


# --- the socket ------------------------------------------------------------------------------------------------

class _Handler(socketserver.StreamRequestHandler):
    def setup(self) -> None:
        # StreamRequestHandler sets this on the connection: each write waits at most this long
        self.timeout = self.server.daemon.config.idle_timeout  # type: ignore[attr-defined]
        super().setup()
        self.lines = _Lines(self.connection, self.timeout, self.server.line_budget)  # type: ignore[attr-defined]

    def handle(self) -> None:
        daemon: Daemon = self.server.daemon  # type: ignore[attr-defined]
        try:
            while line := self.lines.next():
                with self.server.replies:  # type: ignore[attr-defined]
                    reply, more = self._answer(daemon, line)
                    # The line and its request dropped, their bytes go back to the budget before the reply is
                    # written: a client that has read its reply finds them there (they went back only as the next
                    # line was read, and one sending its next long line at once was refused busy: a test on a
                    # loaded machine), and a client that reads no reply holds no line meanwhile.
                    del line
                    self.lines.release()
                    if not (self._reply(reply) and more):
                        return
        except _Busy as exc:
            self._reply({"ok": False, "error": "refused", "message": str(exc)})
        finally:
            self.lines.release()

    def _answer(self, daemon: Daemon, line: bytes) -> tuple[dict, bool]:
        """The reply to one request line, and whether the connection goes on after it (not after a line too long)."""
        if len(line) > MAX_LINE:
            return {"ok": False, "error": "protocol", "message": f"a request line is over {MAX_LINE} bytes"}, False
        try:
            # parsing a line can take ~27 times its size (a list of empty objects): the long ones one at a time
            with self.server.long_parse if len(line) > LINE_ALLOWANCE else contextlib.nullcontext():  # type: ignore
                request = _parsed(line)
        except RepeatedKey as exc:  # the last one won: {"op": "stats", "op": "harnesses"} was answered (a review)
            reply = {"ok": False, "error": "protocol", "message": f"a request names the key {exc.key[:80]!r} twice"}
        except LongInteger as exc:  # (the interpreter's own limit was quoted: a review)
            reply = {"ok": False, "error": "protocol", "message": f"a request holds {exc}"}
        except (ValueError, UnicodeDecodeError) as exc:
            reply = {"ok": False, "error": "protocol", "message": f"not a JSON line: {exc}"}
        except (RecursionError, _TooDeep):
            reply = {"ok": False, "error": "protocol", "message": "the JSON is nested too deeply"}
        else:
            reply = daemon.handle(request, self._hung_up)
        return reply, True

    def _hung_up(self) -> bool:
        """Whether the client has closed its end of the connection (POLLHUP: closed whole, not a half-close after
        sending its request, which still reads the reply)."""
        poll = select.poll()
        poll.register(self.connection, select.POLLHUP)
        return any(events & (select.POLLHUP | select.POLLERR) for _, events in poll.poll(0))

    def _reply(self, reply: dict) -> bool:
        """Write ``reply``; False when the client has gone."""
        chunks = _reply_chunks(reply)
        try:
            first = next(chunks)  # every value but the long texts (valid Unicode, whole or in slices) encoded
        except (TypeError, ValueError) as exc:  # a value JSON cannot hold (a damaged row's blob): a host bug
            log.error("a reply could not be encoded: %s", escaped(f"{type(exc).__name__}: {exc}", lines=False))
            first = _encode({"ok": False, "error": "host", "message": f"the reply could not be encoded: {exc}"})
            chunks = iter(())
        try:
            self.wfile.write(first)
            for chunk in chunks:
                self.wfile.write(chunk)
            return True
        except OSError:  # the client went away before its reply: nothing to tell it
            return False


class _Busy(Exception):
    """A request line found LINE_BUDGET spent by others."""


class _LineBudget:
    """The bytes that request lines may hold past their LINE_ALLOWANCE, all connections together."""

    def __init__(self, total: int):
        self.left = total
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.left += n


class _Lines:
    """The request lines of one connection. A line must arrive whole within ``timeout`` of the wait for it
    starting, and the bytes it holds past LINE_ALLOWANCE are drawn from ``budget`` as they arrive and held until
    ``release`` (its request served) or the next line is asked for: a line finding the budget spent raises _Busy.
    Waiting for budget instead would let a few long lines, each holding part of it, wait on each other until their
    timeouts."""

    def __init__(self, sock: socket.socket, timeout: float, budget: _LineBudget):
        self._sock = sock
        self._timeout = timeout
        self._budget = budget
        self._buf = bytearray()
        self._held = 0

    def next(self) -> bytes:
        """The next line with its newline (without one when the client ended in the middle of it); MAX_LINE + 1
        of its bytes when it is longer; b"" once the client has gone (closed, reset) or the time ran out."""
        self.release()
        try:
            return self._read(time.monotonic() + self._timeout)
        finally:
            self._sock.settimeout(self._timeout)  # what the reply's write may take

    def _read(self, end: float) -> bytes:
        scanned = 0
        while (newline := self._buf.find(b"\n", scanned)) < 0:
            if len(self._buf) > MAX_LINE:
                return bytes(self._buf[:MAX_LINE + 1])
            scanned = len(self._buf)
            left = end - time.monotonic()
            if left <= 0:
                return b""
            try:
                self._sock.settimeout(left)
                chunk = self._sock.recv(RECV_CHUNK)
            except OSError:  # timed out, or reset
                return b""
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += chunk
            self._hold(len(self._buf) - LINE_ALLOWANCE)
        line = bytes(self._buf[:newline + 1])
        del self._buf[:newline + 1]
        return line

    def _hold(self, n: int) -> None:
        if n > self._held:
            if not self._budget.take(n - self._held):
                raise _Busy(f"the daemon is busy: other clients' request lines hold its {LINE_BUDGET >> 20} MiB "
                            "for them; send this one again later")
            self._held = n

    def release(self) -> None:
        self._budget.give(self._held)
        self._held = 0


class _InFlight:
    """Counts control requests between being read and having their reply written, so stop() can wait for them."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def __enter__(self) -> None:
        with self._idle:
            self._count += 1

    def __exit__(self, *exc: object) -> None:
        with self._idle:
            self._count -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    #: Connections waiting to be accepted. socketserver's 5 was found by a review: of 60 clients connecting at once
    #: with a timeout (non-blocking connects), 5 failed at once with EAGAIN.
    request_queue_size = 2 * MAX_CLIENTS

    def __init__(self, path: Path, daemon: Daemon):
        self.daemon = daemon
        self.replies = _InFlight()
        self.clients = threading.BoundedSemaphore(MAX_CLIENTS)
        self.line_budget = _LineBudget(LINE_BUDGET)
        self.long_parse = threading.Lock()
        super().__init__(str(path), _Handler)

    def server_bind(self) -> None:
        super().server_bind()
        bound = os.lstat(self.server_address)
        self.bound = (bound.st_dev, bound.st_ino)

    def unlink(self) -> None:
        """Remove the socket file, if it is still the one this server bound: found by a review, a daemon that had
        lost its path to another deleted the live daemon's socket as it stopped. The socket's lock now keeps a second
        daemon off the path; this check remains for a program that binds it without the lock."""
        with contextlib.suppress(FileNotFoundError):
            now = os.lstat(self.server_address)
            if (now.st_dev, now.st_ino) == self.bound:
                os.unlink(self.server_address)

    def handle_error(self, request, client_address) -> None:
        """A handler's unexpected exception, logged as the daemon's (socketserver printed it to stderr)."""
        log.exception("a control connection failed")

    def process_request(self, request, client_address) -> None:
        """A thread per connection, up to MAX_CLIENTS at once (each may buffer a line of up to MAX_LINE bytes);
        one more is told so and closed."""
        if not self.clients.acquire(blocking=False):
            try:
                request.sendall(_encode({"ok": False, "error": "refused",
                                         "message": f"more than {MAX_CLIENTS} clients are connected"}))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.clients.release()  # its thread never started (out of threads): the slot is not used
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.clients.release()


class _TooDeep(Exception):
    """A request line nesting deeper than MAX_REQUEST_NESTING."""


def _parsed(line: bytes) -> object:
    """A request line's JSON. Its nesting is read off its brackets first: json.loads recurses in C once a level up to
    the recursion limit whatever the stack, and a 990-deep line crashed a daemon whose threads had 64 KiB stacks
    (found by a review). Latin-1 reads every byte as one character, so UTF-8 text keeps its quotes and brackets."""
    if line.count(b"[") + line.count(b"{") > MAX_REQUEST_NESTING:
        if text_nesting_depth(line.decode("latin-1")) > MAX_REQUEST_NESTING:
            raise _TooDeep
    return json.loads(line, object_pairs_hook=unique_object, parse_int=bounded_int)


def _encode(reply: dict) -> bytes:
    return json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n"


def _reply_chunks(reply: dict) -> Iterator[bytes]:
    """``reply``'s line in pieces: its long texts (a call's result) escaped REPLY_SLICE characters at a time, its
    lists (a schedule.list page) an item at a time. A result of 16 MiB of control characters is a 96 MiB line, and
    encoding it whole made three copies of that for each client (eight unread replies held 931 MiB: found by a
    review); a page of such payloads, encoded whole, held 25 MB for each client that left it unread (found by
    another)."""
    long = {k: v for k, v in reply.items() if (isinstance(v, str) and len(v) > REPLY_SLICE) or isinstance(v, list)}
    if not long:
        yield _encode(reply)
        return
    rest = json.dumps({k: v for k, v in reply.items() if k not in long}, ensure_ascii=False)
    for value in long.values():  # what JSON cannot hold raises before a byte is written (_Handler._reply)
        if isinstance(value, list):
            for item in value:
                json.dumps(item, ensure_ascii=False)
    yield rest[:-1].encode("utf-8")  # "{...", the closing brace comes last
    for i, (key, value) in enumerate(long.items()):
        yield f'{"," if i or len(rest) > 2 else ""}{json.dumps(key)}:'.encode()
        if isinstance(value, str):
            yield b'"'
            for start in range(0, len(value), REPLY_SLICE):
                yield json.dumps(value[start:start + REPLY_SLICE], ensure_ascii=False)[1:-1].encode("utf-8")
            yield b'"'
        else:
            yield b"["
            for j, item in enumerate(value):
                yield (b"," if j else b"") + json.dumps(item, ensure_ascii=False).encode("utf-8")
            yield b"]"
    yield b"}\n"


def _lock_state(state_dir: Path) -> int:
    """The descriptor holding ``STATE_LOCK`` in ``state_dir``, or a DaemonError when another daemon holds it."""
    try:
        private_directory(state_dir)  # the harnesses' data lives there
        return _flock(state_dir / STATE_LOCK, f"another daemon is serving the state directory {state_dir}")
    except OSError as exc:
        raise DaemonError(f"cannot lock the state directory {state_dir}: {exc.strerror or exc}") from None


def _lock_socket(path: Path) -> int:
    """The descriptor holding ``<path>.lock``, or a DaemonError when another daemon holds it. Found by a review: two
    daemons starting on one socket where a killed one had left it both found it dead; the second removed the
    first's fresh socket and bound its own, and the first, listening where no client reached it, deleted the live
    one's socket as it stopped. Held from before the check of what is at ``path`` until the daemon stops. A path no
    socket can be bound at is refused here, before any harness is loaded (found by a review: it was refused after
    every image had compiled)."""
    if len(os.fsencode(path)) >= SOCKET_PATH_MAX:
        raise DaemonError(f"cannot listen on {path}: a Unix socket's path has at most {SOCKET_PATH_MAX - 1} bytes, "
                          f"and this one has {len(os.fsencode(path))}")
    try:
        _refuse_other_file(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _flock(path.with_name(path.name + ".lock"), f"another daemon is serving or starting on {path}")
    except OSError as exc:
        raise DaemonError(f"cannot listen on {path}: {exc.strerror or exc}") from None


def _flock(path: Path, held: str) -> int:
    """A descriptor holding an exclusive flock on ``path`` (made 0600, never through a link); DaemonError(held)
    when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DaemonError(held) from None
    return fd


def _listen(path: Path, daemon: Daemon) -> _Server:
    """Bind the control socket with mode 0600 (umask held at 0177 across the bind, so it is never wider), its lock
    (``_lock_socket``) held. A path it cannot use is a DaemonError with the reason (its parent a file was a
    traceback, and a path too long for a Unix socket said "None": found by a review)."""
    try:
        if path.exists() or path.is_symlink():
            _refuse_other_file(path)
            if _alive(path):
                raise DaemonError(f"a daemon is already listening on {path}")
            path.unlink()  # left behind by a daemon that was killed
        old = os.umask(0o177)
        try:
            server = _Server(path, daemon)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
    except OSError as exc:
        raise DaemonError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    return server


def _refuse_other_file(path: Path) -> None:
    """A DaemonError when something other than a socket is at ``path`` (never replaced)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise DaemonError(f"{path} exists and is not a socket; refusing to replace it")


def _alive(path: Path) -> bool:
    """Whether a daemon listens on the socket at ``path`` (False: one a killed daemon left); a DaemonError when one
    does but accepts no connection within ALIVE_TIMEOUT."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            _connect(s, path, ALIVE_TIMEOUT)
            return True
        except TimeoutError:
            raise DaemonError(f"a daemon is listening on {path} but does not answer (stopped, or overwhelmed); "
                              "its socket is left in place") from None
        except OSError:
            return False


def _connect(s: socket.socket, path: Path, timeout: float | None) -> None:
    """Connect ``s`` to ``path`` with ``timeout`` (None: no limit). A socket with a timeout connects non-blocking,
    and a Unix socket then fails at once with EAGAIN while the listener's backlog is full: it is tried again until
    the timeout has passed (TimeoutError)."""
    s.settimeout(timeout)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            s.connect(str(path))
            return
        except BlockingIOError:
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"no connection was accepted within {timeout:g} s") from None
            time.sleep(CONNECT_RETRY)


# --- the client ----------------------------------------------------------------------------------------------

class DaemonClient:
    """Talk to a running daemon: ``request({"op": …})`` returns the reply's fields or raises RemoteError; a
    DaemonError when the daemon does not answer within ``timeout`` seconds (None: no limit)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = ANSWER_TIMEOUT):
        self.path = Path(path)
        self.timeout = timeout

    def request(self, message: dict, *, wait: bool = False) -> dict:
        """``wait``: for the answer with no time limit (past the connection, which takes ``timeout`` at most)."""
        try:
            data = _encode(message)
        except UnicodeEncodeError as exc:  # a command-line argument that is not UTF-8 arrives as lone surrogates
            raise DaemonError(f"cannot send the request: it holds {exc.object[exc.start:exc.end]!r}, which is not "
                              "Unicode text (a command-line argument that is not UTF-8?)") from None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                _connect(s, self.path, self.timeout)
                if wait:
                    s.settimeout(None)
                try:
                    s.sendall(data)
                except BrokenPipeError:  # refused part way (busy, too long): its reply may be waiting all the same
                    pass
                with s.makefile("rb") as f:
                    line = f.readline(MAX_REPLY + 1)
        except (FileNotFoundError, ConnectionRefusedError):
            raise DaemonError(f"no daemon is listening on {self.path} (start one with `berm serve`)") from None
        except TimeoutError:
            raise DaemonError(f"the daemon on {self.path} did not answer within {self.timeout:g} s (stopped, or "
                              "stuck?)") from None
        except OSError as exc:
            raise DaemonError(f"talking to the daemon on {self.path} failed: {exc}") from None
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's limit
            raise self._invalid("not a JSON line" if line else "it closed the connection") from None
        if not isinstance(reply, dict):
            raise self._invalid("a reply is a JSON object")
        if not reply.get("ok"):
            chain = reply.get("chain")
            chain = tuple(chain) if isinstance(chain, list) and all(isinstance(c, str) for c in chain) else ()
            raise RemoteError(reply.get("error", "unknown"), reply.get("message", "no message"), chain)
        reply.pop("ok")
        return reply

    def call(self, harness: str, tool: str, args: str = "", **context: str) -> str:
        """The call's result, waited for as long as it runs, once the daemon has answered a request within
        ``timeout`` (one that accepts and never answers would be waited for in silence for ever)."""
        self.harnesses()
        result = self.request({"op": "call", "harness": harness, "tool": tool, "args": args,
                               "context": context}, wait=True).get("result")
        if not isinstance(result, str):
            raise self._invalid('a call\'s reply has a text "result"')
        return result

    def harnesses(self) -> list[str]:
        """The names of the harnesses the daemon serves."""
        names = self.request({"op": "harnesses"}).get("harnesses")
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise self._invalid('a harnesses reply has a list of names as "harnesses"')
        return names

    def schedules(self, harness: str | None = None) -> Iterator[dict]:
        """Every pending wake (of ``harness``, when named), earliest first, a page per request."""
        request = {"op": "schedule.list"} | ({"harness": harness} if harness else {})
        while True:
            reply = self.request(request)
            entries, after = reply.get("entries"), reply.get("next")
            if not (isinstance(entries, list) and all(_is_wake(e, payload=True) for e in entries)
                    and (after is None or isinstance(after, dict))):
                raise self._invalid('a schedule.list reply has a list of wakes as "entries", and "next" an object '
                                    "or null")
            yield from entries
            if after is None:
                return
            request["after"] = after

    def schedule(self, harness: str, id: str, when_ms: int, payload: str = "") -> dict:
        """Schedule a wake: the entry as the daemon keeps it (``harness``, ``id``, ``when_ms``)."""
        entry = self.request({"op": "schedule.add", "harness": harness, "id": id, "when_ms": when_ms,
                              "payload": payload}).get("entry")
        if not _is_wake(entry, payload=False):
            raise self._invalid('a schedule.add reply has the wake as "entry"')
        return entry

    def cancel(self, harness: str, id: str) -> tuple[bool, bool]:
        """Cancel a wake: (whether it was pending, whether it had already started)."""
        reply = self.request({"op": "schedule.cancel", "harness": harness, "id": id})
        cancelled, started = reply.get("cancelled"), reply.get("started")
        if not isinstance(cancelled, bool) or not isinstance(started, bool):
            raise self._invalid('a schedule.cancel reply says "cancelled" and "started" as true or false')
        return cancelled, started

    def _invalid(self, why: str) -> DaemonError:
        """Found by a review: a reply of another shape (another program on the socket, a buggy or older daemon) ended
        the client commands in an AttributeError, KeyError or TypeError traceback."""
        return DaemonError(f"the daemon on {self.path} sent no valid reply ({why})")


def _is_wake(entry: object, *, payload: bool) -> bool:
    """Whether a reply's ``entry`` has a wake's fields, of their types (a list's entries also carry the payload)."""
    fields = {"harness": str, "id": str, "when_ms": int} | ({"payload": str} if payload else {})
    return isinstance(entry, dict) and all(isinstance(entry.get(k), t) for k, t in fields.items())


def default_socket() -> Path:
    """``$BERM_SOCKET``, else ``$XDG_RUNTIME_DIR/berm.sock``, else ``berm.sock`` in the user state directory."""
    import platformdirs

    env = os.environ.get("BERM_SOCKET")
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "berm.sock" if runtime else Path(platformdirs.user_state_dir("berm")) / "berm.sock"
