"""The Engine API on translated code: tools, failures, capabilities, logs, fresh memory per invocation, and
concurrent invocations on several threads (separate memories, GIL released while guest code runs)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from berm_abi.names import ERROR_BIT, fnv1a64
from berm_host.engine import Engine
from berm_host.linker import CapabilityError, Linker
from berm_host.traps import HostError, ToolFailure, Trap, TrapKind
from tests.bounded import GRACE, ends_within
from tests.guests import guest_elf, raw_harness_elf

SOURCE = r"""

u64 data_word = 1234;
u64 bss_word;
static char out[256];
static char buf[4096];

static Pair text(const char *s, u64 n) { Pair p = { (u64)s, n }; return p; }
static u64 put_u64(char *p, u64 v) {
    char tmp[24]; u64 n = 0, k = 0;
    do { tmp[n++] = '0' + v % 10; v /= 10; } while (v);
    while (n) p[k++] = tmp[--n];
    return k;
}

/* Report what the previous invocation could have left behind, then leave traces everywhere. */
Pair berm_tool_scribble(void) {
    volatile u64 stack_word;
    volatile u64 *stack_probe = (volatile u64 *)((u64)&stack_word - 512);
    u64 *heap = (u64 *)ecall2(HEAP_START, 0, 0);
    u64 seen = (data_word != 1234) | (bss_word != 0) << 1 | (heap[100] != 0) << 2 | (*stack_probe != 0) << 3;
    data_word = 99; bss_word = 77; heap[100] = 55; *stack_probe = 33;
    u64 n = put_u64(out, seen);
    return text(out, n);
}

/* Keep a token from the arguments in .bss, spin, and check nobody else changed it. */
static u64 token;
Pair berm_tool_token(void) {
    u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf);
    u64 t = 0;
    for (u64 i = 0; i < n; i++) t = t * 10 + (buf[i] - '0');
    token = t;
    volatile u64 spin = 0;
    for (u64 i = 0; i < 200000; i++) { spin += i; if (token != t) return text("clobbered", 9); }
    return text(buf, n);
}

/* Keep the token of the arguments in .bss across a capability call (which waits for the other invocations). */
Pair berm_tool_held(void) {
    u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf);
    u64 t = 0;
    for (u64 i = 0; i < n; i++) t = t * 10 + (buf[i] - '0');
    token = t;
    ecall2(FS_READ, (u64)buf, n);
    return text(out, put_u64(out, token));
}

Pair berm_tool_spin(void) { volatile u64 x = 0; ecall2(LOG, (u64)"spinning", 8); for (;;) x++; }

Pair berm_tool_fail(void) { ecall2(FAIL, (u64)"first", 5); ecall2(FAIL, (u64)"second", 6); return text("ok", 2); }

Pair berm_tool_log(void) { ecall2(LOG, (u64)"hello log", 9); return text("logged", 6); }

/* Call the capability named by the arguments' hash with the arguments as the request; reply or error. */
Pair berm_tool_cap(void) {
    u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf);
    u64 r = ecall2(FS_READ, (u64)buf, n);
    u64 len = r & ~(1ul << 63);
    u64 got = ecall2(RESULT_READ, (u64)out + 1, sizeof out - 1);
    out[0] = (r >> 63) ? 'E' : 'R';
    return text(out, 1 + (got < len ? got : len));
}

Pair berm_tool_heap(void) {
    u64 n = put_u64(out, ecall2(HEAP_SIZE, 0, 0) + ecall2(ARGS_LEN, 0, 0));
    return text(out, n);
}

