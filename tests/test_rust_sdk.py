"""The Rust guest SDK (harnesses/sdk/rust), through rust-sdk.elf (harnesses/rust-probe/src/sdk), on both engines:
every capability's request as the host receives it and its reply (or error) as the tool gets it, against stand-in
capabilities and then real grants; the checked arguments' messages; the JSON parser and writer, against Python's
json; and the heap, which must reuse what a tool frees. test_rust_build.py rebuilds the image from its source."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from berm_abi.frames import decode_frame, encode_frame
from berm_abi.names import CAPABILITY_CALLS, CORE_CALLS
from berm_aot.elf import read_elf
from berm_host.declaration import Declaration
from berm_host.engine import Engine
from berm_host.grants import linker_for
from berm_host.layout import layout_for
from berm_host.linker import CapabilityError, Linker
from berm_host.traps import ToolFailure, Trap, TrapKind
from tests.sdk_engines import ENGINE_KINDS, engine

HARNESSES = Path(__file__).resolve().parent.parent / "harnesses"
SDK_SOURCES = HARNESSES / "sdk" / "rust" / "src"
ELF = (HARNESSES / "rust-probe" / "rust-sdk.elf").read_bytes()


@pytest.fixture(params=ENGINE_KINDS)
def kind(request) -> str:
    return request.param


class StandIn:
    """A capability that records each request's fields and answers ``reply``, or the error ``error``."""

    def __init__(self, reply: bytes = b"", error: str | None = None):
        self.reply, self.error, self.seen = reply, error, []

    def __call__(self, request: bytes) -> bytes:
        self.seen.append(decode_frame(request))
        if self.error is not None:
            raise CapabilityError(self.error)
        return self.reply


def sdk(kind: str, **stand_ins: StandIn):
    """rust-sdk with the stand-ins as its only capabilities, keyed by name with '_' for '.': fs_read=StandIn(…)."""
    linker = Linker()
    for name, fn in stand_ins.items():
        linker.define("berm." + name.replace("_", "."), fn)
    return engine(kind).load(ELF).harness(linker, name="rust-sdk")


def call(harness, tool: str, args) -> str:
    return harness.call(tool, json.dumps(args).encode())


def test_the_sdk_derives_the_number_of_every_host_call_of_the_abi():
    names = re.findall(r'^    [A-Z_]+ = "([a-z.]+)";$', (SDK_SOURCES / "calls.rs").read_text(), re.M)
    assert sorted(names) == sorted(c.name for c in CORE_CALLS + CAPABILITY_CALLS)


# ---------------------------------------------------------------- capabilities against stand-ins


def test_files(kind):
    read, write, glob, grep = StandIn(b"file text"), StandIn(), StandIn(b"a.txt\nb/c.txt\n"), StandIn(b"a.txt:3")
    h = sdk(kind, fs_read=read, fs_write=write, fs_glob=glob, fs_grep=grep)
    assert call(h, "read", {"path": "notes/a.txt"}) == "file text"
    assert call(h, "write", {"path": "a.txt", "content": "héllo"}) == "wrote 6 bytes to a.txt"
    assert call(h, "write", {"path": "d/a.txt", "content": "", "parents": True}) == "wrote 0 bytes to d/a.txt"
    assert call(h, "glob", {"pattern": "**/*.txt"}) == "a.txt\nb/c.txt\n"
    assert call(h, "grep", {"pattern": "x+", "path": "b", "include": "*.txt", "mode": "count"}) == "a.txt:3"
    assert call(h, "grep", {"pattern": "x"}) == "a.txt:3"
    assert read.seen == [[b"notes/a.txt"]]
    assert write.seen == [[b"a.txt", "héllo".encode()], [b"d/a.txt", b"", b"parents", b"1"]]
    assert glob.seen == [[b"**/*.txt", b"."]]
    assert grep.seen == [[b"x+", b"b", b"*.txt", b"count"], [b"x", b".", b"", b"files"]]


