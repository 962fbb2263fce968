"""The core's invocation entry (core.c, berm_run) on both engines: every integer argument an invocation passes
reaches its register, and a deadline that has passed before the run starts still interrupts it."""

from __future__ import annotations

import time

import pytest

from berm_host.backend import RunRequest
from berm_host.traps import TrapKind
from tests.edge_runs import both_engines
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long u64;
/* keep: a call, so the image carries the relocations the host needs */
__attribute__((noinline)) u64 keep(u64 x) { return x + 1; }
/* n trips of a loop (2^32: seconds), unless interrupted */
u64 spin(u64 n) {
    u64 s = 0;
    for (u64 i = 0; i < n; i++) { s += i ^ (s >> 3); __asm__ volatile("" : "+r"(s)); }
    return keep(s);
}
/* Each argument at its own weight, so a dropped or misplaced one changes the sum. */
u64 args8(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h) {
    return keep(a + (b << 4) + (c << 8) + (d << 12) + (e << 16) + (f << 20) + (g << 24) + (h << 28)) - 1;
}
"""


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return both_engines(guest_elf(SOURCE, keep=("args8", "spin")), tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("kind", ["aot", "interp"])
@pytest.mark.parametrize("n", [1, 7, 8])
def test_every_integer_argument_reaches_its_register(engines, kind, n):
    symbols, _, backends = engines
    args = tuple(range(1, n + 1))
    result = backends[kind].run(RunRequest(entry=symbols["args8"], int_args=args))
    assert result.trap is None
    assert result.a0 == sum(v << (4 * i) for i, v in enumerate(args))


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_deadline_already_past_interrupts_the_run(engines, kind):
    """The backend turns the request's deadline into a timeout from now: one already past is the shortest timeout,
    never 0 or less, which the core reads as no deadline (the run went on to its end)."""
    symbols, _, backends = engines
    result = backends[kind].run(RunRequest(entry=symbols["spin"], int_args=(1 << 32,),
                                           deadline=time.monotonic() - 1.0))
    assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED
