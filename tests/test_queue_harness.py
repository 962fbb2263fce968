"""The queue with real guests (the reference interpreter engine): wakes entering on_wake, the SDK's recurring
wrapper, traps costing one occurrence, the deadline, the chain-depth limit, and the reminders harness served by
the daemon across a restart and a SIGKILL loop."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from berm_host.daemon import DUE_DB, Daemon, DaemonClient, DaemonConfig, DaemonError, RemoteError
from berm_host.declaration import Declaration
from berm_host.grants import linker_for
from berm_host.queue import DueSet, Queue, ScheduleError, schedule_capabilities
from berm_host.queue.harness import Loader
from berm_host.traps import Trap, TrapKind
from berm_sdk.build import build_harness

from .queue_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent

# on_wake does what its payload says: "rearm-then-trap" re-arms 100 ms ahead (with payload "after-trap") and then
# traps; "chain" re-schedules itself at once (a tight chain); "spin" never returns; anything else is logged.
WAKER_C = r"""
#include "berm.h"
#include "berm_recurring.h"

BERM_TOOL(spin) { for (volatile int i = 0;; i++) {} }

BERM_ON_WAKE {
    berm_wake wake = berm_wake_args();
    if (wake.error) return berm_fail(wake.error);
    berm_clock clock = berm_clock_now();
    if (berm_str_eq(wake.payload, "rearm-then-trap")) {  /* re-arm first, as the SDK's wrapper does */
        berm_reply armed = berm_schedule_at(clock.utc_millis + 100, wake.id, BERM_STR("after-trap"));
        if (armed.error) return berm_fail(armed.error);
        berm_panic("the body traps");
    }
    if (berm_str_eq(wake.payload, "chain")) {
        berm_reply again = berm_schedule_at(clock.utc_millis, wake.id, wake.payload);
        if (again.error) berm_logf("chain stopped: %s", again.error);
        return berm_ok_str("ok");
    }
    if (berm_str_eq(wake.payload, "spin")) for (volatile int i = 0;; i++) {}
    berm_logf("woke %.*s with %.*s at %lld for %lld", (int)wake.id.len, wake.id.ptr, (int)wake.payload.len,
              wake.payload.ptr, (long long)wake.now, (long long)wake.scheduled_at);
    return berm_ok_str("ok");
}

BERM_ON_NOTIFY {
    berm_notify event = berm_notify_args();
    if (event.error) return berm_fail(event.error);
    berm_logf("event on %.*s: %.*s", (int)event.topic.len, event.topic.ptr, (int)event.event.len, event.event.ptr);
    return berm_ok_str("seen");
}
"""

WAKER_TOML = """
name = "waker"
usage = "Test harness for timed wakes."
[[tools]]
name = "spin"
description = "Never returns."
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("images")
    src = d / "waker-src"
    src.mkdir()
    (src / "waker.c").write_text(WAKER_C)
    (src / "harness.toml").write_text(WAKER_TOML)
    build_harness(src, d / "waker.elf")
    build_harness(ROOT / "harnesses" / "reminders", d / "reminders.elf")
    build_harness(ROOT / "harnesses" / "fixture", d / "fixture.elf")
    return d


class Logs:
    def __init__(self):
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, harness: str, line: bytes) -> None:
        with self.lock:
            self.lines.append(line.decode("utf-8", "replace"))

    def matching(self, text: str) -> list[str]:
        with self.lock:
            return [line for line in self.lines if text in line]


def _waker(images, tmp_path, timeout: float):
    q = Queue(tmp_path / "due.db", workers=2, timeout=timeout)
    decl = Declaration(name="waker", capabilities=("clock", "schedule"))
    linker = linker_for(decl, extra={"schedule": lambda d: {c.name: c.fn for c in schedule_capabilities(q, d.name)}})
    logs = Logs()
    q.add("waker", Loader("interp", timeout=timeout, log=logs).load(decl, images / "waker.elf", linker))
    q.start()
    yield q, logs
    q.stop()


