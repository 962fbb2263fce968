"""Capabilities as a guest sees them, on every engine: absent unless granted with their bounding argument (the
call traps as an unknown host call naming the capability); present, they work; their failures come back with
the ERROR bit (a tool failure here), never as a trap.

The guest is C with raw ``ecall``s. Tool ``call`` takes ``u64 number (LE) + request frame`` as its arguments,
makes that host call and returns the reply hex-encoded (or ``berm.fail``s with the error text). ``read`` reads the
file named by its JSON-string argument through ``berm.fs.read``; ``echo`` returns its arguments; ``crash``
executes ``ebreak``. test_call_cli.py drives the same image through ``berm call``.
"""

from __future__ import annotations

import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from berm_abi.frames import decode_frame, encode_frame
from berm_abi.names import fnv1a64
from berm_host.declaration import Declaration
from berm_host.engine import Engine
from berm_host.grants import linker_for
from berm_host.linker import Linker
from berm_host.traps import ToolFailure, Trap, TrapKind
from tests.guests import raw_harness_elf

_SOURCE = r"""
static unsigned char in[1 << 16], reply[1 << 16], out[1 << 17];
static const char hex[] = "0123456789abcdef";

static u64 args(void) {
    u64 n = ecall2(ARGS_LEN, 0, 0);
    if (n > sizeof in) n = sizeof in;
    ecall2(ARGS_READ, (u64)in, n);
    return n;
}

/* Make host call `num` on in[from, n); on success the reply is in reply[0, *len), else berm.fail was called. */
static int capability(u64 num, u64 from, u64 n, u64 *len) {
    u64 r = ecall2(num, (u64)(in + from), n - from);
    *len = r & ~(1UL << 63);
    if (*len > sizeof reply) *len = sizeof reply;
    ecall2(RESULT_READ, (u64)reply, *len);
    if (r >> 63) {
        ecall2(FAIL, (u64)reply, *len);
        return 0;
    }
    return 1;
}

Pair berm_tool_call(void) {
    u64 n = args(), len, num = 0;
    Pair p = {0, 0};
    for (int i = 0; i < 8; i++) num |= (u64)in[i] << (8 * i);
    if (!capability(num, 8, n, &len)) return p;
    for (u64 i = 0; i < len; i++) {
        out[2 * i] = hex[reply[i] >> 4];
        out[2 * i + 1] = hex[reply[i] & 15];
    }
    p.ptr = (u64)out;
    p.len = 2 * len;
    return p;
}

Pair berm_tool_read(void) {  /* args: a JSON string without escapes, e.g. "notes/a.txt" */
    u64 n = args(), len;
    Pair p = {0, 0};
    if (n < 2) return p;
    u64 path = n - 2;  /* reuse `in` as the frame: [u32 len][path], the path moves 3 bytes right */
    for (u64 i = path; i > 0; i--) in[i + 3] = in[i];
    in[0] = path & 255; in[1] = (path >> 8) & 255; in[2] = (path >> 16) & 255; in[3] = path >> 24;
    if (!capability(FS_READ, 0, 4 + path, &len)) return p;
    p.ptr = (u64)reply;
    p.len = len;
    return p;
}

Pair berm_tool_echo(void) {
    Pair p = {(u64)in, args()};
    return p;
}

Pair berm_tool_crash(void) {
    asm volatile("ebreak");
    Pair p = {0, 0};
    return p;
}

"""

TOOLS = ("call", "read", "echo", "crash")


def probe_elf() -> bytes:
    return raw_harness_elf(_SOURCE, TOOLS)


GRANTED_NAMES = {
    "fs": ["berm.fs.read", "berm.fs.write", "berm.fs.glob", "berm.fs.grep", "crabtalk.fs.read", "crabtalk.fs.write"],
    "exec": ["berm.exec.run", "crabtalk.exec.run"],
    "http": ["berm.http.fetch", "crabtalk.http.fetch"],
    "clock": ["berm.clock.now"],
    "kv": ["berm.kv.get", "berm.kv.set", "berm.kv.delete", "berm.kv.list"],
}
ALL_NAMES = sorted(n for names in GRANTED_NAMES.values() for n in names)


@pytest.fixture(scope="module", params=["interp", "aot"])
def image(request, tmp_path_factory):
    engine = Engine(kind=request.param, cache_dir=tmp_path_factory.mktemp("cache"))
    return engine.load(probe_elf())


def call(harness, name: str, fields: list) -> bytes:
    """Make capability ``name`` with the request ``fields`` from inside the guest; the raw reply."""
    return bytes.fromhex(harness.call("call", struct.pack("<Q", fnv1a64(name)) + encode_frame(fields)))


