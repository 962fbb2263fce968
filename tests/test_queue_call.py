"""berm.call: a harness calls a tool of another harness of the same agent, inside its own invocation — one link
deeper in the chain, within its deadline, never waiting for a worker — and gets the result, or an error reply it
can handle for the callee's failure, trap or refusal. Fake targets for the queue's rules; real guests on both
engines for the path through the SDK and the engine."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import pytest

from berm_abi.frames import encode_frame
from berm_host.declaration import Declaration
from berm_host.grants import linker_for
from berm_host.linker import CapabilityError
from berm_host.queue import Queue, call_capabilities, current_invocation
from berm_host.queue.harness import Loader
from berm_host.running import interpreting
from berm_host.traps import HostError, ToolFailure, Trap, TrapInfo, TrapKind
from berm_sdk.build import build_harness
from tests.queue_helpers import queue_factory
from tests.sdk_engines import ENGINE_KINDS

FIXTURE = Path(__file__).resolve().parent.parent / "harnesses" / "fixture"


class Fake:
    """A harness whose every tool runs ``body(invocation, berm_call)``."""

    exports = frozenset()

    def __init__(self, body, tools=("echo",)):
        self.body, self.tools, self.call = body, frozenset(tools), None
        self.depths: list[int] = []
        self.deadlines: list[float] = []

    def invoke(self, inv, deadline):
        self.depths.append(current_invocation().context.depth)
        self.deadlines.append(deadline)
        return self.body(inv, lambda *fields: self.call(encode_frame(list(fields))).decode())


@pytest.fixture
def queue(tmp_path):
    """A started queue of Fake targets, each given the queue's berm.call."""
    with queue_factory(tmp_path / "due.db") as make:
        def with_calls(targets: dict, **kw) -> Queue:
            q = make(targets, start=False, **kw)
            (call,) = call_capabilities(q)
            for target in targets.values():
                target.call = call.fn
            q.start()
            return q

        yield with_calls


def test_a_call_returns_the_other_harness_result_one_link_deeper_without_a_second_worker(queue):
    callee = Fake(lambda inv, call: f"<{inv.args.decode()}>")
    caller = Fake(lambda inv, call: "got " + call("b", "echo", inv.args))
    q = queue({"a": caller, "b": callee}, workers=1)  # a worker waiting for a worker would wait forever
    assert q.call("a", "echo", "hi").result(5) == "got <hi>"
    assert caller.depths == [0] and callee.depths == [1]


def test_the_callee_ends_within_the_callers_time_and_the_caller_is_current_again(queue):
    """The callee runs inside the caller's invocation: its deadline leaves the caller a fifth of what it had (at
    most 5 s) to handle the reply (given all of it, a callee that used it up trapped the caller), and afterwards
    the caller's invocation is this thread's current one again."""
    after = []

    def caller(inv, call):
        end = time.monotonic() + 2.0
        with interpreting(end):  # as an engine running the caller with 2 s left
            call("b", "echo", "")
            returned = time.monotonic()
        after.append(current_invocation())
        # the call began before `returned`, with more than end - returned left: a fifth of that stays the caller's
        # (give or take the microseconds between two reads of the clock)
        return "reserved" if callee.deadlines[0] <= end - (end - returned) / 5 + 0.01 else "given all of it"

    callee = Fake(lambda inv, call: "ok")
    q = queue({"a": Fake(caller), "b": callee})
    assert q.call("a", "echo").result(5) == "reserved"
    assert after[0].harness == "a" and after[0].context.depth == 0


def _refused(inv, call):
    try:
        return call(*json.loads(inv.args))
    except CapabilityError as exc:
        return f"error: {exc}"