"""

TOOLS = ("scribble", "token", "held", "spin", "fail", "log", "cap", "heap")


@pytest.fixture(scope="module")
def elf():
    return raw_harness_elf(SOURCE, TOOLS)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(cache_dir=tmp_path_factory.mktemp("cache"), deadline=2.0)


def test_tools_and_manifest(engine, elf):
    image = engine.load(elf)
    assert engine.load(elf) is image  # the same bytes load once
    assert image.manifest is not None and image.digest == image.program.image.sha256
    h = image.harness(name="t")
    assert h.tools == TOOLS
    with pytest.raises(HostError, match="no tool"):
        h.call("nope")


def test_memory_is_fresh_for_every_invocation(engine, elf):
    h = engine.load(elf).harness()
    for _ in range(5):
        assert h.call("scribble") == "0"


def test_fresh_memory_after_a_trap(engine, elf):
    h = engine.load(elf).harness()
    h.call("scribble")
    with pytest.raises(Trap) as info:
        ends_within(GRACE, lambda: h.call("spin"))
    assert info.value.kind is TrapKind.INTERRUPTED
    assert h.call("scribble") == "0"


def test_failure_last_call_wins(engine, elf):
    with pytest.raises(ToolFailure) as info:
        engine.load(elf).harness().call("fail")
    assert info.value.message == "second" and info.value.tool == "fail"


def test_log_reaches_the_engine_sink(tmp_path, elf):
    lines = []
    h = Engine(cache_dir=tmp_path, log=lambda name, line: lines.append((name, line))).load(elf).harness(name="lg")
    assert h.call("log") == "logged"
    assert lines == [("lg", b"hello log")]


def test_capability_reply_error_and_bug(engine, elf):
    def fs_read(request: bytes) -> bytes:
        if request == b"missing":
            raise CapabilityError("no such file")
        if request == b"bug":
            raise RuntimeError("capability bug")
        return b"content of " + request

    h = engine.load(elf).harness(Linker(), name="c")
    with pytest.raises(Trap, match="berm.fs.read, not granted"):
        h.call("cap", "x")
    linker = Linker()
    linker.define("berm.fs.read", fs_read)
    h = engine.load(elf).harness(linker)
    assert h.call("cap", "a.txt") == "Rcontent of a.txt"
    assert h.call("cap", "missing") == "Eno such file"
    with pytest.raises(Trap) as info:
        h.call("cap", "bug")
    assert info.value.kind is TrapKind.HOST_CALL_FAILED and "capability bug" in str(info.value)
    assert info.value.addr == fnv1a64("berm.fs.read")
    assert ERROR_BIT == 1 << 63


def test_heap_and_args(engine, elf):
    image = engine.load(elf)
    lay = image.backend.layout
    assert image.harness().call("heap", "abc") == str(lay.heap_size + 3)


def test_concurrent_invocations_do_not_share_memory(engine, elf):
    h = engine.load(elf).harness()
    results: dict[int, str] = {}

    def worker(k: int) -> None:
        for i in range(6):
            token = str(1000 * k + i)
            results[1000 * k + i] = h.call("token", token)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {key: str(key) for key in results} and len(results) == 24


def test_invocations_inside_guest_code_at_once_each_keep_their_own_memory(tmp_path, elf):
    """The test above proves separate memories only if invocations overlap (a review): here each waits inside its
    guest, in a capability, until all four are there (a barrier that breaks, failing the test, if they ran one
    after the other), then returns the token its .bss kept meanwhile."""
    arrived = threading.Barrier(4, timeout=30)

    def wait_for_the_others(request: bytes) -> bytes:
        arrived.wait()
        return b""

    linker = Linker()
    linker.define("berm.fs.read", wait_for_the_others)
    h = Engine(cache_dir=tmp_path, deadline=60.0).load(elf).harness(linker)
    results: dict[str, str] = {}
    threads = [threading.Thread(target=lambda k=k: results.setdefault(str(k), h.call("held", str(k))))
               for k in range(1000, 1004)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {str(k): str(k) for k in range(1000, 1004)} and not arrived.broken


def test_guest_code_runs_without_the_gil(tmp_path, elf):
    """While one thread's guest spins (until its deadline), this thread keeps running Python."""
    started, done = threading.Event(), threading.Event()
    engine = Engine(cache_dir=tmp_path, deadline=2.0, log=lambda name, line: started.set())
    h = engine.load(elf).harness()

    def spin() -> None:
        with pytest.raises(Trap):
            h.call("spin")  # logs (the guest is running), then spins until the deadline
        done.set()

    t = threading.Thread(target=spin)
    t.start()
    started.wait()
    time.sleep(0.1)  # waking from this needs the GIL back while the guest still spins
    progress = sum(range(200_000))  # Python work that needs the GIL
    assert progress and not done.is_set()
    t.join()
    assert done.is_set()


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match="power of two"):
        Engine(memory_size=3 << 20)
    with pytest.raises(ValueError, match="kind"):
        Engine(kind="jit")
    # found by a review: jobs went unchecked until the first compile (a TypeError deep in it), and an infinite
    # deadline turned the watchdog off
    for jobs in ("2", -3, 0, 2.5, True):
        with pytest.raises(ValueError, match="jobs must be"):
            Engine(jobs=jobs)
    for deadline in (float("inf"), float("nan"), 1e300, 0, -1.0, "60", True):
        with pytest.raises(ValueError, match=r"deadline must be a number of seconds in \(0, 86400\]"):
            Engine(deadline=deadline)
    # found by a review: a float memory size was a TypeError, "" a code cache in the current directory, and a log
    # that is no function was taken, and raised TypeError when a harness was made
    with pytest.raises(ValueError, match="power of two"):
        Engine(memory_size=65536.0)
    with pytest.raises(ValueError, match="cache directory is empty"):
        Engine(cache_dir="")
    with pytest.raises(ValueError, match="log must be a callable"):
        Engine(log=5)


