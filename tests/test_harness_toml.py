"""harness.toml: what berm build refuses before compiling, at the line to change (berm_sdk/harness_toml.py). The
manifest it renders and the errors of its shape are in test_sdk_manifest.py."""

from __future__ import annotations

import pytest

from berm_aot.elf import MAX_MANIFEST_BYTES
from berm_aot.manifest import parse_manifest
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import MAX_PARAMETERS_NESTING, load_harness_toml
from berm_sdk.schemas import schema_problem


def _load(tmp_path, text: str):
    (tmp_path / "harness.toml").write_text(text)
    return load_harness_toml(tmp_path / "harness.toml")


def _nested_not(depth: int) -> str:
    """A harness.toml whose one tool's parameters nest ``depth`` deep: ``{type, properties = {p = {not = …}}}``."""
    inner = "{}"
    for _ in range(depth - 3):
        inner = "{not=" + inner + "}"
    return f'name = "x"\n\n[[tools]]\nname = "t"\ndescription = "d"\nparameters = {{type = "object", ' \
           f'properties = {{p = {inner}}}}}\n'


@pytest.mark.parametrize("depth", [MAX_PARAMETERS_NESTING + 1, 203])
def test_parameters_nested_deeper_than_a_host_reads_are_refused_at_their_line(tmp_path, depth):
    """Found by a review: parameters nested 203 deep were a RecursionError traceback out of jsonschema; 101 deep
    were taken, and the image was refused by its own check after compiling, without a line."""
    with pytest.raises(BuildError, match=rf"harness.toml:6: tool 't': parameters nest {depth} deep; at most "
                                         rf"{MAX_PARAMETERS_NESTING} "):
        _load(tmp_path, _nested_not(depth))


def test_the_deepest_parameters_taken_make_a_manifest_the_host_reads(tmp_path):
    spec = _load(tmp_path, _nested_not(MAX_PARAMETERS_NESTING))
    assert parse_manifest(spec.manifest_bytes()).tools[0].name == "t"


def test_a_schema_too_deep_for_the_checker_is_a_problem_not_a_traceback():
    schema: dict = {}
    for _ in range(2000):
        schema = {"not": schema}
    assert schema_problem(schema) == "it nests too deeply to be checked"


def test_a_manifest_larger_than_a_host_reads_is_refused_at_its_largest_part(tmp_path):
    """Found by a review: a 1.1 MB description was taken, and the image refused by its own check after compiling."""
    text = 'name = "x"\nusage = "{}"\n\n[[tools]]\nname = "t"\ndescription = "{}"\n'
    rest = len('{"abi_version":0,"tools":[{"name":"t","description":"","parameters":{"type":"object","properties":{}}}]'
               ',"usage":"u"}')
    with pytest.raises(BuildError, match=rf"harness.toml:6: the manifest would be {MAX_MANIFEST_BYTES + 1} bytes, "
                                         rf"over the {MAX_MANIFEST_BYTES} a host reads \(the description of tool 't' is "):
        _load(tmp_path, text.format("u", "d" * (MAX_MANIFEST_BYTES + 1 - rest)))
    with pytest.raises(BuildError, match=r"harness.toml:2: the manifest would be .* \(usage is the largest part\)"):
        _load(tmp_path, text.format("u" * MAX_MANIFEST_BYTES, "d"))
    most = _load(tmp_path, text.format("u", "d" * (MAX_MANIFEST_BYTES - rest))).manifest_bytes()
    assert len(most) == MAX_MANIFEST_BYTES and parse_manifest(most).tools[0].name == "t"  # the most a host reads


TOOL = '\n[[tools]]\nname = "t"\ndescription = "d"\n'


@pytest.mark.parametrize("text, message", [
    ('name = "x"\nrequests = { hosts = [""] }\n' + TOOL, "harness.toml:2: requests.hosts: bad host entry ''"),
    ('name = "x"\nrequests = { hosts = ["http://a b/"] }\n' + TOOL,
     "harness.toml:2: requests.hosts: bad host entry 'http://a b/'"),
    ('name = "x"\n\n[requests]\nhosts = ["api.example.com", "*"]\n' + TOOL,
     "harness.toml:3: requests.hosts: bad host entry '*'"),
    ('name = "x"\nrequests = { capabilities = ["fs", "exec", "fs"] }\n' + TOOL,
     "harness.toml:2: requests.capabilities names 'fs' twice"),
    ('name = "x"\n' + TOOL + 'parameters = { type = "string" }\n',
     "harness.toml:6: tool 't': parameters must be a schema of type = \"object\""),
    ('name = "x"\n' + TOOL + 'parameters = {}\n', "harness.toml:6: tool 't': parameters must be a schema of type"),
])
def test_what_no_host_or_sdk_could_use_is_refused_at_its_line(tmp_path, text, message):
    """Found by a review: hosts a declaration's host list refuses, a capability named twice, and parameters that
    are no object schema (a tool's arguments are an object) were all taken without a word."""
    with pytest.raises(BuildError) as refused:
        _load(tmp_path, text)
    assert message in str(refused.value)


def test_requests_a_declaration_could_grant_are_taken(tmp_path):
    spec = _load(tmp_path, 'name = "x"\nrequests = { capabilities = ["fs", "http"], hosts = ["api.example.com", '
                           '"*.example.org", "10.0.0.1"] }\n' + TOOL)
    assert spec.requests == {"capabilities": ["fs", "http"], "hosts": ["api.example.com", "*.example.org", "10.0.0.1"]}


@pytest.mark.parametrize("second, message", [
    ('description = "d"\n', "harness.toml:7: tools[1] has no name"),
    ('name = "b-c"\ndescription = "d"\n', "harness.toml:7: tools[1].name must be"),
    ('name = 3\n', "harness.toml:7: tools[1].name must be"),
])
def test_a_later_tool_without_a_usable_name_is_placed_at_its_header(tmp_path, second, message):
    """Found by a review: only the first tool's were given a line."""
    with pytest.raises(BuildError) as refused:
        _load(tmp_path, 'name = "x"\n\n[[tools]]\nname = "a"\ndescription = "d"\n\n[[tools]]\n' + second)
    assert message in str(refused.value)
