"""Translated code is unloaded with the last reference to its image: an engine that loads image after image (an
embedder running images it receives) does not keep every object mapped, and code that may still run — a run in
progress on another thread, however its caller's references went — is never unmapped under it."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from berm_host.engine import Engine
from berm_host.traps import Trap
from tests.guests import raw_harness_elf

SOURCE = r"""
static char out[8] = "%d";
Pair berm_tool_which(void) { Pair p = { (u64)out, 1 }; return p; }
/* Spin until the deadline interrupts (a loop the compiler cannot remove). */
Pair berm_tool_spin(void) {
    for (volatile u64 i = 0; ; i++) {}
    Pair p = { 0, 0 };
    return p;
}
"""


def mapped(cache_dir) -> set[str]:
    """The files under ``cache_dir`` this process has mapped (translated objects it has loaded)."""
    with open("/proc/self/maps") as maps:
        paths = (line.split(maxsplit=5)[5:] for line in maps)  # address, perms, offset, dev, inode[, path]
        return {path[0].strip() for path in paths if path and path[0].startswith(str(cache_dir))}


@pytest.fixture(scope="module")
def elves() -> list[bytes]:
    return [raw_harness_elf(SOURCE % k, ("which", "spin")) for k in range(3)]


def test_an_image_nobody_holds_is_unloaded(tmp_path, elves):
    engine = Engine(cache_dir=tmp_path)
    harness = engine.load(elves[0]).harness()
    assert harness.call("which") == "0"
    assert len(mapped(tmp_path)) == 1
    del harness
    gc.collect()
    assert mapped(tmp_path) == set()
    assert engine.load(elves[0]).harness().call("which") == "0"  # loads again, from the code cache


def test_an_engine_that_loads_image_after_image_keeps_only_those_in_use(tmp_path, elves):
    engine = Engine(cache_dir=tmp_path)
    held = engine.load(elves[0]).harness()
    for k, elf in enumerate(elves[1:], start=1):
        assert engine.load(elf).harness().call("which") == str(k)
        gc.collect()
        assert len(mapped(tmp_path)) == 1, "an image nobody holds stayed mapped"
    assert held.call("which") == "0"
    assert engine.load(elves[0]) is held.image  # held: the same image, not a second load


def test_a_run_in_progress_keeps_its_code_while_its_caller_lets_go(tmp_path, elves):
    """Another thread drops every reference it has to the image while a run spins in its code: the run ends with
    the deadline's trap (not a crash), and only then is the object unmapped."""
    holder = {"harness": Engine(cache_dir=tmp_path, deadline=0.5).load(elves[1]).harness()}
    outcome = []

    def run(harness):
        try:
            harness.call("spin")
        except Trap as trap:
            outcome.append(trap.info.kind.name)

    worker = threading.Thread(target=run, args=(holder.pop("harness"),))
    worker.start()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # only the worker thread (its frames and arguments) holds the image now
        gc.collect()
    assert len(mapped(tmp_path)) == 1
    worker.join(30)
    del worker
    gc.collect()
    assert outcome == ["INTERRUPTED"]
    assert mapped(tmp_path) == set()
