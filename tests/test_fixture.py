"""The fixture harness's four tools, built by `berm build`, run on the reference interpreter and natively."""

from __future__ import annotations

from pathlib import Path

import pytest

from berm_aot.elf import read_elf
from berm_aot.manifest import load_manifest
from berm_host.traps import ToolFailure
from berm_sdk.build import build_harness
from berm_sdk.native import NativeHarness, build_native_library
from tests.sdk_engines import Interp

FIXTURE = Path(__file__).resolve().parent.parent / "harnesses" / "fixture"


@pytest.fixture(scope="module")
def elf(tmp_path_factory):
    return build_harness(FIXTURE, tmp_path_factory.mktemp("fixture") / "fixture.elf").read_bytes()


@pytest.fixture(scope="module")
def image(elf):
    return read_elf(elf)


@pytest.fixture(scope="module", params=["interp", "native"])
def engine(request, elf, tmp_path_factory):
    if request.param == "interp":
        return Interp(elf)
    out = tmp_path_factory.mktemp("fixture-native") / "fixture.so"
    return NativeHarness(build_native_library(sorted(FIXTURE.glob("*.c")), out))


def test_manifest_lists_the_four_tools(image):
    manifest = load_manifest(image)
    assert [t.name for t in manifest.tools] == ["echo", "chatty", "probe", "boom"]
    assert manifest.usage.startswith("A conformance fixture")


@pytest.mark.parametrize("args, expected", [
    (b'{"a":[1,"x"]}', b'{"echo":{"a":[1,"x"]}}'),
    (b"", b'{"echo":null}'),
    ("\"\u00e9\U0001F600\"".encode(), "{\"echo\":\"\u00e9\U0001F600\"}".encode()),
])
def test_echo(engine, args, expected):
    assert engine.call("echo", args) == expected


def test_echo_of_large_arguments(engine):
    args = b'"' + b"x" * 200_000 + b'"'
    assert engine.call("echo", args) == b'{"echo":' + args + b"}"


def test_chatty_returns_the_argument_length(engine):
    assert engine.call("chatty", b"12345") == b"5"
    assert engine.call("chatty") == b"0"


def test_probe_allocates_and_returns_from_the_heap(engine):
    assert engine.call("probe") == b"[7,7]"


def test_boom_fails_as_requested(engine):
    with pytest.raises(ToolFailure, match="^boom, as requested$"):
        engine.call("boom")


def test_probe_result_lies_in_the_heap(elf, image):
    result = Interp(elf).run("probe")
    assert result.a0 >= max(seg.end for seg in image.segments) and result.a1 == 5
