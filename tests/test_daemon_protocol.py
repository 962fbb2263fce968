"""The control protocol's field checks and replies, request by request: what a malformed field is (a protocol
error, never a refusal or a host bug), what a null optional field means, and what each kind of outcome of a call
comes back as."""

import json
import re
import socket
import sqlite3
import threading

import pytest

from berm_host.daemon import Daemon, DaemonClient, DaemonConfig, DaemonError, RemoteError

from .queue_helpers import RecordingTarget, connections


@pytest.fixture
def daemon(tmp_path):
    """A started daemon with no harness declared and one recording target ``h`` added, stopped after the test."""
    decl = tmp_path / "agent.toml"
    decl.write_text("")
    d = Daemon(DaemonConfig(declarations=decl, socket=tmp_path / "run" / "berm.sock", state_dir=tmp_path / "state"))
    d.start()
    d.target = RecordingTarget()
    d.queue.add("h", d.target)
    yield d
    d.stop()


def _error(client: DaemonClient, request: dict) -> tuple[str, str]:
    with pytest.raises(RemoteError) as err:
        client.request(request)
    return err.value.kind, str(err.value)


def test_a_boolean_is_not_a_number_of_milliseconds(daemon):
    """JSON true is a Python int subclass: it must not schedule a wake at 1 ms after the epoch."""
    client = DaemonClient(daemon.config.socket)
    assert _error(client, {"op": "schedule.add", "harness": "h", "id": "x", "when_ms": True}) == (
        "protocol", "'when_ms' must be int, not bool")
    assert list(client.schedules()) == []


def test_a_null_optional_field_is_the_field_left_out(daemon):
    """``"harness": null`` and ``"after": null`` in schedule.list ask for what leaving them out asks for (every
    harness, from the first entry); a null where a value is required is still an error."""
    client = DaemonClient(daemon.config.socket)
    client.request({"op": "schedule.add", "harness": "h", "id": "a", "when_ms": 4102444800000})
    entries = client.request({"op": "schedule.list", "harness": None, "after": None})
    assert [e["id"] for e in entries["entries"]] == ["a"] and entries["next"] is None
    assert _error(client, {"op": "schedule.cancel", "harness": None, "id": "a"})[0] == "protocol"


def test_a_cursor_past_the_64_bit_range_is_a_protocol_error(daemon):
    """when_ms of a cursor is a signed 64-bit instant: 2**63 is out of range (a malformed request), -2**63 is the
    earliest there is."""
    client = DaemonClient(daemon.config.socket)
    client.request({"op": "schedule.add", "harness": "h", "id": "a", "when_ms": 4102444800000})
    kind, message = _error(client, {"op": "schedule.list", "after": {"when_ms": 1 << 63, "harness": "h", "id": "a"}})
    assert kind == "protocol" and "out of range" in message
    page = client.request({"op": "schedule.list", "after": {"when_ms": -(1 << 63), "harness": "", "id": ""}})
    assert [e["id"] for e in page["entries"]] == ["a"]


def test_a_listing_of_exactly_one_page_has_no_next_page(daemon):
    """``next`` is a cursor only while more entries follow: a full page that is the whole listing ends it (a
    cursor there sent every client an extra request for an empty page), one entry more makes a second page."""
    from berm_host.daemon import LIST_PAGE

    far = 4102444800000
    daemon.queue.dueset.put_many([("h", f"{i:04}", far + i, "", 0) for i in range(LIST_PAGE)])
    client = DaemonClient(daemon.config.socket)
    page = client.request({"op": "schedule.list"})
    assert len(page["entries"]) == LIST_PAGE and page["next"] is None
    daemon.queue.dueset.put("h", "last", far + LIST_PAGE)
    page = client.request({"op": "schedule.list"})
    assert len(page["entries"]) == LIST_PAGE
    assert page["next"] == {"when_ms": far + LIST_PAGE - 1, "harness": "h", "id": f"{LIST_PAGE - 1:04}"}
    page = client.request({"op": "schedule.list", "after": page["next"]})
    assert [e["id"] for e in page["entries"]] == ["last"] and page["next"] is None


