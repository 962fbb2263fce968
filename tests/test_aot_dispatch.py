"""Dispatch blocks of indirect jumps that expect a jump table's cases (berm_aot.emit.function, _indirect_jump):

- such a jump tests its cases before ``t == ret`` — unless a case is a call's link, which ``ret`` may hold: there
  ``t == ret`` is a return (the frame ends) and a case a jump inside the frame, so the order decides the outcome;
- its block polls the interrupt flag only when a case lies at or behind the jump (it may close a loop); a loop
  through cases that all lie ahead still polls, at its backward branch.

Each guest runs on both engines and must end in the interpreter's registers, pc and trap."""

from __future__ import annotations

import re
import time

import pytest

from berm_aot.elf import read_elf
from berm_aot.emit import emit_program
from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import layout_for
from berm_host.traps import TrapKind
from tests.bounded import GRACE, ends_within
from tests.elf_samples import ASM_PRELUDE
from tests.guests import guest_elf

SOURCE = ASM_PRELUDE + r"""
    .globl link_case, cases, spin_ahead, spin_behind

# link_case(a0: depth, a1: first index): calls itself a0 times; the innermost frame pops its own stack frame, then
# dispatches through .Ltab1 from a1 on, each case 0 adding 1 and moving to the next entry. Entry 1 is .Llink, the
# link of the self-call: reached from the innermost frame, whose return address it is, it is a return (the frame
# ends, its caller goes on at .Llink); a frame that took it as a plain jump would end in a bad-target trap at its
# second return.
    .type link_case, @function
link_case:
    addi sp, sp, -16
    sd ra, 8(sp)
    sd s0, 0(sp)
    mv s0, a0
    beqz a0, .Lbottom
    addi a0, a0, -1
    call link_case
.Llink:
    addi a0, a0, 100
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
    ret
.Lbottom:
    ld ra, 8(sp)
    ld s0, 0(sp)
    addi sp, sp, 16
.Ldispatch1:
    lla t0, .Ltab1
    slli t2, a1, 3
    add t0, t0, t2
    ld t0, 0(t0)
    jr t0
.Lcase1_0:
    addi a0, a0, 1
    addi a1, a1, 1
    j .Ldispatch1
.Lcase1_2:
    addi a0, a0, 7
.Lx1:
    ret

# cases(a0: n): n rounds of a switch whose cases are no call's link, then returns the sum.
    .type cases, @function
cases:
    li a1, 0
.Lround:
    beqz a0, .Ldone
    addi a0, a0, -1
    andi t1, a0, 1
    lla t0, .Ltab2
    slli t1, t1, 3
    add t0, t0, t1
    ld t0, 0(t0)
    jr t0
.Lcase2_0:
    addi a1, a1, 3
    j .Lround
.Lcase2_1:
    addi a1, a1, 5
    j .Lround
.Ldone:
    mv a0, a1
.Lx2:
    ret

# never ends: a jump through a table to a case ahead of it, then a backward branch
    .type spin_ahead, @function
spin_ahead:
    lla t0, .Ltab3
    ld t0, 0(t0)
    jr t0
.Lcase3_0:
    addi a0, a0, 1
    j spin_ahead
.Lx3:
    ret

# never ends: the jump through the table is the loop's only backward transfer
    .type spin_behind, @function
spin_behind:
    li a0, 0
.Lcase4_0:
    addi a0, a0, 1
    lla t0, .Ltab4
    ld t0, 0(t0)
    jr t0
.Lx4:
    ret

    .section .rodata
    .p2align 3
.Ltab1:
    .quad .Lcase1_0, .Llink, .Lcase1_2
.Ltab2:
    .quad .Lcase2_0, .Lcase2_1
.Ltab3:
    .quad .Lcase3_0
.Ltab4:
    .quad .Lcase4_0
# one more legal target in each function, so that no table covers all of its function's targets (a jump expecting
# every target has no dispatch block of its own: berm_aot.emit.sites)
.Lextras:
    .quad .Lx1, .Lx2, .Lx3, .Lx4
"""

ENTRIES = ("link_case", "cases", "spin_ahead", "spin_behind")