@pytest.fixture
def waker(images, tmp_path):
    """The waker harness on the interpreter, queued with a deadline no ordinary wake comes near. It once shared the
    spinning test's 1 s, and an event's handler, on a machine running other jobs too, was interrupted in berm_logf."""
    yield from _waker(images, tmp_path, 30.0)


@pytest.fixture
def short_waker(images, tmp_path):
    """The same with a 1 s deadline, for the wake that spins until it is interrupted."""
    yield from _waker(images, tmp_path, 1.0)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_wake_enters_on_wake_with_its_times(waker):
    q, logs = waker
    when = now_ms() + 200
    q.schedule("waker", "hello", when, "plain")
    wait_for(lambda: logs.matching("woke hello"))
    (line,) = logs.matching("woke hello")
    delivered, scheduled = (int(x) for x in line.split(" at ")[1].split(" for "))
    assert "with plain" in line
    assert scheduled == when and when <= delivered < when + 500
    wait_for(lambda: q.stats()["pending"] == 0)


def test_a_trap_costs_one_occurrence_not_the_schedule(waker, caplog):
    q, logs = waker
    with caplog.at_level(logging.WARNING, logger="berm.queue"):
        q.schedule("waker", "r", now_ms(), "rearm-then-trap")
        wait_for(lambda: logs.matching("woke r with after-trap") and q.stats()["pending"] == 0)
        wait_for(lambda: q.stats()["harnesses"]["waker"]["invocations"] == 2)
    h = q.stats()["harnesses"]["waker"]
    assert h["traps"] == 1 and h["ok"] == 1
    # berm_panic's reason reaches whoever reads the trap (it was only a log line once)
    assert any("guest executed ebreak" in r.getMessage() and "(after berm.fail: the body traps)" in r.getMessage()
               for r in caplog.records)


def test_the_chain_depth_limit_stops_a_tight_chain(waker):
    q, logs = waker
    q.schedule("waker", "loop", now_ms(), "chain")
    wait_for(lambda: logs.matching("chain stopped") and q.stats()["pending"] == 0)
    wait_for(lambda: q.stats()["harnesses"]["waker"]["invocations"] >= 9)
    (stopped,) = logs.matching("chain stopped")
    assert "chain depth 9 exceeds the limit of 8" in stopped
    h = q.stats()["harnesses"]["waker"]
    assert h["invocations"] == 9 and h["refused"] == 1


def test_the_deadline_interrupts_a_spinning_wake_and_the_queue_goes_on(short_waker):
    q, logs = short_waker
    q.schedule("waker", "s", now_ms(), "spin")
    wait_for(lambda: q.stats()["harnesses"].get("waker", {}).get("traps") == 1)
    with pytest.raises(Trap) as trap:
        q.call("waker", "spin").result(10)
    assert trap.value.kind is TrapKind.INTERRUPTED
    q.schedule("waker", "after", now_ms(), "plain")
    wait_for(lambda: logs.matching("woke after"))


def test_a_published_event_enters_on_notify_of_each_subscriber(waker):
    q, logs = waker
    q.subscribe("agent:x:done", "waker", once=True)
    (delivery,) = q.publish("agent:x:done", '{"turns": 3}')
    delivery.result(10)
    assert logs.matching('event on agent:x:done: {"turns": 3}')
    assert q.publish("agent:x:done", "again") == []  # a once subscription is consumed


def test_a_harness_without_on_wake_cannot_be_scheduled(images, tmp_path):
    q = Queue(tmp_path / "due.db")
    try:
        decl = Declaration(name="fixture")
        q.add("fixture", Loader("interp").load(decl, images / "fixture.elf", linker_for(decl)))
        with pytest.raises(ScheduleError, match="does not export on_wake"):
            q.schedule("fixture", "x", now_ms())
        assert q.call("fixture", "echo", "[1]").result(10) == '{"echo":[1]}'
    finally:
        q.stop()


# --- the daemon, with the reminders harness ------------------------------------------------------------------