def test_each_outcome_of_a_call_comes_back_as_its_own_kind_of_error(daemon):
    """A guest's trap is a ``trap`` reply (not a ``refused`` one, though a Trap is a BermError too), its
    ``berm.fail`` a ``failure`` reply with the guest's text, a harness nobody declared ``refused``."""
    from berm_host.traps import ToolFailure

    def fail_on_request(inv):
        if inv.args == b"fail":
            raise ToolFailure("echo", "the guest says no")

    daemon.target.on_call = fail_on_request
    client = DaemonClient(daemon.config.socket)
    assert client.call("h", "echo", "hi") == "hi"
    kind, message = _error(client, {"op": "call", "harness": "h", "tool": "echo", "args": "trap"})
    assert kind == "trap" and "trapped" in message
    assert _error(client, {"op": "call", "harness": "h", "tool": "echo", "args": "fail"}) == (
        "failure", "the guest says no")
    assert _error(client, {"op": "call", "harness": "ghost", "tool": "echo"})[0] == "refused"


def test_a_request_line_of_more_than_max_line_bytes_is_refused_unread(daemon):
    """MAX_LINE bytes of request and its newline are read; one byte more is a protocol error, not parsed."""
    import json
    import socket

    from berm_host.daemon import MAX_LINE

    def line(size: int) -> bytes:
        head = json.dumps({"op": "publish", "topic": "t", "event": ""}).encode()
        return head[:-2] + b"x" * (size - len(head)) + head[-2:]

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.config.socket))
        f = s.makefile("rb")
        s.sendall(line(MAX_LINE - 1) + b"\n")
        assert json.loads(f.readline()) == {"ok": True, "delivered": 0}
        s.sendall(line(MAX_LINE) + b"\n")
        reply = json.loads(f.readline())
    assert reply["ok"] is False and reply["error"] == "protocol" and f"over {MAX_LINE} bytes" in reply["message"]


def test_publish_says_how_many_subscribers_it_delivered_to(daemon):
    client = DaemonClient(daemon.config.socket)
    assert client.request({"op": "publish", "topic": "t", "event": "e"}) == {"delivered": 0}
    daemon.queue.add("g", RecordingTarget())
    daemon.queue.subscribe("t", "h")
    daemon.queue.subscribe("t", "g")
    daemon.queue.subscribe("other", "h")
    assert client.request({"op": "publish", "topic": "t", "event": "e"}) == {"delivered": 2}


def test_a_request_without_a_string_op_is_a_protocol_error(daemon):
    client = DaemonClient(daemon.config.socket)
    for request in ({}, {"op": None}, {"op": 7}, {"tool": "echo"}):
        assert _error(client, request) == ("protocol", 'a request is a JSON object with a string "op"')


def test_a_calls_context_reaches_the_invocation(daemon):
    seen = []
    daemon.target.on_call = lambda inv: seen.append(inv.context)
    client = DaemonClient(daemon.config.socket)
    assert client.call("h", "echo", "x", agent="ag", conversation="c1", sender="alice") == "x"
    assert client.call("h", "echo", "y") == "y"
    assert [(c.agent, c.conversation, c.sender) for c in seen] == [("ag", "c1", "alice"), ("", "", "")]
    assert _error(client, {"op": "call", "harness": "h", "tool": "echo", "context": {"agent": 5}})[0] == "protocol"


def test_a_file_that_is_not_a_socket_where_the_socket_goes_is_left_alone(tmp_path):
    """A stale socket from a killed daemon is replaced; anything else at that path is the user's, never deleted."""
    from berm_host.daemon import DaemonError

    decl = tmp_path / "agent.toml"
    decl.write_text("")
    path = tmp_path / "run" / "berm.sock"
    path.parent.mkdir()
    path.write_text("precious")
    d = Daemon(DaemonConfig(declarations=decl, socket=path, state_dir=tmp_path / "state"))
    with pytest.raises(DaemonError, match="exists and is not a socket"):
        d.start()
    assert path.read_text() == "precious"


