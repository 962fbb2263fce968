"""berm_aot.manifest: parsing the .berm.abi JSON, and checking it against the image's exports (ABI.md §4)."""

from __future__ import annotations

import json
import re
import struct
import sys

import pytest

from berm_aot.elf import read_elf
from berm_aot.errors import (AbiVersionError, ManifestEncodingError, ManifestError, ManifestJsonError,
                             MissingExportError, NoManifestError)
from berm_abi.json_objects import MAX_INT_DIGITS
from berm_aot.manifest import MAX_NESTING, ToolSpec, lifecycle_exports, load_manifest, parse_manifest, tool_exports
from berm_cli.main import main as berm_main
from berm_host.engine import Engine
from tests.elf_samples import ASM_PRELUDE, SHDR_FIELDS, field, harness_elf, manifest_json, patched, shdr_offsets
from tests.bounded import ends_within
from tests.children import on_a_small_stack, run_python
from tests.guests import guest_elf


def _load(manifest, tools):
    return load_manifest(read_elf(harness_elf(manifest, tools)))


def test_valid_manifest_round_trip():
    m = _load(manifest_json(["read", "write"], capabilities=["fs"], hosts=["example.com"], extra={"x": 1}),
              ["read", "write"])
    assert m.abi_version == 0
    assert [t.name for t in m.tools] == ["read", "write"]
    assert m.tools[0] == ToolSpec("read", "the read tool",
                                  {"type": "object", "properties": {"x": {"type": "string"}}})
    assert m.tool("write").description == "the write tool" and m.tool("nope") is None
    assert m.usage == "Call the tools."
    assert m.requests == {"capabilities": ["fs"], "hosts": ["example.com"]}
    assert m.raw["extra"] == {"x": 1}


def test_tool_exports_are_global_functions_by_name():
    image = read_elf(harness_elf(manifest_json(["alpha"]), ["alpha", "beta_2"]))
    exports = tool_exports(image)
    assert set(exports) == {"alpha", "beta_2"}
    funcs = {s.name: s.value for s in image.symbols if s.kind == "func"}
    assert exports["alpha"] == funcs["berm_tool_alpha"]


def test_requests_may_sit_in_a_requests_object():
    m = parse_manifest(json.dumps({"abi_version": 0, "tools": [],
                                   "requests": {"capabilities": ["exec"], "hosts": ["h.example"]}}).encode())
    assert m.requests == {"capabilities": ["exec"], "hosts": ["h.example"]}


def test_requests_in_both_places_are_both_kept():
    """Found by a review: the nested list replaced the top-level one, so berm inspect hid requests."""
    m = parse_manifest(json.dumps({"abi_version": 0, "tools": [], "capabilities": ["exec", "fs"],
                                   "requests": {"capabilities": ["clock", "fs"]}}).encode())
    assert m.requests == {"capabilities": ["exec", "fs", "clock"]}


@pytest.mark.parametrize("value, words", [
    (b"NaN", "NaN, Infinity"), (b"-Infinity", "NaN, Infinity"), (b"1e999", "NaN, Infinity"),
    (b'"hi \\ud800 there"', "lone surrogate"),
])
def test_what_python_reads_but_json_cannot_say_is_refused(value, words):
    """Found by a review: Python's parser takes NaN, Infinity (1e999 too, read as infinity) and escaped lone
    surrogates, which are no JSON text and no Unicode: berm inspect --json printed NaN, and a surrogate made
    berm inspect a traceback."""
    doc = b'{"abi_version": 0, "tools": [{"name": "t", "parameters": {"default": ' + value + b'}}]}'
    with pytest.raises(ManifestJsonError, match=f"not valid JSON: it holds (a )?{words}"):
        parse_manifest(doc)
    with pytest.raises(ManifestJsonError, match="lone surrogate"):
        parse_manifest(b'{"abi_version": 0, "tools": [], "usage": "use \\udcff", "\\ud800": 1}')


@pytest.mark.parametrize("doc, key", [
    (b'{"abi_version": 0, "tools": [{"name": "safe"}], "tools": [{"name": "wipe"}]}', "tools"),
    (b'{"abi_version": 0, "tools": [{"name": "wipe", "description": "x", "name": "safe"}]}', "name"),
    (b'{"abi_version": 0, "tools": [], "requests": {"hosts": ["a.example"], "hosts": ["b.example"]}}', "hosts"),
])
def test_a_key_named_twice_in_an_object_is_refused(doc, key):
    """Found by a review: the last of two keys won, so a manifest with two "tools" (or a tool with two "name"s)
    read as whichever came last, while another reader may take the first."""
    with pytest.raises(ManifestJsonError, match=f"the manifest names the key '{key}' twice in one object"):
        parse_manifest(doc)
    assert parse_manifest(b'{"abi_version": 0, "tools": [{"name": "a"}, {"name": "b"}]}').tools[1].name == "b"