DECLARATIONS = """
[[harnesses]]
name = "reminders"
capabilities = ["clock", "kv", "schedule"]

[[harnesses]]
name = "waker"
capabilities = ["clock", "schedule"]
"""


def _config(images: Path, tmp_path: Path) -> DaemonConfig:
    decl = tmp_path / "agent.toml"
    decl.write_text(DECLARATIONS)
    return DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state",
                        harnesses_dir=images, engine="interp", workers=2)


def test_reminders_through_the_daemon_and_across_a_restart(images, tmp_path):
    config = _config(images, tmp_path)
    daemon = Daemon(config)
    daemon.start()
    client = DaemonClient(config.socket)
    try:
        soon = json.loads(client.call("reminders", "add", json.dumps({"text": "kettle", "at": "00:00"})))
        far = json.loads(client.call("reminders", "add", json.dumps({"text": "dentist",
                                                                        "at": "2099-01-02T08:30:00Z"})))
        entries = client.request({"op": "schedule.list", "harness": "reminders"})["entries"]
        assert {e["id"] for e in entries} == {soon["id"], far["id"]}
        with pytest.raises(RemoteError, match="`at` must be an ISO-8601") as err:
            client.call("reminders", "add", json.dumps({"text": "x", "at": "soon"}))
        assert err.value.kind == "failure"
    finally:
        daemon.stop()
    # make the first one come due while the daemon is down: it must arrive after the restart, late, once
    dueset = DueSet(Path(config.state_dir) / DUE_DB)
    (entry,) = [e for e in dueset.list("reminders") if e.id == soon["id"]]
    due = now_ms() - 1000
    dueset.put("reminders", entry.id, due, entry.payload, entry.depth)
    dueset.close()
    restarted = now_ms()
    daemon = Daemon(config)
    daemon.start()
    try:
        wait_for(lambda: json.loads(client.call("reminders", "outbox")))
        (delivered,) = json.loads(client.call("reminders", "outbox"))
        assert delivered["text"] == "kettle" and delivered["scheduled_at"] == due
        assert delivered["now"] >= restarted  # delivered by the restarted daemon, not before
        # the due entry goes once its wake has finished, a moment after the wake wrote the outbox
        wait_for(lambda: [e["id"] for e in client.request({"op": "schedule.list"})["entries"]] == [far["id"]])
        assert len(json.loads(client.call("reminders", "outbox"))) == 1  # and it was not delivered again
        assert [r["text"] for r in json.loads(client.call("reminders", "list"))] == ["dentist"]
    finally:
        daemon.stop()


_ADDER = """
import sys, time
from berm_host.daemon import DaemonClient, DaemonError
client = DaemonClient(sys.argv[1])
i = int(sys.argv[2])
while True:
    try:
        client.request({"op": "schedule.add", "harness": "waker", "id": f"k{i}", "when_ms": 4102444800000 + i})
    except DaemonError:
        break
    print(i, flush=True)  # acknowledged by the daemon: committed
    i += 1
"""


def test_sigkill_while_scheduling_loses_no_acknowledged_schedule(images, tmp_path):
    config = _config(images, tmp_path)
    acked: set[int] = set()
    for round_ in range(3):
        daemon = subprocess.Popen(
            [sys.executable, "-m", "berm_cli.main", "serve", str(config.declarations), "--socket",
             str(config.socket), "--state-dir", str(config.state_dir), "--harnesses-dir", str(images),
             "--engine", "interp"], stderr=subprocess.PIPE, text=True)
        try:
            assert "listening on" in daemon.stderr.readline()
            adder = subprocess.Popen([sys.executable, "-c", _ADDER, str(config.socket), str(len(acked) + 1000 * round_)],
                                     stdout=subprocess.PIPE, text=True)
            for n, line in enumerate(adder.stdout):
                acked.add(int(line))
                if n >= 20 + 7 * round_:
                    break
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(10)
            acked |= {int(line) for line in adder.stdout}
            adder.wait(10)
        finally:
            for p in (daemon,):
                if p.poll() is None:
                    p.kill()
        db = config.state_dir / "due.sqlite3"
        with sqlite3.connect(db) as con:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            present = {int(i[1:]) for (i,) in con.execute("SELECT id FROM due WHERE harness='waker'")}
        assert acked <= present