def test_a_request_holding_text_that_is_not_unicode_is_refused_before_sending(daemon, capsys):
    """Found by a hostile review: a command-line argument that is not UTF-8 (Python's lone surrogates) made the
    client's encoding raise, a traceback out of `berm schedule` and `berm call --daemon` instead of their error."""
    from berm_cli.main import main

    client = DaemonClient(daemon.config.socket)
    with pytest.raises(DaemonError, match=r"cannot send the request: it holds '\\udcff', which is not Unicode text"):
        client.request({"op": "call", "harness": "echo\udcff", "tool": "t"})
    assert main(["call", "--daemon", str(daemon.config.socket), "h\udcff", "t", '"x"']) == 2
    assert "berm call: cannot send the request: it holds" in capsys.readouterr().err
    assert client.request({"op": "schedule.list"})["entries"] == []  # the daemon never saw it


@pytest.mark.parametrize("request_, named", [
    ({"op": "call", "harness": "h", "tool": "echo", "arg": "x"}, "'arg'"),
    ({"op": "call", "harness": "h", "tool": "echo", "context": {"agent": "a", "user": "u"}}, "'user'"),
    ({"op": "harnesses", "verbose": True}, "'verbose'"),
    ({"op": "schedule.list", "after": {"when_ms": 1, "harness": "h", "id": "i", "page": 2}}, "'page'"),
])
def test_a_field_the_op_does_not_take_is_a_protocol_error(daemon, request_, named):
    """A misspelt field was ignored: {"arg": ...} was a call with no arguments, run as if nothing were wrong."""
    kind, message = _error(DaemonClient(daemon.config.socket), request_)
    assert kind == "protocol" and named in message
    assert daemon.target.calls == []  # refused before anything ran


def test_names_the_daemon_does_not_know_come_back_cut_short(daemon):
    """Found by a review: an unknown harness name (and op, and field name) was echoed whole, so a 2 MB name made a
    6 MB reply, which the daemon held for as long as its client left it unread."""
    client = DaemonClient(daemon.config.socket)
    long = "x" * 2_000_000
    for request_, words in [({"op": "call", "harness": long, "tool": "echo"}, "no harness named 'xxx"),
                            ({"op": long}, "unknown op 'xxx"),
                            ({"op": "harnesses", **{long + str(i): 1 for i in range(6)}}, "takes no 'xxx")]:
        kind, message = _error(client, request_)
        assert words in message and len(message) < 1000, (kind, message[:200])


def test_a_damaged_row_is_left_out_of_listings(daemon):
    """Found by a review: a due-set row of types the due-set never writes (another program's blob payload) made
    every schedule.list that reached it end with no reply, and socketserver printed a traceback."""
    far = 4102444800000
    daemon.queue.dueset.put_many([("h", "a", far, "", 0), ("h", "c", far + 2, "", 0)])
    with sqlite3.connect(daemon.queue.dueset.path) as db:
        db.execute("INSERT INTO due VALUES ('h', 'b', ?, x'00ff', 0, 99)", (far + 1,))
        db.execute("INSERT INTO due VALUES ('h', 'd', 'soon', '', 0, 98)")
    page = DaemonClient(daemon.config.socket).request({"op": "schedule.list"})
    assert [e["id"] for e in page["entries"]] == ["a", "c"] and page["next"] is None