@pytest.mark.parametrize("setting, value", [("deadline", 0), ("max_result", 2), ("memory_size", 1 << 16),
                                            ("kind", "interp")])
def test_an_engines_settings_are_fixed_once_it_is_made(engine, setting, value):
    """Found by a review: they were plain attributes, checked only when the engine was made; a deadline set to 0
    afterwards let a spinning guest run for ever on translated code (the core reads 0 as no deadline), and a result
    cap set between a load and a harness held on one engine and not on the other."""
    before = getattr(engine, setting)
    with pytest.raises(AttributeError):
        setattr(engine, setting, value)
    assert getattr(engine, setting) == before


def test_a_caller_deadline_that_is_not_a_number_is_refused(engine, elf):
    """Found by a review: min() ignores a nan, so a nan deadline silently ran to the engine's own."""
    h = engine.load(elf).harness()
    with pytest.raises(ValueError, match="nan"):
        h.call("log", deadline=float("nan"))
    # found by a review: True was read as the instant 1.0, a string and a huge int raised TypeError and
    # OverflowError, and a tool name that cannot be a key TypeError
    for deadline in (True, "5", 10**400):
        with pytest.raises(ValueError, match="the deadline must be a time.monotonic"):
            h.call("log", deadline=deadline)
    with pytest.raises(HostError, match=r"has no tool \['log'\]"):
        h.call(["log"])
    assert h.call("log", deadline=float("inf")) == "logged"  # no deadline of its own: the engine's


def test_deadline_still_fires_in_a_forked_child(engine, elf):
    """A forked child inherits no threads: the watchdog must start again there, or a spinning guest hangs."""
    h = engine.load(elf).harness()
    assert h.call("scribble") == "0"  # the watchdog is running in this process
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the guest was interrupted
        code = 1
        try:
            h.call("spin")
        except Trap as exc:
            code = 0 if exc.kind is TrapKind.INTERRUPTED else 2
        finally:
            os._exit(code)
    for _ in range(600):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's guest was never interrupted")


def test_a_large_bss_costs_nothing_and_is_fresh(tmp_path):
    """32 MiB of .bss: loading does not materialise it, and writes to it do not survive an invocation."""
    source = r"""
    typedef unsigned long u64;
    typedef struct { u64 ptr, len; } Pair;
    static volatile char big[32 << 20];
    static char out[2];
    Pair berm_tool_touch(void) {
        out[0] = '0' + (big[0] != 0) + (big[sizeof big - 1] != 0);
        big[0] = 1; big[sizeof big - 1] = 1;
        Pair p = { (u64)out, 1 }; return p;
    }
    __attribute__((section(".berm.abi"), used, retain)) static const char manifest[] = MANIFEST;
    void _start(void) {}
    """
    manifest = json.dumps({"abi_version": 0, "tools": [{"name": "touch", "description": "", "parameters": {}}]})
    elf = guest_elf(source.replace("MANIFEST", json.dumps(manifest)), keep=("berm_tool_touch",))
    image = Engine(cache_dir=tmp_path).load(elf)
    assert len(image.backend.memory._keep) < 1 << 20  # the pristine copy holds file bytes only
    h = image.harness()
    assert [h.call("touch") for _ in range(3)] == ["0", "0", "0"]


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("ahead", [0.2, -1.0], ids=["soon", "already-past"])
def test_a_caller_deadline_shortens_the_engine_deadline(tmp_path, elf, kind, ahead):
    """The queue passes its own deadline; it must win over a far engine deadline, even when already past (a
    non-positive timeout must never read as "no deadline"). The engine alone would let the guest spin 10 min."""
    h = Engine(kind=kind, cache_dir=tmp_path, deadline=600.0).load(elf).harness()
    with pytest.raises(Trap) as trap:  # a hang guard, not a measurement: without it the guest spins for 600 s
        ends_within(GRACE, lambda: h.call("spin", deadline=time.monotonic() + ahead))
    assert trap.value.kind is TrapKind.INTERRUPTED


def test_an_image_without_lifecycle_exports_cannot_be_entered(engine, elf):
    h = engine.load(elf).harness()
    assert h.exports == frozenset()
    with pytest.raises(HostError, match="does not export on_wake"):
        h.enter("on_wake", b"{}")


def test_a_load_that_compiles_says_so_first(tmp_path, elf):
    """The first load of a large image takes minutes (a Rust debug build: 91 s of silence in ``berm call``):
    ``on_compile`` hears what is compiled before a cache miss compiles, and nothing on a hit."""
    said = []
    Engine(cache_dir=tmp_path, on_compile=said.append).load(elf)
    assert len(said) == 1 and said[0].startswith("translating and compiling ") and "KB of guest code" in said[0]
    Engine(cache_dir=tmp_path, on_compile=said.append).load(elf)
    assert len(said) == 1
