"""``berm.kv.get`` / ``set`` / ``delete`` / ``list``: the one state that outlives an invocation.

One SQLite database (WAL journal, ``synchronous=FULL``: a write acknowledged to the guest survives a crash) under
the data directory, shared by every harness; each capability set is bound to one namespace (the harness's name)
and cannot name another. Keys and values are bytes. Caps: key and value sizes, and per namespace the number of
keys and the bytes they hold (counted with every write, not summed per call); a ``set`` over a cap is refused and
changes nothing. A call waits for the store (this process's other calls, another process's write lock) no longer
than the invocation it serves can.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from berm_abi.errors import BermError
from berm_abi.frames import encode_frame
from berm_abi.names import KV_LIST_PAGE
from berm_host.linker import CapabilityError, CapabilityFn
from berm_host.private_files import private_database
from berm_host.sqlite_writes import WriteTransaction

from ._request import Deadline, capability, fields

KEY_CAP = 1024
VALUE_CAP = 1024 * 1024
NAMESPACE_KEYS_CAP = 100_000
NAMESPACE_BYTES_CAP = 64 * 1024 * 1024
#: The most keys one ``berm.kv.list`` reply holds: a prefix with more is an error, unless the request asks for a page.
LIST_CAP = KV_LIST_PAGE
#: How long a call waits for another process holding the database's write lock.
KV_TIMEOUT = 5.0
DB_NAME = "kv.sqlite3"
#: Each namespace's key count and bytes, kept with every write: the caps were checked by summing the namespace on
#: every set, ~50 ms for a full one, under the lock every harness's kv calls share.
_USAGE_SCHEMA = ("CREATE TABLE IF NOT EXISTS usage (ns TEXT PRIMARY KEY, keys INTEGER NOT NULL, bytes INTEGER NOT NULL) "
                 "WITHOUT ROWID")
#: SQLite's errors (primary codes) for a store that can be read but not written now: a full disk, a read-only file,
#: another process's write lock held past KV_TIMEOUT. An open meeting one leaves the recount to the first write.
_CANNOT_WRITE_NOW = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_BUSY)


class KvStoreError(BermError):
    """The key-value database cannot be opened or created."""


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where persistent harness data lives: ``override``, else ``$BERM_DATA_DIR``, else the user data dir."""
    chosen = override or os.environ.get("BERM_DATA_DIR") or platformdirs.user_data_dir("berm")
    return Path(chosen).expanduser().resolve()


#: Every store of this process, for the fork handler.
_STORES: "weakref.WeakSet[KvStore]" = weakref.WeakSet()
#: Held by a fork from before it takes the stores' locks until after: a store registers under it, so the stores a
#: fork waits for are exactly those it releases after (``_HELD``).
_REGISTRY = threading.Lock()
_HELD: list["KvStore"] = []


def _before_fork() -> None:
    """Wait for every store's call in progress, and for a store being opened: a fork in the middle of another
    thread's write left the child's SQLite believing its own (inherited, never used) connection held the write
    lock, and every call in the child failed with "database is locked" for good."""
    _REGISTRY.acquire()
    _HELD[:] = list(_STORES)
    for store in _HELD:
        store._lock.acquire()


def _after_fork_in_parent() -> None:
    """Release what ``_before_fork`` took, exactly: a store opened meanwhile was not among them (releasing its lock
    raised, leaving the stores after it in the set locked for good, and let a second call run beside one in
    progress: found by a review)."""
    for store in _HELD:
        store._lock.release()
    _HELD.clear()
    _REGISTRY.release()