@pytest.mark.parametrize("fields", [{"ok": True}, {}], ids=["with-others", "alone"])
def test_a_long_result_is_written_in_slices_that_make_the_same_line(fields):
    """Found by a review: a result of 16 MiB of control characters is a 96 MiB reply line, and encoding it whole
    made three copies of it for each client that had not read its reply yet (eight held 931 MiB). Long texts are
    now escaped and written a slice at a time."""
    from berm_host.daemon import REPLY_SLICE, _encode, _reply_chunks

    reply = {**fields, "result": "\x00é\n" * REPLY_SLICE + "tail", "note": "short"}
    chunks = list(_reply_chunks(reply))
    assert len(chunks) > 3 and max(map(len, chunks)) <= 6 * REPLY_SLICE
    line = b"".join(chunks)
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    assert json.loads(line) == reply
    assert list(_reply_chunks({"ok": True, "result": "small"})) == [_encode({"ok": True, "result": "small"})]


@pytest.mark.parametrize("reply", [
    {"entries": [{"id": str(i), "payload": "\x01" * 1000} for i in range(50)], "next": {"id": "49"}},
    {"entries": [], "next": None}, {"harnesses": ["a", "b"]}, {"result": "x" * (2 << 20), "entries": [1]},
], ids=["page", "empty-page", "names", "with-a-long-text"])
def test_a_list_in_a_reply_is_written_an_item_at_a_time(reply):
    """Found by a review: a schedule.list page of payloads of control characters was encoded whole, a 16 MiB line,
    and sixty clients that asked and never read held 1.5 GB."""
    from berm_host.daemon import _reply_chunks

    chunks = list(_reply_chunks(reply))
    line = b"".join(chunks)
    assert json.loads(line) == reply and line.endswith(b"}\n") and line.count(b"\n") == 1
    assert max(map(len, chunks)) < 7000 or "result" in reply


def test_a_socket_path_the_daemon_cannot_use_is_a_clear_error(tmp_path):
    """Found by reviews: a socket path under a file was a FileExistsError traceback, and a path too long for a
    Unix socket was refused with the reason "None"; then both, and a file where the socket goes, were refused only
    after every declared harness had loaded (minutes of compiling, for a cold cache). Now before any, and the
    too long path leaves nothing made behind."""
    decl = tmp_path / "agent.toml"
    decl.write_text('[[harnesses]]\nname = "never"\n')  # no image: loading it would fail first
    (tmp_path / "plain").write_text("")
    long_dir = tmp_path / ("x" * 200)
    for path, reason in [(decl / "berm.sock", "Not a directory"), (long_dir / "b.sock", "at most 107 bytes"),
                         (tmp_path / "plain", "exists and is not a socket")]:
        d = Daemon(DaemonConfig(declarations=decl, socket=path, state_dir=tmp_path / "state"))
        with pytest.raises(DaemonError, match=reason):
            d.start()
    assert not long_dir.exists()


def test_a_reply_json_cannot_hold_is_a_host_error_reply(caplog):
    """Whatever a reply holds, the client gets a line: a value JSON cannot hold (a blob) ended the connection with
    no reply and a traceback on stderr."""
    import io
    import types

    from berm_host.daemon import _Handler

    handler = types.SimpleNamespace(wfile=io.BytesIO())
    assert _Handler._reply(handler, {"ok": True, "entries": [{"payload": b"\x00"}]})
    reply = json.loads(handler.wfile.getvalue())
    assert reply["error"] == "host" and "could not be encoded" in reply["message"]
    assert "a reply could not be encoded" in caplog.text


def _call(client: DaemonClient):
    return client.call("h", "echo")


def _listing(client: DaemonClient):
    return list(client.schedules())


def _adding(client: DaemonClient):
    return client.schedule("h", "i", 5)


def _cancelling(client: DaemonClient):
    return client.cancel("h", "i")