def test_an_error_reply_is_the_tools_failure_and_a_reply_that_is_not_text_is_one_too(kind):
    h = sdk(kind, fs_read=StandIn(error="notes/a.txt: no such file"))
    with pytest.raises(ToolFailure, match="^notes/a.txt: no such file$"):
        call(h, "read", {"path": "notes/a.txt"})
    h = sdk(kind, fs_read=StandIn(b"\xff\xfe"), fs_glob=StandIn(b"caf\xe9"))
    with pytest.raises(ToolFailure, match="^a.bin is not UTF-8$"):
        call(h, "read", {"path": "a.bin"})
    with pytest.raises(ToolFailure, match="^the reply of berm.fs.glob is not UTF-8$"):
        call(h, "glob", {"pattern": "*"})


def test_exec_run_flattens_the_environment_in_its_order(kind):
    run = StandIn(b'{"exit_code":0,"stderr":"","stdout":"hi\\n"}')
    h = sdk(kind, exec_run=run)
    assert call(h, "run", {"command": "echo hi", "env": {"B": "2", "A": ""}}) == run.reply.decode()
    assert call(h, "run", {"command": "ls", "cwd": "src"}) == run.reply.decode()
    assert run.seen == [[b"echo hi", b".", b"B", b"2", b"A", b""], [b"ls", b"src"]]


def test_http_fetch_splits_the_framed_reply(kind):
    fetch = StandIn(encode_frame([200, "a: b\n", b"body \xff"]))
    h = sdk(kind, http_fetch=fetch)
    response = call(h, "fetch", {"url": "https://x.example/", "method": "POST", "body": "q", "headers": {"k": "v"}})
    assert json.loads(response) == {"status": 200, "headers": "a: b\n", "body": "body \ufffd"}
    assert fetch.seen == [[b"POST", b"https://x.example/", b"q", b"k", b"v"]]
    for reply, problem in [(encode_frame(["2xx", "", ""]), "status 2xx is not a number"),
                           (encode_frame(["200", ""]), "expected 3 fields, got 2"),
                           (b"\x09\0\0\0200", "a field runs past its end")]:
        with pytest.raises(ToolFailure, match=f"^malformed reply from berm.http.fetch: {problem}$"):
            call(sdk(kind, http_fetch=StandIn(reply)), "fetch", {"url": "u"})


def test_clock(kind):
    h = sdk(kind, clock_now=StandIn(encode_frame([1767225600000, -3600])))
    assert json.loads(call(h, "now", {})) == {"utc_millis": 1767225600000, "local_offset_seconds": -3600}
    with pytest.raises(ToolFailure, match="^malformed reply from berm.clock.now: a field is not a number$"):
        call(sdk(kind, clock_now=StandIn(encode_frame(["soon", 0]))), "now", {})


def test_kv(kind):
    get, put, delete = StandIn(b"v1"), StandIn(), StandIn()
    listing = StandIn(encode_frame(["pa", "pb", ""]))
    h = sdk(kind, kv_get=get, kv_set=put, kv_delete=delete, kv_list=listing)
    assert call(h, "kv", {"op": "get", "key": "k"}) == "v1"
    assert call(h, "kv", {"op": "set", "key": "k", "value": "v2"}) == "done"
    assert call(h, "kv", {"op": "delete", "key": "k"}) == "done"
    assert json.loads(call(h, "kv", {"op": "list", "key": "p"})) == ["pa", "pb", ""]
    assert json.loads(call(h, "kv", {"op": "list", "after": "pa"})) == ["pa", "pb", ""]
    assert (get.seen, put.seen, delete.seen) == ([[b"k"]], [[b"k", b"v2"]], [[b"k"]])
    assert listing.seen == [[b"p"], [b"", b"pa"]]
    with pytest.raises(ToolFailure, match="^malformed reply from berm.kv.list: a field runs past its end$"):
        call(sdk(kind, kv_list=StandIn(b"\x05\0\0\0ab")), "kv", {"op": "list"})
    with pytest.raises(ToolFailure, match="^no value for key 'k'$"):
        call(sdk(kind, kv_get=StandIn(error="no value for key 'k'")), "kv", {"op": "get", "key": "k"})
    with pytest.raises(ToolFailure, match="^storage is busy$"):  # a store that failed is not a key it does not hold
        call(sdk(kind, kv_get=StandIn(error="storage is busy")), "kv", {"op": "lookup", "key": "k"})


