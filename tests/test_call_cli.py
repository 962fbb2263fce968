"""``berm call``: the result on stdout and exit 0; a tool failure on stderr and exit 1; a trap, an ungranted
capability or a host error on stderr and exit 2."""

from __future__ import annotations

import io

import pytest

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
    code, out, err = berm_call("read", '"hello.txt"', "--root", str(root))
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
    (["echo", "--grant", "teleport"], "does not know"),
    (["echo", "--memory", "3M"], "power of two"),
    (["echo", "--host", "bad host"], "bad host entry"),
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
    monkeypatch.setattr("sys.stdin", io.StringIO(f'{{"text": "{big}"}}'))
    code, out, err = berm_call("echo", "-")
    assert (code, err) == (0, "") and out == f'{{"text": "{big}"}}\n'
    monkeypatch.setattr("sys.stdin", io.StringIO("{not json"))
    assert berm_call("echo", "-")[0] == 2


def test_stdin_that_is_not_utf8_is_refused(berm_call, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'"\xff"'), encoding="utf-8", errors="strict"))
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


@pytest.mark.parametrize("command, said", [("call", "berm call: interrupted\n"),
                                           ("schedule", "berm schedule: interrupted (the daemon may have made the "
                                                        "change: berm schedule list shows)\n")])
def test_ctrl_c_while_waiting_for_the_daemon_is_one_line_and_status_130(capsys, command, said):
    """Found by a review: Ctrl-C while ``berm call --daemon`` or ``berm schedule`` waited for the daemon's reply
    printed a KeyboardInterrupt traceback, status -2 (a call run here ends at its own Ctrl-C, interrupt.py)."""
    import argparse
    import types

    from berm_cli.main import _run

    def run(args):
        raise KeyboardInterrupt

    args = argparse.Namespace(command=command, _module=types.SimpleNamespace(run=run))
    assert _run(args) == 130
    assert capsys.readouterr().err == said