@pytest.mark.parametrize("request_, error", [
    (["nobody", "echo", "x"], "no harness named 'nobody'"),
    (["b", "nothing", "x"], "harness 'b' has no tool 'nothing' (it has: "),
    (["b", "fail", "x"], "b.fail failed: no"),
    (["b", "trap", "x"], "b.trap trapped: "),
])
def test_what_goes_wrong_in_the_callee_is_an_error_reply_to_the_caller(queue, request_, error):
    def callee(inv, call):
        if inv.tool == "fail":
            raise ToolFailure("fail", "no")
        raise Trap(TrapInfo(TrapKind.BREAKPOINT, pc=0x1000))

    q = queue({"a": Fake(_refused), "b": Fake(callee, tools=("fail", "trap"))})
    assert q.call("a", "echo", json.dumps(request_)).result(5).startswith(f"error: {error}")


def test_a_call_is_counted_and_held_to_the_callees_concurrency_limit(queue):
    """RFC 0205: concurrency lives in the one queue and nothing starts a guest without passing through it. A
    nested call ran past the callee's limit and was missing from its accounting (a spec review: two of b running
    at per_harness=1, one counted). Now it takes one of the callee's slots, or is refused while b is at its limit,
    and b's queued work waits for that slot like any other."""
    entered, release, order = threading.Event(), threading.Event(), []

    def callee(inv, call):
        if inv.args == b"hold":
            entered.set()
            assert release.wait(10)
        order.append(inv.args.decode())
        return "done"

    q = queue({"a": Fake(_refused), "c": Fake(_refused), "b": Fake(callee)}, workers=2, per_harness=1)
    nested = q.call("a", "echo", json.dumps(["b", "echo", "hold"]))
    assert entered.wait(10)  # b runs inside a's invocation, holding b's one slot
    assert q.call("c", "echo", json.dumps(["b", "echo", "x"])).result(5) == (
        "error: harness 'b' is at its concurrency limit (1 running or queued): try again later")
    queued = q.call("b", "echo", "queued")
    time.sleep(0.2)
    assert order == []  # b's queued call waits for the slot the nested call holds
    release.set()
    assert nested.result(5) == "done" and queued.result(5) == "done" and order == ["hold", "queued"]
    stats = q.executor.stats()["b"]
    assert (stats.invocations, stats.ok, stats.refused) == (2, 2, 1)


def test_work_queued_for_the_callee_takes_its_freed_slot_before_another_nested_call(queue):
    """Found by a review: a nested call took any free slot of its callee, though work queued for the callee was
    waiting for it, so a caller that called again at once kept a client's call to b queued as long as it kept
    calling (5.5 s of a 6 s loop). Here a calls b twice in a row while a call to b waits: the second is refused,
    and the queued call has the slot (c holds the other worker, so nothing else could take the slot first)."""
    holding, release, c_gate = threading.Event(), threading.Event(), threading.Event()

    def caller(inv, call):
        first = call("b", "echo", "hold")
        try:
            return f"{first}, {call('b', 'echo', 'again')}"
        except CapabilityError as exc:
            return f"{first}, error: {exc}"

    def callee(inv, call):
        if inv.args == b"hold":
            holding.set()
            assert release.wait(10)
        return inv.args.decode()

    q = queue({"a": Fake(caller), "b": Fake(callee), "c": Fake(lambda inv, call: str(c_gate.wait(10)))},
              workers=2, per_harness=1)
    calling = q.call("a", "echo", "")
    assert holding.wait(10)
    busy = q.call("c", "echo", "")  # the other worker
    queued = q.call("b", "echo", "queued")
    release.set()
    assert calling.result(10) == ("hold, error: harness 'b' is at its concurrency limit (1 running or queued): "
                                  "try again later")
    c_gate.set()
    assert queued.result(10) == "queued" and busy.result(10) == "True"


