"""The Engine's deadlines as a host call sees them (``running.time_left``): a caller's deadline only ever shortens
the engine's, a run nested in a capability ends by the earliest of its own and its caller's, and once a run is over
nothing of its deadline stays on the thread. Also the bounds of the result cap an Engine accepts. Both engines."""

from __future__ import annotations

import time
import types

import pytest

from berm_host import running
from berm_host.engine import Engine
from berm_host.linker import Linker
from berm_host.running import time_left
from berm_host.traps import HostError
from tests.guests import capability_relay_elf

KINDS = ("aot", "interp")


@pytest.fixture(scope="module")
def elf() -> bytes:
    return capability_relay_elf()


def _linker(fn) -> Linker:
    linker = Linker()
    linker.define("x.cap", fn)
    return linker


def _left(request: bytes) -> bytes:
    """x.cap: the seconds the running invocation has left, as a host call serving it sees them."""
    return repr(time_left()).encode()


@pytest.mark.parametrize("kind", KINDS)
def test_a_caller_deadline_far_away_does_not_lengthen_the_engine_deadline(tmp_path, elf, kind):
    """``deadline`` "can only shorten the engine's own deadline": one an hour away leaves the engine's 5 s (a
    capability that bounds its own timeout by time_left would otherwise wait long past the engine's deadline)."""
    h = Engine(kind=kind, cache_dir=tmp_path, deadline=5.0).load(elf).harness(_linker(_left))
    assert 0 < float(h.call("cap")) <= 5.0
    assert 0 < float(h.call("cap", deadline=time.monotonic() + 3600)) <= 5.0
    assert 0 < float(h.call("cap", deadline=time.monotonic() + 2.0)) <= 2.0  # a nearer one wins
    assert time_left() is None  # nothing of the runs' deadlines stays on this thread


@pytest.mark.parametrize("outer", KINDS)
@pytest.mark.parametrize("inner", KINDS)
@pytest.mark.parametrize("outer_deadline, inner_deadline", [(5.0, 3600.0), (3600.0, 5.0)],
                         ids=["caller-earlier", "nested-earlier"])
def test_a_run_nested_in_a_capability_ends_by_the_earliest_deadline_and_leaves_none_behind(
        tmp_path, elf, outer, inner, outer_deadline, inner_deadline):
    """A harness run by a capability has the earlier of its own engine's deadline and what its caller has left
    (5 s either way, never the hour) — across engines too — and once it and its caller are over no deadline stays
    on the thread; in between the caller has its own deadline again."""
    seen = {}
    nested = Engine(kind=inner, cache_dir=tmp_path, deadline=inner_deadline).load(elf).harness(_linker(_left))

    def run_nested(request: bytes) -> bytes:
        seen["nested"] = float(nested.call("cap"))
        seen["after"] = time_left()
        return b"back"

    caller = Engine(kind=outer, cache_dir=tmp_path, deadline=outer_deadline).load(elf).harness(_linker(run_nested))
    assert caller.call("cap") == "back"
    assert 0 < seen["nested"] <= 5.0
    assert seen["after"] is not None and 0 < seen["after"] <= outer_deadline
    assert seen["after"] > 5.0 or outer_deadline == 5.0  # the caller's own deadline again, not the nested one's
    assert time_left() is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_result_cap_of_zero_bytes_is_a_cap(tmp_path, elf, kind):
    """0 is a byte count like any other (``0 <= max_result``): an engine made with it refuses any non-empty
    result and returns the empty one."""
    reply = {}
    h = Engine(kind=kind, cache_dir=tmp_path, max_result=0).load(elf).harness(_linker(lambda r: reply["r"]))
    reply["r"] = b""
    assert h.call("cap") == ""
    reply["r"] = b"x"
    with pytest.raises(HostError, match="result of 1 bytes, over the cap of 0 bytes"):
        h.call("cap")


def test_a_result_cap_must_be_an_unsigned_64_bit_byte_count(tmp_path):
    assert Engine(cache_dir=tmp_path, max_result=(1 << 64) - 1).max_result == (1 << 64) - 1
    for bad in (1 << 64, -1, True, 1000.0, "1000", None):
        with pytest.raises(ValueError, match="the result cap must be a number of bytes"):
            Engine(cache_dir=tmp_path, max_result=bad)


@pytest.mark.parametrize("call", ["berm_thread_deadline", "berm_thread_runs", "berm_thread_enter",
                                  "berm_thread_restore"])
def test_a_keyboard_interrupt_as_an_interpreted_run_starts_or_ends_leaves_nothing_on_the_thread(
        tmp_path, elf, monkeypatch, call):
    """Found by a review: CPython raises a pending KeyboardInterrupt as a call into the core returns, and an
    interpreted run set the thread's deadline and its run count in separate calls, and set them back the same way.
    An interrupt between them left a deadline behind, which interrupted every later run on the thread, of either
    engine (a Ctrl-C caught in a REPL), or a count that grew until every run was "nested too deep". Here each of
    the core calls a run makes raises KeyboardInterrupt once, as it returns."""
    core = running._core()
    assert core is not None  # the translated engine is built: its core keeps the thread's state

    class Interrupting:
        def __getattr__(self, name):
            fn = getattr(core.lib, name)
            if name != call:
                return fn

            def interrupted(*args):
                fn(*args)
                raise KeyboardInterrupt(f"as {name} returned")
            return interrupted

    monkeypatch.setattr(running, "_core", lambda: types.SimpleNamespace(lib=Interrupting()))
    h = Engine(kind="interp", cache_dir=tmp_path, deadline=0.5).load(elf).harness(_linker(_left))
    with pytest.raises(KeyboardInterrupt, match=f"as {call} returned"):
        h.call("cap")
    assert time_left() is None and core.lib.berm_thread_runs() == 0
    monkeypatch.undo()
    assert float(h.call("cap")) > 0  # and the next run runs
