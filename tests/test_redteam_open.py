"""Red team findings that are still open: each test fails because of a real bug and is its regression test.

Each docstring says what is wrong, where, and what the fix is. Move a test to tests/test_redteam_guests.py once
it passes.
"""

from __future__ import annotations

from berm_abi.names import core_number, fnv1a64
from berm_host.traps import TrapKind
from tests.test_redteam_guests import ECHO, both, cache_dir, images  # noqa: F401 - fixtures


def test_falling_through_into_the_middle_of_the_next_function(images):
    """``overlap`` (a0 = 1) runs a 4-byte instruction that straddles the start of the next function (the start is
    there because ``overlap_mid`` jumps to that address), so it falls through to the *middle* of that function.
    The interpreter continues there (it is code, SEMANTICS "fall-through off the end of a function into the next");
    the translated code traps "illegal instruction": berm_aot/emit/function.py ``_leave_to`` only knows local
    labels and function starts. Fix: in Program._close_starts, make the fall-through address of an instruction
    that ends inside another function a function start (then both engines agree and ``_leave_to`` tail-transfers)."""
    r = both(images, "overlap", 1)
    assert r.trap is None and r.a0 == 1 + 0x451  # the straddling addi a0, a0, 0x451, then the ret after it


def test_buffer_trap_details_agree_at_address_zero(images):
    """The translated runtime words a host-call buffer at address 0 as "the buffer at 0 (8 bytes)", the
    interpreter (and the Python half of the AOT runtime) as "the buffer at 0x0 (8 bytes)": berm_host/aot/core.c
    ``buffer_trap`` formats with ``%#llx``, which prints no 0x for zero. Fix: format with ``0x%llx``."""
    for call in ("berm.args.read", "berm.fail"):
        r = both(images, "hc", core_number(call), 0, 8, blob=b"12345678")
        assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "at 0x0 (8 bytes)" in r.trap.detail
    r = both(images, "stage_then_read", fnv1a64(ECHO), 0, 8)
    assert r.trap.kind is TrapKind.HOST_CALL_FAILED and "at 0x0 (8 bytes)" in r.trap.detail


def test_tool_arguments_that_are_not_utf8_text_are_a_clear_error(cache_dir):
    """``Harness.call(tool, str)`` with a lone surrogate (what ``json.loads`` makes of ``"\\udcff"``, or argv
    decoded with surrogateescape) raises a raw UnicodeEncodeError from the public entry point:
    berm_host/engine.py ``Harness.call`` does ``args.encode("utf-8")`` unguarded. Fix: turn it into a HostError
    ("tool arguments are not valid UTF-8 text: …")."""
    from berm_abi.errors import BermError
    from tests.test_redteam_guests import load
    for kind in ("aot", "interp"):
        harness = load(kind, cache_dir).harness(name="args")
        try:
            harness.call("reverse", '"\udcff"')
        except BermError:
            continue
        except Exception as exc:  # noqa: BLE001 - the finding
            raise AssertionError(f"{kind}: {type(exc).__name__}: {exc}") from None
        raise AssertionError(f"{kind}: a lone surrogate went through as arguments")