def test_a_due_wake_runs_when_nested_calls_free_its_harness(queue):
    """Found by a review: a drain that found b's slots all held by nested calls (berm.call) left b to be drained
    when one of its invocations ended, but a nested call's end told nobody, so b's due wake waited for some
    unrelated invocation to end (a wake never ran in 20 s of the review's run)."""
    holding, release, done = threading.Event(), threading.Event(), threading.Event()
    woken = threading.Event()

    def caller(inv, call):
        reply = call("b", "echo", "hold")
        assert done.wait(20)  # a runs on, so its own end cannot be what wakes the scheduler
        return reply

    def callee(inv, call):
        if inv.args == b"hold":
            holding.set()
            assert release.wait(10)
        else:
            woken.set()
        return "b"

    b = Fake(callee)
    b.exports = frozenset({"on_wake"})
    q = queue({"a": Fake(caller), "b": b}, workers=2, per_harness=1)
    calling = q.call("a", "echo", "")
    assert holding.wait(10)
    q.schedule("b", "w", time.time_ns() // 1_000_000)
    time.sleep(0.2)  # the drain finds b at its limit
    assert not woken.is_set()
    release.set()
    try:
        assert woken.wait(10)
    finally:
        done.set()
    assert calling.result(10) == "b"


def test_nested_calls_and_queued_work_never_take_a_harness_past_its_limit(queue):
    """b has queued work and no worker is free; then two nested calls ask for b, limit 2. One takes a slot, the
    other is refused (the queued work counts as started), and a worker freed then starts the queued work: never
    more than two of b at once (b once stayed on the ready list at its limit, and three of b ran)."""
    lock, go, free_d, release = threading.Lock(), threading.Event(), threading.Event(), threading.Event()
    entered = threading.Semaphore(0)
    state = {"b": 0, "most": 0}

    def callee(inv, call):
        with lock:
            state["b"] += 1
            state["most"] = max(state["most"], state["b"])
        try:
            entered.release()
            assert release.wait(10)
            return "done"
        finally:
            with lock:
                state["b"] -= 1

    def nesting(inv, call):
        entered.release()
        assert go.wait(10)
        return _refused(inv, call)

    def blocker(inv, call):
        entered.release()
        assert free_d.wait(10)
        return "free"

    q = queue({"a": Fake(nesting), "c": Fake(nesting), "d": Fake(blocker), "b": Fake(callee)},
              workers=3, per_harness=2)
    held = [q.call(name, "echo", json.dumps(["b", "echo", "hold"])) for name in "dac"]
    for _ in range(3):
        assert entered.acquire(timeout=10)  # every worker is busy
    queued = q.call("b", "echo", "queued")  # b is ready, with no worker to run it
    go.set()
    assert entered.acquire(timeout=10)  # one nested call holds one of b's slots
    free_d.set()  # a worker is free: it starts b's queued work in the other
    assert entered.acquire(timeout=10)
    # the other nested call has been refused (it must be told before anything of b ends: a CI run under load
    # asked only once both had ended, and was let in)
    done, _ = concurrent.futures.wait(held[1:], timeout=10, return_when=concurrent.futures.FIRST_COMPLETED)
    assert len(done) == 1
    release.set()
    results = [f.result(10) for f in [*held, queued]]
    assert results[0] == "free" and results[3] == "done"
    assert sorted(results[1:3]) == [
        "done", "error: harness 'b' is at its concurrency limit (2 running or queued): try again later"]
    assert state["most"] == 2


def test_queued_tool_arguments_must_be_text_or_bytes(queue):
    """As Harness.call's: ``bytes(5)`` handed the guest five zero bytes."""
    q = queue({"a": Fake(lambda inv, call: inv.args.decode())})
    with pytest.raises(HostError, match="not valid UTF-8 text or bytes"):
        q.call("a", "echo", 5)
    assert q.call("a", "echo", bytearray(b"ok")).result(5) == "ok"


def test_a_cycle_of_calls_ends_at_the_chain_depth_limit(queue):
    def ping(inv, call):
        try:
            return call("b", "echo", "")
        except CapabilityError as exc:
            return f"refused: {exc}"

    a, b = Fake(ping), Fake(lambda inv, call: ping(inv, lambda *f: call("a", "echo", "")))
    q = queue({"a": a, "b": b}, max_depth=5)
    assert "chain depth" in q.call("a", "echo").result(5)
    assert a.depths == [0, 2, 4] and b.depths == [1, 3, 5]


CALLER = {
    "harness.toml": '''name = "caller"
usage = "Relays its arguments to the fixture's echo through berm.call."

[[tools]]
name = "relay"
description = "berm.call fixture.echo with these arguments."
parameters = { type = "object", additionalProperties = true }

[[tools]]
name = "wrong"
description = "berm.call a tool the fixture does not have."
parameters = { type = "object", properties = {} }

[[tools]]
name = "spin"
description = "Never returns."
parameters = { type = "object", properties = {} }

[[tools]]
name = "interrupted"
description = "berm.call its own spin, and return the error it gets."
parameters = { type = "object", properties = {} }
''',
    "caller.c": r'''#include "berm.h"

static berm_result_t relay(const char *tool) {
    berm_str args = berm_args();
    berm_reply reply = berm_call(BERM_STR("fixture"), (berm_str){tool, strlen(tool)},
                                 args.ptr ? args : BERM_STR(""));
    return berm_reply_result(&reply, 0);
}

BERM_TOOL(relay) { return relay("echo"); }
BERM_TOOL(wrong) { return relay("nothing"); }
BERM_TOOL(spin) { for (volatile int i = 0;; i++) {} }

BERM_TOOL(interrupted) {
    berm_reply reply = berm_call(BERM_STR("caller"), BERM_STR("spin"), BERM_STR(""));
    return berm_ok_str(reply.error ? reply.error : "no error");
}
''',
}


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("caller")
    for name, text in CALLER.items():
        (d / name).write_text(text)
    out = tmp_path_factory.mktemp("images")
    return build_harness(d, out / "caller.elf"), build_harness(FIXTURE, out / "fixture.elf")


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_guest_calls_another_through_the_sdk(tmp_path, images, kind):
    q = Queue(tmp_path / "due.db")
    loader = Loader(kind)
    (call,) = call_capabilities(q)
    caller = linker_for(Declaration(name="caller", capabilities=("call",)),
                        extra={"call": lambda decl: {call.name: call.fn}})
    q.add("caller", loader.load(Declaration(name="caller"), images[0], caller))
    q.add("fixture", loader.load(Declaration(name="fixture"), images[1], linker_for(Declaration(name="fixture"))))
    q.start()
    try:
        assert q.call("caller", "relay", '{"n": 1}').result(60) == '{"echo":{"n": 1}}'
        with pytest.raises(ToolFailure, match="harness 'fixture' has no tool 'nothing'"):
            q.call("caller", "wrong").result(60)
        assert q.call("caller", "relay").result(60) == '{"echo":null}'
    finally:
        q.stop()


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_callee_interrupted_at_its_deadline_reads_the_same_on_either_engine(tmp_path, images, kind):
    """Found by a review: the caller's error reply carried where the interrupt struck, which is wherever an engine
    checked its deadline (berm_tool_spin+0xa translated, +0x8 interpreted): the same guest read different bytes."""
    # the callee spins to the call's deadline, which leaves the caller a fifth of its own (Deadline.within_invocation)
    # to turn the reply into its failure: with 0.5 s, the interpreted caller's 0.1 s ran out once in seven CI runs
    q = Queue(tmp_path / "due.db", timeout=2.0)
    (call,) = call_capabilities(q)
    caller = linker_for(Declaration(name="caller", capabilities=("call",)),
                        extra={"call": lambda decl: {call.name: call.fn}})
    q.add("caller", Loader(kind).load(Declaration(name="caller"), images[0], caller))
    q.start()
    try:
        assert q.call("caller", "interrupted").result(60) == \
            "caller.spin trapped: harness trapped in spin: guest was interrupted (deadline passed)"
    finally:
        q.stop()
