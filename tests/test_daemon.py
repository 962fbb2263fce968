"""The daemon's control socket and lifecycle: 0600 socket, JSON-lines protocol, errors as replies, SIGTERM."""

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import socketserver
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from berm_abi.errors import BermError
from berm_cli import serve
from berm_cli.main import main as cli_main
from berm_cli.schedule import WhenError, _iso, parse_when
from berm_host import daemon as daemon_mod
from berm_host.capabilities.kv import data_dir
from berm_host.daemon import Daemon, DaemonClient, DaemonConfig, DaemonError, RemoteError
from berm_host.queue.dueset import MAX_ID, MAX_PAYLOAD, MAX_PAYLOAD_BYTES

from .children import on_a_small_stack, run_python
from .queue_helpers import RecordingTarget, connections, wait_for



@pytest.fixture
def make_daemon(tmp_path):
    """``make(**config)``: a started daemon with no harness declared, stopped after the test."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    daemons = []

    def make(**config) -> Daemon:
        d = Daemon(DaemonConfig(declarations=decl, socket=tmp_path / "run" / "berm.sock",
                                state_dir=tmp_path / "state", **config))
        d.start()
        daemons.append(d)
        return d

    yield make
    for d in daemons:
        d.stop()


@pytest.fixture
def empty_daemon(make_daemon):
    return make_daemon()


def test_socket_is_private_and_speaks_json_lines(empty_daemon):
    path = empty_daemon.config.socket
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    client = DaemonClient(path)
    assert client.request({"op": "harnesses"}) == {"harnesses": []}
    stats = client.request({"op": "stats"})["stats"]
    assert stats["pending"] == 0 and stats["executor"]["workers"] == 4
    assert stats["scheduler"]["wakeups"] == 0  # an idle daemon's scheduler has never woken
    with socket.socket(socket.AF_UNIX) as s:  # several requests on one connection, and garbage in between
        s.connect(str(path))
        s.sendall(b'{"op": "harnesses"}\nnot json\n[1]\n{"op": "nope"}\n')
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in range(4)]
    assert replies[0] == {"ok": True, "harnesses": []}
    assert [r["error"] for r in replies[1:]] == ["protocol"] * 3
    assert "unknown op 'nope'" in replies[3]["message"]


def test_the_socket_is_never_wider_than_0600_even_under_a_loose_umask(make_daemon, monkeypatch):
    """The socket is 0600 from the moment it is bound (the umask held at 0177 across the bind), not only once the
    daemon has started: the test above saw only the chmod after it (found by a review). Its mode is read inside
    the bind, under umask 002."""
    from berm_host import daemon as daemon_module

    seen = []
    bind = daemon_module._Server.server_bind

    def bind_and_look(server):
        bind(server)
        seen.append(stat.S_IMODE(os.lstat(server.server_address).st_mode))

    monkeypatch.setattr(daemon_module._Server, "server_bind", bind_and_look)
    old = os.umask(0o002)
    try:
        make_daemon()
    finally:
        os.umask(old)
    assert seen == [0o600]


def test_deeply_nested_json_is_a_protocol_error_reply(empty_daemon):
    """json.loads raises RecursionError, not ValueError, past Python's recursion limit: the connection was dropped
    with no reply and a traceback on the daemon's stderr."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(empty_daemon.config.socket))
        s.sendall(b"[" * 100_000 + b"]" * 100_000 + b'\n{"op": "harnesses"}\n')
        f = s.makefile("rb")
        replies = [json.loads(f.readline()) for _ in range(2)]
    assert replies[0] == {"ok": False, "error": "protocol", "message": "the JSON is nested too deeply"}
    assert replies[1] == {"ok": True, "harnesses": []}


def test_a_deep_request_is_refused_before_json_loads_recurses_even_on_a_small_stack():
    """Found by a review: json.loads recurses in C up to Python's recursion limit whatever the stack, so a 990-deep
    line crashed a daemon whose handler threads had 64 KiB stacks (exit status -11)."""
    done = run_python(on_a_small_stack("from berm_host import daemon", (
        "for depth in (daemon.MAX_REQUEST_NESTING, 990):\n"
        "    try:\n"
        "        print(depth, type(daemon._parsed(b'[' * depth + b']' * depth)).__name__)\n"
        "    except Exception as exc:\n"
        "        print(depth, type(exc).__name__)\n")))
    assert (done.returncode, done.stdout.split("\n")) == (0, ["16 list", "990 _TooDeep", ""]), done.stderr


def test_errors_come_back_as_replies(empty_daemon):
    client = DaemonClient(empty_daemon.config.socket)
    with pytest.raises(RemoteError, match="no harness named 'ghost'") as err:
        client.request({"op": "schedule.add", "harness": "ghost", "id": "x", "when_ms": 1})
    assert err.value.kind == "refused"
    with pytest.raises(RemoteError, match="'when_ms' must be int") as err:
        client.request({"op": "schedule.add", "harness": "ghost", "id": "x", "when_ms": "soon"})
    assert err.value.kind == "protocol"
    with pytest.raises(RemoteError, match="needs 'tool'"):
        client.request({"op": "call", "harness": "ghost"})


