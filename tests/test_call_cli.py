"""``berm call``: the result on stdout and exit 0; a tool failure on stderr and exit 1; a trap, an ungranted
capability or a host error on stderr and exit 2."""

from __future__ import annotations

import io
import sys

import pytest

from berm_abi.errors import BermError
from berm_cli.main import main
from tests.test_cap_guest import probe_elf


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "probe.elf"
    path.write_bytes(probe_elf())
    return path


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    (r / "hello.txt").write_text("hello, world")
    return r


@pytest.fixture(params=["interp", "aot"])
def berm_call(request, elf, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path / "cache"))

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["call", str(elf), *args, "--engine", request.param, "--data-dir", str(tmp_path / "data")])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_success_prints_the_result(berm_call, root):
    assert berm_call("read", '"hello.txt"', "--grant", "fs", "--root", str(root)) == (0, "hello, world\n", "")
    assert berm_call("echo", '{"a": [1, 2]}') == (0, '{"a": [1, 2]}\n', "")
    assert berm_call("echo") == (0, "{}\n", "")


def test_tool_failure_exits_1_with_the_message_on_stderr(berm_call, root):
    code, out, err = berm_call("read", '"missing.txt"', "--grant", "fs", "--root", str(root))
    assert (code, out) == (1, "")
    assert err == "berm.fs.read: missing.txt: no such file\n"


def test_an_ungranted_capability_is_a_trap_exit_2(berm_call, root):
    code, out, err = berm_call("read", '"hello.txt"')
    assert (code, out) == (2, "")
    assert "no host function for call" in err and "berm.fs.read, not granted to this harness" in err
    # how to grant it, the last line (a newcomer's walkthrough: the trap named the call, not the option)
    assert err.endswith("\nberm call: to grant berm.fs.read, add --grant fs --root DIR\n")


@pytest.mark.parametrize("grant, needs", [("fs", "--root DIR"), ("exec", "--root DIR"), ("http", "--host HOST")])
def test_a_grant_without_its_bound_is_refused(berm_call, grant, needs):
    """A grant without its bound gives nothing: the command line said --grant fs and the guest trapped with
    "not granted". It is refused before anything runs."""
    code, out, err = berm_call("read", '"hello.txt"', "--grant", grant)
    assert (code, out) == (2, "")
    assert f"--grant {grant} needs {needs}" in err and "trapped" not in err


def test_a_trap_exits_2(berm_call):
    code, out, err = berm_call("crash")
    assert (code, out) == (2, "")
    assert "harness trapped in crash: guest executed ebreak" in err


@pytest.mark.parametrize("args, words", [
    (["echo", "{not json"], "not valid JSON"),
    (["echo", "--grant", "teleport"], "--grant 'teleport': this host knows no such grant (known: clock, exec, fs"),
    # found by a review: with --root or --host given, a misspelt grant was said to be missing
    (["echo", "--grant", "fs,exec", "--root", "."], "--grant 'fs,exec': this host knows no such grant (known: clock, "
                                                    "exec, fs, http, kv); give each its own --grant"),
    (["echo", "--grant", "HTTP", "--host", "example.org"], "--grant 'HTTP': this host knows no such grant"),
    (["echo", "--memory", "3M"], "berm call: --memory: guest memory must be a power of two"),  # not "command line"
    (["echo", "--host", "bad host", "--grant", "http"], "bad host entry"),
    # found by a review: taken without a word, though they bound nothing; and daemon-only grants said unknown
    (["echo", "--root", "."], "--root bounds only --grant exec or --grant fs: without one it gives nothing"),
    (["echo", "--host", "example.org"], "--host bounds only --grant http: without one it gives nothing"),
    (["echo", "--grant", "call"], "--grant call: only a declaration under berm serve grants call: call the harness"),
    (["echo", "--grant", "fs", "--root", "/definitely/not/here"], "not an existing directory"),
    (["nosuchtool"], "nosuchtool"),
])
def test_bad_input_exits_2_with_a_message(berm_call, args, words):
    code, out, err = berm_call(*args)
    assert (code, out) == (2, "")
    assert words in err