@contextmanager
def _serving_a_spin(images, tmp_path, timeout: str):
    """`berm serve` of the waker image with ``--timeout``, a client's call of spin running in it: (its config, its
    process, the client's thread, what the call raised once it has)."""
    config = _config(images, tmp_path)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "berm_cli.main", "serve", str(config.declarations), "--socket", str(config.socket),
         "--state-dir", str(config.state_dir), "--harnesses-dir", str(images), "--engine", "interp",
         "--timeout", timeout], stderr=subprocess.PIPE, text=True)
    raised: list = []

    def spin():
        try:
            DaemonClient(config.socket).call("waker", "spin")
        except (DaemonError, RemoteError) as exc:
            raised.append(exc)

    try:
        assert "listening on" in daemon.stderr.readline()
        caller = threading.Thread(target=spin, daemon=True)
        caller.start()
        wait_for(lambda: DaemonClient(config.socket).request({"op": "stats"})["stats"]["executor"]["busy"] == 1)
        yield config, daemon, caller, raised
    finally:
        if daemon.poll() is None:
            daemon.kill()


def test_sigterm_finishes_or_interrupts_in_flight_work(images, tmp_path):
    with _serving_a_spin(images, tmp_path, "1") as (_, daemon, caller, raised):
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0
        caller.join(10)
        assert raised and raised[0].kind == "trap" and "interrupted" in str(raised[0])


def test_a_second_signal_ends_berm_serve_without_waiting_for_running_guests(images, tmp_path):
    """Found by a review: a second SIGTERM or Ctrl-C was ignored, and shutdown waits for running guests' deadlines,
    so a guest spinning under --timeout 86400 kept `berm serve` from stopping for a day. A second signal now ends it
    at once; what it cut short is left for the next start, which takes over its state and socket."""
    with _serving_a_spin(images, tmp_path, "86400") as (config, daemon, caller, raised):
        daemon.send_signal(signal.SIGTERM)
        wait_for(lambda: not config.socket.exists(), 30)  # stopping: its socket is gone, the guest spins on
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 128 + signal.SIGTERM  # a hang guard: the guest's deadline is a day
        assert ("berm serve: second signal: exiting now, without waiting for 1 running invocation\n"
                in daemon.stderr.read())
        caller.join(30)
        assert raised and "sent no valid reply" in str(raised[0])  # its connection closed with the process
    restarted = Daemon(config)
    restarted.start()
    restarted.stop()


