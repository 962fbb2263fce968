"""harness.toml → the compact .berm.abi manifest, and the errors that name the file and line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from berm_aot.manifest import parse_manifest
from berm_sdk.entry import entry_source
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import MAX_TOML_BYTES, load_harness_toml
from tests.bounded import GRACE, ends_within

KNOWN = '''\
name = "demo"
usage = "Tools for a d\u00e9mo."
requests = { capabilities = ["fs", "exec"], hosts = ["api.example.com"] }

[[tools]]
name = "echo"
description = "Returns its arguments."
parameters = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }

[[tools]]
name = "ping"
description = "Pong."
'''


def write(tmp_path, text: str):
    path = tmp_path / "harness.toml"
    path.write_text(text)
    return path


def test_manifest_bytes_of_a_known_harness_toml(tmp_path):
    spec = load_harness_toml(write(tmp_path, KNOWN))
    assert spec.manifest_bytes() == (
        '{"abi_version":0,"tools":[{"name":"echo","description":"Returns its arguments.","parameters":'
        '{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},'
        '{"name":"ping","description":"Pong.","parameters":{"type":"object","properties":{}}}],'
        '"usage":"Tools for a d\u00e9mo.","requests":{"capabilities":["fs","exec"],"hosts":["api.example.com"]}}'
    ).encode("utf-8")
    manifest = parse_manifest(spec.manifest_bytes())
    assert [t.name for t in manifest.tools] == ["echo", "ping"]


def test_usage_defaults_to_empty_and_requests_are_optional(tmp_path):
    spec = load_harness_toml(write(tmp_path, 'name = "x"\n[[tools]]\nname = "t"\ndescription = ""\n'))
    assert json.loads(spec.manifest_bytes()) == {
        "abi_version": 0, "usage": "",
        "tools": [{"name": "t", "description": "", "parameters": {"type": "object", "properties": {}}}]}


def test_entry_anchors_the_manifest_and_every_tool(tmp_path):
    source = entry_source(load_harness_toml(write(tmp_path, KNOWN)))
    assert 'section(".berm.abi")' in source
    assert '"r"(berm_tool_echo)' in source and '"r"(berm_tool_ping)' in source


@pytest.mark.parametrize("text, message", [
    ('name = "x"\n[[tools]\nname = "t"\n', r"harness.toml: .*\(at line 2, column 8\)"),
    ('name = "x"\nusage = 3\n[[tools]]\nname = "t"\ndescription = ""\n', r"harness.toml:2: usage must be a string"),
    ('name = "a b"\n[[tools]]\nname = "t"\ndescription = ""\n', r"harness.toml:1: name must be"),
    ('name = "x"\n', r"harness.toml: declare at least one tool"),
    ('usage = "u"\n[[tools]]\nname = "t"\n', r"harness.toml: name is missing"),  # it said "not None"
    ('name = "x"\n[[tools]]\ndescription = ""\n', r"harness.toml:2: tools\[0\] has no name"),
    ('name = "x"\n\n[[tools]]\nname = "t"\n', r"harness.toml:4: tool 't': description must be a string"),
    ('name = "x"\n[[tools]]\nname = "bad-name"\n', r"harness.toml:2: tools\[0\].name must be"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\n[[tools]]\nname = "t"\ndescription = ""\n',
     r"harness.toml:6: tool 't' is declared twice"),
    # found by a review: a harness named like its tool gave its own line as the tool's
    ('name = "t"\n[[tools]]\nname = "t"\ndescription = ""\n[[tools]]\nname = "t"\ndescription = ""\n',
     r"harness.toml:6: tool 't' is declared twice"),
    ('name = "t"\n\n[[tools]]\nname = "t"\n', r"harness.toml:4: tool 't': description must be a string"),
    # found by a review: a date said only "a tool's parameters cannot be written as JSON", with no tool or line
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = {type = "object", default = 1979-05-27}\n',
     r"harness.toml:5: tool 't': parameters hold a value JSON has no form for \(a TOML date"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = {type = "object", maximum = inf}\n',
     r"harness.toml:5: tool 't': parameters hold a value JSON has no form for"),
    # found by a review: tools as an inline array were searched for from line 1, which found the harness's name
    ('name = "t"\ntools = [{name = "t", description = 1}]\n', r"harness.toml:2: tool 't': description must be"),
    ('name = "t"\ntools = [\n  {name = "a", description = ""}, {name = "t"},\n]\n',
     r"harness.toml:3: tool 't': description must be"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparams = {}\n', r"harness.toml:5: tool 't': unknown key 'params'"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = "object"\n',
     r"harness.toml:5: tool 't': parameters must be a table"),
    ('name = "x"\ntool = 1\n', r"harness.toml:2: unknown key 'tool'"),
    # found by a review: a key after blank lines was placed at the first of them (the pattern's \s* ran across them)
    ('name = "x"\n\n\ntool = 1\n', r"harness.toml:4: unknown key 'tool'"),
    ('name = "x"\n\n \n\t[requests]\ncapabilities = ["teleport"]\n[[tools]]\nname = "t"\ndescription = ""\n',
     r"harness.toml:4: requests.capabilities: unknown capability 'teleport'"),
    ('name = "x"\nrequests = { capabilities = ["teleport"] }\n[[tools]]\nname = "t"\ndescription = ""\n',
     r"harness.toml:2: requests.capabilities: unknown capability 'teleport'"),
    # a newcomer's walkthrough: a typo in the schema reached the manifest without a word
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = { type = "object", properties = '
     '{ name = { type = "strin" } } }\n', r"harness.toml:5: tool 't': parameters are not a JSON Schema: 'strin' is "
     r"not valid under any of the given schemas \(at properties/name/type\)"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = { type = "object", required = "name" }\n',
     r"harness.toml:5: tool 't': parameters are not a JSON Schema: 'name' is not of type 'array' \(at required\)"),
])
def test_errors_name_file_and_line(tmp_path, text, message):
    with pytest.raises(BuildError, match=message):
        load_harness_toml(write(tmp_path, text)).manifest_bytes()


def test_a_harness_toml_that_is_not_utf8_is_placed_at_its_line(tmp_path):
    """Found by a review: the error gave the byte's position in the file, not its line."""
    path = tmp_path / "harness.toml"
    path.write_bytes(b'name = "x"\n[[tools]]\nname = "t"\ndescription = "caf\xe9"\n')
    with pytest.raises(BuildError, match=r"harness.toml:4: not UTF-8 \(byte 19 of the line\)$"):
        load_harness_toml(path)