def _traps_naming(harness, name: str) -> None:
    with pytest.raises(Trap) as info:
        call(harness, name, [])
    assert info.value.kind is TrapKind.UNKNOWN_HOST_CALL
    assert f"no host function for call {fnv1a64(name)} ({name}, not granted to this harness)" in str(info.value)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_without_the_grant_each_capability_traps_naming_it(image, name):
    _traps_naming(image.harness(Linker()), name)


@pytest.mark.parametrize("grant", ["fs", "exec", "http"])
def test_granted_without_its_bounding_argument_is_still_absent(image, grant, tmp_path):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=(grant,)), data_dir=tmp_path))
    for name in GRANTED_NAMES[grant]:
        _traps_naming(harness, name)


def test_a_grant_links_only_its_own_family(image, tmp_path):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=("clock",)), data_dir=tmp_path))
    for name in ALL_NAMES:
        if name != "berm.clock.now":
            _traps_naming(harness, name)


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "docs").mkdir(parents=True)
    (r / "docs" / "a.txt").write_text("alpha TODO\n")
    return r


def test_fs_granted_works(image, root):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=("fs",), root=str(root))))
    assert call(harness, "berm.fs.read", ["docs/a.txt"]) == b"alpha TODO\n"
    assert call(harness, "crabtalk.fs.read", ["docs/a.txt"]) == b"alpha TODO\n"
    assert call(harness, "berm.fs.write", ["docs/b.txt", b"beta"]) == b""
    assert call(harness, "crabtalk.fs.write", ["docs/c.txt", b"gamma"]) == b""
    assert (root / "docs" / "b.txt").read_bytes() == b"beta" and (root / "docs" / "c.txt").read_bytes() == b"gamma"
    assert call(harness, "berm.fs.glob", ["**/*.txt", ""]).decode().split("\n")[-1] == "docs/a.txt"
    assert call(harness, "berm.fs.grep", ["TODO", "", "", "count"]) == b"docs/a.txt:1"
    assert harness.call("read", '"docs/a.txt"') == "alpha TODO\n"


def test_capability_failures_come_back_as_errors_not_traps(image, root):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=("fs",), root=str(root))))
    with pytest.raises(ToolFailure, match="berm.fs.read: ../etc/passwd: leaves the root"):
        call(harness, "berm.fs.read", ["../etc/passwd"])
    with pytest.raises(ToolFailure, match="malformed request"):
        harness.call("call", struct.pack("<Q", fnv1a64("berm.fs.read")) + b"\xff\xff\xff\x7fshort")
    assert harness.call("echo", "still alive") == "still alive"


def test_exec_granted_works(image, root):
    decl = Declaration(name="probe", capabilities=("exec",), root=str(root), env=(("WHO", "declared"),))
    harness = image.harness(linker_for(decl))
    reply = json.loads(call(harness, "berm.exec.run", ["echo $WHO $CALL; pwd", "docs", "CALL", "call"]))
    assert reply == {"exit_code": 0, "stderr": "", "stdout": f"declared call\n{root.resolve()}/docs\n"}
    assert json.loads(call(harness, "crabtalk.exec.run", ["exit 3", ""]))["exit_code"] == 3


def test_clock_granted_works(image):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=("clock",))))
    millis, offset = decode_frame(call(harness, "berm.clock.now", []))
    assert int(millis) > 1_600_000_000_000 and -86400 < int(offset) < 86400


def test_kv_granted_persists_across_invocations(image, tmp_path):
    harness = image.harness(linker_for(Declaration(name="probe", capabilities=("kv",)), data_dir=tmp_path))
    assert call(harness, "berm.kv.set", ["greeting", "hello"]) == b""
    assert call(harness, "berm.kv.get", ["greeting"]) == b"hello"  # a fresh invocation, the same store
    assert decode_frame(call(harness, "berm.kv.list", [""])) == [b"greeting"]
    other = image.harness(linker_for(Declaration(name="other", capabilities=("kv",)), data_dir=tmp_path))
    with pytest.raises(ToolFailure, match="no value for key"):
        call(other, "berm.kv.get", ["greeting"])


class _Hello(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b"hi from " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_http_granted_works_for_listed_hosts_only(image):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        harness = image.harness(linker_for(Declaration(name="probe", capabilities=("http",), hosts=("127.0.0.1",))))
        status, headers, body = decode_frame(call(harness, "berm.http.fetch", ["GET", url, b""]))
        assert (status, body) == (b"200", b"hi from /x") and b"Content-Length: 10\n" in headers
        assert decode_frame(call(harness, "crabtalk.http.fetch", ["GET", url, b""]))[0] == b"200"
        elsewhere = image.harness(linker_for(Declaration(name="probe", capabilities=("http",), hosts=("example.com",))))
        with pytest.raises(ToolFailure, match="not in this harness's hosts"):
            call(elsewhere, "berm.http.fetch", ["GET", url, b""])
    finally:
        server.shutdown()
        server.server_close()