def _after_fork_in_child() -> None:
    global _REGISTRY
    _REGISTRY = threading.Lock()
    _HELD.clear()
    KvStore._open_lock = threading.Lock()  # another thread may have held it, opening a store
    for store in list(_STORES):
        store._after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class KvStore:
    """One database file; safe to share between threads (one connection behind a lock) and processes (SQLite
    locking, waiting up to ``KV_TIMEOUT`` seconds). A fork waits for the calls in progress, and the child opens a
    connection of its own at its first call (``_before_fork``, ``_after_fork_in_child``)."""

    _open: dict[Path, "KvStore"] = {}
    _open_lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._counted = False
        with self._lock:  # registered first: a fork waits for the open and the recount to end (_before_fork)
            with _REGISTRY:
                _STORES.add(self)
            self._db = self._connect(KV_TIMEOUT)
            try:
                with WriteTransaction(self._db):
                    self._count(self._db)
                self._counted = True
            except sqlite3.Error as exc:
                if exc.sqlite_errorcode & 0xFF not in _CANNOT_WRITE_NOW:
                    raise KvStoreError(f"cannot open the key-value store {self.path}: {exc}") from None

    def _connect(self, timeout: float) -> sqlite3.Connection:
        """A connection to the store, waiting up to ``timeout`` seconds for another's lock."""
        path = self.path
        try:
            private_database(path)  # every harness's data: the user's only
            db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            return db
        except (OSError, sqlite3.Error) as exc:
            raise KvStoreError(f"cannot open the key-value store {self.path}: {exc}") from None

    @staticmethod
    def _count(db: sqlite3.Connection) -> None:
        """In the caller's transaction: create the tables if need be and count every namespace's usage afresh, once
        per process (a forked child reconnects without it, within the budget of the call it serves: the parent
        counted). At the open, unless the store cannot be written then (``_CANNOT_WRITE_NOW``): the first write
        counts instead. Found by a review: on a full disk no new process could open the store, even to read."""
        db.execute("CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key BLOB NOT NULL, "
                   "value BLOB NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID")
        # counted afresh at every open: a store written before the table existed, or by such a version of this code
        # while this one ran, is counted right again
        db.execute(_USAGE_SCHEMA)
        db.execute("DELETE FROM usage")
        db.execute("INSERT INTO usage SELECT ns, COUNT(*), SUM(length(key) + length(value)) FROM kv GROUP BY ns")

    def _after_fork_in_child(self) -> None:
        """A forked child has only the thread that forked, which holds every store's lock (``_before_fork``), and an
        SQLite connection must not be used on both sides of a fork (the database can be corrupted). The child gets
        a fresh lock, closes the inherited connection (idle: ``_before_fork``) and opens one of its own at its first
        call. Closed before that open, not kept: found by a review, SQLite's POSIX-lock bookkeeping is per process,
        so beside the inherited connection the child's own took no kernel lock; once the parent had exited, another
        process opening and closing the store checkpointed and deleted the -wal and -shm under the child, and its
        later writes, acknowledged, were lost."""
        self._lock = threading.Lock()
        if self._db is not None:
            self._db.close()
        self._db = None

    @classmethod
    def shared(cls, directory: Path) -> "KvStore":
        """The process-wide store for ``directory`` (opened once)."""
        path = directory / DB_NAME
        with cls._open_lock:
            store = cls._open.get(path)
            if store is None:
                store = cls._open[path] = cls(path)
            return store

    @contextlib.contextmanager
    def _locked(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection, for as long as the invocation being served can wait (a guest blocked in a host call
        cannot be interrupted): for this process's other calls, and for another process holding the file's write
        lock. A write is one transaction. SQLite errors become the guest's CapabilityError."""
        budget = Deadline.within_invocation(KV_TIMEOUT)
        if not self._lock.acquire(timeout=max(budget.seconds, 0.001)):
            raise CapabilityError(f"storage is busy: waited {budget.seconds:.3g} s")
        try:
            if self._db is None:  # the first call in a forked child
                self._db = self._connect(max(budget.remaining(), 0.001))
            db = self._db
            db.execute(f"PRAGMA busy_timeout = {max(1, int(budget.remaining() * 1000))}")
            if not write:
                yield db
                return
            with WriteTransaction(db):
                if not self._counted:  # the open could not write (_count)
                    self._count(db)
                yield db
            self._counted = True
        except sqlite3.Error as exc:
            raise CapabilityError(f"storage failed: {exc}") from None
        except KvStoreError as exc:
            raise CapabilityError(str(exc)) from None
        finally:
            self._lock.release()

    def get(self, ns: str, key: bytes) -> bytes | None:
        if len(key) > KEY_CAP:  # none is stored, and SQLite takes no blob of 2 GiB (an OverflowError, not its error)
            return None
        with self._locked() as db:
            rows = db.execute("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchall()
        return bytes(rows[0][0]) if rows else None

    def set(self, ns: str, key: bytes, value: bytes) -> None:
        if len(key) > KEY_CAP or not key:
            raise CapabilityError(f"a key must be 1 to {KEY_CAP} bytes, not {len(key)}")
        if len(value) > VALUE_CAP:
            raise CapabilityError(f"a value must be at most {VALUE_CAP} bytes, not {len(value)}")
        with self._locked(write=True) as db:
            old = _size_of(db, ns, key)
            count, used = _usage(db, ns)
            count, used = count + (old is None), used - (old or 0) + len(key) + len(value)
            if count > NAMESPACE_KEYS_CAP:
                raise CapabilityError(f"this harness already holds {NAMESPACE_KEYS_CAP} keys")
            if used > NAMESPACE_BYTES_CAP:
                raise CapabilityError(f"this harness's storage would exceed {NAMESPACE_BYTES_CAP} bytes")
            db.execute("INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)", (ns, key, value))
            db.execute("INSERT OR REPLACE INTO usage (ns, keys, bytes) VALUES (?, ?, ?)", (ns, count, used))

    def delete(self, ns: str, key: bytes) -> None:
        if len(key) > KEY_CAP:  # none is stored (as in get)
            return
        with self._locked(write=True) as db:
            old = _size_of(db, ns, key)
            if old is not None:
                count, used = _usage(db, ns)
                db.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key))
                db.execute("UPDATE usage SET keys = ?, bytes = ? WHERE ns = ?", (count - 1, used - old, ns))

    def keys(self, ns: str, prefix: bytes, limit: int, after: bytes = b"") -> list[bytes]:
        """Up to ``limit`` keys starting with ``prefix`` and greater than ``after``, sorted: a range of the primary
        key (every key is greater than the empty one). Past KEY_CAP bytes no key starts with ``prefix``, and a key
        is greater than ``after`` just when it is greater than its first KEY_CAP bytes: what SQLite is given stays
        small (a blob of 2 GiB was an OverflowError out of the capability, found by a hostile review)."""
        if len(prefix) > KEY_CAP:
            return []
        after = after[:KEY_CAP]
        # One lower bound, the tighter: with two, SQLite seeks to the prefix and filters out what is not after
        # ``after``, so a page past 100,000 keys read them all (23 ms under the lock every harness's kv calls
        # share, for an empty page: found by a review).
        lower, above = (after, ">") if after >= prefix else (prefix, ">=")
        end = _after_prefix(prefix)
        with self._locked() as db:
            rows = db.execute(f"SELECT key FROM kv WHERE ns = ? AND key {above} ? AND (? IS NULL OR key < ?) "
                              "ORDER BY key LIMIT ?", (ns, lower, end, end, limit)).fetchall()
        return [bytes(r[0]) for r in rows]


