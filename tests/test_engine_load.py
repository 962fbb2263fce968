"""Engine.load from several threads: loads of different images run side by side (one image's cold compile must not
hold up another's load), and concurrent loads of the same bytes share one image, translated once."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from berm_host.engine import Engine
from tests.guests import guest_elf
from tests.queue_helpers import wait_for

#: A tiny guest; the table gives it relocations naming its function (every loadable image has some).
SOURCE = """unsigned long f%d(unsigned long x) { return x + %d; }
unsigned long (*volatile table[])(unsigned long) = {f%d};
unsigned long pick(unsigned long i, unsigned long x) { return table[i](x); }"""


@pytest.fixture(scope="module")
def elves():
    return [guest_elf(SOURCE % (k, k, k), keep=(f"f{k}", "pick")) for k in (1, 2)]


def test_a_slow_load_does_not_block_the_load_of_another_image(tmp_path, elves, monkeypatch):
    engine = Engine(kind="interp", cache_dir=tmp_path)
    slow, fast = elves
    entered, release = threading.Event(), threading.Event()
    real = Engine._facts

    def facts(self, data, digest):
        if data == slow:
            entered.set()
            assert release.wait(30), "the test never released the slow load"
        return real(self, data, digest)

    monkeypatch.setattr(Engine, "_facts", facts)
    loaded = {}
    worker = threading.Thread(target=lambda: loaded.setdefault("slow", engine.load(slow)))
    worker.start()
    try:
        assert entered.wait(30)
        # the slow load is in progress and holds its own gate only: this load must complete now
        done = threading.Event()
        threading.Thread(target=lambda: (loaded.setdefault("fast", engine.load(fast)), done.set())).start()
        assert done.wait(30), "loading another image waited for the slow load"
    finally:
        release.set()
        worker.join(30)
    assert loaded["slow"] is engine.load(slow) and loaded["fast"] is engine.load(fast)


def test_concurrent_loads_of_the_same_bytes_share_one_image(tmp_path, elves, monkeypatch):
    engine = Engine(kind="interp", cache_dir=tmp_path)
    calls, gate = [], threading.Barrier(4)
    real = Engine._facts

    def facts(self, data, digest):
        calls.append(digest)
        return real(self, data, digest)

    monkeypatch.setattr(Engine, "_facts", facts)
    images = []

    def load():
        gate.wait(30)
        images.append(engine.load(elves[0]))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(images) == 4 and all(image is images[0] for image in images)
    assert len(calls) == 1


def test_a_failed_load_can_be_retried(tmp_path, elves, monkeypatch):
    engine = Engine(kind="interp", cache_dir=tmp_path)
    real, failures = Engine._facts, [RuntimeError("disk full")]

    def facts(self, data, digest):
        if failures:
            raise failures.pop()
        return real(self, data, digest)

    monkeypatch.setattr(Engine, "_facts", facts)
    with pytest.raises(RuntimeError, match="disk full"):
        engine.load(elves[0])
    # a failed load's gate goes with its last user (it stayed for good: 20,000 bad images, 20,000 locks)
    assert not engine._loading
    assert engine.load(elves[0]).digest
    assert not engine._loading


def test_threads_waiting_on_a_failing_load_share_its_error(tmp_path, elves, monkeypatch):
    """Each thread waiting on the gate reran the failing compile after the one before it failed (6 callers, 12
    compiler runs, 6 s in a row): the threads that waited raise the error of the load they waited for."""
    engine = Engine(kind="interp", cache_dir=tmp_path)
    entered, release, calls = threading.Event(), threading.Event(), []

    def facts(self, data, digest):
        calls.append(digest)
        entered.set()
        assert release.wait(30), "the test never released the failing load"
        raise RuntimeError("cc failed")

    monkeypatch.setattr(Engine, "_facts", facts)
    errors = []

    def load():
        try:
            engine.load(elves[0])
        except RuntimeError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=load) for _ in range(4)]
    threads[0].start()
    assert entered.wait(30)
    for t in threads[1:]:
        t.start()
    gate, waited = engine._loading[hashlib.sha256(elves[0]).hexdigest()], time.monotonic()
    while gate.users < 4:  # the other three wait at the gate of the failing load
        assert time.monotonic() - waited < 30
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(30)
    assert errors == ["cc failed"] * 4 and len(calls) == 1
    assert not engine._loading


def test_a_load_interrupted_in_one_thread_is_loaded_by_a_thread_waiting_for_it(tmp_path, elves, monkeypatch):
    """Found by a review: a KeyboardInterrupt (or SystemExit) ending one thread's load was the error every thread
    waiting for that image raised too. Only an error of the load itself is shared; a waiting thread loads then."""
    engine = Engine(kind="interp", cache_dir=tmp_path)
    entered, release, calls = threading.Event(), threading.Event(), []
    real_facts = Engine._facts

    def facts(self, data, digest):
        calls.append(digest)
        if len(calls) == 1:
            entered.set()
            assert release.wait(30), "the test never released the interrupted load"
            raise KeyboardInterrupt
        return real_facts(self, data, digest)

    monkeypatch.setattr(Engine, "_facts", facts)
    outcomes = []

    def load():
        try:
            outcomes.append(engine.load(elves[0]).digest)
        except KeyboardInterrupt:
            outcomes.append("interrupted")

    first, second = threading.Thread(target=load), threading.Thread(target=load)
    first.start()
    assert entered.wait(30)
    second.start()
    gate = engine._loading[hashlib.sha256(elves[0]).hexdigest()]
    wait_for(lambda: gate.users == 2)
    release.set()
    first.join(30)
    second.join(30)
    assert sorted(outcomes) == sorted(["interrupted", hashlib.sha256(elves[0]).hexdigest()]) and len(calls) == 2


def test_an_engine_reads_no_file_larger_than_its_memory_can_hold(tmp_path, monkeypatch):
    """``Engine.load(path)`` reads at most the engine's memory size plus berm_aot.elf's MAX_UNLOADED_BYTES (lowered
    here to 4 KiB): a larger file is refused from its size, before it is read (it is sparse here); one at the limit
    is read, and refused for what it holds."""
    from berm_aot import elf
    from berm_aot.errors import ElfError

    monkeypatch.setattr(elf, "MAX_UNLOADED_BYTES", 4096)
    engine = Engine(kind="aot", memory_size=64 << 10, cache_dir=tmp_path / "cache")
    limit, path = (64 << 10) + 4096, tmp_path / "big.elf"
    with open(path, "wb") as f:
        f.truncate(limit + 1)
    with pytest.raises(ElfError, match=f"is {limit + 1} bytes, larger than any image read here \\({limit} bytes"):
        engine.load(path)
    with open(path, "r+b") as f:
        f.truncate(limit)
    with pytest.raises(ElfError, match="not an ELF file"):
        engine.load(path)
