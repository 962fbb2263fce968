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
from berm_host.queue.errors import QueueError


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



@pytest.mark.parametrize("name", [kv.DB_NAME, kv.DB_NAME + "-wal", kv.DB_NAME + "-shm", kv.DB_NAME + "-journal"])
def test_a_symbolic_link_for_the_database_or_a_companion_is_refused_and_its_target_untouched(tmp_path, name):
    """Found by a review: the link was followed and its target, a file or a directory outside the data directory
    (its owner then unable to reach anything in it), narrowed to 0600."""
    outside_dir, outside_file, data = tmp_path / "outside", tmp_path / "outside.txt", tmp_path / "data"
    outside_dir.mkdir(mode=0o755)
    outside_file.write_text("not a database")
    os.chmod(outside_file, 0o644)
    data.mkdir(mode=0o700)
    os.symlink(outside_dir if name != kv.DB_NAME else outside_file, data / name)
    with pytest.raises(kv.KvStoreError, match="is a symbolic link"):
        kv.KvStore(data / kv.DB_NAME)
    assert (_mode(outside_dir), _mode(outside_file)) == (0o755, 0o644)


def test_a_companion_that_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "kv.sqlite3-wal", 0o644)
    with pytest.raises(PermissionError, match="not a regular file"):
        private_database(tmp_path / "kv.sqlite3")
    assert _mode(tmp_path / "kv.sqlite3-wal") == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_companion_of_another_users_is_refused(tmp_path):
    (tmp_path / "kv.sqlite3-shm").write_bytes(b"")
    os.chmod(tmp_path / "kv.sqlite3-shm", 0o644)
    os.chown(tmp_path / "kv.sqlite3-shm", 65534, 65534)
    with pytest.raises(PermissionError, match="not a regular file of this user's"):
        private_database(tmp_path / "kv.sqlite3")
    assert _mode(tmp_path / "kv.sqlite3-shm") == 0o644


def test_a_data_dir_others_can_write_to_is_refused_by_the_stores_and_the_daemon(tmp_path):
    """Anyone who can write to the directory can plant a link or a file of their own for this user's data."""
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    with pytest.raises(kv.KvStoreError, match="writable by other users"):
        kv.KvStore(state / kv.DB_NAME)
    with pytest.raises(QueueError, match="writable by other users"):
        DueSet(state / "due.sqlite3")
    with pytest.raises(daemon.DaemonError, match="writable by other users"):
        daemon._lock_state(state)
    assert list(state.iterdir()) == []


def test_a_data_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: state.stat().st_uid + 1)
    with pytest.raises(PermissionError, match="not to this user"):
        private_database(state / kv.DB_NAME)
    assert list(state.iterdir()) == []


def test_every_directory_made_is_0700_whatever_the_umask(tmp_path):
    """Path.mkdir(parents=True) made the parents with the umask's mode: 0777 under umask 0."""
    old = os.umask(0)
    try:
        private_database(tmp_path / "a" / "b" / kv.DB_NAME)
        os.close(daemon._lock_state(tmp_path / "c" / "d"))
    finally:
        os.umask(old)
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "c", "c/d")] == [0o700] * 4
