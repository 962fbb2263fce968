"""The due-set: persisted one-shots ``(when, harness, id, payload)``, indexed by time (RFC 0205, "Scheduling").

SQLite in WAL mode with ``synchronous=FULL``: every committed put or cancel has been fsynced before the call
returns, so neither a killed daemon (SIGKILL) nor a power loss loses a schedule the caller was told about. (NORMAL
survives a killed process but may roll back the last commits on power loss.) The one exception is deleting
delivered occurrences, which the scheduler does in a batch per drain at NORMAL: the worst a power cut can do there
is deliver a wake again, and at FULL the fsync per drain would cap the drain rate (~900 wakes/s measured).

``(harness, id)`` is the key: scheduling an id that exists replaces it. Each write gives the row a fresh
generation number, so deleting a fired occurrence (``remove_fired``) never removes the re-arm its own wake just
wrote under the same id. Opening a file without the usage table counts each harness's usage once, which triggers
keep from then on; no guest runs to rebuild anything.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from berm_host.private_files import private_database
from berm_host.sqlite_writes import WriteTransaction, damage

from .errors import QueueClosed, QueueError, ScheduleError

MAX_ID = 256  # bytes of UTF-8
MAX_PAYLOAD = 64 << 10  # bytes of UTF-8
DEFAULT_PER_HARNESS = 100_000
#: All of one harness's pending payloads together, bytes of UTF-8: the count limit alone let one harness persist
#: 100,000 x 64 KiB (6.5 GB), written at fsync speed by its own wakes.
MAX_PAYLOAD_BYTES = 16 << 20
#: Seconds a write waits for the due-set while another connection writes it (SQLite's busy timeout), unless its
#: caller has less time: a guest's berm.schedule.* waits no longer than its invocation has left.
BUSY_TIMEOUT = 30.0
#: Restricts a read to the named harnesses; None reads them all.
Harnesses = frozenset[str] | None
#: Where an entry sorts in a listing: ``(when_ms, harness, id)``.
Key = tuple[int, str, str]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS due (
    harness TEXT NOT NULL,
    id TEXT NOT NULL,
    when_ms INTEGER NOT NULL,
    payload TEXT NOT NULL,
    depth INTEGER NOT NULL,
    gen INTEGER NOT NULL,
    PRIMARY KEY (harness, id)
);
CREATE INDEX IF NOT EXISTS due_by_time ON due (when_ms, harness, id);
CREATE INDEX IF NOT EXISTS due_by_harness ON due (harness, when_ms, id);
"""
#: Each harness's pending count and payload bytes, kept by triggers in the same transaction as every write: the
#: limits were checked by summing the harness's payloads at every put, ~38 ms with 100,000 pending, under the lock
#: every harness's scheduling shares.
_USAGE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage (harness TEXT PRIMARY KEY, count INTEGER NOT NULL, bytes INTEGER NOT NULL) "
    "WITHOUT ROWID",
    "CREATE TRIGGER IF NOT EXISTS due_inserted AFTER INSERT ON due BEGIN "
    "INSERT INTO usage VALUES (new.harness, 1, length(CAST(new.payload AS BLOB))) ON CONFLICT (harness) "
    "DO UPDATE SET count = count + 1, bytes = bytes + excluded.bytes; END",
    "CREATE TRIGGER IF NOT EXISTS due_updated AFTER UPDATE OF payload ON due BEGIN "
    "UPDATE usage SET bytes = bytes - length(CAST(old.payload AS BLOB)) + length(CAST(new.payload AS BLOB)) "
    "WHERE harness = new.harness; END",
    "CREATE TRIGGER IF NOT EXISTS due_deleted AFTER DELETE ON due BEGIN "
    "UPDATE usage SET count = count - 1, bytes = bytes - length(CAST(old.payload AS BLOB)) "
    "WHERE harness = old.harness; DELETE FROM usage WHERE harness = old.harness AND count = 0; END",
)
_COLUMNS = "harness, id, when_ms, payload, depth, gen"
#: A row of the types this module writes.
_WELL_TYPED = ("typeof(harness) = 'text' AND typeof(id) = 'text' AND typeof(when_ms) = 'integer' "
               "AND typeof(payload) = 'text' AND typeof(depth) = 'integer'")


