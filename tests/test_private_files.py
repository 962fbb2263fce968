"""Harnesses' data is this user's only, whatever the umask: found by two reviews, under ``berm serve`` with umask
022 the state directory was 0755 and the kv store and the due-set 0644 (their WAL files too), so any local user
could read every harness's storage and every wake's payload."""

from __future__ import annotations

import os
import stat

import pytest

from berm_host import daemon
from berm_host.capabilities import kv
from berm_host.private_files import private_database
from berm_host.queue.dueset import DueSet


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_kv_store_and_the_due_set_are_the_users_only(tmp_path, umask_022):
    state = tmp_path / "state"
    os.close(daemon._lock_state(state))
    store = kv.KvStore(state / kv.DB_NAME)
    store.set("h", b"secret", b"the PIN")
    due = DueSet(state / "due.sqlite3")
    assert _mode(state) == 0o700
    for name in (kv.DB_NAME, kv.DB_NAME + "-wal", kv.DB_NAME + "-shm", "due.sqlite3", "due.sqlite3-wal"):
        assert _mode(state / name) == 0o600, name
    assert due.path.exists()


def test_an_existing_database_and_its_companions_are_narrowed(tmp_path, umask_022):
    """A store written by an older version (0644) is made 0600 when opened, its WAL files too."""
    path = tmp_path / "kv.sqlite3"
    for name in ("kv.sqlite3", "kv.sqlite3-wal", "kv.sqlite3-shm"):
        (tmp_path / name).write_bytes(b"")
        os.chmod(tmp_path / name, 0o644)
    private_database(path)
    assert [_mode(tmp_path / n) for n in ("kv.sqlite3", "kv.sqlite3-wal", "kv.sqlite3-shm")] == [0o600] * 3