def test_missing_harness_toml(tmp_path):
    with pytest.raises(BuildError, match="no such file"):
        load_harness_toml(tmp_path / "harness.toml")


@pytest.mark.parametrize("make", [lambda p: os.mkfifo(p), lambda p: p.symlink_to("/dev/zero"),
                                  lambda p: p.write_bytes(b"#" * (MAX_TOML_BYTES + 1))],
                         ids=["fifo", "dev-zero", "too-large"])
def test_a_harness_toml_is_a_regular_file_of_bounded_size(tmp_path, make):
    """Found by a review: a harness.toml that is a FIFO, or a link to /dev/zero, kept berm build waiting for
    ever."""
    make(tmp_path / "harness.toml")
    with pytest.raises(BuildError, match="harness.toml (is not a regular file|is [0-9]+ bytes, over 4 MiB)"):
        ends_within(GRACE, lambda: load_harness_toml(tmp_path / "harness.toml"))


def test_a_harness_toml_nested_too_deeply_is_a_build_error(tmp_path):
    """tomllib parses nested arrays recursively: a deep one was a RecursionError traceback from berm build."""
    with pytest.raises(BuildError, match="nested too deeply"):
        load_harness_toml(write(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n"))


#: Loads a harness.toml in a child process, printing its tools' lines or the error.
_LOAD = """
import sys
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import load_harness_toml
try:
    print([t.line for t in load_harness_toml(sys.argv[1]).tools])
except BuildError as exc:
    print(exc)
"""


def _loaded_in_a_child(path) -> str:
    """What ``_LOAD`` says of ``path``, from a child process killed after GRACE seconds: a regular expression holds
    the GIL through its whole search, so no bound kept in this process could end one (``ends_within`` waits on it)."""
    try:
        said = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True,
                              timeout=GRACE, cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} was still running after {GRACE} s")
    assert said.returncode == 0, said.stderr
    return said.stdout.strip()


def test_a_harness_toml_of_many_blank_lines_loads_and_places_its_errors(tmp_path):
    """Found by a review: the patterns that place an error searched the whole text from every line's start with
    ``^\\s*``, whose ``\\s*`` ran across newlines: cubic in a file of blank lines (8,000 of them kept berm build
    busy over a minute)."""
    blank = "\n" * 20_000 + " \t" * 10_000  # KNOWN starts on line 20,001, after a line's worth of blanks
    assert _loaded_in_a_child(write(tmp_path, blank + KNOWN)) == "[20006, 20011]"
    for text, message in [
        (KNOWN.replace('"exec"', '"teleport"'), "harness.toml:20003: requests.capabilities: unknown capability"),
        (KNOWN.replace("usage =", "bogus = 1\nusage ="), "harness.toml:20002: unknown key 'bogus'"),
        (KNOWN.replace('"echo"', '"two words"'), "harness.toml:20005: tools[0].name must be"),
    ]:
        assert message in _loaded_in_a_child(write(tmp_path, blank + text))