@dataclass(frozen=True)
class Entry:
    """One scheduled wake. ``when_ms`` is UTC milliseconds since the epoch; ``depth`` the chain depth its wake
    runs at; ``gen`` identifies this write of the key."""

    harness: str
    id: str
    when_ms: int
    payload: str
    depth: int = 0
    gen: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.harness, self.id)

    def as_dict(self) -> dict:
        return {"harness": self.harness, "id": self.id, "when_ms": self.when_ms, "payload": self.payload,
                "depth": self.depth}


class DueSet:
    """Thread-safe: one connection for writes behind a lock (SQLite serialises writers anyway), another for reads
    behind its own. In WAL mode a read never waits for a writer, so a read must not queue behind a write that
    waits for another connection's lock: the scheduler reads while every worker waits to tell it of an end, and
    one sqlite3 shell's open write held up every tool call (found by a review)."""

    def __init__(self, path: str | Path, *, per_harness: int = DEFAULT_PER_HARNESS):
        self.path = Path(path)
        self.per_harness = per_harness
        try:
            private_database(self.path)  # the harnesses' payloads: the user's only
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                       timeout=BUSY_TIMEOUT)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # found by a review: with its time index damaged (the table whole) a due-set opened, every due wake ran,
            # none could be deleted, and each ran again at every start of the daemon
            found = damage(self._db)
            if found is not None:
                self._db.close()
                raise QueueError(f"the due-set {self.path} is damaged (SQLite's quick_check: {found}): restore it "
                                 "from a backup, or move it aside to start with no wakes")
            self._db.executescript(_SCHEMA)
            with _Transaction(self._db, self.path):
                self._count()
            (self._gen,) = self._db.execute("SELECT coalesce(max(gen), 0) FROM due").fetchone()
            self._reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                           timeout=BUSY_TIMEOUT)
        except (sqlite3.Error, OSError) as exc:
            raise QueueError(f"cannot open the due-set {self.path}: {exc}") from None
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False

    def _count(self) -> None:
        """Create the usage table and its triggers, counting every harness's usage, when the due-set has none (one
        written before they existed); the triggers keep it right from then on, whoever writes."""
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='usage'").fetchone():
            return
        for statement in _USAGE_SCHEMA:
            self._db.execute(statement)
        self._db.execute("INSERT INTO usage SELECT harness, count(*), sum(length(CAST(payload AS BLOB))) FROM due "
                         "GROUP BY harness")

    def close(self) -> None:
        """Close both connections; any later use raises QueueClosed (not sqlite's ProgrammingError, which the
        daemon answered as a host bug to a client still connected while it stopped: found by a review)."""
        with self._lock, self._read_lock:
            self._closed = True
            self._db.close()
            self._reader.close()

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"the due-set {self.path} is closed: its queue has stopped")

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._read_lock:
            self._check_open()
            try:
                yield self._reader
            except sqlite3.Error as exc:  # a QueueError as writes are (it reached clients as a host error)
                raise QueueError(f"cannot read the due-set {self.path}: {exc}") from None

    # --- writes ---------------------------------------------------------------------------------------------

    def put(self, harness: str, id: str, when_ms: int, payload: str = "", depth: int = 0, *,
            wait: float | None = None) -> Entry:
        """Schedule (or replace) ``(harness, id)`` at ``when_ms``; durable when this returns. A QueueError when the
        due-set stays busy for ``wait`` seconds (None: BUSY_TIMEOUT, and as long as this process's other writes
        take)."""
        return self.put_many([(harness, id, when_ms, payload, depth)], wait=wait)[0]

    def put_many(self, rows: list[tuple[str, str, int, str, int]], *, wait: float | None = None) -> list[Entry]:
        """``put`` for many ``(harness, id, when_ms, payload, depth)`` rows in one transaction (one fsync)."""
        for harness, id, when_ms, payload, depth in rows:
            _check_text(id, "schedule id", MAX_ID, allow_empty=False)
            _check_text(payload, "payload", MAX_PAYLOAD)
            if not isinstance(when_ms, int) or not -(1 << 62) < when_ms < (1 << 62):
                raise ScheduleError(f"the instant must be integer UTC milliseconds, not {when_ms!r}")
        with self._writing(wait):
            return [self._insert(*row) for row in rows]

    def _insert(self, harness: str, id: str, when_ms: int, payload: str, depth: int) -> Entry:
        old = self._db.execute("SELECT length(CAST(payload AS BLOB)) FROM due WHERE harness=? AND id=?",
                               (harness, id)).fetchone()
        count, used = self._db.execute("SELECT count, bytes FROM usage WHERE harness=?",
                                       (harness,)).fetchone() or (0, 0)
        if not old and count >= self.per_harness:
            raise ScheduleError(f"{harness!r} already has {count} pending schedules (the limit)")
        if used - (old[0] if old else 0) + len(payload.encode("utf-8")) > MAX_PAYLOAD_BYTES:
            raise ScheduleError(f"{harness!r}'s pending schedules would hold more than {MAX_PAYLOAD_BYTES >> 20} MiB "
                                "of payload (the limit)")
        self._gen += 1
        self._db.execute(
            f"INSERT INTO due ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (harness, id) DO UPDATE SET "
            "when_ms=excluded.when_ms, payload=excluded.payload, depth=excluded.depth, gen=excluded.gen",
            (harness, id, when_ms, payload, depth, self._gen))
        return Entry(harness, id, when_ms, payload, depth, self._gen)

    def cancel(self, harness: str, id: str, *, wait: float | None = None) -> bool:
        """Remove ``(harness, id)``; False when it was not scheduled. ``wait`` as for ``put``."""
        with self._writing(wait):
            return self._db.execute("DELETE FROM due WHERE harness=? AND id=?", (harness, id)).rowcount > 0

    def remove_fired(self, entries: list[Entry], *, wait: float | None = None) -> None:
        """Delete delivered occurrences, in one transaction; a key re-written since (a re-arm) is kept. ``wait`` as
        for ``put``. No fsync for these: losing one to a power cut means delivering that wake again
        (at-least-once), never losing a schedule; the next synchronous commit makes them durable with itself."""
        if not entries:
            return
        with self._writing(wait, durable=False):
            self._db.executemany("DELETE FROM due WHERE harness=? AND id=? AND gen=?",
                                 [(e.harness, e.id, e.gen) for e in entries])

    # --- reads ----------------------------------------------------------------------------------------------

    def get(self, harness: str, id: str) -> Entry | None:
        rows = self._select("WHERE harness=? AND id=?", (harness, id))
        return rows[0] if rows else None

    def list(self, harness: str | None = None, *, after: Key | None = None, limit: int = -1) -> list[Entry]:
        """The pending entries (of one harness, when named) in ``(when_ms, harness, id)`` order, earliest first:
        those past ``after`` in that order, at most ``limit`` (-1: all). A page and the key of its last entry
        read the next page: an entry never moved between the reads is never missed nor repeated. A row of types the
        due-set never writes (another program's: a blob payload, a text instant) is not listed: its entry could not
        be sent, nor its instant be a cursor (one made every listing fail, found by a review); its wake ends in an
        error when it comes (the scheduler)."""
        terms, params = [_WELL_TYPED], []
        if harness is not None:
            terms.append("harness=?")
            params.append(harness)
        if after is not None:
            terms.append("(when_ms, harness, id) > (?, ?, ?)")
            params.extend(after)
        return self._select(f"WHERE {' AND '.join(terms)} ORDER BY when_ms, harness, id LIMIT ?", (*params, limit))

    def earliest(self, n: int, *, only: Harnesses = None) -> list[Entry]:
        """The ``n`` earliest entries (of the harnesses in ``only``, when given: each harness's own, through its
        index, in one statement; walking the time index past the rows of the others took 29 ms a drain with
        100,000 due rows of a held harness, found by a review)."""
        if only is None:
            return self._select("ORDER BY when_ms, harness, id LIMIT ?", (n,))
        return self._select(f"WHERE rowid IN ({_each_harness(due=False)}) ORDER BY when_ms, harness, id LIMIT ?",
                            (_harness_list(only), n, n))

    def due(self, now_ms: int, n: int, *, only: Harnesses = None) -> list[Entry]:
        """Up to ``n`` entries due at ``now_ms`` (of the harnesses in ``only``, when given), taken in rounds: every
        harness's earliest, then every harness's second, …, earlier first within a round. In time order alone, one
        harness's flood of due wakes kept every other harness's waiting behind it."""
        if only is None:
            with self._reading() as reader:
                only = frozenset(h for (h,) in reader.execute(
                    "SELECT DISTINCT harness FROM due WHERE when_ms <= ?", (now_ms,)))
        return self._select(
            f"WHERE rowid IN ({_each_harness(due=True)}) ORDER BY row_number() OVER (PARTITION BY harness ORDER BY "
            "when_ms, id), when_ms, harness, id LIMIT ?", (_harness_list(only), now_ms, n, n))

    def count(self, *, due_at: int | None = None, only: Harnesses = None) -> int:
        where, params = _only(only)
        if due_at is not None:
            where, params = f"when_ms <= ? AND {where}", (due_at, *params)
        with self._reading() as reader:
            return reader.execute(f"SELECT count(*) FROM due WHERE {where}", params).fetchone()[0]

    def _select(self, tail: str, params: tuple) -> list[Entry]:
        with self._reading() as reader:
            rows = reader.execute(f"SELECT {_COLUMNS} FROM due {tail}", params).fetchall()
        return [Entry(*row) for row in rows]

    def _write(self) -> "_Transaction":
        return _Transaction(self._db, self.path)

    @contextlib.contextmanager
    def _writing(self, wait: float | None, *, durable: bool = True) -> Iterator[None]:
        """The lock and a write transaction, each waited for at most ``wait`` seconds when it is given; committed
        without an fsync unless ``durable``."""
        if not self._lock.acquire(timeout=-1 if wait is None else max(0.0, wait)):
            raise QueueError(f"the due-set {self.path} is busy: another write held it for {wait:.3g} s")
        try:
            self._check_open()
            if wait is not None:
                self._db.execute(f"PRAGMA busy_timeout = {int(max(0.0, wait) * 1000)}")
            if not durable:
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._write():
                    yield
            finally:
                if not durable:
                    self._db.execute("PRAGMA synchronous=FULL")
                if wait is not None:
                    self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        finally:
            self._lock.release()


