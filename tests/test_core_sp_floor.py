"""The stack-exhausted trap of an instruction that moves sp below the stack window (berm_code.h, BERM_SP_WRITE;
SEMANTICS.md): exact at the window's lowest byte on both engines — sp may reach it, one doubleword below traps at
that instruction with the value sp would have had as the address."""

from __future__ import annotations

import pytest

from berm_host.backend import RunRequest
from berm_host.layout import SP_BELOW_STACK
from berm_host.traps import TrapKind
from tests.edge_runs import LOW, TOP, both_engines, outcome
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf

#: sink(d): sp -= d, then back; the tail call into another section gives the image a relocation, as the
#: host needs.
SOURCE = ASM_PRELUDE + r"""
    .globl sink
    .type sink, @function
sink:
    sub sp, sp, a0
    add sp, sp, a0
    tail back
    .section .text.back, "ax", @progbits
    .type back, @function
back:
    li a0, 7
    ret
"""

ENTRY_SP = TOP - 16  # core.c, berm_run


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return both_engines(guest_elf(SOURCE, suffix=".S", keep=("sink", "back")), tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("below", [0, 8, 16, 4096])
def test_sp_below_the_stack_traps_at_its_first_byte(engines, below):
    symbols, _, backends = engines
    request = RunRequest(entry=symbols["sink"], int_args=(ENTRY_SP - LOW + below,))
    results = {kind: backend.run(request) for kind, backend in backends.items()}
    assert outcome(results["aot"]) == outcome(results["interp"])
    result = results["aot"]
    if below == 0:
        assert result.trap is None and result.a0 == 7
    else:
        trap = result.trap
        assert (trap.kind, trap.pc, trap.addr) == (TrapKind.STACK_EXHAUSTED, symbols["sink"], LOW - below)
        assert trap.detail == SP_BELOW_STACK
        assert result.regs[2] == ENTRY_SP  # sp as it was before the instruction