def test_schedule_list_pages_what_one_reply_line_cannot_hold(empty_daemon, capsys):
    """256 payloads of 64 KiB (one harness's payload cap) made one schedule.list reply of over 16 MiB, past what
    a client reads: "the daemon sent no valid reply", so no schedule could be seen, nor found to cancel."""
    empty_daemon.queue.add("h", RecordingTarget())
    far = 4102444800000  # 2100-01-01: none of them comes due
    worst = daemon_mod.LIST_PAGE + 1  # a page of the entries JSON makes longest (6 bytes a character) still fits
    ids = [f"{i:03}".ljust(MAX_ID, "\x01" if i < worst else "-") for i in range(MAX_PAYLOAD_BYTES // MAX_PAYLOAD)]
    empty_daemon.queue.dueset.put_many([("h", id, far, ("\x01" if i < worst else "x") * MAX_PAYLOAD, 0)
                                        for i, id in enumerate(ids)])
    empty_daemon.queue.dueset.put("gone", "other", far + 1)  # another harness's, after all of h's
    entries = list(DaemonClient(empty_daemon.config.socket).schedules())
    assert [(e["harness"], e["id"]) for e in entries] == [("h", id) for id in ids] + [("gone", "other")]
    assert all(len(e["payload"]) == MAX_PAYLOAD for e in entries[:-1])
    assert cli_main(["schedule", "--socket", str(empty_daemon.config.socket), "list", "h", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ids


def test_schedule_list_json_carries_no_terminal_control(empty_daemon, capsys):
    """Found by a review: --json printed a harness's C1 controls raw (U+009B is a terminal's CSI, as ESC [ is);
    each line is now ASCII, and the same text once parsed."""
    empty_daemon.queue.add("h", RecordingTarget())
    hostile = "\x9b2J\x1b]0;owned\x07caf\u00e9\u2028"
    empty_daemon.queue.dueset.put("h", hostile, 4102444800000, hostile)
    assert cli_main(["schedule", "--socket", str(empty_daemon.config.socket), "list", "h", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.isascii() and not any(c < " " for c in out.replace("\n", ""))
    (entry,) = [json.loads(line) for line in out.splitlines()]
    assert entry["id"] == hostile and entry["payload"] == hostile


def test_a_schedule_list_cursor_is_checked(empty_daemon):
    client = DaemonClient(empty_daemon.config.socket)
    for after in ({"when_ms": 1, "harness": "h"}, {"when_ms": 1 << 70, "harness": "h", "id": "x"}, []):
        with pytest.raises(RemoteError) as err:
            client.request({"op": "schedule.list", "after": after})
        assert err.value.kind == "protocol"


def test_a_second_daemon_on_the_same_socket_is_refused(empty_daemon, tmp_path):
    path = empty_daemon.config.socket
    other = Daemon(DaemonConfig(declarations=empty_daemon.config.declarations, socket=path,
                                state_dir=tmp_path / "state2"))
    with pytest.raises(DaemonError, match=f"another daemon is serving or starting on {re.escape(str(path))}"):
        other.start()
    assert stat.S_IMODE(path.with_name(path.name + ".lock").stat().st_mode) == 0o600


def test_a_second_start_of_a_serving_daemon_is_refused_and_leaves_it_serving(empty_daemon, tmp_path):
    """Found by a review: the second start() was refused by the state directory's lock the first had taken, and
    undoing it closed the serving socket, stopped the queue and let go of both locks, so another daemon could take
    the state directory."""
    with pytest.raises(DaemonError, match="already been started"):
        empty_daemon.start()
    assert DaemonClient(empty_daemon.config.socket).request({"op": "harnesses"}) == {"harnesses": []}
    other = Daemon(DaemonConfig(declarations=empty_daemon.config.declarations, socket=tmp_path / "other.sock",
                                state_dir=empty_daemon.config.state_dir))
    with pytest.raises(DaemonError, match="another daemon is serving the state directory"):
        other.start()


def test_a_second_daemon_on_the_same_socket_is_refused_before_loading_its_harnesses(empty_daemon, tmp_path):
    """It took the socket's lock after loading every harness it declared: it compiled them all before it was
    refused, and one it could not load was the error it gave."""
    decl = tmp_path / "other.toml"
    decl.write_text('[[harnesses]]\nname = "missing"\ncapabilities = ["clock"]\n')
    path = empty_daemon.config.socket
    other = Daemon(DaemonConfig(declarations=decl, socket=path, state_dir=tmp_path / "state2",
                                harnesses_dir=tmp_path / "images"))
    with pytest.raises(DaemonError, match=f"another daemon is serving or starting on {re.escape(str(path))}"):
        other.start()


def test_a_daemon_keeps_all_its_state_in_one_directory_however_it_is_named(tmp_path, monkeypatch):
    """Found by a review: a DaemonConfig of "~/state" put the due-set and the lock under ./~/state and the kv store
    under $HOME/state; only the CLI resolved it. The config resolves it now, as the kv store does."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=Path("~/state"))
    assert config.state_dir == data_dir("~/state") == tmp_path / "home" / "state"
    daemon = Daemon(config)
    daemon.start()
    daemon.stop()
    assert sorted(p.name for p in (tmp_path / "home" / "state").iterdir())[:2] == [daemon_mod.STATE_LOCK,
                                                                                   daemon_mod.DUE_DB]
    assert list((tmp_path / "cwd").iterdir()) == []
    monkeypatch.setenv("BERM_DATA_DIR", str(tmp_path / "data"))
    assert DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock").state_dir == tmp_path / "data"
    with pytest.raises(ValueError, match="the state directory is empty"):  # not "none given", as kv.data_dir took it
        DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir="")


def test_of_two_daemons_starting_on_one_stale_socket_the_second_is_refused(tmp_path, monkeypatch):
    """Found by a review: two daemons (two state directories) starting on one socket where a killed daemon had left
    it both found it dead; the second removed the first's fresh socket and bound its own, both said they were
    listening, and the first, unreachable, deleted the live one's socket as it stopped. The first, held here in its
    check, now holds the socket's lock, and the second is refused."""
    decl, path = tmp_path / "agent.toml", tmp_path / "berm.sock"
    decl.write_text("")
    with socket.socket(socket.AF_UNIX) as stale:  # as a kill -9 leaves it
        stale.bind(str(path))
    checking, go_on = threading.Event(), threading.Event()
    real_alive = daemon_mod._alive

    def held_in_check(at):
        alive = real_alive(at)
        if not checking.is_set():  # the first daemon's check only
            checking.set()
            go_on.wait(10)
        return alive

    monkeypatch.setattr(daemon_mod, "_alive", held_in_check)
    first, second = (Daemon(DaemonConfig(declarations=decl, socket=path, state_dir=tmp_path / name))
                     for name in ("first", "second"))
    starting = threading.Thread(target=first.start)
    starting.start()
    try:
        assert checking.wait(10)
        with pytest.raises(DaemonError, match=f"another daemon is serving or starting on {re.escape(str(path))}"):
            second.start()
    finally:
        go_on.set()
        starting.join(10)
    try:
        first.queue.add("of-first", RecordingTarget())
        assert DaemonClient(path, timeout=10).request({"op": "harnesses"}) == {"harnesses": ["of-first"]}
    finally:
        first.stop()
    second.start()  # the socket's lock went with the first daemon's stop
    second.stop()


def test_a_start_failing_once_it_listens_lets_go_of_the_socket_and_the_state(tmp_path, monkeypatch):
    """Found by a review: a thread that could not start (the process at its limit) after the socket was bound left
    the socket and both locks held, so every later daemon was refused with nothing serving, and stop() waited for
    ever on a server that was never started."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state")
    failing = Daemon(config)

    def no_thread() -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(failing.queue.scheduler, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        failing.start()
    assert not config.socket.exists()
    stopping = threading.Thread(target=failing.stop, daemon=True)
    stopping.start()
    stopping.join(10)  # a hang guard
    assert not stopping.is_alive()
    again = Daemon(config)
    again.start()
    assert DaemonClient(config.socket).request({"op": "harnesses"}) == {"harnesses": []}
    again.stop()


def test_a_stop_from_a_second_thread_waits_for_the_first(empty_daemon, monkeypatch):
    """Two threads stopping at once each ran every step (and raced to release the locks): the second now waits for
    the first's stop to end, and does nothing more."""
    inside, release, stops = threading.Event(), threading.Event(), []
    real_stop = empty_daemon.queue.stop

    def slow_stop(**kwargs):
        stops.append(kwargs)
        inside.set()
        release.wait(10)
        real_stop(**kwargs)

    class Watched:
        """The daemon's stop lock, counting the threads that have come to take it."""

        def __init__(self, lock):
            self.lock, self.comers = lock, []

        def __enter__(self):
            self.comers.append(threading.current_thread())
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    lock = Watched(empty_daemon._stop_lock)
    monkeypatch.setattr(empty_daemon, "_stop_lock", lock)
    monkeypatch.setattr(empty_daemon.queue, "stop", slow_stop)
    first = threading.Thread(target=empty_daemon.stop)
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=empty_daemon.stop)
    second.start()
    wait_for(lambda: len(lock.comers) == 2)
    assert second.is_alive() and not empty_daemon.wait(0)  # at the lock, while the first is still stopping
    release.set()
    first.join(10)
    second.join(10)
    assert empty_daemon.wait(0) and len(stops) == 1


def test_a_stopping_daemon_leaves_a_socket_that_is_not_its_own(empty_daemon):
    """stop() removed whatever was at the socket's path: the live socket of another daemon that had taken the path
    over (found by a review)."""
    path = empty_daemon.config.socket
    path.unlink()
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        empty_daemon.stop()
        assert stat.S_ISSOCK(path.lstat().st_mode)


def test_a_start_finding_a_socket_whose_daemon_accepts_nothing_is_refused_not_hung(tmp_path):
    """Found by a review: a socket whose listener does not accept (an earlier daemon, stopped) and whose backlog is
    full held `berm serve` in its check of that socket, connecting with no timeout, for ever and silently."""
    decl, path = tmp_path / "agent.toml", tmp_path / "berm.sock"
    decl.write_text("")
    config = DaemonConfig(declarations=decl, socket=path, state_dir=tmp_path / "state")
    wedged = socket.socket(socket.AF_UNIX)
    wedged.bind(str(path))
    wedged.listen(0)
    queued = []
    outcome = []

    def start() -> None:
        try:
            Daemon(config).start()
            outcome.append("started")
        except DaemonError as exc:
            outcome.append(str(exc))

    try:
        while True:  # fill its backlog
            waiting = socket.socket(socket.AF_UNIX)
            waiting.setblocking(False)
            queued.append(waiting)
            try:
                waiting.connect(str(path))
            except BlockingIOError:
                break
        starting = threading.Thread(target=start, daemon=True)
        starting.start()
        starting.join(30)  # a hang guard
        assert outcome == [f"a daemon is listening on {path} but does not answer (stopped, or overwhelmed); its "
                           "socket is left in place"]
        assert stat.S_ISSOCK(path.lstat().st_mode)
    finally:
        for s in (*queued, wedged):
            s.close()
    again = Daemon(config)  # the refused start let go of the state directory and the socket: now stale, taken over
    again.start()
    again.stop()


def test_connections_wait_in_a_backlog_longer_than_socketservers_five(empty_daemon, monkeypatch):
    """Found by a review: the listening socket's backlog was socketserver's default 5, and a client with a timeout
    connects non-blocking, so of 60 clients connecting at once, those finding it full failed at once (EAGAIN).
    Here nothing is accepted until MAX_CLIENTS connections wait."""
    server, gate = empty_daemon._server, threading.Event()
    accept = server._handle_request_noblock
    monkeypatch.setattr(server, "_handle_request_noblock", lambda: (gate.wait(10), accept()))
    clients = [socket.socket(socket.AF_UNIX) for _ in range(daemon_mod.MAX_CLIENTS)]
    try:
        for c in clients:
            c.setblocking(False)
            c.connect(str(empty_daemon.config.socket))
        gate.set()
        for c in clients:
            c.settimeout(10)
            c.sendall(b'{"op": "harnesses"}\n')
        assert all(json.loads(c.makefile("rb").readline()) == {"ok": True, "harnesses": []} for c in clients)
    finally:
        gate.set()
        for c in clients:
            c.close()


def test_a_client_with_a_timeout_waits_for_room_in_a_full_backlog(tmp_path, monkeypatch):
    """A client with a timeout connects non-blocking, which a full backlog refuses at once with EAGAIN rather than
    waiting: it tries again until its timeout (found by a review: 60 clients at once, 5 failed)."""
    path = tmp_path / "berm.sock"
    outcome = []
    retrying = threading.Event()

    class PausesNoted:  # the client's clock: a pause between connects is a connect the full backlog refused
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            retrying.set()
            time.sleep(seconds)

    monkeypatch.setattr(daemon_mod, "time", PausesNoted)

    def ask() -> None:
        try:
            outcome.append(DaemonClient(path, timeout=30).request({"op": "harnesses"}))
        except DaemonError as exc:
            outcome.append(exc)

    with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as filler:
        listener.bind(str(path))
        listener.listen(0)
        listener.settimeout(10)  # a hang guard
        filler.connect(str(path))  # a backlog of 0 holds one connection: full
        client = threading.Thread(target=ask)
        client.start()
        assert retrying.wait(30)  # the client met the full backlog
        listener.accept()[0].close()  # the filler's connection, accepted: room for the client's
        conn, _ = listener.accept()
        with conn:
            assert conn.makefile("rb").readline() == b'{"op": "harnesses"}\n'
            conn.sendall(b'{"ok": true, "harnesses": []}\n')
        client.join(30)
    assert outcome == [{"harnesses": []}]


def test_a_second_daemon_on_the_same_state_directory_is_refused(empty_daemon, tmp_path):
    """Found by a review: two daemons on one due-set (two sockets: the default one follows XDG_RUNTIME_DIR, the state
    directory does not) both ran every wake."""
    config = empty_daemon.config
    other = Daemon(DaemonConfig(declarations=config.declarations, socket=tmp_path / "other.sock",
                                state_dir=config.state_dir))
    with pytest.raises(DaemonError, match="another daemon is serving the state directory"):
        other.start()
    assert not (tmp_path / "other.sock").exists()
    empty_daemon.stop()  # the directory is free again once the first has stopped
    other.start()
    other.stop()


def test_client_without_daemon_says_so(tmp_path):
    with pytest.raises(DaemonError, match="no daemon is listening"):
        DaemonClient(tmp_path / "none.sock").request({"op": "stats"})


def test_berm_serve_stops_cleanly_on_sigterm(tmp_path):
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    sock = tmp_path / "berm.sock"
    proc = subprocess.Popen([sys.executable, "-m", "berm_cli.main", "serve", str(decl), "--socket", str(sock),
                             "--state-dir", str(tmp_path / "state")], stderr=subprocess.PIPE, text=True)
    try:
        assert "declares no harnesses" in proc.stderr.readline() and "listening on" in proc.stderr.readline()
        assert DaemonClient(sock).request({"op": "harnesses"}) == {"harnesses": []}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stderr.read().splitlines() == [
            "berm serve: stopping, waiting for 0 running invocations (a second signal exits at once)",
            "berm serve: stopped"]
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_berm_serve_closes_a_connection_silent_for_its_idle_timeout(tmp_path):
    """The idle timeout was a DaemonConfig field that `berm serve` gave no way to set (session 14's note)."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    sock = tmp_path / "berm.sock"
    proc = subprocess.Popen([sys.executable, "-m", "berm_cli.main", "serve", str(decl), "--socket", str(sock),
                             "--state-dir", str(tmp_path / "state"), "--idle-timeout", "0.3"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert "declares no harnesses" in proc.stderr.readline() and "listening on" in proc.stderr.readline()
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)  # a hang guard: the default idle timeout is 60 s
            s.connect(str(sock))
            assert s.recv(1) == b""  # closed by the daemon, the client having said nothing
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_berm_serve_keeps_all_its_state_in_one_directory_given_with_a_tilde(tmp_path):
    """Found by a review: ``--state-dir '~/state'`` (a literal ~, as a systemd unit passes it) put the due-set and
    the daemon's lock in ./~/state while the kv store, expanding it, went to $HOME/state: the state split, and a
    second daemon started elsewhere was not refused."""
    decl, home, cwd = tmp_path / "agent.toml", tmp_path / "home", tmp_path / "cwd"
    decl.write_text("")
    cwd.mkdir()
    sock = tmp_path / "berm.sock"
    proc = subprocess.Popen([sys.executable, "-m", "berm_cli.main", "serve", str(decl), "--socket", str(sock),
                             "--state-dir", "~/state"], stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env={**os.environ, "HOME": str(home)})
    try:
        assert "declares no harnesses" in proc.stderr.readline() and "listening on" in proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert list(cwd.iterdir()) == []
    assert {"due.sqlite3", daemon_mod.STATE_LOCK} <= {p.name for p in (home / "state").iterdir()}


@pytest.mark.parametrize("option, message", [
    ("--workers=0", "--workers: must be at least 1, not 0"),
    ("--per-harness=0", "--per-harness: must be at least 1, not 0"),
    ("--per-harness=-1", "--per-harness: must be at least 1, not -1"),
    ("--max-depth=-1", "--max-depth: must be at least 0, not -1"),
    ("--timeout=nan", r"--timeout: must be a number of seconds in \(0, 86400\], not nan"),
    ("--timeout=0", "--timeout: must be a number of seconds"),
    ("--workers=four", "--workers: 'four' is not a whole number"),
    ("--idle-timeout=0", r"--idle-timeout: must be a number of seconds in \(0, 86400\], not 0"),
])
def test_berm_serve_refuses_limits_it_cannot_run_with(option, message, capsys):
    """They were taken as given: --workers 0 and --timeout nan ended in a traceback, --per-harness -1 started a
    daemon where every call waited for ever, --max-depth -1 refused every harness-caused enqueue."""
    parser = argparse.ArgumentParser(prog="berm serve")
    serve.add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["agent.toml", option])
    assert exit_.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_a_daemon_configured_with_a_bad_limit_refuses_to_start(tmp_path):
    config = DaemonConfig(declarations=tmp_path / "agent.toml", socket=tmp_path / "berm.sock",
                          state_dir=tmp_path / "state", per_harness=-1)
    with pytest.raises(BermError, match="per-harness limit must be at least 1, not -1"):
        Daemon(config)


@pytest.mark.parametrize("text, expected", [
    ("+30s", 1_000_030_000), ("+5m", 1_000_300_000), ("+2h", 1_007_200_000), ("+1d", 1_086_400_000),
    ("+250ms", 1_000_000_250), ("1234", 1234), ("2030-01-02T08:30:00Z", 1893573000000),
    ("2030-01-02T08:30:00+01:00", 1893569400000),
    # found by a review: timestamp() * 1000 in floating point, truncated, came out 1 ms early (late before 1970)
    ("2038-11-20T03:43:53.595+00:00", 2173837433595), ("1969-12-31T23:59:59.999+00:00", -1),
])
def test_schedule_instants(text, expected):
    assert parse_when(text, now_ms=1_000_000_000) == expected


@pytest.mark.parametrize("text", ["tomorrow", "0001-01-01T00:00", "9" * 5000, "+" + "9" * 5000 + "s", "\u00b2",
                                  "\u0663\u0663\u0663", "+\u0665m", "\uff11\uff12\uff13"],
                         ids=["word", "year-0-local", "5000-digits", "relative-5000-digits", "superscript",
                              "arabic-indic-digits", "relative-arabic-indic", "fullwidth-digits"])
def test_schedule_instant_errors_are_clear(text):
    """An instant before the year 1 in local time, or past int()'s digit limit, was a bare ValueError."""
    with pytest.raises(WhenError, match="cannot read '"):
        parse_when(text)


@pytest.mark.parametrize("text, error", [
    ("2026-03-29T02:30", "2026-03-29T02:30:00 does not exist in local time (the clocks skip it): give it a UTC "
                         "offset, as 2026-03-29T01:30:00+01:00 or 2026-03-29T03:30:00+02:00"),
    ("2026-10-25T02:30", "2026-10-25T02:30:00 happens twice in local time (the clocks go back): give it a UTC "
                         "offset, as 2026-10-25T02:30:00+02:00 or 2026-10-25T02:30:00+01:00"),
    ("2026-06-01T02:30", None),
], ids=["skipped", "twice", "summer"])
def test_a_local_time_a_clock_change_skips_or_repeats_is_refused(monkeypatch, text, error):
    """Found by a review: a skipped local time was taken as an hour before it, a repeated one as its first."""
    monkeypatch.setenv("TZ", "CET-1CEST,M3.5.0,M10.5.0/3")  # Central Europe's rules, without the zone database
    time.tzset()
    try:
        if error is None:
            assert parse_when(text) == parse_when(text + "+02:00")
        else:
            with pytest.raises(WhenError) as refused:
                parse_when(text)
            assert str(refused.value) == error
    finally:
        monkeypatch.undo()
        time.tzset()


def test_berm_schedule_shows_instants_no_date_can_hold(empty_daemon, capsys):
    """A harness may schedule any instant within 2**62 ms of the epoch: 'year 146140482 is out of range' broke
    `berm schedule add`'s output, and every `berm schedule list` after it."""
    empty_daemon.queue.add("h", RecordingTarget())
    sock = str(empty_daemon.config.socket)
    far, early = (1 << 62) - 1, -(1 << 62) + 1
    assert cli_main(["schedule", "--socket", sock, "add", "h", "far", str(far)]) == 0
    empty_daemon.queue.dueset.put("gone", "early", early)  # its harness is not loaded: it stays pending
    assert cli_main(["schedule", "--socket", sock, "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"scheduled h[far] at {far}", f"{early}  gone  early  ",
                                                    f"{far}  h  far  "]


def test_berm_schedule_list_escapes_what_a_harness_chose(empty_daemon, capsys):
    """A harness names its wakes and their payloads (berm.schedule.at): `berm schedule list` printed them raw, so a
    wake could clear the reader's terminal, set its clipboard (OSC 52) or forge list lines of its own."""
    # its harness is not loaded: the wake stays pending
    empty_daemon.queue.dueset.put("h", "a\nfake  line", 5, payload="\x1b]52;c;cm0gLXJm\x07\x1b[2J")
    assert cli_main(["schedule", "--socket", str(empty_daemon.config.socket), "list", "h"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"{_iso(5)}  h  a\\x0afake  line  \\x1b]52;c;cm0gLXJm\\x07\\x1b[2J"]
    assert "\x1b" not in out and "\x07" not in out


def test_berm_schedule_add_and_cancel_escape_the_wake_they_name(empty_daemon, capsys):
    """Found by a review: list escaped a harness's wake ids, but cancelling such a wake passes its id back, and the
    confirmation (and add's, and "was not scheduled") printed it raw."""
    hostile = "id\x1b]52;c;SGVsbG8=\x07\x1b[2J\u202e"
    empty_daemon.queue.dueset.put("h", hostile, 5)
    sock = ["schedule", "--socket", str(empty_daemon.config.socket)]
    assert cli_main([*sock, "cancel", "h", hostile]) == 0
    assert cli_main([*sock, "cancel", "h", hostile]) == 1
    empty_daemon.queue.add("h", RecordingTarget())
    assert cli_main([*sock, "add", "h", hostile, "+1h"]) == 0
    out, err = capsys.readouterr()
    shown = "h[id\\x1b]52;c;SGVsbG8=\\x07\\x1b[2J\\u202e]"
    assert out.splitlines()[0] == f"cancelled {shown}" and out.splitlines()[1].startswith(f"scheduled {shown} at ")
    assert err == f"berm schedule: {shown} was not scheduled\n"


def test_berm_schedule_cancel_says_when_the_wake_had_started(empty_daemon, capsys):
    started, gate = threading.Event(), threading.Event()
    empty_daemon.queue.add("h", RecordingTarget(on_wake=lambda inv: (started.set(), gate.wait(10))))
    sock = ["schedule", "--socket", str(empty_daemon.config.socket)]
    assert cli_main([*sock, "add", "h", "running", "1"]) == 0
    assert cli_main([*sock, "add", "h", "later", "+1h"]) == 0
    try:
        assert started.wait(10)
        capsys.readouterr()
        assert cli_main([*sock, "cancel", "h", "running"]) == 0
        assert cli_main([*sock, "cancel", "h", "later"]) == 0
    finally:
        gate.set()
    assert capsys.readouterr().out.splitlines() == [
        "cancelled h[running]; its wake had already started and runs to its end", "cancelled h[later]"]


def test_a_declared_harness_without_an_image_stops_the_start_clearly(tmp_path):
    decl = tmp_path / "agent.toml"
    decl.write_text('[[harnesses]]\nname = "missing"\ncapabilities = ["clock"]\n')
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state",
                          harnesses_dir=tmp_path / "images")
    with pytest.raises(BermError, match="harness 'missing': no image at"):
        Daemon(config).start()
    assert not config.socket.exists()


def test_a_stop_asked_while_the_daemon_starts_serves_nothing(tmp_path, monkeypatch):
    """Found by a review: a SIGTERM while the harnesses loaded (minutes of compiling) was put off until the start
    ended: the socket was bound, the scheduler started, and wakes that had come due ran after the stop was asked."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state")
    daemon = Daemon(config)
    woken = RecordingTarget()
    due = daemon_mod.Queue(config.state_dir / daemon_mod.DUE_DB)
    due.add("h", woken)
    due.schedule("h", "came-due", int(time.time() * 1000) - 1000)  # due while the daemon was down

    def loading(config, queue, until):  # the signal arrives while the harnesses load
        daemon.request_stop()
        return {"h": woken}

    monkeypatch.setattr(daemon_mod, "load_targets", loading)
    started = []
    monkeypatch.setattr(daemon.queue, "start", lambda: started.append("the queue and its scheduler"))
    assert daemon.start() is False
    assert not config.socket.exists() and daemon.wait(0) and started == []
    assert [e.id for e in due.list()] == ["came-due"]  # still due, for the next start
    monkeypatch.undo()
    again = Daemon(config)  # the locks went with it
    assert again.start() is True
    again.stop()


def test_loading_stops_before_the_next_harness_once_a_stop_is_asked(tmp_path):
    decl = tmp_path / "agent.toml"
    decl.write_text('[[harnesses]]\nname = "never"\n')  # no image: loading it would fail
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state")
    assert daemon_mod.load_targets(config, Daemon(config).queue, until=lambda: True) == {}


def test_a_harness_that_cannot_load_is_named_with_its_declarations_file(tmp_path):
    """Found by a review: an unknown capability, a missing image or a wrong digest was said without the file."""
    decl = tmp_path / "agent.toml"
    decl.write_text('[[harnesses]]\nname = "missing"\ncapabilities = ["clock"]\n')
    config = DaemonConfig(declarations=decl, socket=tmp_path / "berm.sock", state_dir=tmp_path / "state",
                          harnesses_dir=tmp_path / "images")
    with pytest.raises(DaemonError, match=f"^{re.escape(str(decl))}: harnesses\\[0\\]: harness 'missing': no image"):
        Daemon(config).start()


def test_a_request_naming_a_key_twice_is_a_protocol_error(empty_daemon):
    """Found by a review: the last one won, so {"op": "stats", "op": "harnesses"} was answered as harnesses, and a
    proxy that checked a call's first "args" was passed by."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(empty_daemon.config.socket))
        s.sendall(b'{"op": "stats", "op": "harnesses"}\n')
        reply = json.loads(s.makefile("rb").readline())
    assert reply == {"ok": False, "error": "protocol", "message": "a request names the key 'op' twice"}


def test_a_request_holding_a_long_integer_is_a_protocol_error_in_berms_words(empty_daemon):
    """It was answered "not a JSON line: Exceeds the limit (4300 digits) … use sys.set_int_max_str_digits()", the
    interpreter's own words, of a line that is JSON (found by a review)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(empty_daemon.config.socket))
        s.sendall(b'{"op": "stats", "n": ' + b"9" * 5000 + b"}\n")
        reply = json.loads(s.makefile("rb").readline())
    assert reply == {"ok": False, "error": "protocol", "message": "a request holds an integer of more than 600 digits"}


def test_an_invocation_ending_in_system_exit_is_a_host_error_reply(empty_daemon):
    class Exits:
        tools, exports = frozenset({"quit"}), frozenset()

        def invoke(self, inv, deadline):
            raise SystemExit(3)  # a capability calling sys.exit(): the executor hands it to the future

    empty_daemon.queue.add("exits", Exits())
    reply = empty_daemon.handle({"op": "call", "harness": "exits", "tool": "quit"})
    assert reply == {"ok": False, "error": "host", "message": "SystemExit: 3"}
    assert empty_daemon.handle({"op": "harnesses"})["ok"]


@pytest.mark.parametrize("request_line", [b'{"op": "schedule.cancel", "harness": "h", "id": "\\ud800"}',
                                          b'{"op": "schedule.list", "harness": "\\udfff"}',
                                          b'{"op": "call", "harness": "h", "tool": "echo", "args": "\\ud800"}'])
def test_a_lone_surrogate_in_a_request_is_a_protocol_error(empty_daemon, request_line, caplog):
    """JSON may escape a lone surrogate, which no UTF-8 text holds: the due-set's SQLite raised on it, and the
    daemon answered 'host' and logged a traceback as for a bug of its own."""
    empty_daemon.queue.add("h", RecordingTarget())
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(empty_daemon.config.socket))
        s.sendall(request_line + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    assert reply["error"] == "protocol" and "lone surrogate" in reply["message"]
    assert not caplog.records


def test_a_call_still_queued_at_stop_is_told_the_daemon_is_stopping(make_daemon):
    """stop() drops queued work: the call's future.result() raised CancelledError, answered as a host error
    with an empty message ('CancelledError: ') and logged with a traceback."""
    daemon = make_daemon(workers=1)
    gate = threading.Event()
    daemon.queue.add("h", RecordingTarget(on_call=lambda inv: gate.wait(10)))
    replies = {}

    def ask(name: str) -> None:
        replies[name] = daemon.handle({"op": "call", "harness": "h", "tool": "echo", "args": name})

    running = threading.Thread(target=ask, args=("running",))
    queued = threading.Thread(target=ask, args=("queued",))
    stopping = threading.Thread(target=daemon.stop)
    try:
        running.start()
        wait_for(lambda: daemon.queue.executor.load()["busy"] == 1)
        queued.start()
        wait_for(lambda: daemon.queue.executor.load()["queued"] == 1)
        stopping.start()
        queued.join(10)
        assert replies["queued"] == {"ok": False, "error": "refused", "message": "the daemon is stopping"}
        # while the running call ends, a new client is told at once that nobody listens (found by a review: the
        # listening socket stayed open, and a client hung until the guests had ended, then was reset)
        with pytest.raises(DaemonError, match="no daemon is listening"):
            DaemonClient(daemon.config.socket).request({"op": "stats"})
    finally:
        gate.set()
    for t in (running, stopping):
        t.join(10)
    assert replies["running"] == {"ok": True, "result": "running"}


def test_a_connection_open_at_stop_is_refused_not_answered_as_a_host_bug(make_daemon, caplog):
    """Found by a review: requests on a connection opened before stop() met the closed due-set, and came back as
    host errors ('ProgrammingError: Cannot operate on a closed database') logged with a traceback."""
    daemon = make_daemon()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.config.socket))
        f = s.makefile("rb")
        s.sendall(b'{"op": "harnesses"}\n')
        assert json.loads(f.readline()) == {"ok": True, "harnesses": []}
        daemon.stop()
        for op in ("schedule.list", "stats", "harnesses"):
            s.sendall(json.dumps({"op": op}).encode() + b"\n")
            assert json.loads(f.readline()) == {"ok": False, "error": "refused", "message": "the daemon is stopping"}
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_connections_past_the_limit_are_told_so_and_closed(empty_daemon):
    held = connections(empty_daemon.config.socket, daemon_mod.MAX_CLIENTS)
    try:
        with pytest.raises(RemoteError, match=f"more than {daemon_mod.MAX_CLIENTS} clients are connected"):
            DaemonClient(empty_daemon.config.socket).request({"op": "harnesses"})
    finally:
        for s in held:
            s.close()
    for _ in range(100):  # the held connections' threads end as they see them close
        try:
            assert DaemonClient(empty_daemon.config.socket).request({"op": "harnesses"}) == {"harnesses": []}
            break
        except RemoteError:
            time.sleep(0.05)
    else:
        pytest.fail("the daemon never served a client again")


def test_idle_connections_are_closed_and_free_their_slots(make_daemon):
    """With no idle timeout, MAX_CLIENTS connections a client opened and never used (or leaked) held every slot,
    locking every other client out of the daemon for good."""
    daemon = make_daemon(idle_timeout=0.2)
    held = [socket.socket(socket.AF_UNIX) for _ in range(daemon_mod.MAX_CLIENTS)]
    try:
        for s in held:
            s.connect(str(daemon.config.socket))
            s.settimeout(10)
            if s is held[0]:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed already, on a slow day
                    s.sendall(b'{"op": "harn')  # half a request, then silence
        assert all(s.recv(1) == b"" for s in held)  # each closed by the daemon
    finally:
        for s in held:
            s.close()
    wait_for(lambda: _answers(daemon))


def test_a_request_line_must_arrive_whole_within_the_idle_timeout(make_daemon):
    """The idle timeout was per read: a client sending a byte now and then kept its connection (and its slot) for as
    long as it liked without ever completing a request."""
    daemon = make_daemon(idle_timeout=0.3)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.config.socket))
        s.settimeout(0.05)
        closed_after = None
        for sent in range(200):  # a byte every 50 ms, for up to 10 s: far more than 0.3 s
            try:
                s.sendall(b"{" if sent == 0 else b" ")
                if s.recv(1) == b"":
                    closed_after = sent
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed_after = sent
                break
    assert closed_after is not None and closed_after < 100


def test_a_reply_may_take_the_whole_idle_timeout_to_write_however_late_its_request_came(make_daemon):
    """Reading a request line bounds each read by what is left of the line's time; the reply's write got that same
    bound, so a long reply to a request completed near its end was cut off after a moment."""
    daemon = make_daemon(idle_timeout=2.0)
    daemon.queue.add("h", RecordingTarget())
    for i in range(12):  # a listing of ~800 KB: more than the socket holds, so the write waits for the reader
        daemon.queue.schedule("h", f"w{i}", 1 << 50, "x" * 60_000)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.config.socket))
        s.settimeout(10)
        s.sendall(b'{"op": "schedule.list", ')
        time.sleep(1.7)
        s.sendall(b'"harness": ')
        time.sleep(0.1)  # the last read starts with ~0.2 s of the line's 2 s left
        s.sendall(b'"h"}\n')
        time.sleep(0.8)  # then the client reads, late but well within the idle timeout
        reply = json.loads(s.makefile("rb").readline())
    assert reply["ok"] is True and len(reply["entries"]) == 12


def test_a_result_whose_json_is_longer_than_a_request_line_reaches_the_client(make_daemon):
    """The client read a reply only to MAX_LINE bytes, and JSON writes a control character in six: a result of
    3 MiB of them came back as "no valid reply"."""

    class Controls(RecordingTarget):
        def invoke(self, inv, deadline):
            return "\x01" * (3 << 20)

    daemon = make_daemon()
    daemon.queue.add("h", Controls())
    assert DaemonClient(daemon.config.socket).call("h", "echo") == "\x01" * (3 << 20)


def test_long_request_lines_share_one_budget_and_one_too_many_is_refused_busy(make_daemon, monkeypatch):
    """64 clients each sending a 16 MiB line held a GiB at once; past each line's allowance, lines now draw on one
    budget, and a line that finds it spent is refused rather than buffered."""
    monkeypatch.setattr(daemon_mod, "LINE_ALLOWANCE", 1000)
    monkeypatch.setattr(daemon_mod, "LINE_BUDGET", 8000)
    answered, read_next = threading.Event(), daemon_mod._Lines.next

    def next_line(lines):  # a connection's next line waits until the test has looked at the budget
        if getattr(lines, "answered_one", False):
            answered.wait(10)
        lines.answered_one = True
        return read_next(lines)

    monkeypatch.setattr(daemon_mod._Lines, "next", next_line)
    daemon = make_daemon()
    event = json.dumps({"op": "publish", "topic": "t", "event": "x" * 6000}).encode()
    with socket.socket(socket.AF_UNIX) as first, socket.socket(socket.AF_UNIX) as second:
        for s in (first, second):
            s.connect(str(daemon.config.socket))
            s.settimeout(10)
        first.sendall(event[:-10])  # holds ~5,000 bytes of the budget while it is being sent
        wait_for(lambda: daemon._server.line_budget.left < 4000)
        second.sendall(event + b"\n")
        reply = json.loads(second.makefile("rb").readline())
        assert reply["ok"] is False and reply["error"] == "refused" and "busy" in reply["message"]
        assert second.recv(1) == b""  # and closed
        # a client still sending when refused (the daemon closed on it: a broken pipe) reads the refusal all the same
        with pytest.raises(RemoteError, match="busy") as refused:
            DaemonClient(daemon.config.socket).request({"op": "publish", "topic": "t", "event": "x" * (4 << 20)})
        assert refused.value.kind == "refused"
        first.sendall(event[-10:] + b"\n")
        assert json.loads(first.makefile("rb").readline()) == {"ok": True, "delivered": 0}
        # given back before the reply was written: it went back only as the connection's next line was read, and
        # a client sending its next long line at once was refused busy (seen on a loaded machine)
        assert daemon._server.line_budget.left == 8000
        answered.set()
    assert DaemonClient(daemon.config.socket).request(json.loads(event)) == {"delivered": 0}  # the budget came back
    wait_for(lambda: daemon._server.line_budget.left == 8000)


def _answers(daemon: Daemon) -> bool:
    try:
        return DaemonClient(daemon.config.socket).request({"op": "harnesses"}) == {"harnesses": []}
    except RemoteError:  # the slots are given back as the closed connections' threads end
        return False


def test_a_connection_whose_thread_could_not_start_gives_its_slot_back(empty_daemon, monkeypatch):
    failures = [daemon_mod.MAX_CLIENTS]

    def no_thread(self, request, client_address):
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("can't start new thread")
        return real(self, request, client_address)

    real = socketserver.ThreadingMixIn.process_request
    monkeypatch.setattr(socketserver.ThreadingMixIn, "process_request", no_thread)
    monkeypatch.setattr(empty_daemon._server, "handle_error", lambda request, address: None)
    for _ in range(daemon_mod.MAX_CLIENTS):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(empty_daemon.config.socket))
            s.recv(1)  # closed by the server
    assert DaemonClient(empty_daemon.config.socket).request({"op": "harnesses"}) == {"harnesses": []}


def test_a_client_that_leaves_with_a_reply_unread_is_no_error(empty_daemon, monkeypatch):
    """Closing a connection with a reply unread resets it: the handler's next read raised ConnectionResetError,
    and socketserver printed its traceback on the daemon's stderr."""
    server = empty_daemon._server
    errors, done = [], threading.Event()
    monkeypatch.setattr(server, "handle_error", lambda request, address: errors.append(sys.exc_info()[1]))
    monkeypatch.setattr(server, "shutdown_request", lambda request: (request.close(), done.set()))
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(empty_daemon.config.socket))
        s.sendall(b'{"op": "stats"}\n')
        s.settimeout(10)
        s.recv(1, socket.MSG_PEEK)  # the reply has arrived; it is left unread
    assert done.wait(10)  # the connection's handler has ended
    assert errors == []


def test_guest_text_cannot_forge_daemon_log_lines(caplog):
    """A guest's berm.log line, or a failure message in a record, reached the daemon's log verbatim: a newline in
    it started a forged record ("INFO berm.daemon: loaded harness admin"), an escape rewrote the terminal."""
    import io
    import logging

    from berm_cli.serve import OneRecordALine

    forged = "fine\n2026-12-01 INFO berm.daemon: loaded harness admin\x1b[2K"
    with caplog.at_level(logging.INFO, logger="berm.guest"):
        daemon_mod._guest_log("h", forged.encode())
    assert caplog.records[-1].getMessage() == "[h] fine\\x0a2026-12-01 INFO berm.daemon: loaded harness admin\\x1b[2K"

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(OneRecordALine("%(levelname)s %(message)s"))
    logger = logging.getLogger("berm.test-forgery")
    logger.addHandler(handler)
    try:
        logger.warning("%s failed: %s", "h.tool", forged)
        try:
            raise ValueError(forged)
        except ValueError:
            logger.exception("h.tool raised a host error")
    finally:
        logger.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0] == "WARNING h.tool failed: fine\\x0a2026-12-01 INFO berm.daemon: loaded harness admin\\x1b[2K"
    assert lines[1] == "ERROR h.tool raised a host error"
    assert lines[2:] and all(line.startswith("  | ") for line in lines[2:])
    assert "\x1b" not in out.getvalue()


def test_a_queued_call_whose_client_hung_up_is_withdrawn(make_daemon, monkeypatch, caplog):
    """Found by a review: a client that sent a call and closed its connection while the call was queued left it to
    run for nobody. It is withdrawn when the client has closed its end; a client that only half-closes (shut its
    writing side after the request, as ``nc -N`` does) still gets its reply. Found by another: withdrawn, it stayed
    queued, arguments and all, until a worker reached it (clients that hung up piled up gigabytes)."""
    import logging

    monkeypatch.setattr(daemon_mod, "HANGUP_POLL", 0.05)
    daemon = make_daemon(workers=1)
    gate = threading.Event()
    target = RecordingTarget(on_call=lambda inv: gate.wait(10) if inv.args == b"first" else None)
    daemon.queue.add("h", target)

    def send(args: str) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(daemon.config.socket))
        s.sendall(json.dumps({"op": "call", "harness": "h", "tool": "echo", "args": args}).encode() + b"\n")
        return s

    with caplog.at_level(logging.INFO, logger="berm.daemon"):
        first = send("first")
        wait_for(lambda: daemon.queue.executor.load()["busy"] == 1)
        send("gone").close()
        half = send("half")
        half.shutdown(socket.SHUT_WR)
        wait_for(lambda: "withdrew a queued call: its client hung up" in caplog.text)
        assert daemon.queue.executor.load()["queued"] == 1  # out of the queue at once, not when a worker comes by
        gate.set()
        with first, half:
            assert json.loads(first.makefile("rb").readline())["result"] == "first"
            assert json.loads(half.makefile("rb").readline())["result"] == "half"
    assert sorted(c["args"] for c in target.calls) == [b"first", b"half"]