def test_schedule_and_call(kind):
    at, cancel, other = StandIn(), StandIn(), StandIn(b"the other's result")
    h = sdk(kind, schedule_at=at, schedule_cancel=cancel, call=other)
    assert call(h, "schedule", {"op": "at", "id": "w1", "when": -42, "payload": "p"}) == "done"
    assert call(h, "schedule", {"op": "cancel", "id": "w1"}) == "done"
    assert call(h, "call", {"harness": "os", "tool": "read", "args": '{"path": "x"}'}) == "the other's result"
    assert at.seen == [[b"-42", b"w1", b"p"]]
    assert cancel.seen == [[b"w1"]]
    assert other.seen == [[b"os", b"read", b'{"path": "x"}']]


def test_a_capability_that_was_not_granted_traps_naming_it(kind):
    with pytest.raises(Trap, match=r"no host function for call \d+ \(berm.clock.now, not granted") as trap:
        call(sdk(kind), "now", {})
    assert trap.value.kind is TrapKind.UNKNOWN_HOST_CALL
    assert trap.value.info.where.startswith("berm::caps::capability+")


# ---------------------------------------------------------------- checked arguments


@pytest.mark.parametrize(("tool", "args", "message"), [
    ("read", b"", "missing required field 'path'"),
    ("read", b"{}", "missing required field 'path'"),
    ("read", b'{"path": 3}', "'path' must be a string, not integer"),
    ("read", b'{"path": 3e0}', "'path' must be a string, not number"),
    ("read", b'{"path": "a", "mode": 1}', "unknown field 'mode' (expected: path)"),
    # shown as the C SDK shows them (a review): control characters escaped, at most 64 bytes of a key
    ("read", b'{"pa\\u0000th\\u001b[2J": "a"}', "unknown field 'pa\\u0000th\\u001b[2J' (expected: path)"),
    ("read", b'{"' + b"k" * 100 + b'": "a"}', "unknown field '" + "k" * 64 + "' (expected: path)"),
    ("read", b'["a"]', "expected a JSON object, not array"),
    ("read", b'{"path": "a",}', "not JSON: invalid JSON at byte 13: expected a key"),
    ("write", b'{"path": "a", "content": "", "parents": "yes"}', "'parents' must be a boolean, not string"),
    ("grep", b'{"pattern": "x", "mode": "lines"}', "'mode' must be one of files, content, count, not 'lines'"),
    ("run", b'{"command": "ls", "env": {"A": 1}}', "'env.A' must be a string, not integer"),
    ("run", b'{"command": "ls", "env": []}', "'env' must be an object of strings, not array"),
    ("schedule", b'{"op": "at", "id": "w", "when": 1.5}', "'when' must be an integer between"),
    ("schedule", b'{"op": "at", "id": "w", "when": true}', "'when' must be an integer, not boolean"),
    ("schedule", b'{"op": "at", "id": "w", "when": 99999999999999999999}', "'when' must be an integer between"),
    ("heap", b'{"rounds": -1, "size": 1}', "'rounds' must be between 0 and 1048576, not -1"),
])
def test_argument_problems_are_messages(kind, tool, args, message):
    with pytest.raises(ToolFailure) as failure:
        sdk(kind).call(tool, args)
    assert failure.value.message.startswith(f"invalid arguments: {message}")


