"""harness.toml → the compact .berm.abi manifest, and the errors that name the file and line."""

from __future__ import annotations

import json

import pytest

from berm_aot.manifest import parse_manifest
from berm_sdk.entry import entry_source
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import load_harness_toml

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
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparams = {}\n', r"harness.toml:3: tool 't': unknown key 'params'"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = "object"\n',
     r"harness.toml:3: tool 't': parameters must be a table"),
    ('name = "x"\ntool = 1\n', r"harness.toml:2: unknown key 'tool'"),
    ('name = "x"\nrequests = { capabilities = ["teleport"] }\n[[tools]]\nname = "t"\ndescription = ""\n',
     r"harness.toml:2: requests.capabilities: unknown capability 'teleport'"),
    ('name = "x"\n[[tools]]\nname = "t"\ndescription = ""\nparameters = { default = 1979-05-27 }\n',
     r"harness.toml: a tool's parameters cannot be written as JSON"),
])
def test_errors_name_file_and_line(tmp_path, text, message):
    with pytest.raises(BuildError, match=message):
        load_harness_toml(write(tmp_path, text)).manifest_bytes()


def test_missing_harness_toml(tmp_path):
    with pytest.raises(BuildError, match="no such file"):
        load_harness_toml(tmp_path / "harness.toml")


def test_a_harness_toml_nested_too_deeply_is_a_build_error(tmp_path):
    """tomllib parses nested arrays recursively: a deep one was a RecursionError traceback from berm build."""
    with pytest.raises(BuildError, match="nested too deeply"):
        load_harness_toml(write(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n"))
