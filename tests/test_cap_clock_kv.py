"""berm.clock.now and berm.kv.*: values, namespacing, persistence, caps and malformed requests."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from berm_abi.frames import decode_frame, encode_frame
from berm_host.capabilities import clock, kv
from berm_host.declaration import Declaration, DeclarationError
from berm_host.grants import GrantError, linker_for
from berm_host.linker import CapabilityError
from berm_host.running import interpreting
from tests.bounded import ends_within


def test_clock_now_is_utc_millis_and_the_local_offset():
    before = time.time_ns() // 1_000_000
    millis, offset = decode_frame(clock.capabilities()["berm.clock.now"](b""))
    after = time.time_ns() // 1_000_000
    assert before <= int(millis) <= after
    assert int(offset) == time.localtime(int(millis) // 1000).tm_gmtoff


def test_clock_now_reports_the_hosts_zone_offset_not_zero(monkeypatch):
    """With the host in a zone east of UTC (POSIX TZ "BRM-5:30", no DST), the offset is +5:30 in seconds."""
    monkeypatch.setenv("TZ", "BRM-5:30")
    time.tzset()
    try:
        _, offset = decode_frame(clock.capabilities()["berm.clock.now"](b""))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert int(offset) == 5 * 3600 + 30 * 60


def test_clock_now_takes_no_fields():
    with pytest.raises(CapabilityError, match="malformed request"):
        clock.capabilities()["berm.clock.now"](encode_frame(["x"]))


@pytest.fixture
def store(tmp_path):
    return kv.KvStore(tmp_path / "kv.sqlite3")


def _kv(store, ns):
    caps = kv.capabilities(store, ns)
    return {name.rsplit(".", 1)[1]: (lambda fn: lambda *f: fn(encode_frame(list(f))))(fn) for name, fn in caps.items()}


def test_set_get_delete_list(store):
    a = _kv(store, "a")
    assert a["set"]("k1", b"\0binary\xff") == b""
    a["set"]("k2", "two")
    a["set"]("other", "x")
    assert a["get"]("k1") == b"\0binary\xff"
    assert decode_frame(a["list"]("k")) == [b"k1", b"k2"]
    assert decode_frame(a["list"]("")) == [b"k1", b"k2", b"other"]
    a["set"]("k1", "replaced")
    assert a["get"]("k1") == b"replaced"
    assert a["delete"]("k1") == b""
    assert a["delete"]("k1") == b""  # deleting what is not there is fine
    with pytest.raises(CapabilityError, match="berm.kv.get: no value for key"):
        a["get"]("k1")


def test_namespaces_do_not_see_each_other(store):
    a, b = _kv(store, "a"), _kv(store, "b")
    a["set"]("shared-name", "from a")
    b["set"]("shared-name", "from b")
    assert a["get"]("shared-name") == b"from a"
    assert b["get"]("shared-name") == b"from b"
    b["delete"]("shared-name")
    assert a["get"]("shared-name") == b"from a"
    assert decode_frame(b["list"]("")) == []


def test_values_outlive_the_store_object(tmp_path):
    path = tmp_path / "kv.sqlite3"
    _kv(kv.KvStore(path), "h")["set"]("persist", "yes")
    assert _kv(kv.KvStore(path), "h")["get"]("persist") == b"yes"


def test_size_caps_refuse_and_change_nothing(store, monkeypatch):
    a = _kv(store, "a")
    a["set"]("k", "old")
    with pytest.raises(CapabilityError, match="value must be at most"):
        a["set"]("k", b"v" * (kv.VALUE_CAP + 1))
    with pytest.raises(CapabilityError, match="key must be 1 to"):
        a["set"](b"k" * (kv.KEY_CAP + 1), "v")
    with pytest.raises(CapabilityError, match="key must be 1 to"):
        a["set"]("", "v")
    assert a["get"]("k") == b"old"
    monkeypatch.setattr(kv, "NAMESPACE_KEYS_CAP", 2)
    a["set"]("k2", "v")
    a["set"]("k2", "replacing does not count as a new key")
    with pytest.raises(CapabilityError, match="already holds 2 keys"):
        a["set"]("k3", "v")
    _kv(store, "b")["set"]("k3", "another namespace has its own budget")
    monkeypatch.setattr(kv, "NAMESPACE_BYTES_CAP", 100)
    with pytest.raises(CapabilityError, match="would exceed 100 bytes"):
        a["set"]("k", b"x" * 90)
    assert a["get"]("k") == b"old"


def test_list_prefix_is_a_byte_prefix(store):
    a = _kv(store, "a")
    for key in [b"a%", b"a_", b"ab", b"a\xff", b"b"]:
        a["set"](key, "v")
    assert decode_frame(a["list"]("a%")) == [b"a%"]  # no LIKE wildcards
    assert decode_frame(a["list"](b"a")) == [b"a%", b"a_", b"ab", b"a\xff"]


def test_keys_longer_than_any_stored_never_reach_sqlite(store, monkeypatch):
    """Found by a hostile review: get, delete and list handed SQLite whatever the guest sent, and a key of 2 GiB + 1
    (a harness with 4 GiB of memory) raised Python's OverflowError ("BLOB longer than INT_MAX bytes"), a host-call
    trap. No stored key is longer than KEY_CAP: the answers follow without asking SQLite."""
    a = _kv(store, "a")
    edge, past = b"k" * kv.KEY_CAP, b"k" * (kv.KEY_CAP - 1) + b"l"
    a["set"](edge, "v")
    a["set"](past, "v")
    monkeypatch.setattr(store, "_locked", lambda *args, **kwargs: pytest.fail("SQLite was asked"))
    long = edge + b"z"
    with pytest.raises(CapabilityError, match="no value for key"):
        a["get"](long)
    assert a["delete"](long) == b""
    assert decode_frame(a["list"](long)) == []
    monkeypatch.undo()
    assert decode_frame(a["list"](b"k", long)) == [past]  # edge is a prefix of `long`, so it sorts before it
    assert decode_frame(a["list"](b"k", edge)) == [past]


def test_list_prefixes_ending_in_ff_bytes(store):
    a = _kv(store, "a")
    for key in [b"a\xff", b"a\xff\xff", b"a\xff\x00", b"b", b"\xff", b"\xff\xff"]:
        a["set"](key, "v")
    assert decode_frame(a["list"](b"a\xff")) == [b"a\xff", b"a\xff\x00", b"a\xff\xff"]
    assert decode_frame(a["list"](b"\xff")) == [b"\xff", b"\xff\xff"]
    assert decode_frame(a["list"](b"\xff\xff\xff")) == []


def test_list_refuses_more_keys_than_a_reply_holds_and_pages_through_them(store, monkeypatch):
    """More keys than LIST_CAP under a prefix were silently cut to the first LIST_CAP: now that is an error, and a
    request with an ``after`` field reads them page by page."""
    monkeypatch.setattr(kv, "LIST_CAP", 3)
    a = _kv(store, "a")
    keys = [b"k%d" % i for i in range(8)]
    for key in keys + [b"j", b"l"]:
        a["set"](key, "v")
    assert decode_frame(a["list"]("k", "k6")) == [b"k7"]
    assert decode_frame(a["list"]("l")) == [b"l"]  # a prefix with fewer keys than the cap: every key
    with pytest.raises(CapabilityError, match="berm.kv.list: more than 3 keys start with b'k': list them in pages"):
        a["list"]("k")
    got, after = [], b""
    while True:
        page = decode_frame(a["list"]("k", after))
        got += page
        if len(page) < 3:
            break
        after = page[-1]
    assert got == keys  # pages of 3, 3 and 2, from the first key (the empty after)
    assert decode_frame(a["list"]("", "k7")) == [b"l"]
    with pytest.raises(CapabilityError, match=r"expected fields \['prefix'\] then optionally \['after'\], got more than 2"):
        a["list"]("k", "a", "b")


def _recounted(store) -> dict:
    db = sqlite3.connect(store.path)
    try:
        counted = {ns: (k, b) for ns, k, b in db.execute("SELECT ns, keys, bytes FROM usage WHERE keys > 0")}
        actual = {ns: (k, b) for ns, k, b in db.execute(
            "SELECT ns, COUNT(*), SUM(length(key) + length(value)) FROM kv GROUP BY ns")}
    finally:
        db.close()
    assert counted == actual
    return counted


def test_each_namespace_usage_is_kept_with_every_write(store):
    """The caps were checked by summing the whole namespace on every set (~50 ms for a full one, under the lock
    every harness's kv calls share); the counts kept instead must stay exact through replaces and deletes."""
    a, b = _kv(store, "a"), _kv(store, "b")
    a["set"]("k1", "one")
    a["set"]("k2", "two")
    a["set"]("k1", "a longer one")
    b["set"]("k", "b's")
    a["delete"]("k2")
    a["delete"]("nothing")
    assert _recounted(store) == {"a": (1, 2 + 12), "b": (1, 1 + 3)}
    a["delete"]("k1")
    assert _recounted(store) == {"b": (1, 4)}


def test_a_store_from_before_usage_was_kept_is_counted_when_opened(tmp_path, monkeypatch):
    path = tmp_path / "kv.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE kv (ns TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ns, key)) "
               "WITHOUT ROWID")
    db.executemany("INSERT INTO kv VALUES (?, ?, ?)", [("a", b"k1", b"v" * 40), ("a", b"k2", b"v" * 40)])
    db.commit()
    db.close()
    store = kv.KvStore(path)
    assert _recounted(store) == {"a": (2, 84)}
    monkeypatch.setattr(kv, "NAMESPACE_BYTES_CAP", 100)
    with pytest.raises(CapabilityError, match="would exceed 100 bytes"):
        _kv(store, "a")["set"]("k3", b"v" * 20)


