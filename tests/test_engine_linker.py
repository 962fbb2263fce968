"""The linker as the capability set a guest sees, on both engines: core host calls cannot be taken over by a
capability, defining a name again replaces what it serves, and membership and listing are by name."""

from __future__ import annotations

import pytest

from berm_abi.names import fnv1a64
from berm_host.engine import Engine
from berm_host.linker import Capability, Linker
from berm_host.traps import Trap, TrapKind
from tests.guests import capability_relay_elf

KINDS = ("aot", "interp")


@pytest.fixture(scope="module")
def elf() -> bytes:
    return capability_relay_elf()


@pytest.mark.parametrize("name", ["berm.log", "berm.fail", "berm.args.read", "berm.result.read"])
def test_a_core_host_call_cannot_be_defined_as_a_capability(name):
    """The engine serves core calls itself: a capability of the same name would never be called on one engine
    and would shadow the core call on another."""
    linker = Linker()
    with pytest.raises(ValueError, match=f"{name} is a core host call"):
        linker.define(name, lambda request: b"")
    with pytest.raises(ValueError, match="core host call"):
        Linker([Capability(name, lambda request: b"")])
    assert linker.names() == [] and name not in linker


@pytest.mark.parametrize("kind", KINDS)
def test_defining_a_capability_again_replaces_it(tmp_path, elf, kind):
    linker = Linker()
    linker.define("x.cap", lambda request: b"first " + request)
    h = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness(linker)
    assert h.call("cap", "a") == "first a"
    linker.define("x.cap", lambda request: b"second " + request)
    assert h.call("cap", "b") == "second b"
    assert linker.names() == ["x.cap"] and "x.cap" in linker and "x.other" not in linker


def test_names_and_iteration_are_sorted_by_name():
    linker = Linker([Capability(n, lambda request: b"") for n in ("x.zeta", "x.alpha", "x.mid")])
    assert linker.names() == ["x.alpha", "x.mid", "x.zeta"]
    assert [c.name for c in linker] == ["x.alpha", "x.mid", "x.zeta"]
    assert linker.lookup(fnv1a64("x.mid")).name == "x.mid" and linker.lookup(fnv1a64("x.none")) is None


class _BrokenLookup(Linker):
    def __init__(self, problem: str):
        super().__init__()
        self.define("x.cap", lambda request: b"")
        self.problem = problem

    def lookup(self, number):
        if self.problem == "raises":
            raise KeyError("boom")
        return "not a capability"


@pytest.mark.parametrize("problem, detail", [("raises", "KeyError: 'boom'"),
                                             ("returns", "AttributeError: 'str' object has no attribute 'name'")])
@pytest.mark.parametrize("kind", KINDS)
def test_a_linkers_lookup_that_fails_is_a_host_call_trap_on_both_engines(tmp_path, elf, kind, problem, detail):
    """Found by a review: a Linker subclass whose lookup raised (or returned what is no Capability) trapped on
    translated code, and on the interpreter its exception escaped Harness.call."""
    h = Engine(kind=kind, cache_dir=tmp_path).load(elf).harness(_BrokenLookup(problem))
    with pytest.raises(Trap) as info:
        h.call("cap", "a")
    assert info.value.kind is TrapKind.HOST_CALL_FAILED and detail in str(info.value)