def test_a_trailing_nul_is_ignored_and_usage_defaults_to_empty():
    m = parse_manifest(json.dumps({"abi_version": 0, "tools": []}).encode() + b"\0\0")
    assert m.usage == "" and m.tools == () and m.requests == {}


def test_exported_tool_not_in_the_manifest_is_allowed():
    assert [t.name for t in _load(manifest_json(["a"]), ["a", "b"]).tools] == ["a"]


def test_no_manifest_section():
    with pytest.raises(NoManifestError, match="no .berm.abi section"):
        _load(None, ["a"])


def test_manifest_not_utf8():
    with pytest.raises(ManifestEncodingError, match="not UTF-8"):
        _load(b'{"abi_version": 0, "usage": "\xff\xfe"}', ["a"])


def test_manifest_not_json():
    with pytest.raises(ManifestJsonError, match="not valid JSON"):
        _load(b'{"abi_version": 0, "tools": [', ["a"])


def test_wrong_abi_version():
    with pytest.raises(AbiVersionError, match="harness was built against ABI version 3, this host speaks 0"):
        _load(manifest_json(["a"], abi_version=3), ["a"])
    with pytest.raises(AbiVersionError, match="built against ABI version -1, this host speaks 0"):  # older is no match either
        _load(manifest_json(["a"], abi_version=-1), ["a"])


def test_declared_tool_not_exported():
    with pytest.raises(MissingExportError, match="'b'.*berm_tool_b"):
        _load(manifest_json(["a", "b"]), ["a"])


#: Symbols named like exports that are not global functions defined in the image: a local one, a weak one, an
#: undefined weak function (made global by a patch: a linker refuses to leave one), a global label that is no
#: function, and a name that cannot be a tool; only ``berm_tool_good`` (and no lifecycle) counts.
NOT_EXPORTS_SOURCE = ASM_PRELUDE + r"""
    la t0, berm_tool_undef
    ret
    .globl berm_tool_good
    .type berm_tool_good, @function
berm_tool_good:
    ret
    .type berm_tool_local, @function
berm_tool_local:
    ret
    .weak berm_tool_weak
    .type berm_tool_weak, @function
berm_tool_weak:
    ret
    .globl "berm_tool_a.b"
    .type "berm_tool_a.b", @function
"berm_tool_a.b":
    ret
    .type on_wake, @function
on_wake:
    ret
    .weak on_notify
    .type on_notify, @function
on_notify:
    ret
    .globl berm_tool_label
berm_tool_label:
    ret
    .weak berm_tool_undef
    .type berm_tool_undef, @function
"""


def _global_undefined(data: bytes, name: bytes) -> bytes:
    """``data`` with the symbol ``name``'s binding set to GLOBAL (st_info's high nibble)."""
    symtab, strtab = (shdr_offsets(data)[n] for n in (".symtab", ".strtab"))
    at, size = (field(data, symtab, SHDR_FIELDS, k) for k in ("sh_offset", "sh_size"))
    names_at = field(data, strtab, SHDR_FIELDS, "sh_offset")
    for entry in range(at, at + size, 24):
        st_name = struct.unpack_from("<I", data, entry)[0]
        if data[names_at + st_name:data.index(b"\0", names_at + st_name)] == name:
            return patched(data, entry + 4, "<B", (1 << 4) | (data[entry + 4] & 0xF))
    raise AssertionError(name)


def test_only_global_defined_functions_with_tool_names_are_exports():
    image = read_elf(_global_undefined(guest_elf(NOT_EXPORTS_SOURCE, suffix=".S"), b"berm_tool_undef"))
    names = {s.name: (s.kind, s.binding, s.section is not None) for s in image.symbols}
    assert names["berm_tool_local"] == ("func", "local", True) and names["berm_tool_weak"] == ("func", "weak", True)
    assert names["berm_tool_undef"] == ("func", "global", False) and names["berm_tool_a.b"] == ("func", "global", True)
    assert names["berm_tool_label"] == ("notype", "global", True)
    assert names["on_wake"] == ("func", "local", True) and names["on_notify"] == ("func", "weak", True)
    assert set(tool_exports(image)) == {"good"}
    assert lifecycle_exports(image) == {}