def test_berm_schedule_add_list_cancel_against_a_running_daemon(images, tmp_path, capsys):
    from berm_cli.main import main

    config = _config(images, tmp_path)
    daemon = Daemon(config)
    daemon.start()
    try:
        sock = ["schedule", "--socket", str(config.socket)]
        assert main([*sock, "add", "waker", "nightly", "+1h", "--payload", "p"]) == 0
        assert "scheduled waker[nightly] at" in capsys.readouterr().out
        assert main([*sock, "list", "--json"]) == 0
        (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert listed["id"] == "nightly" and listed["payload"] == "p" and listed["when_ms"] > now_ms() + 3500_000
        assert main([*sock, "cancel", "waker", "nightly"]) == 0
        assert main([*sock, "cancel", "waker", "nightly"]) == 1
        assert main([*sock, "add", "fixture-less", "x", "+1s"]) == 2
        assert "no harness named 'fixture-less'" in capsys.readouterr().err
        assert daemon.queue.list() == []
        assert main(["schedule", "list", "--socket", str(config.socket)]) == 0  # the option after the action too
        assert main(["schedule", "--socket", "/nonexistent/berm.sock", "list", "--socket", str(config.socket)]) == 0
    finally:
        daemon.stop()


def test_a_trap_through_the_daemon_carries_its_call_chain(images, tmp_path, capsys):
    """A trap's reply carries its call chain, and ``berm call --daemon`` prints it under the trap as a direct call
    does (it printed the message alone, so a harness's author saw where it trapped but not how it got there)."""
    from berm_cli.main import main

    shutil.copy(ROOT / "harnesses" / "rust-probe" / "rust-probe.elf", images / "rust-probe.elf")
    config = _config(images, tmp_path)
    config.declarations.write_text('[[harnesses]]\nname = "rust-probe"\ncapabilities = []\n')
    daemon = Daemon(config)
    daemon.start()
    try:
        with pytest.raises(RemoteError, match="harness trapped in check: guest executed ebreak") as err:
            DaemonClient(config.socket).call("rust-probe", "check", '"panic"')
        assert err.value.kind == "trap"
        assert [line.split("+")[0] for line in err.value.chain] == ["called from __rustc::rust_begin_unwind",
                                                                     "called from core::panicking::panic_fmt",
                                                                     "called from berm_tool_check"]
        assert main(["call", "--daemon", str(config.socket), "rust-probe", "check", '"panic"']) == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith("berm call: harness trapped in check: guest executed ebreak")
        assert lines[1:] == [f"  {line}" for line in err.value.chain]
    finally:
        daemon.stop()


def test_berm_call_through_a_running_daemon(images, tmp_path, capsys):
    from berm_cli.main import main

    config = _config(images, tmp_path)
    config.declarations.write_text(DECLARATIONS + '\n[[harnesses]]\nname = "fixture"\n')
    daemon = Daemon(config)
    daemon.start()
    try:
        via = ["call", "--daemon", str(config.socket)]
        assert main([*via, "fixture", "echo", '{"a":1}']) == 0
        assert capsys.readouterr().out == '{"echo":{"a":1}}\n'
        assert main([*via, "fixture", "boom"]) == 1
        assert capsys.readouterr().err == "boom, as requested\n"  # a tool's failure as a direct call prints it
        assert main([*via, "nobody", "echo"]) == 2
        assert "nobody" in capsys.readouterr().err
        assert main([*via, "fixture", "echo", "--grant", "fs"]) == 2
        assert "--grant cannot be combined with --daemon" in capsys.readouterr().err
        assert main([*via, "fixture", "echo", "--engine", "interp"]) == 2  # found by a review: silently ignored
        assert "--engine cannot be combined with --daemon" in capsys.readouterr().err
        assert daemon.queue.stats()["harnesses"]["fixture"]["invocations"] >= 2
    finally:
        daemon.stop()
    assert main(["call", "--daemon", str(config.socket), "fixture", "echo"]) == 2
    assert "no daemon is listening" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_two_harnesses_of_one_image_keep_their_own_grants(tmp_path, kind):
    """Declarations of the same image, memory and timeout share one loaded image and its pool of memory regions
    (Loader); a region keeps the linker of its last run. Found untested by a review: the granted harness run
    first, then the one granted nothing on the region it left, in turns."""
    from berm_sdk.bundled import bundled_image

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "secret.txt").write_text("secret")
    granted = Declaration(name="granted", capabilities=("fs",), root=str(tmp_path / "root"))
    bare = Declaration(name="bare")
    loader, image = Loader(kind, cache_dir=tmp_path / "cache"), bundled_image("os")
    with_fs, without = loader.load(granted, image, linker_for(granted)), loader.load(bare, image, linker_for(bare))
    assert with_fs.harness.image is without.harness.image
    for _ in range(3):
        assert "secret" in with_fs.harness.call("read", b'{"path": "secret.txt"}')
        with pytest.raises(Trap) as trap:
            without.harness.call("read", b'{"path": "secret.txt"}')
        assert trap.value.kind is TrapKind.UNKNOWN_HOST_CALL and "not granted to this harness" in str(trap.value)