def _size_of(db: sqlite3.Connection, ns: str, key: bytes) -> int | None:
    row = db.execute("SELECT length(key) + length(value) FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
    return None if row is None else row[0]


def _usage(db: sqlite3.Connection, ns: str) -> tuple[int, int]:
    row = db.execute("SELECT keys, bytes FROM usage WHERE ns = ?", (ns,)).fetchone()
    return (0, 0) if row is None else row


def _after_prefix(prefix: bytes) -> bytes | None:
    """The least byte string after every string starting with ``prefix`` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1]) if stripped else None


def capabilities(store: KvStore, namespace: str) -> dict[str, CapabilityFn]:
    """``berm.kv.*`` bound to ``namespace``: a harness sees only its own keys."""

    @capability("berm.kv.get")
    def kv_get(request: bytes) -> bytes:
        (key,), _ = fields(request, ("key",))
        value = store.get(namespace, key)
        if value is None:
            raise CapabilityError(f"no value for key {key[:80]!r}")
        return value

    @capability("berm.kv.set")
    def kv_set(request: bytes) -> bytes:
        (key, value), _ = fields(request, ("key", "value"))
        store.set(namespace, key, value)
        return b""

    @capability("berm.kv.delete")
    def kv_delete(request: bytes) -> bytes:
        (key,), _ = fields(request, ("key",))
        store.delete(namespace, key)
        return b""

    @capability("berm.kv.list")
    def kv_list(request: bytes) -> bytes:
        """``[prefix]``: every key starting with it, sorted; more than LIST_CAP is an error, so that none is left
        out unseen. ``[prefix, after]``: a page, the first LIST_CAP of those keys greater than ``after`` (a full
        page may have more after its last key)."""
        (prefix, *after), _ = fields(request, ("prefix",), optional=("after",))
        if after:
            return encode_frame(store.keys(namespace, prefix, LIST_CAP, after[0]))
        keys = store.keys(namespace, prefix, LIST_CAP + 1)
        if len(keys) > LIST_CAP:
            raise CapabilityError(f"more than {LIST_CAP} keys start with {prefix[:80]!r}: list them in pages "
                                  "(a request [prefix, after]; the C SDK's berm_kv_list_page)")
        return encode_frame(keys)

    return {"berm.kv.get": kv_get, "berm.kv.set": kv_set, "berm.kv.delete": kv_delete, "berm.kv.list": kv_list}