def test_image_exporting_no_tools():
    image = read_elf(harness_elf(manifest_json([]), []))
    assert parse_manifest(image.manifest_bytes).tools == ()
    with pytest.raises(MissingExportError, match="exports no tools"):
        load_manifest(image)


@pytest.mark.parametrize("doc, message", [
    ([], "must be a JSON object, not an array"),
    ({"tools": []}, "abi_version must be an integer, not null"),
    ({"abi_version": "0", "tools": []}, "abi_version must be an integer, not a string"),
    ({"abi_version": True, "tools": []}, "abi_version must be an integer, not a boolean"),
    ({"abi_version": 1.0, "tools": []}, "not a number with a fraction or an exponent"),
    ({"abi_version": 0}, "tools must be an array, not null"),
    ({"abi_version": 0, "tools": {}}, "tools must be an array, not an object"),
    ({"abi_version": 0, "tools": ["x"]}, r"tools\[0\] must be an object"),
    ({"abi_version": 0, "tools": [{"name": "a b"}]}, r"tools\[0\].name must be a string of letters"),
    ({"abi_version": 0, "tools": [{"name": ""}]}, r"tools\[0\].name"),
    ({"abi_version": 0, "tools": [{"name": 7}]}, r"tools\[0\].name"),
    ({"abi_version": 0, "tools": [{"name": "a.b"}]}, r"tools\[0\].name must be a string of letters"),
    ({"abi_version": 0, "tools": [], "usage": None}, "usage must be a string, not null"),
    ({"abi_version": 0, "tools": [{"name": "a"}, {"name": "a"}]}, "declared twice"),
    ({"abi_version": 0, "tools": [{"name": "a", "description": 1}]}, "description must be a string"),
    ({"abi_version": 0, "tools": [{"name": "a", "parameters": []}]}, "parameters must be a JSON Schema object"),
    ({"abi_version": 0, "tools": [], "usage": 5}, "usage must be a string"),
    ({"abi_version": 0, "tools": [], "capabilities": "fs"}, "capabilities must be an array of strings"),
    ({"abi_version": 0, "tools": [], "hosts": [1]}, "hosts must be an array of strings"),
    ({"abi_version": 0, "tools": [], "requests": []}, "requests must be an object"),
    ({"abi_version": 0, "tools": [], "requests": {"capabilities": [2]}}, "capabilities must be an array"),
])
def test_schema_errors(doc, message):
    with pytest.raises(ManifestJsonError, match=message):
        parse_manifest(json.dumps(doc).encode())


def test_deeply_nested_json_is_a_manifest_error():
    with pytest.raises(ManifestJsonError):
        parse_manifest(b"[" * 100_000 + b"]" * 100_000)


def _nested(depth: int) -> bytes:
    """A manifest of one tool whose extra key holds arrays nested so that the whole document is ``depth`` deep."""
    inner = depth - 1
    return b'{"abi_version": 0, "tools": [{"name": "alpha"}], "x": ' + b"[" * inner + b"]" * inner + b"}"


def test_nesting_is_bounded_before_parsing():
    assert parse_manifest(_nested(MAX_NESTING)).tools[0].name == "alpha"
    assert parse_manifest(b'{"abi_version": 0, "tools": [], "x": "' + b"[" * 5000 + b'"}').raw["x"] == "[" * 5000
    with pytest.raises(ManifestJsonError, match="must be a JSON object, not a string"):
        parse_manifest(b'"' + b"{" * 500 + b'"')
    with pytest.raises(ManifestJsonError, match=f"nests arrays and objects {MAX_NESTING + 1} deep; at most"):
        parse_manifest(_nested(MAX_NESTING + 1))


def test_brackets_in_strings_do_not_count_as_nesting():
    text = b'{"abi_version": 0, "tools": [], "x": ["\\"[{\\\\", "' + b"[" * 200 + b'"], "y": [[[]]]}'
    assert parse_manifest(text).raw["x"][0] == '"[{\\'


def test_the_nesting_of_a_manifest_with_a_string_that_never_closes_is_read_in_linear_time():
    """Found by a review: the first scan of the brackets matched strings by backtracking, and a string that never
    closes, full of escaped quotes, was gone over again from each one: 128 KB took 84 s (256 KB here: minutes)."""
    text = b"[" * (MAX_NESTING + 1) + b'"' + b'\\"' * (128 << 10)
    with pytest.raises(ManifestJsonError, match=f"nests arrays and objects {MAX_NESTING + 1} deep"):
        ends_within(30, lambda: parse_manifest(text))