@pytest.mark.parametrize("reply, ask", [
    (b"[1]\n", _call), (b'"ok"\n', _listing), (b"[" * 100_000 + b"\n", _call),
    (b'{"ok": true}\n', _call), (b'{"ok": true, "result": 5}\n', _call),
    (b'{"ok": true, "next": null}\n', _listing), (b'{"ok": true, "entries": 5, "next": null}\n', _listing),
    (b'{"ok": true, "entries": [1], "next": null}\n', _listing),
    (b'{"ok": true, "entries": [{"harness": "h", "id": "i", "when_ms": "5", "payload": ""}], "next": null}\n',
     _listing),
    (b'{"ok": true, "entries": [], "next": 5}\n', _listing),
    (b'{"ok": true, "entry": {"harness": "h", "id": 1, "when_ms": 5}}\n', _adding),
    (b'{"ok": true, "cancelled": 1}\n', _cancelling),
], ids=["list", "text", "nested-too-deeply", "no-result", "result-not-text", "no-entries", "entries-not-a-list",
        "entry-not-an-object", "entry-of-other-fields", "next-not-a-cursor", "added-entry-of-other-fields",
        "cancelled-not-a-bool"])
def test_a_reply_of_another_shape_is_no_valid_reply(tmp_path, reply, ask):
    """Found by a review: a well-formed reply of another shape (another program on the socket, a buggy or older
    daemon) ended `berm call --daemon` and `berm schedule` in an AttributeError, KeyError or TypeError traceback."""
    path = tmp_path / "peer.sock"

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(reply)

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)
        listener.settimeout(30)  # a hang guard
        peer = threading.Thread(target=answer)
        peer.start()
        with pytest.raises(DaemonError, match=f"^the daemon on {re.escape(str(path))} sent no valid reply"):
            ask(DaemonClient(path, timeout=10))
        peer.join(30)


def test_a_daemon_that_accepts_and_never_answers_is_said_so(tmp_path):
    """Found by a review: against a daemon that accepts connections and never answers (stopped, stuck), `berm
    schedule` and `berm call --daemon` waited for ever in silence. A request other than a call waits ``timeout``;
    a call first asks the daemon something that it must answer within ``timeout``, then waits for its result as long
    as it runs."""
    path = tmp_path / "d.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)  # the kernel accepts into the backlog; nobody reads
        said = f"^the daemon on {re.escape(str(path))} did not answer within 0.3 s \\(stopped, or stuck\\?\\)$"
        with pytest.raises(DaemonError, match=said):
            DaemonClient(path, timeout=0.3).request({"op": "schedule.list"})
        with pytest.raises(DaemonError, match=said):
            DaemonClient(path, timeout=0.3).call("h", "echo", "x")


def test_a_call_waits_for_its_result_past_the_answer_timeout(daemon):
    """The answer timeout is no limit on a call's own run (its harness's timeout is)."""
    daemon.queue.add("slow", RecordingTarget(work=2.0))  # the first answer takes ~2 ms; a loaded machine, more
    assert DaemonClient(daemon.config.socket, timeout=1.0).call("slow", "echo", "done") == "done"


def test_calls_leave_connections_for_other_requests(daemon):
    """Found by a review: one client keeping 64 calls queued held every connection slot, and `berm schedule`, stats
    and calls to idle harnesses were refused. Past MAX_CALLS calls in progress a call is refused; other requests
    still find a connection."""
    from berm_host import daemon as daemon_mod

    gate = threading.Event()
    daemon.queue.add("slow", RecordingTarget(on_call=lambda inv: gate.wait(30)))
    held = connections(daemon.config.socket, daemon_mod.MAX_CALLS,
                       b'{"op": "call", "harness": "slow", "tool": "echo", "args": "x"}\n')
    try:
        load = daemon.queue.executor.load
        for _ in range(1000):
            if load()["busy"] + load()["queued"] == daemon_mod.MAX_CALLS:
                break
            threading.Event().wait(0.01)
        client = DaemonClient(daemon.config.socket, timeout=10)
        with pytest.raises(RemoteError, match=f"the daemon is busy: its clients have {daemon_mod.MAX_CALLS} calls"):
            client.call("h", "echo", "y")
        assert "h" in client.harnesses() and client.request({"op": "stats"})["stats"]["pending"] == 0
    finally:
        gate.set()
        for s in held:
            s.makefile("rb").readline()  # its result
            s.close()
    assert DaemonClient(daemon.config.socket, timeout=10).call("h", "echo", "z") == "z"