@pytest.fixture(scope="module")
def guest(tmp_path_factory):
    elf = guest_elf(SOURCE, suffix=".S", keep=ENTRIES)
    program = Program.from_image(read_elf(elf))
    cache = tmp_path_factory.mktemp("cache")
    backends = {kind: Engine(kind=kind, cache_dir=cache).load(elf).backend for kind in ("aot", "interp")}
    return program, backends


def _function_c(program: Program, name: str) -> str:
    """The translated C of one guest function (without its resume copy)."""
    source = "".join(emit_program(program, windows=layout_for(program.image).windows()))
    start = program.symbol(name)
    body = source[source.index(f"uint64_t f_{start:x}(berm_ctx *ctx, uint64_t ret, uint32_t depth) {{"):]
    return body[:body.index("\n}\n")]


def _jump_line(c: str, pc: int) -> str:
    return next(line for line in c.splitlines() if f"jpc_ = {pc:#x}ull" in line)


def _dispatch_block(c: str, label: str) -> str:
    return re.search(rf"^{label}:\n(.*?)^    goto indirect;", c, re.S | re.M).group(1)


def run_both(guest, name, *args):
    program, backends = guest
    request = RunRequest(entry=program.symbol(name), int_args=args)
    aot, interp = (backends[k].run(request) for k in ("aot", "interp"))
    return aot, interp


def assert_same(aot, interp, what):
    assert (aot.trap, aot.pc, aot.failure) == (interp.trap, interp.pc, interp.failure), what
    for r in range(32):
        assert aot.regs[r] == interp.regs[r], f"{what}: x{r} aot {aot.regs[r]:#x} vs interp {interp.regs[r]:#x}"


def _table_jump(program: Program, name: str) -> int:
    """The address of the one table jump (``jr`` through a register other than ra) in function ``name``."""
    info = next(f for f in program.functions if f.name == name)
    return next(a for a in range(info.start, info.end, 2)
                if (i := program.code.get(a)) is not None and i.op == "jalr" and i.rd == 0 and i.rs1 != 1)


def test_a_table_with_a_call_link_among_its_cases_tests_ret_first(guest):
    program, _ = guest
    c = _function_c(program, "link_case")
    assert "BERM_LIKELY(t_ ==" in _jump_line(c, _table_jump(program, "link_case"))


@pytest.mark.parametrize("depth", [1, 2, 5])
@pytest.mark.parametrize("first", [0, 1, 2])
def test_a_case_that_is_the_expected_link_returns_as_on_the_interpreter(guest, depth, first):
    aot, interp = run_both(guest, "link_case", depth, first)
    assert interp.trap is None
    assert_same(aot, interp, f"link_case({depth}, {first})")


def test_a_table_of_plain_cases_is_tested_before_ret(guest):
    program, _ = guest
    c = _function_c(program, "cases")
    line = _jump_line(c, _table_jump(program, "cases"))
    assert "t_ ==" not in line
    block = _dispatch_block(c, re.search(r"goto (dispatch\d+);", line).group(1))
    assert "if (jt_ == ret) goto exit_ret;" in block and "BERM_POLL" not in block  # both cases lie ahead


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_plain_cases_run_as_on_the_interpreter(guest, n):
    aot, interp = run_both(guest, "cases", n)
    assert interp.trap is None and aot.regs[10] == (n // 2) * 8 + (n % 2) * 3
    assert_same(aot, interp, f"cases({n})")


def test_only_a_block_with_a_case_behind_its_jump_polls(guest):
    program, _ = guest
    for name, polls in (("spin_ahead", False), ("spin_behind", True)):
        c = _function_c(program, name)
        block = _dispatch_block(c, re.search(r"goto (dispatch\d+);", _jump_line(c, _table_jump(program, name))).group(1))
        assert ("BERM_POLL(jpc_);" in block) is polls, name


@pytest.mark.parametrize("name", ["spin_ahead", "spin_behind"])
def test_loops_through_a_table_end_at_the_deadline(guest, name):
    program, backends = guest
    request = RunRequest(entry=program.symbol(name), deadline=time.monotonic() + 0.3)
    r = ends_within(GRACE, lambda: backends["aot"].run(request))
    assert r.trap is not None and r.trap.kind is TrapKind.INTERRUPTED
