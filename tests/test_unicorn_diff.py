"""The interpreter against an independent emulator: random programs from tests/progen.py run on
``InterpBackend`` and on unicorn (QEMU's RISC-V) from the same image and memory layout must end with the same
registers, pc, data and stack memory — and fault at the same instruction when one of them faults.

Unicorn knows nothing of the shadow call stack or CFI; progen's programs only make transfers that are legal under
both (direct calls, calls through an R_RISCV_64 function table or an auipc/addi pair, jumps through a switch's
table — past its end into the next table too — returns forged to one of those cases, tail calls by ``jal x0`` or
``jalr x0`` to a function, and calls linking through t0 to a leaf that returns through it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from unicorn import UC_ARCH_RISCV, UC_HOOK_MEM_INVALID, UC_MEM_FETCH_UNMAPPED, UC_MODE_RISCV64, UC_PROT_ALL, UC_PROT_EXEC, UC_PROT_READ, \
    UC_PROT_WRITE, Uc, UcError
from unicorn.riscv_const import UC_RISCV_REG_PC, UC_RISCV_REG_X0

from berm_aot.program import Program
from berm_host.backend import RunRequest
from berm_host.interp import InterpBackend
from berm_host.layout import PAGE, layout_for, round_up
from berm_host.traps import TrapKind
from tests import progen
from tests.rvenc import Op

#: More than any generated program runs (loops are bounded and calls go only forward).
INSTRUCTION_LIMIT = 200_000


@dataclass
class UnicornRun:
    regs: tuple[int, ...]
    pc: int
    fault: int | None  # the faulting data address unicorn reported, when the run ended in a memory fault
    snapshot: tuple[bytes, ...]


def run_unicorn(prog: progen.GenProgram) -> UnicornRun:
    image = prog.image
    layout = layout_for(image, progen.MEMORY_SIZE)
    uc = Uc(UC_ARCH_RISCV, UC_MODE_RISCV64)
    lo = layout.image_lo & ~(PAGE - 1)
    uc.mem_map(lo, layout.guard_lo - lo, UC_PROT_READ | UC_PROT_WRITE)
    uc.mem_map(layout.stack_lo, layout.size - layout.stack_lo, UC_PROT_READ | UC_PROT_WRITE)
    for seg in image.segments:
        uc.mem_write(seg.vaddr, seg.data)
    for seg in image.segments:  # page permissions after the bytes are in (progen's segments are page-aligned)
        if not seg.writable:
            perms = UC_PROT_READ | (UC_PROT_EXEC if seg.executable else 0)
            uc.mem_protect(seg.vaddr, round_up(seg.memsz, PAGE), perms)
        elif seg.executable:
            uc.mem_protect(seg.vaddr, round_up(seg.memsz, PAGE), UC_PROT_ALL)
    uc.reg_write(UC_RISCV_REG_X0 + 2, layout.initial_sp)
    faults: list[int] = []

    def invalid(uc, access, addr, size, value, data):
        if not (access == UC_MEM_FETCH_UNMAPPED and addr == 0):  # the final return: unicorn fetches before stopping
            faults.append(addr)
        return False
    uc.hook_add(UC_HOOK_MEM_INVALID, invalid)
    try:
        uc.emu_start(prog.entry, 0, count=INSTRUCTION_LIMIT)
    except UcError:
        pass
    regs = tuple(uc.reg_read(UC_RISCV_REG_X0 + i) for i in range(32))
    snapshot = tuple(bytes(uc.mem_read(addr, n)) for addr, n in prog.snapshot)
    return UnicornRun(regs, uc.reg_read(UC_RISCV_REG_PC), faults[0] if faults else None, snapshot)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# unicorn knows nothing of Berm's host calls and legal indirect targets, nor of what else only Berm defines
@given(progen.programs(endings=False, berm_only=False))
def test_interpreter_matches_unicorn(prog):
    compare(prog)


def test_store_straddling_the_end_of_memory():
    """Found by the test above: ``sh`` at the last byte of guest memory faults on both, but unicorn has written the
    byte that was mapped; Berm has written nothing."""
    ops = [Op("addi", rd=2, rs1=2, imm=-256), Op("sd", rs1=2, rs2=1), Op("lui", rd=5, imm=progen.MEMORY_SIZE),
           Op("addiw", rd=5, rs1=5, imm=-1), Op("sh", rs1=5, rs2=5), Op("ld", rd=1, rs1=2),
           Op("addi", rd=2, rs1=2, imm=256), Op("jalr", rs1=1)]
    image = progen.build_image([progen.Function("f0", ops)])
    compare(progen.GenProgram(image, image.entry, "\n".join(map(str, ops))))


def compare(prog: progen.GenProgram) -> None:
    program = Program.from_image(prog.image)
    request = RunRequest(entry=prog.entry, snapshot=prog.snapshot, deadline=time.monotonic() + 30)
    ours = InterpBackend(program, progen.MEMORY_SIZE).run(request)
    theirs = run_unicorn(prog)
    if ours.trap is None:
        assert theirs.fault is None, f"only unicorn faulted, at {theirs.fault:#x}\n{prog.listing}"
        assert theirs.pc == 0
    else:
        assert ours.trap.kind is TrapKind.MEMORY_FAULT, f"{ours.trap}\n{prog.listing}"
        assert theirs.fault is not None, f"only the interpreter faulted: {ours.trap}\n{prog.listing}"
        assert theirs.pc == ours.pc
        # unicorn names the first unmapped byte of an access that straddles into unmapped memory
        assert ours.trap.addr <= theirs.fault < ours.trap.addr + 8, f"{ours.trap} vs {theirs.fault:#x}"
    assert ours.pc == theirs.pc
    for i, (a, b) in enumerate(zip(ours.regs, theirs.regs)):
        assert a == b, f"x{i}: interp {a:#x}, unicorn {b:#x}\n{prog.listing}"
    if ours.trap is not None and "store" in ours.trap.detail:
        # a misaligned store straddling into unmapped memory: unicorn writes the mapped part before it faults (the
        # spec allows either), Berm writes nothing (ABI.md: a trap has no effect)
        assert mask(prog.snapshot, ours.snapshot, ours.trap.addr) == mask(prog.snapshot, theirs.snapshot,
                                                                            ours.trap.addr), prog.listing
        return
    assert ours.snapshot == theirs.snapshot, prog.listing


def mask(ranges, snapshot: tuple[bytes, ...], addr: int) -> tuple[bytes, ...]:
    """``snapshot`` (the bytes of ``ranges``) with the 8 bytes from ``addr`` zeroed."""
    out = []
    for (lo, n), data in zip(ranges, snapshot):
        out.append(bytes(0 if addr <= lo + i < addr + 8 else b for i, b in enumerate(data)))
    return tuple(out)
