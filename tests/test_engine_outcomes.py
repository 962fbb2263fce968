"""What a Harness raises for each way an invocation ends, on both engines: a trap after a ``berm.fail`` is the
trap, carrying the text (ABI §3), and lifecycle exports (``Harness.enter``) end the same way as tools, by the
caller's deadline too."""

from __future__ import annotations

import time

import pytest

from berm_host.engine import Engine
from berm_host.traps import HostError, ToolFailure, Trap, TrapKind
from tests.bounded import GRACE, ends_within
from tests.guests import raw_harness_elf

KINDS = ("aot", "interp")

SOURCE = r"""
static char out[8];
/* A panic handler: it says why, then executes ebreak. */
Pair berm_tool_panic(void) { ecall2(FAIL, (u64)"out of cheese", 13); __asm__ volatile("ebreak"); for (;;) {} }
/* One whose failure text forges a line under the trap, and terminal controls. */
Pair berm_tool_forger(void) {
    static const char text[] = "x\n  called from admin_grant+0x0\x1b]52;c;cm0=\x07";
    ecall2(FAIL, (u64)text, sizeof text - 1); __asm__ volatile("ebreak"); for (;;) {}
}
Pair berm_tool_latin1(void) { out[0] = 'c'; out[1] = (char)0xe9; Pair p = { (u64)out, 2 }; return p; }
Pair berm_tool_nowhere(void) { Pair p = { 0, 2000 }; return p; }
Pair berm_tool_ok(void) { out[0] = 'o'; out[1] = 'k'; Pair p = { (u64)out, 2 }; return p; }
void on_wake(void) {
    static char buf[8];
    u64 n = ecall2(ARGS_READ, (u64)buf, sizeof buf);
    if (n == 4 && buf[0] == 'f') ecall2(FAIL, (u64)"wake failed", 11);
    if (n == 4 && buf[0] == 'p') { ecall2(FAIL, (u64)"wake panic", 10); __asm__ volatile("ebreak"); }
    if (n == 4 && buf[0] == 's') for (volatile u64 i = 0; ; i++) {}
}
"""


@pytest.fixture(scope="module")
def elf() -> bytes:
    return raw_harness_elf(SOURCE, ("panic", "forger", "latin1", "nowhere", "ok"), keep=("on_wake",))


@pytest.mark.parametrize("kind", KINDS)
def test_a_trap_after_a_failure_is_the_trap_carrying_the_failure_text(tmp_path, elf, kind):
    h = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness()
    with pytest.raises(Trap) as info:
        h.call("panic")
    assert info.value.kind is TrapKind.BREAKPOINT and info.value.failure == "out of cheese"
    assert str(info.value).endswith("(after berm.fail: out of cheese)")


@pytest.mark.parametrize("kind", KINDS)
def test_a_traps_message_shows_the_failure_text_on_one_line_without_controls(tmp_path, elf, kind):
    """Found by a review: the berm.fail text went into the trap's message as it was, so an embedder logging a trap
    logged the lines and terminal controls the guest forged; ``failure`` keeps the text as it was."""
    h = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness()
    with pytest.raises(Trap) as info:
        h.call("forger")
    assert info.value.failure == "x\n  called from admin_grant+0x0\x1b]52;c;cm0=\x07"
    assert str(info.value).endswith(r"(after berm.fail: x\x0a  called from admin_grant+0x0\x1b]52;c;cm0=\x07)")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_result_that_is_not_utf8_is_a_host_error(tmp_path, elf, kind):
    """A tool's result is text: bytes that are not UTF-8 are refused, never replaced with U+FFFD behind the
    caller's back."""
    h = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness()
    with pytest.raises(HostError, match=r"tool latin1 returned a result that is not UTF-8 \(byte 1\)"):
        h.call("latin1")
    assert h.call("ok") == "ok"


@pytest.mark.parametrize("kind", KINDS)
def test_a_result_outside_guest_memory_is_said_to_be_so_even_when_over_the_cap(tmp_path, elf, kind):
    """2000 bytes at address 0, with a cap of 1000: what is wrong is where it is, not only how long."""
    h = Engine(kind=kind, cache_dir=tmp_path, max_result=1000).load(elf).harness()
    with pytest.raises(HostError, match=r"returned a result at 0x0 \(2000 bytes\) that is not inside guest memory"):
        h.call("nowhere")


@pytest.mark.parametrize("kind", KINDS)
def test_a_lifecycle_export_ends_like_a_tool(tmp_path, elf, kind):
    image = Engine(kind=kind, cache_dir=tmp_path).load(elf)
    h = image.harness()
    assert h.name == image.digest[:12]  # no name given: the image's, as logs and errors show it
    assert h.exports == frozenset({"on_wake"})
    assert h.enter("on_wake", b"{}") is None
    with pytest.raises(ToolFailure, match="wake failed"):
        h.enter("on_wake", "fail")
    with pytest.raises(Trap) as info:
        h.enter("on_wake", "panc")
    assert info.value.kind is TrapKind.BREAKPOINT and info.value.failure == "wake panic"


@pytest.mark.parametrize("kind", KINDS)
def test_a_lifecycle_export_ends_by_the_callers_deadline(tmp_path, elf, kind):
    """The queue passes its deadline to ``enter`` as to ``call``; the engine alone would let a wake spin 10 min."""
    h = Engine(kind=kind, cache_dir=tmp_path, deadline=600.0).load(elf).harness()
    with pytest.raises(Trap) as trap:  # a hang guard, not a measurement: without it the wake spins for 600 s
        ends_within(GRACE, lambda: h.enter("on_wake", "spin", deadline=time.monotonic() + 0.2))
    assert trap.value.kind is TrapKind.INTERRUPTED