def test_usage_is_counted_afresh_at_every_open(tmp_path):
    """A version of this code from before the usage table, writing to the same file while this one ran, left the
    counts short for good; later deletes took them below zero, loosening the caps."""
    path = tmp_path / "kv.sqlite3"
    _kv(kv.KvStore(path), "a")["set"]("k", "v")
    db = sqlite3.connect(path)
    db.execute("INSERT INTO kv VALUES ('a', x'6b32', x'7676')")  # as the old code wrote: usage untouched
    db.commit()
    db.close()
    assert _recounted(kv.KvStore(path)) == {"a": (2, 6)}


def test_a_full_disk_is_reported_as_such(store):
    a = _kv(store, "a")
    a["set"]("small", "v")
    store._db.execute("PRAGMA max_page_count = 8")  # the file cannot grow: as a disk with no room left
    with pytest.raises(CapabilityError, match="full"):
        a["set"]("big", b"x" * 200_000)
    assert a["get"]("small") == b"v" and _recounted(store) == {"a": (1, 6)}


def test_a_failed_commit_leaves_the_store_writable(store):
    """Found as a review's duplicate was merged: a COMMIT that failed (as a full disk fails it in WAL mode) left the
    store's connection inside the transaction, and every later write of the process failed ("cannot start a
    transaction within a transaction"). Here a deferred foreign key, checked only at COMMIT, fails the write of one
    key."""
    a = _kv(store, "a")
    a["set"]("before", "v")
    store._db.executescript("""
        PRAGMA foreign_keys = ON;
        CREATE TABLE nowhere (id INTEGER PRIMARY KEY);
        CREATE TABLE dangling (ref INTEGER REFERENCES nowhere(id) DEFERRABLE INITIALLY DEFERRED);
        CREATE TRIGGER fails_at_commit AFTER INSERT ON kv WHEN NEW.key = CAST('doomed' AS BLOB)
            BEGIN INSERT INTO dangling VALUES (1); END;
    """)
    with pytest.raises(CapabilityError, match="storage failed: FOREIGN KEY constraint failed"):
        a["set"]("doomed", "x")
    assert not store._db.in_transaction
    a["set"]("after", "w")
    assert decode_frame(a["list"]("")) == [b"after", b"before"]
    assert _recounted(store) == {"a": (2, 13)}