@pytest.mark.parametrize(("rounds", "whole"), [
    ("2", 2), ("2.0", 2), ("2e0", 2), ("0.2e1", 2), ("200e-2", 2), ("-0", 0), ("0e99999999999999999999", 0),
    ("0." + "0" * 9999 + "2e10000", 2), ("3.000", 3),
    ("2.5", None), ("1e-1", None), ("1e99999999999999999999", None), ("0." + "0" * 9999 + "25e10000", None),
    ("1048577", "range"), ("-1.0", "range"), ("1e19", None), ("-9223372036854775809", None),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_an_integer_argument_is_any_whole_number_as_in_the_c_sdk(kind, rounds, whole):
    """The C SDK's berm_arg_int takes 2.0 and 2e0 as JSON Schema's "integer" does; the Rust SDK refused them (found
    by a review comparing the two)."""
    args = f'{{"rounds": {rounds}, "size": 16}}'.encode()
    if isinstance(whole, int):
        expected = sdk(kind).call("heap", f'{{"rounds": {whole}, "size": 16}}'.encode())
        assert sdk(kind).call("heap", args) == expected
        return
    with pytest.raises(ToolFailure) as failure:
        sdk(kind).call("heap", args)
    problem = "must be between 0 and 1048576" if whole == "range" else "must be an integer between 0 and 1048576"
    assert failure.value.message.startswith(f"invalid arguments: 'rounds' {problem}, not ")


# ---------------------------------------------------------------- JSON


def _written(value) -> str:
    """What berm::json::write makes of ``value`` (numbers keep the text they were written with)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_written(k)}:{_written(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_written(v) for v in value) + "]"
    if isinstance(value, str):
        escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
        return '"' + "".join(escapes.get(c, f"\\u{ord(c):04x}" if ord(c) < 0x20 else c) for c in value) + '"'
    return json.dumps(value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(value=_JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_echo_reads_what_python_writes(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    for kind in ENGINE_KINDS:
        assert sdk(kind).call("echo", text.encode()) == _written(value)


@pytest.mark.parametrize(("text", "message"), [
    (b"[1,", "invalid JSON at byte 3: expected a value"),
    (b"[1] x", "invalid JSON at byte 4: text after the value"),
    (b"01", "invalid JSON at byte 2: a number with a leading zero"),
    (b"1.", "invalid JSON at byte 2: expected a digit after '.'"),
    (b"-", "invalid JSON at byte 1: expected a digit"),
    (b"1e+", "invalid JSON at byte 3: expected a digit in the exponent"),
    # the byte at fault, where the C SDK's parser places it (found by reviews: the byte after it, or past the
    # closing quote; a \u escape's error past its digits; a string that never closes at the end of the text)
    (b'"a\x01"', "invalid JSON at byte 2: a control character in a string"),
    (b'"\\x"', "invalid JSON at byte 1: an unknown escape"),
    (b'"\\u12"', "invalid JSON at byte 1: a short \\u escape"),
    (b'"\\u12g4"', "invalid JSON at byte 1: a \\u escape that is not four hex digits"),
    (b'"\\ud800"', "invalid JSON at byte 1: a high surrogate without its low one"),
    (b'"\\ud800\\u0041"', "invalid JSON at byte 1: a high surrogate without its low one"),
    (b'"\\udc00"', "invalid JSON at byte 1: a lone low surrogate"),
    (b'"caf\xe9"', "invalid JSON at byte 4: a string that is not UTF-8"),
    (b'"ab\xffcd"', "invalid JSON at byte 3: a string that is not UTF-8"),
    (b'"\xe2\x82"', "invalid JSON at byte 1: a string that is not UTF-8"),
    (b'"open', "invalid JSON at byte 0: a string with no closing quote"),
    (b'["ab\\', "invalid JSON at byte 1: a string with no closing quote"),
    (b'{"a": 1, "a": 2}', 'invalid JSON at byte 16: key "a" repeated'),
    # found by a review: quoted whole, an 8 MiB key made a message the heap could not hold beside the value (a trap);
    # 32 bytes of it at a whole character, as the C SDK shows it (an id: the bytes made a long one)
    pytest.param(b'{"' + "é".encode() * 40 + b'": 1, "' + "é".encode() * 40 + b'": 2}',
                 'invalid JSON at byte 174: key "' + "é" * 16 + '..." repeated', id="a long key repeated"),
    (b"[" * 65 + b"]" * 65, "invalid JSON at byte 64: nested too deeply"),
])
def test_json_errors_say_what_and_where(kind, text, message):
    with pytest.raises(ToolFailure, match=f"^{re.escape(message)}$"):
        sdk(kind).call("echo", text)


@pytest.mark.parametrize("arguments", [
    b'{"path": "' + b"x" * 700_000 + b'"}',  # a string was grown by doubling: twice its size at the end
    b'{"path": [' + b",".join([b"0"] * 100_000) + b"]}",  # a value per element, in a vector grown by doubling
    b'{"path": "' + b"x" * 3_000_000 + b'"}',  # more than the heap: the arguments' own buffer
], ids=["a long string", "a long array", "more than the heap"])  # (an id of 3 MB, in PYTEST_CURRENT_TEST, was an
# environment too large for the C compiler)
def test_arguments_the_heap_cannot_hold_are_an_error_not_a_trap(kind, arguments):
    """Found by a review: the parser's allocations panicked (a trap), where the C SDK's tool fails with this
    message; on 2 MiB of guest memory."""
    harness = Engine(kind=kind, memory_size=2 << 20).load(ELF).harness(None, name="rust-sdk")
    with pytest.raises(ToolFailure, match=f"^invalid arguments: out of memory reading {len(arguments)} bytes of "
                                          "arguments$"):
        harness.call("read", arguments)


def test_a_long_string_that_never_closes_is_a_syntax_error_not_out_of_memory(kind):
    """Its room was reserved before its closing quote was looked for: 900 kB unclosed, on 2 MiB of guest memory, was
    "out of memory" (found by a review)."""
    harness = Engine(kind=kind, memory_size=2 << 20).load(ELF).harness(None, name="rust-sdk")
    with pytest.raises(ToolFailure, match="^invalid arguments: not JSON: invalid JSON at byte 9: a string with no "
                                          "closing quote$"):
        harness.call("read", b'{"path": "' + b"x" * 900_000)


def test_an_object_of_many_keys_is_checked_for_repeats_in_n_log_n():
    """Found by a review: each key was compared with every earlier one, and an object of 40,000 keys took 13 s of the
    translated code (a million would take hours), past a tool's deadline. 100,000 keys now take well under it."""
    keys = [f"k{i:07d}" for i in range(100_000)]
    text = "{" + ",".join(f'"{k}":{i}' for i, k in enumerate(keys)) + "}"
    assert sdk("aot").call("echo", text.encode()) == text
    with pytest.raises(ToolFailure, match=f'^invalid JSON at byte {len(text) + 13}: key "k0050000" repeated$'):
        sdk("aot").call("echo", (text[:-1] + ',"k0050000":1}').encode())


def test_json_nests_64_levels(kind):
    assert sdk(kind).call("echo", b"[" * 64 + b"]" * 64) == "[" * 64 + "]" * 64


# ---------------------------------------------------------------- the heap


def test_the_heap_reuses_what_a_tool_frees(kind):
    """On 1 MiB of guest memory the heap is about half of it: a tool allocating more than that in blocks it frees as
    it goes runs only if freed blocks come back (a bump allocator, as rust-probe once had, runs out)."""
    memory = 1 << 20
    heap = layout_for(read_elf(ELF), memory).heap_size
    harness = Engine(kind=kind, memory_size=memory).load(ELF).harness(None, name="rust-sdk")
    rounds = heap // 90_000 + 2  # a round allocates 44,850 bytes of small strings and a block of 32 or 64 KiB
    out = call(harness, "heap", {"rounds": rounds, "size": 65536})
    allocated = int(re.fullmatch(rf"{rounds} rounds, (\d+) bytes allocated, checksum \d+", out).group(1))
    assert allocated > heap
    with pytest.raises(Trap) as trap:
        call(harness, "heap", {"rounds": 1, "size": heap})
    assert trap.value.failure == f"rust-sdk panicked: memory allocation of {heap} bytes failed"


_SIZES = st.integers(1, 300) | st.integers(301, 5000) | st.integers(4097, 40_000)
_OPS = st.lists(st.tuples(st.sampled_from([0, 0, 1, 2]), st.integers(0, 15), _SIZES,
                          st.sampled_from([1, 2, 8, 16, 64, 4096, 8192])), max_size=50)


def _live_sizes(ops) -> str:
    """What ``allocate`` answers when the allocator keeps every block's bytes: the live blocks' sizes by slot."""
    slots = [0] * 16
    for op, slot, size, _ in ops:
        if op == 0 or (op == 1 and slots[slot]):
            slots[slot] = size
        elif op == 2:
            slots[slot] = 0
    return " ".join(map(str, slots))


@settings(max_examples=150, deadline=None)
@given(ops=_OPS)
def test_the_heap_keeps_every_blocks_bytes_and_alignment(ops):
    """Random allocations, reallocations (in place at the top of the heap, within a class, or moved) and frees,
    every live block checked after each step by the guest itself. The translated code runs them all; the
    interpreter runs the same guest code (test_both_engines_agree_on_the_heap)."""
    assert call(sdk("aot"), "allocate", {"ops": ops}) == _live_sizes(ops)


def test_the_heap_keeps_every_blocks_bytes_on_the_interpreter():
    ops = [[0, 0, 100, 8], [0, 1, 5000, 4096], [1, 0, 120, 8], [1, 1, 9000, 4096], [0, 2, 16, 64], [2, 0, 0, 1],
           [0, 3, 100, 8], [1, 2, 70000, 64], [1, 3, 3, 8], [2, 1, 0, 1], [0, 4, 8000, 8192]]
    assert call(sdk("interp"), "allocate", {"ops": ops}) == _live_sizes(ops)


def test_a_large_free_block_is_split_not_lost(kind):
    """Found by a review: a large request took the best-fitting free block whole, and freed it at the size asked
    for, so the rest was lost for the invocation: freeing 1 MiB and keeping 5 KB, round after round, ran the 64 MiB
    heap out of memory with under 1.4 MB live. A larger block is now split, its rest freed. Here, on 8 MiB of guest
    memory, each round frees 512 KiB and keeps 5 KB: 15 rounds lost 7.5 MiB, and the last 1 MiB found no room."""
    # the interpreter takes ~5 s on an idle machine: on a loaded one it ran past the default deadline (60 s)
    harness = Engine(kind=kind, memory_size=8 << 20, deadline=600).load(ELF).harness(None, name="rust-sdk")
    ops = []
    for r in range(15):
        ops += [[0, 0, 512 << 10, 8], [2, 0, 0, 8], [0, 1 + r, 5000, 8]]
    ops.append([0, 0, 1 << 20, 8])
    assert call(harness, "allocate", {"ops": ops}) == _live_sizes(ops)


def test_freed_neighbours_merge_to_serve_a_larger_request(kind):
    """Found by a review: a freed block was only ever reused at its own size or smaller, so with the heap full of
    freed neighbours no request larger than each of them could be served. On 1 MiB of guest memory: fifteen blocks
    of a sixteenth of the heap, then all freed but the middle one (and a small block on top), then two requests of
    six of them, one on each side of the middle; free neighbours are merged when a request finds nothing."""
    memory = 1 << 20
    piece = layout_for(read_elf(ELF), memory).heap_size // 16 // 4096 * 4096
    harness = Engine(kind=kind, memory_size=memory).load(ELF).harness(None, name="rust-sdk")
    ops = [[0, slot, piece, 8] for slot in range(15)] + [[0, 15, 16, 8]]
    ops += [[2, slot, 0, 8] for slot in range(15) if slot != 7]
    ops += [[0, 0, 6 * piece, 4096], [0, 1, 6 * piece, 8]]
    assert call(harness, "allocate", {"ops": ops}) == _live_sizes(ops)


def test_the_bytes_skipped_to_align_a_block_are_freed_not_lost(kind):
    """Found by a review: the bump pointer skipped bytes to align a block and they were lost for the invocation, so
    sixteen-byte and 4 KiB blocks in turn filled a 64 MiB heap with 32 MB live, and once all were freed the runs
    between the lost bytes could not be merged into one block. On 1 MiB of guest memory (a heap of 588 KiB from
    0x2c000): a block aligned to 256 KiB skips about 80 KiB; both freed, a block of all the heap but the 64 KiB the
    tool's own allocations may take fits only if the skipped bytes came back."""
    memory = 1 << 20
    heap = layout_for(read_elf(ELF), memory).heap_size
    harness = Engine(kind=kind, memory_size=memory).load(ELF).harness(None, name="rust-sdk")
    ops = [[0, 0, 16, 8], [0, 1, 4096, 1 << 18], [2, 1, 0, 8], [2, 0, 0, 8], [0, 0, (heap - (64 << 10)) & ~4095, 8]]
    assert call(harness, "allocate", {"ops": ops}) == _live_sizes(ops)


def test_a_block_shrinks_where_it_is_when_the_heap_is_full(kind):
    """Found by a review: a shrink moved the block (a new one, a copy), so on a full heap shrink_to_fit panicked out
    of memory though it would have freed memory. On 1 MiB of guest memory: 64 KiB, then the heap filled with pages
    and then sixteen-byte blocks, then the first shrunk to 10 bytes."""
    harness = Engine(kind=kind, memory_size=1 << 20).load(ELF).harness(None, name="rust-sdk")
    ops = [[0, 0, 64 << 10, 8], [3, 1, 4096, 8], [3, 1, 16, 8], [1, 0, 10, 8]]
    assert call(harness, "allocate", {"ops": ops}) == _live_sizes(ops)


# a small request with the heap's end reached and memory free only in larger blocks (it failed, with merging alone:
# the tool's own "out of memory" message could not be allocated, a panic)
@example(ops=[[2, 5, 1439, 4096], [1, 3, 24795, 16], [2, 2, 199779, 8192], [0, 3, 193124, 4096], [0, 14, 24, 8],
              [0, 6, 30831, 1], [0, 6, 43287, 1], [0, 6, 248, 1], [2, 7, 171916, 8], [2, 1, 81112, 4096],
              [0, 10, 30086, 8], [1, 6, 52, 1], [0, 7, 182902, 16], [0, 15, 132, 4096], [2, 0, 4169, 1],
              [1, 5, 101620, 16], [2, 8, 108944, 1], [1, 10, 135, 16], [0, 5, 150450, 8192], [0, 2, 175, 16],
              [1, 15, 136, 8], [0, 10, 4454, 8192], [0, 1, 3362, 1]])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from([0, 0, 1, 2]), st.integers(0, 15),
                              st.integers(1, 300) | st.integers(301, 5000) | st.integers(4097, 200_000),
                              st.sampled_from([1, 8, 16, 4096, 8192])), max_size=50))
