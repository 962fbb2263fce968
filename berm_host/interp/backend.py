"""``InterpBackend``: the reference interpreter, an implementation of ``berm_host.backend.Backend``.

Each guest address is decoded once (``Program.instruction``) and turned once into a handler closure, cached per
address and shared by every run of this backend; a handler captures only the instruction, the layout and the
program, never per-run state, so concurrent runs on several threads share the cache safely. Per-run state (the
registers, guest memory, the shadow call stack, the host-call state) lives in a ``RunState`` made by each ``run``.
"""

from __future__ import annotations

import time
from itertools import repeat

from berm_aot.isa import checks_sp
from berm_aot.program import Program
from berm_host.backend import LogSink, RunRequest, RunResult
from berm_host.layout import DEFAULT_MEMORY, TRACE_KEEP, Layout, layout_for
from berm_host.linker import Linker
from berm_host.running import NESTED_DETAIL, interpreting
from berm_host.traps import HostError, TrapInfo, TrapKind, illegal_detail, trap_info

from . import control, semantics
from .memory import GuestMemory
from .trap import GuestTrap, Returned, deadline_passed

#: Instructions run between two looks at the clock.
CHECK_EVERY = 4096


def _builders() -> dict:
    """op -> ``build(insn, layout, program) -> handler``: the interpreter's dispatch table."""
    table: dict = {}
    for op in [*semantics.ALU, *semantics.IMM_FORMS, "lui", "auipc"]:
        table[op] = lambda insn, layout, program: semantics.alu(insn)
    for op in semantics.BRANCH:
        table[op] = lambda insn, layout, program: semantics.branch(insn)
    for op in semantics.LOADS:
        table[op] = lambda insn, layout, program: semantics.load(insn, layout)
    for op in semantics.STORES:
        table[op] = lambda insn, layout, program: semantics.store(insn, layout)
    for base in ["lr", "sc", *semantics.AMO]:
        for width in "wd":
            table[f"{base}.{width}"] = lambda insn, layout, program: semantics.atomic(insn, layout)
    table["fence"] = table["fence.i"] = lambda insn, layout, program: semantics.nop(insn)
    table["jal"] = lambda insn, layout, program: control.jal(insn)
    table["jalr"] = lambda insn, layout, program: control.jalr(insn, program)
    table["ecall"] = lambda insn, layout, program: control.ecall(insn)
    for op in ("ebreak", "illegal", "unsupported"):
        table[op] = lambda insn, layout, program: control.trap_only(insn)
    return table


BUILDERS = _builders()


class RunState:
    """Everything one invocation owns. Never shared between runs."""

    __slots__ = ("mem", "frames", "args", "staged", "failure", "linker", "log", "logged", "deadline")

    def __init__(self, mem: GuestMemory, args: bytes, linker: Linker, log: LogSink | None,
                 deadline: float | None = None):
        self.mem = mem
        self.deadline = deadline  # a time.monotonic() instant; also looked at after every call served in Python
        self.frames: list[int] = [0]  # the shadow call stack: return addresses; the entry frame returns to 0
        self.args = args
        self.staged = b""  # the last capability reply, served by berm.result.read
        self.failure: bytes | None = None
        self.linker = linker
        self.log = log
        self.logged = 0  # bytes of berm.log lines the sink received (layout.budgeted_log)


class InterpBackend:
    """``program`` loaded into the interpreter with ``memory_size`` bytes of guest memory per invocation."""

    def __init__(self, program: Program, memory_size: int = DEFAULT_MEMORY):
        self.program = program
        try:
            self.layout: Layout = layout_for(program.image, memory_size)
        except ValueError as exc:  # not a power of two in [64 KiB, 4 GiB]
            raise HostError(str(exc)) from None
        self._handlers: dict = {}

    def _handler(self, pc: int):
        """The handler for the instruction at ``pc``, built on first use. Addresses outside code trap and are
        not cached (a wild jump may name any of 2^64 addresses)."""
        if not self.program.in_code(pc):
            return _no_code(pc)
        insn = self.program.instruction(pc)
        h = BUILDERS[insn.op](insn, self.layout, self.program)
        if checks_sp(insn):
            h = control.sp_checked(h, insn, self.layout.stack_lo)
        self._handlers[pc] = h
        return h

    def run(self, request: RunRequest) -> RunResult:
        mem = GuestMemory(self.program.image, self.layout)
        try:
            st = RunState(mem, request.args, request.linker, request.log, request.deadline)
            x = [0] * 32
            x[2] = self.layout.initial_sp
            for i, v in enumerate(request.int_args):
                x[10 + i] = v & semantics.M
            locator = self.program.locator
            pc = request.entry
            # a run nested in a host call ends by its caller's deadline too, and nests only so deep: that first, then
            # the entry, in translated code's order (the two engines described a bad entry past the depth apart:
            # found by a review)
            with interpreting(request.deadline) as (st.deadline, too_deep):
                if too_deep:  # as translated code: nothing runs
                    trap = trap_info(TrapKind.STACK_EXHAUSTED, pc, 0, NESTED_DETAIL, locator, self.layout)
                elif pc not in self.program.function_starts:  # as translated code, which enters functions only
                    trap = trap_info(TrapKind.ILLEGAL_INSTRUCTION, pc, pc, illegal_detail(locator, pc, pc), locator,
                                     self.layout)
                else:
                    pc, trap = self._execute(x, mem.buf, st, pc)
            result = None
            if (request.read_result and trap is None and self.layout.holds_result(x[10], x[11])
                    and (request.max_result is None or x[11] <= request.max_result)):
                result = mem.buf[x[10]:x[10] + x[11]]
            snapshot = tuple(mem.copy_out(addr, n) for addr, n in request.snapshot)
            return RunResult(regs=tuple(x), pc=pc, trap=trap, failure=st.failure, result=result, snapshot=snapshot)
        finally:
            mem.close()

    def _execute(self, x: list[int], m, st: RunState, pc: int) -> tuple[int, TrapInfo | None]:
        """Run from ``pc`` until the entry frame returns (→ ``(0, None)``) or a trap (→ ``(pc, info)``)."""
        get, build, deadline = self._handlers.get, self._handler, st.deadline
        try:
            while True:
                for _ in repeat(None, CHECK_EVERY):
                    pc = (get(pc) or build(pc))(x, m, st)
                if deadline is not None and time.monotonic() > deadline:
                    raise deadline_passed()
        except Returned:
            return 0, None
        except GuestTrap as t:
            return pc, trap_info(t.kind, pc, t.addr, t.detail, self.program.locator, self.layout,
                                 call_chain(st.frames))


def call_chain(frames: list[int]) -> tuple[tuple[int, ...], int]:
    """The shadow call stack as a trap's call chain (berm_host.traps.trap_info): the return addresses innermost
    first, the entry frame's (0) left out, the first TRACE_KEEP of them and how many more."""
    callers = frames[:0:-1]
    return tuple(callers[:TRACE_KEEP]), max(len(callers) - TRACE_KEEP, 0)


def _no_code(pc: int):
    def h(x, m, st):
        raise GuestTrap(TrapKind.ILLEGAL_INSTRUCTION, pc, f"no code at {pc:#x}")
    return h
