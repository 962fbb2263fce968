"""``berm.kv.get`` / ``set`` / ``delete`` / ``list``: the one state that outlives an invocation.

One SQLite database (WAL journal, ``synchronous=FULL``: a write acknowledged to the guest survives a crash) under
the data directory, shared by every harness; each capability set is bound to one namespace (the harness's name)
and cannot name another. Keys and values are bytes. Caps: key and value sizes, and per namespace the number of
keys and the bytes they hold; a ``set`` over a cap is refused and changes nothing.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import platformdirs

from berm_abi.errors import BermError
from berm_abi.frames import encode_frame
from berm_host.linker import CapabilityError, CapabilityFn

from ._request import capability, fields

KEY_CAP = 1024
VALUE_CAP = 1024 * 1024
NAMESPACE_KEYS_CAP = 100_000
NAMESPACE_BYTES_CAP = 64 * 1024 * 1024
LIST_CAP = 10_000
#: How long a call waits for another process holding the database's write lock.
KV_TIMEOUT = 5.0
DB_NAME = "kv.sqlite3"


class KvStoreError(BermError):
    """The key-value database cannot be opened or created."""


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where persistent harness data lives: ``override``, else ``$BERM_DATA_DIR``, else the user data dir."""
    chosen = override or os.environ.get("BERM_DATA_DIR") or platformdirs.user_data_dir("berm")
    return Path(chosen).expanduser().resolve()


class KvStore:
    """One database file; safe to share between threads (one connection behind a lock) and processes (SQLite
    locking, waiting up to ``KV_TIMEOUT`` seconds)."""

    _open: dict[Path, "KvStore"] = {}
    _open_lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=KV_TIMEOUT, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key BLOB NOT NULL, "
                             "value BLOB NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID")
        except (OSError, sqlite3.Error) as exc:
            raise KvStoreError(f"cannot open the key-value store {path}: {exc}") from None

    @classmethod
    def shared(cls, directory: Path) -> "KvStore":
        """The process-wide store for ``directory`` (opened once)."""
        path = directory / DB_NAME
        with cls._open_lock:
            store = cls._open.get(path)
            if store is None:
                store = cls._open[path] = cls(path)
            return store

    def _run(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise CapabilityError(f"storage failed: {exc}") from None

    def get(self, ns: str, key: bytes) -> bytes | None:
        rows = self._run("SELECT value FROM kv WHERE ns = ? AND key = ?", (ns, key))
        return bytes(rows[0][0]) if rows else None

    def set(self, ns: str, key: bytes, value: bytes) -> None:
        if len(key) > KEY_CAP or not key:
            raise CapabilityError(f"a key must be 1 to {KEY_CAP} bytes, not {len(key)}")
        if len(value) > VALUE_CAP:
            raise CapabilityError(f"a value must be at most {VALUE_CAP} bytes, not {len(value)}")
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    count, used = self._db.execute(
                        "SELECT COUNT(*), COALESCE(SUM(length(key) + length(value)), 0) FROM kv "
                        "WHERE ns = ? AND key != ?", (ns, key)).fetchone()
                    if count + 1 > NAMESPACE_KEYS_CAP:
                        raise CapabilityError(f"this harness already holds {NAMESPACE_KEYS_CAP} keys")
                    if used + len(key) + len(value) > NAMESPACE_BYTES_CAP:
                        raise CapabilityError(f"this harness's storage would exceed {NAMESPACE_BYTES_CAP} bytes")
                    self._db.execute("INSERT OR REPLACE INTO kv (ns, key, value) VALUES (?, ?, ?)", (ns, key, value))
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise CapabilityError(f"storage failed: {exc}") from None

    def delete(self, ns: str, key: bytes) -> None:
        self._run("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key))

    def keys(self, ns: str, prefix: bytes, limit: int = LIST_CAP) -> list[bytes]:
        rows = self._run("SELECT key FROM kv WHERE ns = ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
                         (ns, len(prefix), prefix, limit))
        return [bytes(r[0]) for r in rows]


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
        (prefix,), _ = fields(request, ("prefix",))
        return encode_frame(store.keys(namespace, prefix))

    return {"berm.kv.get": kv_get, "berm.kv.set": kv_set, "berm.kv.delete": kv_delete, "berm.kv.list": kv_list}