class _Transaction(WriteTransaction):
    """A WriteTransaction whose SQLite errors become QueueError naming the file."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        super().__init__(db)
        self._path = path

    def __enter__(self) -> None:
        try:
            super().__enter__()
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY:
                raise QueueError(f"the due-set {self._path} is busy: another connection is writing it") from None
            raise QueueError(f"the due-set {self._path} is not writable: {exc}") from None

    def __exit__(self, kind, exc, tb) -> bool:
        try:
            super().__exit__(kind, exc, tb)
        except sqlite3.Error as err:  # the COMMIT's (rolled back)
            exc = err
        if isinstance(exc, sqlite3.Error):
            raise QueueError(f"writing the due-set {self._path} failed: {exc}") from None
        return False


def _each_harness(due: bool) -> str:
    """A subquery of the rowids of the earliest rows of each harness in a JSON list (its first parameter), at most
    its last parameter of each, and only those due at its second when ``due``: a probe of each harness's index, in
    one statement (a query a harness, from Python, made the scheduler's drains three quarters of the queue's time
    with 100 harnesses)."""
    return ("SELECT d.rowid FROM json_each(?) AS h JOIN due AS d ON d.rowid IN (SELECT rowid FROM due WHERE "
            f"harness = h.value{' AND when_ms <= ?' if due else ''} ORDER BY when_ms, id LIMIT ?)")


@functools.lru_cache(maxsize=8)  # the scheduler asks with the same set at every drain
def _harness_list(harnesses: frozenset[str]) -> str:
    """``harnesses`` as the JSON list ``_each_harness`` takes."""
    return json.dumps(sorted(harnesses))


@functools.lru_cache(maxsize=8)  # the scheduler asks with the same set at every drain
def _only(harnesses: Harnesses) -> tuple[str, tuple]:
    """A WHERE term keeping the rows of ``harnesses`` (all rows when None)."""
    if harnesses is None:
        return "1", ()
    # the unary + keeps the planner on the time index (walk in time order, test membership per row)
    return "+harness IN (SELECT value FROM json_each(?))", (_harness_list(harnesses),)


def _check_text(value: str, what: str, limit: int, *, allow_empty: bool = True) -> None:
    if not isinstance(value, str):
        raise ScheduleError(f"the {what} must be text")
    if not value and not allow_empty:
        raise ScheduleError(f"the {what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ScheduleError(f"the {what} is not valid Unicode text") from None
    if size > limit:
        raise ScheduleError(f"the {what} is longer than {limit} bytes")
