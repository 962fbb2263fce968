"""The OS harness end to end in a temporary root with the real capabilities: on both engines, and natively (the
same C built for the host, which serves the large-file cases the interpreter would take seconds over)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berm_host.declaration import Declaration
from berm_host.grants import linker_for
from berm_host.traps import Trap, ToolFailure, TrapKind
from berm_sdk.build import build_harness
from berm_sdk.harness_toml import load_harness_toml
from berm_sdk.native import NativeHarness, build_native_library
from tests.bounded import GRACE, ends_within
from tests.sdk_engines import ENGINE_KINDS, NativeText, harness

OS_DIR = Path(__file__).resolve().parent.parent / "harnesses" / "os"
TOOLS = ["read", "write", "edit", "bash", "glob", "grep"]


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    return build_harness(OS_DIR, tmp_path_factory.mktemp("os") / "os.elf").read_bytes()


@pytest.fixture(scope="module")
def native_lib(tmp_path_factory):
    return build_native_library(sorted(OS_DIR.glob("*.c")), tmp_path_factory.mktemp("os-native") / "os.so",
                                include=(OS_DIR,))


def linker(root: Path, grants=("fs", "exec"), env=()):
    return linker_for(Declaration(name="os", capabilities=tuple(grants), root=str(root), env=tuple(env)))


class Tools:
    """call(tool, **arguments) on one engine, over a root."""

    def __init__(self, engine, root: Path):
        self.engine, self.root = engine, root

    def __call__(self, tool: str, **arguments) -> str:
        return self.engine.call(tool, json.dumps(arguments))

    def fails(self, tool: str, **arguments) -> str:
        with pytest.raises(ToolFailure) as info:
            self(tool, **arguments)
        return info.value.message


def native_engine(native_lib, link):
    return NativeText(NativeHarness(native_lib, {c.name: c.fn for c in link}))


def engine_tools(kind: str, elf: bytes, native_lib: Path, root: Path, **grants) -> Tools:
    link = linker(root, **grants)
    return Tools(native_engine(native_lib, link) if kind == "native" else harness(kind, elf, link, "os"), root)


@pytest.fixture(params=[*ENGINE_KINDS, "native"])
def os_tools(request, elf, native_lib, tmp_path):
    return engine_tools(request.param, elf, native_lib, tmp_path)


@pytest.fixture(params=["aot", "native"])
def fast_tools(request, elf, native_lib, tmp_path):
    """The engines for megabyte-sized files (the interpreter would take seconds)."""
    return engine_tools(request.param, elf, native_lib, tmp_path)


# ---------------------------------------------------------------- read


@pytest.mark.parametrize("content, args, expected", [
    ("a\nb\nc\n", {}, "1\ta\n2\tb\n3\tc\n\n--- 3 total lines ---"),
    ("a\nb\nc", {}, "1\ta\n2\tb\n3\tc\n\n--- 3 total lines ---"),
    ("a\r\nb\r\n", {}, "1\ta\n2\tb\n\n--- 2 total lines ---"),
    ("", {}, "\n--- 0 total lines ---"),
    ("\n", {}, "1\t\n\n--- 1 total lines ---"),
    ("a\nb\nc\n", {"offset": 0}, "1\ta\n2\tb\n3\tc\n\n--- 3 total lines ---"),
    ("a\nb\nc\n", {"offset": 2, "limit": 1}, "2\tb\n\n--- 3 total lines (showing lines 2-2) ---"),
    ("a\nb\nc\n", {"offset": 3}, "3\tc\n\n--- 3 total lines (showing lines 3-3) ---"),
    ("a\nb\nc\n", {"limit": 2}, "1\ta\n2\tb\n\n--- 3 total lines (showing lines 1-2) ---"),
    ("a\nb\nc\n", {"limit": 3}, "1\ta\n2\tb\n3\tc\n\n--- 3 total lines ---"),
    ("a\nb\nc\n", {"offset": 4}, "--- 3 total lines (offset 4 is past end of file) ---"),
    ("", {"offset": 2}, "--- 0 total lines (offset 2 is past end of file) ---"),
    ("a\nb\nc\n", {"offset": 2, "limit": 9223372036854775807}, "2\tb\n3\tc\n\n--- 3 total lines (showing lines 2-3) ---"),
    ("caf\u00e9\n\U0001F600 \u4e2d\n", {}, "1\tcaf\u00e9\n2\t\U0001F600 \u4e2d\n\n--- 2 total lines ---"),
])
def test_read_windows(os_tools, content, args, expected):
    (os_tools.root / "f.txt").write_bytes(content.encode())
    assert os_tools("read", path="f.txt", **args) == expected


def test_read_default_limit_is_2000_lines(os_tools):
    (os_tools.root / "big.txt").write_text("".join(f"{i}\n" for i in range(2500)))
    out = os_tools("read", path="big.txt")
    assert out.endswith("2000\t1999\n\n--- 2500 total lines (showing lines 1-2000) ---")


def test_read_failures(os_tools):
    (os_tools.root / "bin").write_bytes(b"ok\n\xff\xfe\n")
    assert os_tools.fails("read", path="bin") == "bin is not valid UTF-8"
    assert "missing.txt" in os_tools.fails("read", path="missing.txt")
    assert os_tools.fails("read", path="x", limit=0) == "invalid arguments: 'limit' must be between 1 and 9223372036854775807, not 0"


def test_read_stops_at_its_output_limit_saying_where_to_read_on(fast_tools):
    """It failed whole ('output exceeds the 262144-byte output buffer'), and a file with one line over 256 KiB could
    not be read at any offset or limit."""
    (fast_tools.root / "wide.txt").write_text(("x" * 1000 + "\n") * 300)
    out = fast_tools("read", path="wide.txt")
    body, footer = out.rsplit("\n\n", 1)
    shown = re.fullmatch(r"--- 300 total lines \(showing lines 1-(\d+): the output limit; read on with offset=(\d+)\) ---",
                         footer)
    assert shown and int(shown[2]) == int(shown[1]) + 1 and body.count("\n") == int(shown[1]) - 1
    assert len(body.encode()) <= 256 << 10 and body.split("\n")[-1].startswith(f"{shown[1]}\t")
    assert fast_tools("read", path="wide.txt", offset=int(shown[2])).endswith(f"(showing lines {shown[2]}-300) ---")
    assert fast_tools("read", path="wide.txt", limit=200).endswith("(showing lines 1-200) ---")


def test_read_cuts_a_long_line_on_a_character_boundary_saying_how_much_is_left(fast_tools):
    (fast_tools.root / "min.js").write_text("a" * 1999 + "é" * 200_000 + "\nnext\n")
    first, second = fast_tools("read", path="min.js").split("\n")[:2]
    assert first == "1\t" + "a" * 1999 + " [... 400000 more bytes on this line]"  # not half an é
    assert second == "2\tnext"


# ---------------------------------------------------------------- write and edit


def test_write_then_read_back(os_tools):
    assert os_tools("write", path="new.txt", content="h\u00e9llo\n") == "wrote 7 bytes to new.txt"
    assert (os_tools.root / "new.txt").read_text() == "h\u00e9llo\n"
    assert "nodir" in os_tools.fails("write", path="nodir/x.txt", content="")


@pytest.mark.parametrize("old, new, message", [
    ("", "x", "old_string must not be empty"),
    ("same", "same", "old_string and new_string are identical"),
    ("absent", "x", "old_string not found"),
    ("aa", "b", "old_string is not unique, found 2 occurrences"),  # "aaaa" holds two, not three
])
def test_edit_failures(os_tools, old, new, message):
    (os_tools.root / "e.txt").write_text("aaaa same\n")
    assert os_tools.fails("edit", path="e.txt", old_string=old, new_string=new) == message
    assert (os_tools.root / "e.txt").read_text() == "aaaa same\n"


@pytest.mark.parametrize("text, old", [("x}\n}\n}\n", "}\n}\n"), ("aaa", "aa")])
def test_an_old_string_that_occurs_again_overlapping_itself_is_not_unique(os_tools, text, old):
    """Found by a review: occurrences are counted without overlaps, so "}\n}\n" in "x}\n}\n}\n" counted once, and the
    first of its two places was edited silently."""
    (os_tools.root / "e.txt").write_text(text)
    assert os_tools.fails("edit", path="e.txt", old_string=old, new_string="y") == \
        "old_string is not unique: it occurs again overlapping its first occurrence"
    assert (os_tools.root / "e.txt").read_text() == text


def test_edit_checks_arguments_before_the_file(os_tools):
    assert os_tools.fails("edit", path="missing", old_string="", new_string="x") == "old_string must not be empty"
    assert "missing" in os_tools.fails("edit", path="missing", old_string="a", new_string="x")


def test_edit_replaces_the_one_occurrence(os_tools):
    (os_tools.root / "e.txt").write_text("alpha beta\ngamma\n")
    assert os_tools("edit", path="e.txt", old_string="beta", new_string="\u03b2\u03b5\u03c4\u03b1") == "ok"
    assert (os_tools.root / "e.txt").read_text() == "alpha \u03b2\u03b5\u03c4\u03b1\ngamma\n"


def test_edit_of_lines_as_read_shows_them_in_a_crlf_file_keeps_its_line_ends(os_tools):
    """read shows CRLF lines without their \\r: a multi-line old_string copied from it was 'not found', and a new_string
    with \\n put bare line ends into a CRLF file."""
    (os_tools.root / "crlf.txt").write_bytes(b"line one\r\nline two\r\nline three\r\n")
    assert os_tools("edit", path="crlf.txt", old_string="line one\nline two", new_string="1\n2\n2b") == "ok"
    assert (os_tools.root / "crlf.txt").read_bytes() == b"1\r\n2\r\n2b\r\nline three\r\n"
    assert os_tools.fails("edit", path="crlf.txt", old_string="line one\nline two", new_string="x") == \
        "old_string not found"


def test_edit_of_lines_that_occur_with_both_line_ends_is_not_unique(os_tools):
    """read shows a block with CRLF and the same block with LF alike: edit replaced the LF one and said ok (found
    by a review)."""
    mixed = b"x = 1\r\ny = 2\r\n# copy\nx = 1\ny = 2\n"
    (os_tools.root / "mixed.txt").write_bytes(mixed)
    assert os_tools.fails("edit", path="mixed.txt", old_string="x = 1\ny = 2", new_string="x = 9\ny = 9") == \
        "old_string is not unique, found 2 occurrences"
    assert (os_tools.root / "mixed.txt").read_bytes() == mixed
    assert os_tools("edit", path="mixed.txt", old_string="# copy\nx = 1", new_string="# kept\nx = 1") == "ok"
    assert (os_tools.root / "mixed.txt").read_bytes() == mixed.replace(b"# copy", b"# kept")


def test_edit_a_10_mb_file(fast_tools):
    body = b"0123456789abcdef" * (10 * 2**20 // 16)
    (fast_tools.root / "big").write_bytes(body[:5_000_000] + b"NEEDLE" + body[5_000_000:])
    assert fast_tools("edit", path="big", old_string="NEEDLE", new_string="pin") == "ok"
    assert (fast_tools.root / "big").read_bytes() == body[:5_000_000] + b"pin" + body[5_000_000:]


# ---------------------------------------------------------------- bash, glob, grep


def test_bash_with_cwd_and_env(os_tools):
    (os_tools.root / "sub").mkdir()
    out = json.loads(os_tools("bash", command='echo "$GREETING"; pwd; echo oops >&2; exit 3', cwd="sub",
                              env={"GREETING": "hi there"}))
    assert out == {"exit_code": 3, "stderr": "oops\n", "stdout": f"hi there\n{os_tools.root / 'sub'}\n"}
    assert json.loads(os_tools("bash", command="pwd"))["stdout"] == f"{os_tools.root}\n"


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_a_command_ends_before_the_invocations_deadline(kind, elf, tmp_path):
    """A guest blocked in a host call cannot be interrupted: the command got its own 30 s whatever the
    invocation's deadline, and a 3 s invocation ran for 30 s, holding its worker. It is now killed in time for the
    guest to report it (a fifth of what was left is kept for that)."""
    run = harness(kind, elf, linker(tmp_path), "os")
    start = time.monotonic()
    text = ends_within(3 + GRACE, lambda: run.call("bash", json.dumps({"command": "sleep 30"}),
                                                   deadline=start + 3))
    out = json.loads(text)
    killed = re.fullmatch(r"\[killed: the command ran past its ([\d.]+) s timeout\]", out["stderr"])
    assert out["exit_code"] == -1 and killed and 0 < float(killed[1]) <= 0.8 * 3  # a fifth of what was left kept


def test_bash_output_the_host_bounded_reaches_the_caller_whole(fast_tools):
    """The host keeps 1 MiB of each stream and marks the rest; the harness's own 256 KiB buffer turned anything
    larger into a failure — the command had run, its exit code and output were lost."""
    out = json.loads(fast_tools("bash", command="echo ran > marker; head -c 300000 /dev/zero | tr '\\0' x; exit 3"))
    assert out["exit_code"] == 3 and out["stdout"] == "x" * 300_000
    big = json.loads(fast_tools("bash", command="head -c 1100000 /dev/zero | tr '\\0' y"))
    assert big["stdout"].startswith("y" * 1000) and "[truncated: 1100000 bytes in all" in big["stdout"]


def test_glob_newest_first(os_tools):
    (os_tools.root / "d").mkdir()
    for i, name in enumerate(["old.py", "d/mid.py", "new.py", "skip.txt"]):
        (os_tools.root / name).write_text("")
        os.utime(os_tools.root / name, (1_000_000 + i, 1_000_000 + i))
    assert os_tools("glob", pattern="**/*.py") == "new.py\nd/mid.py\nold.py"
    assert os_tools("glob", pattern="*.py", path="d") == "d/mid.py"
    assert os_tools("glob", pattern="*.none") == "no matches"


def test_grep_modes(os_tools):
    (os_tools.root / "a.py").write_text("x = 1\ny = 2\nx += 1\n")
    (os_tools.root / "b.txt").write_text("x\n")
    assert set(os_tools("grep", pattern="x").split("\n")) == {"a.py", "b.txt"}
    assert os_tools("grep", pattern="^x", include="*.py", mode="content") == "a.py:1:x = 1\na.py:3:x += 1"
    assert os_tools("grep", pattern="x", path="a.py", mode="count") == "a.py:2"
    assert os_tools("grep", pattern="zzz") == "no matches"
    assert os_tools.fails("grep", pattern="x", mode="lines") == \
        "invalid arguments: 'mode' must be one of files, content, count, not 'lines'"


# ---------------------------------------------------------------- arguments and grants


@pytest.mark.parametrize("tool, args, message", [
    ("read", b"[1]", "invalid arguments: expected a JSON object, not array"),
    ("read", b"{", "invalid arguments: not JSON: unterminated object at byte 1"),
    ("read", b"", "invalid arguments: missing required field 'path'"),
    ("read", b'{"path":"a","limit":"5"}', "invalid arguments: 'limit' must be an integer, not string"),
    ("read", b'{"path":"a","offset":-1}', "invalid arguments: 'offset' must be between 0 and 9223372036854775807, not -1"),
    ("read", b'{"path":"a","offset":1e99}', "invalid arguments: 'offset' must be an integer between 0 and 9223372036854775807, not 1e99"),
    ("read", b'{"path":"a","offset":99999999999999999999}', "invalid arguments: 'offset' must be an integer between 0 and 9223372036854775807, not 99999999999999999999"),
    ("read", b'{"path":"a","offset":1.5}', "invalid arguments: 'offset' must be an integer between 0 and 9223372036854775807, not 1.5"),
    ("read", b'{"path":"a","offset":-2.0e0}', "invalid arguments: 'offset' must be between 0 and 9223372036854775807, not -2"),
    ("read", b'{"path":"a","offset":9223372036854775808.0}', "invalid arguments: 'offset' must be an integer between 0 and 9223372036854775807, not 9223372036854775808.0"),
    ("read", b'{"path":""}', "invalid arguments: 'path' must not be empty"),
    ("read", b'{"path":"a","colour":1}', "invalid arguments: unknown field 'colour' (expected: path, offset, limit)"),
    ("write", b'{"path":"a"}', "invalid arguments: missing required field 'content'"),
    ("edit", b'{"path":"a","old_string":null,"new_string":""}', "invalid arguments: 'old_string' must be a string, not null"),
    ("bash", b'{"command":"ls","env":{"A":1}}', "invalid arguments: 'env.A' must be a string, not integer"),
    ("bash", b'{"command":"ls","env":["A"]}', "invalid arguments: 'env' must be an object of strings, not array"),
    ("glob", b'{"pattern":true}', "invalid arguments: 'pattern' must be a string, not boolean"),
    # found by a review: a long name or value was cut mid-character, which the host showed as U+FFFD
    ("read", ('{"path":"a","' + "\u20ac" * 22 + '":1}').encode(),
     "invalid arguments: unknown field '" + "\u20ac" * 21 + "' (expected: path, offset, limit)"),
    ("grep", ('{"pattern":"a","mode":"' + "\u20ac" * 14 + '"}').encode(),
     "invalid arguments: 'mode' must be one of files, content, count, not '" + "\u20ac" * 13 + "'"),
])
def test_invalid_arguments_are_tool_failures(os_tools, tool, args, message):
    with pytest.raises(ToolFailure) as info:
        os_tools.engine.call(tool, args)
    assert info.value.message == message


@pytest.mark.parametrize("offset", ["2.0", "2e0", "0.2e1", "20e-1", "2.000", "200e-2", "0.000002e6",
                                    "2." + "0" * 30, "2" + "0" * 30 + "e-30", "0.0000000000000000000000000002e28"])
def test_whole_numbers_written_as_decimals_are_integers(os_tools, offset):
    """JSON Schema's "integer" takes any number with no fraction: the SDK refused 2.0 and 2e0, and (found by a
    review) any with more than 24 digits from its first significant one, zeros included."""
    (os_tools.root / "n.txt").write_text("one\ntwo\nthree\n")
    out = os_tools.engine.call("read", f'{{"path":"n.txt","offset":{offset},"limit":1}}'.encode())
    assert out.startswith("2\ttwo\n")


@pytest.mark.parametrize("grants, tool, args, missing", [
    (("exec",), "read", {"path": "a"}, "berm.fs.read"),
    (("exec",), "grep", {"pattern": "a"}, "berm.fs.grep"),
    (("exec",), "glob", {"pattern": "*"}, "berm.fs.glob"),
    (("exec",), "write", {"path": "a", "content": ""}, "berm.fs.write"),
    (("exec",), "edit", {"path": "a", "old_string": "x", "new_string": "y"}, "berm.fs.read"),
    (("fs",), "bash", {"command": "true"}, "berm.exec.run"),
])
@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_each_capability_is_absent_without_its_grant(elf, tmp_path, kind, grants, tool, args, missing):
    with pytest.raises(Trap) as info:
        harness(kind, elf, linker(tmp_path, grants)).call(tool, json.dumps(args))
    assert info.value.kind is TrapKind.UNKNOWN_HOST_CALL
    assert f"{missing}, not granted to this harness" in str(info.value)


# ---------------------------------------------------------------- fuzzing the arguments

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
field_names = st.sampled_from(["path", "offset", "limit", "content", "old_string", "new_string", "command", "cwd",
                               "env", "pattern", "include", "mode", "x"])
tool_like = st.dictionaries(field_names, json_values, max_size=4)


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def fuzz_harness(request, elf, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-root")
    (root / "a").write_text("a\nb\n")
    # Commands find nothing on this PATH: only bash builtins run.
    return harness(request.param, elf, linker(root, env=[("PATH", "/nonexistent")]), "os")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(TOOLS), st.one_of(json_values.map(json.dumps), tool_like.map(json.dumps)).map(str.encode)
       | st.binary(max_size=40))
def test_any_arguments_end_in_a_result_or_a_tool_failure(fuzz_harness, tool, args):
    try:
        fuzz_harness.call(tool, args)  # a Trap or HostError escapes and fails the test
    except ToolFailure:
        pass


def test_every_tool_of_the_manifest_is_fuzzed():
    assert [t.name for t in load_harness_toml(OS_DIR / "harness.toml").tools] == TOOLS