def test_a_deep_manifest_is_refused_before_json_loads_recurses_even_on_a_small_stack():
    """Found by a review: json.loads recurses in C once a level up to Python's recursion limit, whatever the stack,
    so a 990-deep manifest read in a thread with a 64 KiB stack crashed the process (exit status 139)."""
    done = run_python(on_a_small_stack("from berm_aot.manifest import parse_manifest", (
        "try:\n"
        "    parse_manifest(b'{\"abi_version\": 0, \"x\": ' + b'[' * 990 + b']' * 990 + b'}')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n")))
    assert done.returncode == 0 and done.stdout.startswith("ManifestJsonError the manifest nests arrays and objects "
                                                           "991 deep"), (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("depth", range(950, 1000, 7))
def test_nesting_just_under_the_recursion_limit_is_a_manifest_error(depth, tmp_path, capsys):
    """Found by a hostile review: nesting just under Python's recursion limit passed json.loads and then broke the
    check that writes the document back, a RecursionError out of Engine.load and berm inspect. Through an image, as
    a harness delivers it."""
    elf = harness_elf(_nested(depth), ["alpha"])
    too_deep = rf"nests arrays and objects {depth} deep; at most {MAX_NESTING} are read"
    with pytest.raises(ManifestJsonError, match=too_deep):
        _load(_nested(depth), ["alpha"])
    with pytest.raises(ManifestJsonError, match=too_deep):
        Engine(kind="interp").load(elf).harness(None)  # a load keeps the image (it runs by symbol), the error
    (tmp_path / "h.elf").write_bytes(elf)
    assert berm_main(["inspect", str(tmp_path / "h.elf"), "--json"]) == 2
    assert re.search(too_deep, capsys.readouterr().err)


@pytest.mark.parametrize("limit", [0, 640, 4300])
def test_an_integer_of_too_many_digits_is_a_manifest_error_whatever_the_interpreters_limit(limit):
    """json.loads refuses to convert integers of more than 4300 digits with a plain ValueError, which escaped
    Engine.load and berm inspect as a traceback; then the answer, and its time, hung on the interpreter's own limit
    (none: a 1 MiB integer took 25 s to read; 640: 700 digits were refused, with its message naming
    sys.set_int_max_str_digits). Found by a review."""
    longest = "9" * MAX_INT_DIGITS
    saved = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        doc = parse_manifest(f'{{"abi_version": 0, "tools": [], "n": [{longest}, -{longest}]}}'.encode())
        assert doc.raw["n"] == [int(longest), -int(longest)]
        for digits in (MAX_INT_DIGITS + 1, 5000, 1 << 20):
            with pytest.raises(ManifestJsonError, match=f"an integer of more than {MAX_INT_DIGITS} digits"):
                parse_manifest(b'{"abi_version": 0, "tools": [], "n": -' + b"9" * digits + b"}")
    finally:
        sys.set_int_max_str_digits(saved)


def test_manifest_text_in_errors_is_cut_short():
    """A manifest's 512 KiB key or tool name came back whole in the error message (found by a review)."""
    long = "k" * (1 << 19)
    for text in (f'{{"{long}": 1, "{long}": 2}}', f'{{"abi_version": 0, "tools": [{{"name": "{long}."}}]}}',
                 f'{{"abi_version": 0, "tools": [{{"name": "{long}"}}, {{"name": "{long}"}}]}}',
                 f'{{"abi_version": 0, "tools": [{{"name": "{long}", "description": 1}}]}}',
                 f'{{"abi_version": {"7" * MAX_INT_DIGITS}, "tools": []}}'):
        with pytest.raises((ManifestJsonError, AbiVersionError)) as caught:
            parse_manifest(text.encode())
        assert len(str(caught.value)) < 300
    with pytest.raises(ManifestJsonError, match=r"name must be .*, not an array$"):
        parse_manifest(b'{"abi_version": 0, "tools": [{"name": ["x"]}]}')


def test_errors_are_distinct_classes():
    classes = [NoManifestError, ManifestEncodingError, ManifestJsonError, AbiVersionError, MissingExportError]
    assert len(set(classes)) == len(classes) and all(issubclass(c, ManifestError) for c in classes)
    for a in classes:
        for b in classes:
            assert a is b or not issubclass(a, b)
