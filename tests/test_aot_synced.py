"""What a call site stores (berm_aot/emit/synced.py): only the registers written since they were last in
ctx->regs. Whether the callee then sees every register's true value is the differential tests' to prove (a
transfer that forgot a write made tests/test_aot_diff.py fail at once); these pin what the analysis proves."""

from __future__ import annotations

import re

import pytest

from berm_aot.elf import read_elf
from berm_aot.emit.function import FunctionEmitter
from berm_aot.emit.synced import synced_registers
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from tests.elf_samples import ASM_PRELUDE
from tests.guests import analysed_function, guest_elf

RA, SP, T0, T1, S0, A0 = 1, 2, 5, 6, 8, 10

SOURCE = ASM_PRELUDE + r"""
    .globl f, g
    .type g, @function
g:
    ret
    .type f, @function
f:
    addi sp, sp, -16
    sd ra, 8(sp)
    li s0, 10
.Lloop:
    mv a0, s0
    call g
    addi s0, s0, -1
    bnez s0, .Lloop
    lla t0, .Ltab
    ld t1, 0(t0)
    jr t1
.Lcase:
    call g
    ld ra, 8(sp)
    addi sp, sp, 16
    ret

    .section .rodata
    .p2align 3
.Ltab:
    .quad .Lcase
"""


@pytest.fixture(scope="module")
def f():
    _, analysis, info = analysed_function(SOURCE, "f", keep=("f", "g"))
    calls = [i.addr for i in info.insns if i.op == "jalr" and i.rd == RA]
    return analysis, info, calls


def test_a_call_in_a_loop_knows_what_the_previous_call_left_in_ctx(f):
    _, info, (in_loop, in_case) = f
    synced = synced_registers(info, None)
    # the loop is entered from the top (sp, s0 written) and from its back-edge (s0 written after the call); a0 and
    # the auipc's ra are written on the way to the call in both
    assert synced[in_loop] == info.touched - {RA, SP, S0, A0}
    # a local target starts with what the jumps that may reach it agree on: `jr t1` (after the loop's call, s0, t0
    # and t1 written) and, since nothing says where a `ret` goes, the `ret` (ra and sp written)
    assert info.local_targets and synced[in_case] == info.touched - {SP, T0, T1, S0, RA}
    # a resume copy enters at a local target only: the loop, reached from the start alone, has no state at all
    resumed = synced_registers(info, None, entered=False)
    assert in_loop not in resumed and resumed[in_case] == frozenset()  # (no state: nothing known)


def test_the_call_site_stores_what_changed_and_the_link(f):
    analysis, info, (in_loop, in_case) = f
    code = "\n".join(FunctionEmitter(analysis, info, "").emit())

    def stored(call: int) -> set[int]:
        site = code[code.index(f"BERM_PUSH({call:#x}ull)"):]
        line = site[:site.index("uint64_t w_")]
        return {int(r) for r in re.findall(r"ctx->regs\[(\d+)\] = x\d+;", line)}

    assert stored(in_loop) == {RA, SP, S0, A0}
    assert stored(in_case) == {RA, SP, T0, T1, S0}
    assert stored(in_case) < set(info.written)


#: ``rec(1)`` sets s1 and calls itself; the nested frame reads s1 after calling ``g``, which saves and restores it.
#: A nested frame runs in its caller's C frame, entered by a goto with the caller's registers in locals, not in
#: ctx->regs: were the analysis applied there, the call to g would store none of them (nothing written since the
#: start, as far as it can see), g would preserve a stale s1 and the nested frame read it back.
SELF_CALLER = ASM_PRELUDE + r"""
    .globl rec, g
    .type g, @function
g:
    addi sp, sp, -16
    sd s1, 0(sp)
    li s1, 99
    ld s1, 0(sp)
    addi sp, sp, 16
    ret
    .type rec, @function
rec:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s1, 0(sp)
    beqz a0, .Lbase
    li s1, 7
    addi a0, a0, -1
    call rec
    add a0, a0, s1
    j .Lout
.Lbase:
    call g
    mv a0, s1
.Lout:
    ld s1, 0(sp)
    ld ra, 8(sp)
    addi sp, sp, 16
    ret
"""


@pytest.mark.parametrize("kind", ["aot", "interp"])
def test_a_nested_frame_of_a_self_call_stores_what_its_caller_wrote(kind, tmp_path):
    elf = guest_elf(SELF_CALLER, suffix=".S", keep=("rec", "g"))
    entry = next(s.value for s in read_elf(elf).symbols if s.name == "rec")
    result = Engine(kind=kind, cache_dir=tmp_path).load(elf).backend.run(RunRequest(entry=entry, int_args=(1,)))
    assert result.trap is None and result.a0 == 14