def test_the_heap_keeps_every_blocks_bytes_through_merges(ops):
    """On 1 MiB of guest memory (a heap of about 600 KB) random requests of up to 200 KB run the heap out, merge
    free neighbours and cut them again: every live block keeps its bytes and alignment (the guest checks them after
    every step), and a request fails only as "out of memory"."""
    harness = Engine(kind="aot", memory_size=1 << 20).load(ELF).harness(None, name="rust-sdk")
    try:
        assert call(harness, "allocate", {"ops": ops}) == _live_sizes(ops)
    except ToolFailure as failure:
        assert re.fullmatch(r"op \d+: out of memory", failure.message)


def test_an_allocation_the_heap_cannot_hold_is_an_error_value(kind):
    ops = [[0, 0, 100, 8], [0, 1, 64 << 20, 8]]  # more than the whole 64 MiB of guest memory
    with pytest.raises(ToolFailure, match="^op 1: out of memory$"):
        call(sdk(kind), "allocate", {"ops": ops})


def test_a_reply_the_heap_cannot_hold_is_an_error_value(kind):
    """Found by a review: the reply's buffer came from the allocator, whose failure is a panic (a trap), and
    http_fetch copied the body out of the reply, so a body of more than half the heap trapped too. On 1 MiB of
    guest memory (a heap of about 600 KB): a larger reply is the capability's error, and a body of two thirds of
    the heap arrives whole."""
    memory = 1 << 20
    heap = layout_for(read_elf(ELF), memory).heap_size
    linker = Linker()
    linker.define("berm.fs.read", StandIn(b"x" * (heap + 10)))
    linker.define("berm.http.fetch", StandIn(encode_frame([200, "a: b\n", b"y" * (heap * 2 // 3)])))
    harness = Engine(kind=kind, memory_size=memory).load(ELF).harness(linker, name="rust-sdk")
    with pytest.raises(ToolFailure, match=f"^a reply of {heap + 10} bytes does not fit in guest memory$"):
        call(harness, "read", {"path": "big"})
    assert call(harness, "fetch", {"url": "u", "body_only": True}) == "y" * (heap * 2 // 3)


def test_both_engines_agree_on_the_heap():
    outs = {kind: call(sdk(kind), "heap", {"rounds": 3, "size": 100_000}) for kind in ENGINE_KINDS}
    assert len(set(outs.values())) == 1, outs


# ---------------------------------------------------------------- real grants


def test_real_grants(kind, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    decl = Declaration(name="rust-sdk", capabilities=("fs", "kv", "clock", "exec"), root=str(root))
    h = engine(kind).load(ELF).harness(linker_for(decl, data_dir=tmp_path / "data"), name="rust-sdk")
    assert call(h, "write", {"path": "d/a.txt", "content": "one\ntwo\n", "parents": True}) == "wrote 8 bytes to d/a.txt"
    assert (root / "d" / "a.txt").read_text() == "one\ntwo\n"
    assert call(h, "read", {"path": "d/a.txt"}) == "one\ntwo\n"
    assert call(h, "glob", {"pattern": "**/*.txt"}).splitlines() == ["d/a.txt"]
    assert call(h, "grep", {"pattern": "tw.", "mode": "content"}).splitlines() == ["d/a.txt:2:two"]
    with pytest.raises(ToolFailure, match="^berm.fs.read: ../escape.txt: leaves the root$"):
        call(h, "read", {"path": "../escape.txt"})
    with pytest.raises(ToolFailure, match=r"^berm.fs.write: e/b.txt: no such file or directory \(e\)$"):
        call(h, "write", {"path": "e/b.txt", "content": "x"})
    ran = json.loads(call(h, "run", {"command": "cat a.txt; echo $WHO", "cwd": "d", "env": {"WHO": "rust"}}))
    assert ran == {"exit_code": 0, "stderr": "", "stdout": "one\ntwo\nrust\n"}
    assert call(h, "kv", {"op": "set", "key": "note:1", "value": "v"}) == "done"
    assert json.loads(call(h, "kv", {"op": "list", "key": "note:"})) == ["note:1"]
    assert call(h, "kv", {"op": "get", "key": "note:1"}) == "v"
    assert call(h, "kv", {"op": "lookup", "key": "note:1"}) == "value:v"
    assert call(h, "kv", {"op": "delete", "key": "note:1"}) == "done"
    with pytest.raises(ToolFailure, match="no value for key"):
        call(h, "kv", {"op": "get", "key": "note:1"})
    assert call(h, "kv", {"op": "lookup", "key": "note:1"}) == "missing"  # the host's own text, as the SDK reads it
    before = time.time() * 1000
    now = json.loads(call(h, "now", {}))
    assert before - 1000 <= now["utc_millis"] <= time.time() * 1000 + 1000