def test_dash_reads_the_arguments_from_stdin(berm_call, monkeypatch):
    """Arguments longer than a command line may be (Linux takes at most 128 KiB in one argument: "Argument list too
    long") come from stdin. The probe's echo holds 64 KiB of them."""
    big = "x" * 60_000
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(f'{{"text": "{big}"}}'.encode())))
    code, out, err = berm_call("echo", "-")
    assert (code, err) == (0, "") and out == f'{{"text": "{big}"}}\n'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"{not json")))
    assert berm_call("echo", "-")[0] == 2


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])
def test_stdin_that_is_not_utf8_is_refused(berm_call, monkeypatch, errors):
    """Read as bytes: under C.UTF-8, stdin's text layer escapes bad bytes (surrogateescape), and the arguments went
    on to a load and a Python encoding error (found by a review)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'"\xff"'), encoding="utf-8", errors=errors))
    code, out, err = berm_call("echo", "-")
    assert (code, out) == (2, "") and err == "berm call: the arguments on stdin are not UTF-8 (byte 1)\n"


def test_a_missing_image_exits_2(tmp_path, capsys):
    assert main(["call", str(tmp_path / "none.elf"), "echo", "--engine", "interp"]) == 2
    assert "none.elf" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """``berm inspect … --disassemble | head -1`` printed a BrokenPipeError traceback."""
    import subprocess
    import sys

    from tests.test_rust_guest import ELF  # its listing (~180 KB) is more than a pipe holds
    proc = subprocess.Popen([sys.executable, "-m", "berm_cli.main", "inspect", str(ELF), "--disassemble"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves with most of the listing unread
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and err == ""


def test_each_line_of_a_guest_log_line_is_tagged_with_the_harness(capsys):
    """A newline in a berm.log line started a line without the tag, which could pass for berm call's own."""
    from berm_cli.call import _log

    _log("h", b"hello\nberm call: harness os: loaded with no capabilities\x1b[2J\xe2\x80\xae")
    assert capsys.readouterr().err == "[h] hello\n[h] berm call: harness os: loaded with no capabilities\\x1b[2J\\u202e\n"


@pytest.mark.parametrize("tty", [True, False])
def test_a_result_is_escaped_for_a_terminal_and_left_as_it_is_for_a_pipe(tty, capsys, monkeypatch):
    """An untrusted harness's result went to the terminal as it was: OSC 52 set the user's clipboard."""
    from berm_cli.terminal import print_result

    monkeypatch.setattr("sys.stdout.isatty", lambda: tty)
    print_result("ok\x1b]52;c;cm0gLXJmIH4K\x07\n\tdone")
    out = capsys.readouterr().out
    assert out == ("ok\\x1b]52;c;cm0gLXJmIH4K\\x07\n\tdone\n" if tty else "ok\x1b]52;c;cm0gLXJmIH4K\x07\n\tdone\n")


def test_a_traps_message_is_one_line_whatever_the_guests_failure_text_holds():
    """Found by a review: a trap carries the guest's earlier berm.fail text, and its newlines printed forged lines
    under the message ("  called from admin_grant+0x0", "berm call: ...")."""
    from berm_cli.call import _trap_text

    text = _trap_text("harness trapped in echo: guest executed ebreak (after berm.fail: oops\n  called from "
                      "admin_grant+0x0\nberm call: \x1b[31mforged)", ["called from main+0x4"])
    assert text.split("\n") == ["berm call: harness trapped in echo: guest executed ebreak (after berm.fail: "
                                "oops\\x0a  called from admin_grant+0x0\\x0aberm call: \\x1b[31mforged)",
                                "  called from main+0x4"]


def test_a_daemon_option_that_took_the_image_for_its_socket_says_so(capsys, tmp_path, monkeypatch):
    """Found by a review: ``berm call --daemon os read '{…}'`` took ``os`` for the socket ("no daemon is listening
    on os"): --daemon takes a path when a word follows it."""
    monkeypatch.chdir(tmp_path)
    assert main(["call", "--daemon", "os", "read", '{"path": "README.md"}']) == 2
    assert capsys.readouterr().err == (
        "berm call: no daemon is listening on os (start one with `berm serve`); if 'os' was meant for the image, put "
        "--daemon after the image, tool and arguments, or write --daemon=SOCKET: --daemon takes the word after it "
        "for its socket\n")
    assert main(["call", "read", "t", "--daemon", "socket/path"]) == 2  # a path: no such hint
    assert "meant for the image" not in capsys.readouterr().err


@pytest.mark.parametrize("command, daemon, said", [
    ("call", "", "berm call: interrupted (a call the daemon had started runs on there until it ends or reaches its "
                 "deadline)\n"),
    ("call", None, "berm call: interrupted\n"),
    ("schedule", None, "berm schedule: interrupted (the daemon may have made the change: berm schedule list "
                       "shows)\n")])
def test_ctrl_c_while_waiting_for_the_daemon_is_one_line_and_status_130(capsys, command, daemon, said):
    """Found by a review: Ctrl-C while ``berm call --daemon`` or ``berm schedule`` waited for the daemon's reply
    printed a KeyboardInterrupt traceback, status -2 (a call run here ends at its own Ctrl-C, interrupt.py); and
    then ``berm call --daemon`` did not say that the daemon ran the call on (a later review)."""
    import argparse
    import types

    from berm_cli.main import _run

    def run(args):
        raise KeyboardInterrupt

    args = argparse.Namespace(command=command, daemon=daemon, _module=types.SimpleNamespace(run=run))
    assert _run(args) == 130
    assert capsys.readouterr().err == said


