"""The harness fast path (berm_host/aot/invoke.c, ``run_text``): one CPython call that runs a tool and builds its
result text from guest memory. Whatever it cannot answer with a str it answers with berm_run's outcome, and
``Harness.call`` then takes the general path: every outcome must come out exactly as ``backend.run`` reports it."""

from __future__ import annotations

import pytest

from berm_host.aot.runtime import lib, run_text
from berm_host.engine import Engine
from berm_host.traps import HostError, ToolFailure, Trap, TrapKind
from tests.guests import raw_harness_elf

SOURCE = r"""
static const char hello[] = "h\xc3\xa9llo, w\xc3\xb6rld";
static const char broken[] = "ok\xff\xfe";
static Pair text(const char *s, u64 n) { Pair p = { (u64)s, n }; return p; }

Pair berm_tool_hello(void) { return text(hello, sizeof hello - 1); }
Pair berm_tool_empty(void) { return text(hello, 0); }
Pair berm_tool_broken(void) { return text(broken, sizeof broken - 1); }
Pair berm_tool_outside(void) { return text((const char *)0x10, 4); }
/* One byte outside: read unchecked, a byte of the null page, or far away, a crash of the host (a review's mutation
 * of the core's result check survived every test). */
Pair berm_tool_outside1(void) { return text((const char *)0x10, 1); }
Pair berm_tool_far1(void) { return text((const char *)0x4000000000000000ul, 1); }
Pair berm_tool_last1(void) { return text((const char *)~0ul, 1); }
Pair berm_tool_failing(void) { ecall2(FAIL, (u64)hello, 5); return text(hello, 1); }
Pair berm_tool_trapping(void) { return text(*(const char **)8, 1); }
/* The argument blob, echoed: the fast path must pass it whole. */
Pair berm_tool_echo(void) {
    u64 n = ecall2(ARGS_LEN, 0, 0);
    char *heap = (char *)ecall2(HEAP_START, 0, 0);
    ecall2(ARGS_READ, (u64)heap, n);
    return text(heap, n);
}
"""

TOOLS = ("hello", "empty", "broken", "outside", "outside1", "far1", "last1", "failing", "trapping", "echo")
OUTSIDE = ("outside", "outside1", "far1", "last1")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    elf = raw_harness_elf(SOURCE, TOOLS)
    return Engine(kind="aot", cache_dir=tmp_path_factory.mktemp("cache"), deadline=10.0).load(elf).harness()


def test_results_come_back_as_text(harness):
    assert harness.call("hello") == "héllo, wörld"
    assert harness.call("empty") == ""
    blob = "añb\0" * 300
    assert harness.call("echo", blob.encode()) == blob


def test_every_other_outcome_takes_the_general_path(harness):
    with pytest.raises(HostError, match="not UTF-8"):
        harness.call("broken")
    for tool in OUTSIDE:
        with pytest.raises(HostError, match="not inside guest memory"):
            harness.call(tool)
    with pytest.raises(ToolFailure, match="^héll$"):
        harness.call("failing")
    with pytest.raises(Trap) as info:
        harness.call("trapping")
    assert info.value.info.kind is TrapKind.MEMORY_FAULT
    assert harness.call("hello") == "héllo, wörld"  # and the pooled region still serves the next call


def test_run_text_answers_an_outcome_it_cannot_turn_into_text(harness):
    backend = harness.image.backend
    region = backend.memory.acquire()
    try:
        entry = harness._entries
        assert run_text(region.addr, entry["hello"], b"", 10.0) == "héllo, wörld"
        assert run_text(region.addr, entry["broken"], b"", 10.0) == lib.BERM_RUN_OK
        for tool in OUTSIDE:
            assert run_text(region.addr, entry[tool], b"", 10.0) == lib.BERM_RUN_BAD_RESULT
        assert run_text(region.addr, entry["failing"], b"", 10.0) == lib.BERM_RUN_FAILED
        assert run_text(region.addr, entry["trapping"], b"", 10.0) == lib.BERM_RUN_TRAPPED
    finally:
        backend.memory.release(region)


@pytest.mark.parametrize("args, error", [
    ((), TypeError),
    ((1, 2, b"", 1.0, 5), TypeError),
    ((0, 0, b"", 1.0), ValueError),  # a NULL region is refused, not dereferenced
    ((1, 0, "text", 1.0), TypeError),  # the blob must be bytes
    ((1, -1, b"", 1.0), OverflowError),
    ((1, 0, b"", "soon"), TypeError),
])
def test_run_text_refuses_bad_arguments_before_running_anything(args, error):
    with pytest.raises(error):
        run_text(*args)


def test_bind_refuses_a_core_of_another_layout_and_keeps_its_binding(harness):
    """A stale _invoke (built against an older berm_rt.h) would read a0, a1 and the memory pointer at the wrong
    offsets: binding it to a core whose layout differs is an ImportError, and the good binding stays."""
    from berm_host.aot import _invoke
    from berm_host.aot.runtime import ffi

    run = int(ffi.cast("uintptr_t", ffi.addressof(lib, "berm_run")))
    regs = ffi.offsetof("berm_region", "ctx") + ffi.offsetof("berm_ctx", "regs")
    mem = ffi.offsetof("berm_region", "ctx") + ffi.offsetof("berm_ctx", "mem")
    with pytest.raises(ImportError, match="another runtime layout"):
        _invoke.bind(run, regs + 8, mem)
    with pytest.raises(ImportError, match="another runtime layout"):
        _invoke.bind(run, regs, mem - 8)
    with pytest.raises(ValueError):
        _invoke.bind(0, regs, mem)
    assert harness.call("hello") == "héllo, wörld"
