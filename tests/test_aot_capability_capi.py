"""The translated engine calls each region's Python host-call server through the CPython C API: capability
errors come back as error replies, unreadable buffers as traps naming the call, and whatever the server itself does
wrong (a result that is not a uint64, an exception escaping it, even one whose message cannot be
read) becomes the host-call-failed trap naming the ecall; a region only borrows it, so a harness whose
capabilities refer back to it is freed. Regions of
one image serve capabilities from several threads at once, each callback in its own region."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from berm_abi.names import fnv1a64
from berm_host import linker as linker_mod
from berm_host.aot import runtime
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.linker import CapabilityError
from berm_host.traps import Trap, TrapKind
from tests.guests import raw_harness_elf

SOURCE = r"""
static char args[64];
static char out[256];
/* Send the arguments to the echo capability and return its reply. */
Pair berm_tool_echo(void) {
    u64 n = ecall2(ARGS_READ, (u64)args, sizeof args);
    ecall2(ECHO, (u64)args, n);
    u64 got = ecall2(RESULT_READ, (u64)out, sizeof out);
    return (Pair){ (u64)out, got < sizeof out ? got : sizeof out };
}
/* The refuse capability's reply behind "E" when it came with the error bit, else behind "R". */
Pair berm_tool_refuse(void) {
    u64 n = ecall2(ARGS_READ, (u64)args, sizeof args);
    u64 ret = ecall2(REFUSE, (u64)args, n);
    out[0] = ret >> 63 ? 'E' : 'R';
    u64 got = ecall2(RESULT_READ, (u64)out + 1, sizeof out - 1);
    return (Pair){ (u64)out, 1 + (got < sizeof out - 1 ? got : sizeof out - 1) };
}
/* berm.log or the echo capability (args[0] 'l' or 'e') with a buffer outside guest memory. */
Pair berm_tool_unreadable(void) {
    ecall2(ARGS_READ, (u64)args, sizeof args);
    ecall2(args[0] == 'l' ? LOG : ECHO, 8, 5);
    return (Pair){ 0, 0 };
}
"""
ECHO = fnv1a64("test.echo")
REFUSE = fnv1a64("test.refuse")


@pytest.fixture(scope="module")
def elf() -> bytes:
    return raw_harness_elf(SOURCE, ("echo", "refuse", "unreadable"), {"ECHO": ECHO, "REFUSE": REFUSE})


def _refuse(request: bytes) -> bytes:
    if request.startswith(b"ok"):
        return bytearray(request)  # converted to bytes before it is staged
    if request.startswith(b"int"):
        return 7  # type: ignore[return-value] - a capability bug: a trap, not a reply
    raise CapabilityError(f"refused {request.decode()}")


def _harness(elf: bytes, cache_dir):
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"<" + request + b">")
    link.define("test.refuse", _refuse)
    return Engine(cache_dir=cache_dir).load(elf).harness(link)


def test_capability_errors_and_replies_of_other_types(tmp_path, elf):
    harness = _harness(elf, tmp_path)
    assert harness.call("refuse", "this") == "Erefused this"
    assert harness.call("refuse", "ok then") == "Rok then"
    with pytest.raises(Trap) as info:
        harness.call("refuse", "int")
    trap = info.value.info
    assert trap.kind is TrapKind.HOST_CALL_FAILED and trap.addr == REFUSE
    assert trap.detail == "test.refuse: TypeError: returned int, not bytes"
    assert harness.call("echo", "x" * 40) == "<" + "x" * 40 + ">"  # then a longer reply than the error's


@pytest.mark.parametrize("which, call", [("l", "berm.log"), ("e", "test.echo")])
def test_an_unreadable_buffer_is_a_trap_naming_the_call(tmp_path, elf, which, call):
    with pytest.raises(Trap) as info:
        _harness(elf, tmp_path).call("unreadable", which)
    trap = info.value.info
    assert trap.kind is TrapKind.HOST_CALL_FAILED and trap.addr == 8
    assert trap.detail == f"{call}: the buffer at 0x8 (5 bytes) is not readable guest memory"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message either")


class Escape(BaseException):
    pass


def _return_text(self, number, request):
    return "not a number"


def _return_negative(self, number, request):
    return -1


def _raise_unprintable(self, number, request):
    raise Unprintable


def _raise_escape(self, number, request):
    raise Escape("out of the server")


def _raise_long_text(self, number, request):
    raise ValueError("xx" + "é" * 150)  # the core keeps 199 bytes of "ValueError: xx...": it cuts an é in two


@pytest.mark.parametrize("serve, detail", [
    (_return_text, "TypeError: "),
    (_return_negative, "OverflowError: "),
    (_raise_unprintable, "Unprintable: (its message could not be read)"),
    (_raise_long_text, "ValueError: xx" + "é" * 92 + "\ufffd"),
])
def test_a_broken_server_is_a_host_call_failed_trap(monkeypatch, tmp_path, elf, serve, detail):
    monkeypatch.setattr(runtime.HostCalls, "serve", serve)  # regions made from here on are served by it
    harness = _harness(elf, tmp_path)
    with pytest.raises(Trap) as info:
        harness.call("echo", "hi")
    trap = info.value.info
    assert trap.kind is TrapKind.HOST_CALL_FAILED and trap.addr == ECHO and trap.pc != 0
    assert trap.detail.startswith(detail)


def _return_a_length(self, number, request):
    return 100_000 if number == ECHO else 0  # as if it had staged a 100,000-byte reply: it staged nothing


def test_a_server_returning_a_length_it_did_not_stage_leaves_nothing_to_read(monkeypatch, tmp_path, elf):
    """berm.result.read copies only what the core staged itself. A server's integer is the guest's a0, never a
    length to read: taken as one, it read 100,000 bytes from an empty staging buffer (the host crashed)."""
    monkeypatch.setattr(runtime.HostCalls, "serve", _return_a_length)
    assert _harness(elf, tmp_path).call("echo", "hi") == ""


def test_a_base_exception_out_of_the_server_is_raised_after_the_run(monkeypatch, tmp_path, elf):
    """A KeyboardInterrupt from a signal handler is raised as the server is entered, before its own handler can
    catch it: the core made it a trap and dropped it (a review: Ctrl-C lost in 197 of 200 runs of a guest calling
    capabilities). It ends the run and is raised after it, as the interpreter lets it through."""
    monkeypatch.setattr(runtime.HostCalls, "serve", _raise_escape)
    with pytest.raises(Escape, match="out of the server"):
        _harness(elf, tmp_path).call("echo", "a")


def test_regions_serve_again_after_a_broken_server_trapped(monkeypatch, tmp_path, elf):
    monkeypatch.setattr(runtime.HostCalls, "serve", _return_text)
    with pytest.raises(Trap):
        _harness(elf, tmp_path).call("echo", "a")
    monkeypatch.undo()
    assert _harness(elf, tmp_path).call("echo", "b") == "<b>"


class _Owner:
    """An embedder's object that owns a harness and logs through a method of its own: the region's log sink then
    refers back to the harness that owns the region."""

    def __init__(self, elf: bytes, cache_dir):
        link = linker_mod.Linker()
        link.define("test.echo", self.echo)
        self.harness = Engine(cache_dir=cache_dir, log=self.log).load(elf).harness(link)
        self.lines: list[bytes] = []

    def echo(self, request: bytes) -> bytes:
        return b"<" + request + b">"

    def log(self, name: str, line: bytes) -> None:
        self.lines.append(line)


def test_a_harness_whose_capabilities_refer_back_to_it_is_freed_with_its_regions(tmp_path, elf):
    """A region took a strong reference to its server, which C keeps out of the garbage collector's sight: through
    the linker or log sink a cycle back to the harness kept every region of the image mapped (64 MiB of address
    space, a 4 MiB native stack) for the life of the process."""
    owner = _Owner(elf, tmp_path)
    assert owner.harness.call("echo", "x") == "<x>"
    regions = [weakref.ref(r) for r in owner.harness.image.backend.memory.pool]
    assert regions
    del owner
    gc.collect()
    assert [r() for r in regions] == [None] * len(regions)


@pytest.mark.parametrize("size, kept", [(1000, True), (int(runtime.lib.BERM_STAGE_KEEP) + 1, False)])
def test_a_large_reply_is_not_kept_by_an_idle_region(tmp_path, elf, size, kept):
    """A reply over BERM_STAGE_KEEP stayed in its region's staging buffer after the run (up to 16 pooled regions
    per image, each pinning the largest reply it ever pulled); a small one keeps its buffer for the next."""
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: b"r" * size)
    harness = Engine(cache_dir=tmp_path).load(elf).harness(link)
    assert harness.call("echo", "x") == "r" * 256
    region = harness.image.backend.memory.pool[-1]
    assert (region.ptr.staged_cap >= size) if kept else region.ptr.staged_cap == 0


def _interrupted(request: bytes) -> bytes:
    if request == b"stop":
        raise KeyboardInterrupt
    return b"<" + request + b">"


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_keyboard_interrupt_in_a_capability_reaches_the_caller(tmp_path, elf, kind):
    """Ctrl-C while Python served a host call became a guest trap on translated code (the interpreter lets it
    through): the run still ends in a trap, then the interrupt is raised to whoever called the tool."""
    link = linker_mod.Linker()
    link.define("test.echo", _interrupted)
    harness = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness(link)
    with pytest.raises(KeyboardInterrupt):
        harness.call("echo", "stop")
    assert harness.call("echo", "go") == "<go>"
    with pytest.raises(KeyboardInterrupt):
        harness.image.backend.run(RunRequest(entry=harness._entries["echo"], args=b"stop", linker=link))


def test_a_capability_that_blocks_past_the_deadline_is_the_interrupt_at_its_ecall_on_both_engines(tmp_path, elf):
    """The interpreter looked at the clock only every 4096 instructions and translated code at its next poll: a
    guest that returned soon after a capability that outlasted the deadline got its result on one engine and the
    interrupt on the other (or on neither)."""
    link = linker_mod.Linker()
    link.define("test.echo", lambda request: time.sleep(0.3) or b"late")
    traps = []
    for kind in ("aot", "interp"):
        harness = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness(link)
        with pytest.raises(Trap) as info:
            harness.call("echo", "x", deadline=time.monotonic() + 0.1)
        traps.append(info.value.info)
    assert [t.kind for t in traps] == [TrapKind.INTERRUPTED] * 2
    assert traps[0].pc == traps[1].pc and traps[0].where == traps[1].where


def test_threads_each_served_in_their_own_region(tmp_path, elf):
    harness = _harness(elf, tmp_path)
    results: dict[int, list[str]] = {}

    def work(t: int) -> None:
        results[t] = [harness.call("echo", f"{t}.{i}") for i in range(200)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {t: [f"<{t}.{i}>" for i in range(200)] for t in range(4)}