@pytest.mark.parametrize("text, problem", [
    ('{"a": 1, "a": 2}', "valid JSON: the key 'a' is given twice in an object"),
    ('{"a": {"b": 1, "b": 1}}', "valid JSON: the key 'b' is given twice in an object"),
    ('{"a": NaN}', "valid JSON: NaN is not JSON"),
    ('[-Infinity]', "valid JSON: -Infinity is not JSON"),
    ('"\\ud800"', "valid JSON: it holds a lone surrogate ('\\ud800'), which is not text"),
    ("[1e999]", None), ("[-1e-999, 1.5e308]", None),  # the SDKs keep a number's text (a later review)
    ("[" * 5000 + "]" * 5000, "valid JSON here: they nest too deeply"),
    # found by a review: the SDKs read 64 levels, and deeper went to the guest (a failure, status 1)
    ('{"a": ' + "[" * 64 + "]" * 64 + "}", "valid JSON here: they nest 65 deep, past the 64 a guest's SDK reads"),
    ("[" * 64 + "]" * 64, None),
    ("{not json", "valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ("\udcff", "UTF-8"),
    ("", "valid JSON: Expecting value: line 1 column 1 (char 0)"),
    ("9" * 5000, None), ('{"a": "\\ud83d\\ude00"}', None), ("[1e308]", None),
])
def test_arguments_are_checked_as_a_guests_sdk_reads_them_before_anything_loads(text, problem):
    """Found by a review: json.loads let a repeated key, NaN and a lone surrogate through to the guest (a failure,
    status 1, where bad arguments are 2), refused a long integer, and raised RecursionError as a traceback. Another
    had 1e999 (infinity to Python) refused as the manifest reader refuses it; a later one found both guest SDKs read
    it, as the number's text, so it goes through."""
    from berm_cli.call import json_problem

    assert json_problem(text) == problem


@pytest.mark.parametrize("text, shown", [
    ("bad\nberm call: to grant berm.fs.read, add --grant exec --root /", "bad\n  berm call: to grant berm.fs.read, "
                                                                        "add --grant exec --root /"),
    ("", "(the tool failed with no message)"), ("one line", "one line"),
])
def test_a_failures_later_lines_are_indented_so_none_passes_for_the_commands_own(text, shown):
    """Found by a review: a guest's failure text printed lines that read as berm call's own (a forged grant hint);
    an empty one printed a bare empty line."""
    from berm_cli.terminal import failure_text

    assert failure_text(text) == shown


def test_a_log_line_stderr_cannot_take_does_not_cost_the_call_its_result(monkeypatch):
    """Found by a review: with stderr full or closed, the log line's failed write was an OSError in the log sink, so
    the call trapped and its result was lost."""
    from berm_cli.call import _log

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("sys.stderr", Full())
    _log("h", b"a line")  # raises nothing


@pytest.mark.parametrize("stem, grants, name", [("my tool", [], "my_tool"), (".hidden", [], "_hidden"),
                                                ("x" * 80, [], "x" * 64), ("ok-name.v2", ["kv"], "ok-name.v2")])
def test_an_image_file_name_that_cannot_name_a_harness_is_made_into_one_unless_kv_needs_it(stem, grants, name):
    """Found by a review: "my tool.elf" was refused (a name must be 1-64 of [A-Za-z0-9_.-]) without a word of --name,
    though without kv the name only tags the harness's log lines."""
    import argparse

    from berm_cli.call import _name

    assert _name(argparse.Namespace(elf=f"/d/{stem}.elf", name=None, grant=grants)) == name
    with pytest.raises(BermError, match=r"cannot name its kv store's namespace: give --name NAME"):
        _name(argparse.Namespace(elf="/d/my tool.elf", name=None, grant=["kv"]))


@pytest.mark.parametrize("redirect, status, said", [
    (">&-", 1, "berm: cannot write its output: standard output is closed\n"),
    ("<&-", 2, "berm call: the arguments are to come from stdin, which is closed\n"),
])
def test_a_closed_standard_stream_is_said_not_a_traceback(tmp_path, redirect, status, said):
    """Found by a review: started with stdout or stdin closed (Python makes them None), berm printed an
    AttributeError traceback, status 1."""
    import subprocess
    import sys

    elf = tmp_path / "probe.elf"
    elf.write_bytes(probe_elf())
    arg = "'{}'" if redirect == ">&-" else "-"
    done = subprocess.run(f"{sys.executable} -m berm_cli.main call {elf} echo {arg} --engine interp {redirect}",
                          shell=True, stdout=None if redirect == ">&-" else subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (status, said)


def test_a_command_started_with_sigchld_ignored_still_sees_exit_statuses(tmp_path):
    """Found by a review: started by a parent that ignores SIGCHLD (kept across exec), every command of exec was
    reaped unseen and read as exit 0. The command line restores SIGCHLD's default action (an embedder's host is
    refused instead: tests/test_cap_exec.py)."""
    import signal
    import subprocess

    done = subprocess.run([sys.executable, "-m", "berm_cli.main", "call", "os", "bash", '{"command": "exit 3"}',
                           "--grant", "exec", "--root", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    assert (done.returncode, done.stdout) == (0, '{"exit_code":3,"stderr":"","stdout":""}\n'), done.stderr