def test_a_store_that_cannot_be_written_still_opens_and_counts_at_its_first_write(tmp_path, monkeypatch):
    """Found by a review: on a full disk no new process could open the store, even to read, because every open
    recounts the usage under a write transaction. Here the store is from before usage was kept: creating its usage
    table needs a page the file cannot have, as on a disk with no room left."""
    path = tmp_path / kv.DB_NAME
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE kv (ns TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (ns, key)) "
               "WITHOUT ROWID")
    db.execute("INSERT INTO kv VALUES ('a', x'6b31', x'7676')")
    db.commit()
    db.close()
    connect = kv.KvStore._connect

    def full(self, timeout):
        db = connect(self, timeout)
        db.execute("PRAGMA max_page_count = 1")  # as small as SQLite lets it be: the file's present size
        return db

    monkeypatch.setattr(kv.KvStore, "_connect", full)
    store = kv.KvStore(path)
    a = _kv(store, "a")
    assert a["get"]("k1") == b"vv"
    with pytest.raises(CapabilityError, match="full"):
        a["set"]("k2", "v")
    store._db.execute("PRAGMA max_page_count = 1000")  # room again
    a["set"]("k2", "v")
    assert _recounted(store) == {"a": (2, 7)}


def test_a_call_waits_for_the_file_lock_only_as_long_as_its_invocation_can(store):
    """Another process holding the database's write lock kept every kv call waiting SQLite's fixed 5 s, past the
    invocation's deadline (and each waiting thread sat through the previous one's wait too)."""
    a = _kv(store, "a")
    a["set"]("k", "v")  # the file exists, with its tables
    other = sqlite3.connect(store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        def call():
            with interpreting(time.monotonic() + 1.0):
                with pytest.raises(CapabilityError, match="locked|busy"):
                    a["set"]("k", "w")
        ends_within(3.0, call)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert a["get"]("k") == b"v"


def test_malformed_kv_requests(store):
    caps = kv.capabilities(store, "a")
    with pytest.raises(CapabilityError, match="malformed request"):
        caps["berm.kv.set"](encode_frame(["only-key"]))
    with pytest.raises(CapabilityError, match="malformed request"):
        caps["berm.kv.get"](b"\x05\x00\x00\x00ab")


def test_data_dir_override_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BERM_DATA_DIR", str(tmp_path / "env"))
    assert kv.data_dir() == (tmp_path / "env").resolve()
    assert kv.data_dir(tmp_path / "arg") == (tmp_path / "arg").resolve()


def test_an_unusable_data_dir_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(kv.KvStoreError, match="cannot open the key-value store"):
        kv.KvStore(tmp_path / "file" / "kv.sqlite3")


_FORK_SCRIPT = """
import os, subprocess, sys, threading, time
from pathlib import Path
from berm_host.capabilities.kv import DB_NAME, KvStore
directory = Path(sys.argv[1])
store = KvStore.shared(directory)
store.set("ns", b"before", b"parent")
held, release = threading.Event(), threading.Event()
def busy():  # another thread of the parent, in the middle of a write and of an open, when the fork happens
    with KvStore._open_lock:
        with store._locked(write=True) as db:
            db.execute("INSERT INTO kv VALUES ('ns', x'6d6964', x'77726974696e67')")  # mid-transaction
            held.set()
            time.sleep(0.3)  # the fork waits for the write: forked mid-write, the child's SQLite saw it locked
        release.wait()
def in_child(work):
    pid = os.fork()
    if pid == 0:
        try:
            work()
            os._exit(0)
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
def reads_and_writes():
    child = KvStore.shared(directory)
    assert child.get("ns", b"before") == b"parent" and child.get("ns", b"mid") == b"writing"
    child.set("ns", b"from", b"child")
    store.set("ns", b"also", b"child")  # a store object the child inherited works too
def reads_while_another_process_writes():  # a read needs no write lock, and the child's first call takes none
    assert KvStore.shared(directory).get("ns", b"from") == b"child"
threading.Thread(target=busy, daemon=True).start()
held.wait()
in_child(reads_and_writes)
release.set()
holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], "
                           "isolation_level=None); db.execute('BEGIN IMMEDIATE'); print('held', flush=True); "
                           "time.sleep(60)", str(directory / DB_NAME)], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline() == "held\\n"
in_child(reads_while_another_process_writes)
holder.kill()
holder.wait()
assert store.get("ns", b"from") == b"child" and store.get("ns", b"also") == b"child"
store.set("ns", b"after", b"parent")  # the parent's own connection still serves it
print("ok")
"""


def test_a_forked_child_uses_its_own_connection_and_locks(tmp_path):
    """A child forked while another thread of its parent was in a write and held the lock that opens stores
    reads and writes that store at once, through a connection of its own: SQLite connections must not cross a fork
    (a database used through one in two processes can be corrupted), and the locks, held for ever in the child,
    made it wait out KV_TIMEOUT on every call, or for ever to open a store. Found by a review since: forked in the
    middle of the write, every call in the child failed for good ("database is locked"; the fork now waits for the
    write), and a read in the child took the write lock (its first call recounted the store: it failed, after
    KV_TIMEOUT whatever its deadline, while another process wrote)."""
    proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
    db = sqlite3.connect(tmp_path / kv.DB_NAME)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_sizes_exactly_at_each_cap_are_accepted(store, monkeypatch):
    a = _kv(store, "a")
    a["set"](b"k" * kv.KEY_CAP, b"v" * kv.VALUE_CAP)
    assert a["get"](b"k" * kv.KEY_CAP) == b"v" * kv.VALUE_CAP
    monkeypatch.setattr(kv, "NAMESPACE_BYTES_CAP", kv.KEY_CAP + kv.VALUE_CAP + 100)
    a["set"]("x", b"y" * 99)  # 1 + 99 bytes: exactly the cap
    assert a["get"]("x") == b"y" * 99
    with pytest.raises(CapabilityError, match="would exceed"):
        a["set"]("x", b"y" * 100)


def test_list_of_exactly_list_cap_keys_is_whole(store, monkeypatch):
    monkeypatch.setattr(kv, "LIST_CAP", 3)
    a = _kv(store, "a")
    for key in [b"k0", b"k1", b"k2", b"l"]:
        a["set"](key, "v")
    assert decode_frame(a["list"]("k")) == [b"k0", b"k1", b"k2"]


_FORK_OWN_CONNECTION = """
import os, sys
from pathlib import Path
from berm_host.capabilities import kv
store = kv.KvStore(Path(sys.argv[1]) / kv.DB_NAME)
store.set("ns", b"k", b"parent")
inherited = store._db
pid = os.fork()
if pid == 0:
    ok = store.get("ns", b"k") == b"parent" and store._db is not None and store._db is not inherited
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("ok" if os.waitstatus_to_exitcode(status) == 0 else "the child used the connection it inherited")
"""


def test_a_forked_child_never_uses_the_connection_it_inherited(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _FORK_OWN_CONNECTION, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr


_FORK_PARENT_EXITS_FIRST = """
import os, subprocess, sys
from pathlib import Path
from berm_host.capabilities import kv
directory = Path(sys.argv[1])
store = kv.KvStore.shared(directory)
store.set("ns", b"parent", b"v")
parent_alive, held_by_parent = os.pipe()
if os.fork():
    os._exit(0)  # the parent ends first, as one that daemonizes does
os.close(held_by_parent)
store.set("ns", b"c1", b"v")
assert os.read(parent_alive, 1) == b""  # end of file: the parent has exited
subprocess.run([sys.executable, "-c", "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
                "db.execute('SELECT count(*) FROM kv').fetchall(); db.close()", str(directory / kv.DB_NAME)], check=True)
store.set("ns", b"c2", b"v")
print("ok", flush=True)
os._exit(0)  # as if killed: what it acknowledged must survive
"""


def test_a_forked_child_keeps_its_writes_after_its_parent_exits(tmp_path):
    """Found by a review: the child kept the connection it inherited open, so SQLite (its POSIX-lock bookkeeping is
    per process) took no kernel lock for the child's own connection. Once the parent had exited, another process
    opening and closing the store saw itself as its last user, checkpointed and deleted the -wal and -shm, and the
    child's later writes, acknowledged, went to an unlinked WAL and were lost."""
    proc = subprocess.run([sys.executable, "-c", _FORK_PARENT_EXITS_FIRST, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)  # returns once the child has closed its output too: it has ended
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    db = sqlite3.connect(tmp_path / kv.DB_NAME)
    assert sorted(bytes(k) for (k,) in db.execute("SELECT key FROM kv")) == [b"c1", b"c2", b"parent"]
    db.close()


def test_a_call_waits_for_another_call_of_this_process(store):
    """A call finding the store busy with another thread's call waits for it (up to its budget), not fails."""
    a = _kv(store, "a")
    a["set"]("k", "v")
    held, release = threading.Event(), threading.Event()

    def other_call():
        with store._locked():
            held.set()
            release.wait(10)

    t = threading.Thread(target=other_call)
    t.start()
    held.wait(10)
    threading.Timer(0.2, release.set).start()
    try:
        assert a["get"]("k") == b"v"
    finally:
        release.set()
        t.join()


def test_a_store_opened_while_a_fork_waits_is_released_exactly_after_it(tmp_path, monkeypatch):
    """Found by a review: the fork handler released every store of the process after the fork, a store opened while
    the fork waited for a call in progress among them. Releasing that store's lock, never taken, raised, which ended
    the handler's loop and left the stores after it locked for good ("storage is busy" at every call), and freed a
    lock a call in progress held. A store now registers under the lock the fork holds throughout."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # where a fork handler's exception goes
    first = kv.KvStore.shared(tmp_path / "first")
    release = threading.Event()

    def call_in_progress():
        with first._lock:
            release.wait(30)

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)

    threads = [threading.Thread(target=call_in_progress), threading.Thread(target=fork)]
    opened = []
    threads.append(threading.Thread(target=lambda: opened.append(kv.KvStore.shared(tmp_path / "late"))))
    for thread in threads:
        thread.start()
        time.sleep(0.2)  # the fork waits for the call; the store is opened meanwhile (or, on a slow machine, before)
    release.set()
    for thread in threads:
        thread.join()
    assert unraisable == []
    assert not first._lock.locked() and not opened[0]._lock.locked()
    for store in (first, opened[0]):
        store.set("ns", b"k", b"v")
        assert store.get("ns", b"k") == b"v"


def test_a_page_after_many_keys_reads_from_where_it_starts(store):
    """Found by a review: a page's query had two lower bounds, the prefix and ``after``, and SQLite sought to the
    prefix and filtered what was not after ``after``: a page past 100,000 keys read them all, under the lock every
    harness's kv calls share (23 ms for an empty page). Counted in SQLite's virtual machine steps, not in time."""
    db = store._db
    db.execute("BEGIN")
    db.executemany("INSERT INTO kv VALUES ('a', ?, x'')", ((b"%06d" % i,) for i in range(20_000)))
    db.execute("COMMIT")
    steps = []
    db.set_progress_handler(lambda: steps.append(1) and 0, 100)
    try:
        assert store.keys("a", b"", 10, after=b"\xff") == []
        assert store.keys("a", b"01", 3, after=b"019998") == [b"019999"]
        assert store.keys("a", b"019", 2, after=b"0") == [b"019000", b"019001"]  # after before the prefix
    finally:
        db.set_progress_handler(None, 0)
    assert len(steps) < 20  # a scan of the 20,000 keys takes thousands


@pytest.mark.parametrize("name", [os.fsdecode(b"caf\xe9"), "../x"])
def test_a_kv_namespace_a_declaration_could_not_name_is_refused_when_linked(tmp_path, name):
    """Found by a review: ``linker_for(harness_name=...)`` was never checked, and a name holding a lone surrogate (a
    Latin-1 file name's stem on a UTF-8 system) made every kv call raise UnicodeEncodeError, a host bug. (A
    Declaration of that name is refused as it is made.)"""
    with pytest.raises(GrantError, match="the kv namespace, must be 1-64 of"):
        linker_for(Declaration(name="h", capabilities=("kv",)), harness_name=name, data_dir=tmp_path)
    with pytest.raises(DeclarationError, match="harness name .* must be 1-64 of"):
        Declaration(name=name, capabilities=("kv",))
