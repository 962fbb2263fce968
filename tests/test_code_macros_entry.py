"""Function entry in translated code (berm_host/aot/berm_code.h, BERM_ENTRY): one compare of the host stack pointer
with ctx->native_limit, which an interrupt raises past every stack address, so that its slow path polls the
interrupt flag. A function with no backward branch and no call of itself is stopped there and nowhere else."""

from __future__ import annotations

from berm_abi.names import core_number
from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.aot.runtime import lib
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.traps import TrapKind
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf

#: outer logs (the host interrupts the run then), then calls leaf, which has no loop and calls nothing: only leaf's
#: entry can notice the interrupt before outer returns.
INTERRUPTED_BEFORE_A_CALL = ASM_PRELUDE + r"""
    .globl outer
    .type outer, @function
outer:
    addi sp, sp, -16
    sd ra, 8(sp)
    mv a0, sp
    li a1, 1
    li a7, %d
    ecall
    li a0, 5
    jal ra, leaf
.Llink:
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
    .globl leaf
    .type leaf, @function
leaf:
    addi a0, a0, 1
    ret
""" % core_number("berm.log")


def test_an_interrupt_is_seen_at_the_entry_of_a_function_without_loops(tmp_path):
    """A mutation review: BERM_ENTRY's slow path without its poll, or its one compare made with native_floor
    instead of native_limit, passed every test (their guests that never loop call themselves, which BERM_SELF_CALL
    polls): the run went on to return 6. The trap is at leaf's first
    instruction, the call having run (ra holds its link); the host's log callback interrupts, so the moment is
    exact."""
    elf = guest_elf(INTERRUPTED_BEFORE_A_CALL, suffix=".S", keep=("outer", "leaf"))
    program = Program.from_image(read_elf(elf))
    regions = []

    def interrupt(*_):
        lib.berm_interrupt(regions[0].ptr, regions[0].ptr.generation)

    backend = Engine(kind="aot", cache_dir=tmp_path).load(elf).backend
    outer, leaf = program.symbol("outer"), program.symbol("leaf")
    assert backend.run(RunRequest(entry=outer, int_args=(0,))).a0 == 6  # makes the region the next run uses
    regions.append(backend.memory.pool[-1])
    result = backend.run(RunRequest(entry=outer, int_args=(0,), log=interrupt))
    assert result.trap is not None and result.trap.kind is TrapKind.INTERRUPTED
    link = next(a for a, i in sorted(program.code.items()) if i.op == "jal" and i.rd == 1) + 4
    assert result.pc == leaf and result.regs[1] == link and result.regs[10] == 5
