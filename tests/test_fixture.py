"""The fixture harness's four tools, built by `berm build`, on both engines and natively."""

from __future__ import annotations

from pathlib import Path

import pytest

from berm_aot.elf import read_elf
from berm_aot.manifest import load_manifest
from berm_host.backend import RunRequest
from berm_host.traps import ToolFailure
from berm_sdk.build import build_harness
from berm_sdk.native import NativeHarness, build_native_library
from tests.sdk_engines import ENGINE_KINDS, NativeText, engine, harness

FIXTURE = Path(__file__).resolve().parent.parent / "harnesses" / "fixture"


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    return build_harness(FIXTURE, tmp_path_factory.mktemp("fixture") / "fixture.elf").read_bytes()


@pytest.fixture(scope="module", params=[*ENGINE_KINDS, "native"])
def tools(request, elf, tmp_path_factory):
    if request.param == "native":
        out = tmp_path_factory.mktemp("fixture-native") / "fixture.so"
        return NativeText(NativeHarness(build_native_library(sorted(FIXTURE.glob("*.c")), out)))
    return harness(request.param, elf, name="fixture")


def test_manifest_lists_the_four_tools(elf):
    manifest = load_manifest(read_elf(elf))
    assert [t.name for t in manifest.tools] == ["echo", "chatty", "probe", "boom"]
    assert manifest.usage.startswith("A conformance fixture")


@pytest.mark.parametrize("args, expected", [
    ('{"a":[1,"x"]}', '{"echo":{"a":[1,"x"]}}'),
    ("", '{"echo":null}'),
    ('"\u00e9\U0001F600"', '{"echo":"\u00e9\U0001F600"}'),
])
def test_echo(tools, args, expected):
    assert tools.call("echo", args) == expected


def test_echo_of_large_arguments(tools):
    args = '"' + "x" * 200_000 + '"'
    assert tools.call("echo", args) == '{"echo":' + args + "}"


def test_chatty_returns_the_argument_length(tools):
    assert tools.call("chatty", "12345") == "5"
    assert tools.call("chatty") == "0"


def test_probe_allocates_and_returns_from_the_heap(tools):
    assert tools.call("probe") == "[7,7]"


def test_boom_fails_as_requested(tools):
    with pytest.raises(ToolFailure, match="^boom, as requested$"):
        tools.call("boom")


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_probe_result_lies_in_the_heap(elf, kind):
    image = engine(kind).load(elf)
    result = image.backend.run(RunRequest(entry=image.program.symbol("berm_tool_probe"), read_result=True))
    assert result.result == b"[7,7]"
    assert result.a0 >= max(seg.end for seg in image.program.image.segments)
