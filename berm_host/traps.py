"""What ends an invocation other than a return: traps (the guest did something wrong to the sandbox) and tool
failures (the guest said, through ``berm.fail``, that its tool failed). ABI.md §3 and §7."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from berm_abi.errors import BermError
from berm_abi.text import escaped

if TYPE_CHECKING:
    from berm_aot.isa import Instruction
    from berm_aot.locator import Locator


#: How many times in a row a call chain line is shown before the rest of its repeats are counted (chain_lines).
REPEATS_SHOWN = 3
#: Bytes of a function ``call_site`` decodes to tell a call's two readings apart. The walk is Python, after the
#: deadline, per frame of the chain, and the image chooses where a call sits: 2 million c.nops before one made each
#: trap take 22-31 s. Past the limit only the offset shown can be 2 bytes off, inside the same function.
WALK_LIMIT = 64 << 10


class TrapKind(enum.Enum):
    MEMORY_FAULT = "memory fault"
    BAD_INDIRECT_TARGET = "bad indirect target"
    BREAKPOINT = "breakpoint"
    UNKNOWN_HOST_CALL = "unknown host call"
    HOST_CALL_FAILED = "host call failed"
    ILLEGAL_INSTRUCTION = "illegal instruction"
    INTERRUPTED = "interrupted"
    STACK_EXHAUSTED = "stack exhausted"


def trap_info(kind: TrapKind, pc: int, addr: int, detail: str, locator: Locator, layout,
              chain: tuple[tuple[int, ...], int] = ((), 0)) -> TrapInfo:
    """The TrapInfo both engines report: the function and offset of ``pc``, for a memory fault where the address
    points (the detail of a store says "store"), and the call chain: ``chain`` is the return addresses of the
    frames the trap struck in, innermost first, the entry frame's left out (at most TRACE_KEEP), and how many more
    frames there were."""
    region = layout.fault_region(addr, detail.startswith("store")) if kind is TrapKind.MEMORY_FAULT else ""
    links, unkept = chain
    callers = tuple((link, locator.symbolize(call_site(locator, link))) for link in links)
    return TrapInfo(kind, pc, addr, detail, locator.symbolize(pc), region, callers, unkept)


def call_site(locator: Locator, link: int) -> int:
    """Where the call that returns to ``link`` was made: the call right before it (a 4-byte ``jal``/``jalr``, else
    a 2-byte ``c.jalr``), else ``link - 1``, inside whatever ends there. A chain names this, not ``link`` itself:
    a call that never returns (a Rust panic, ``berm_panic``) is often its function's last instruction, and its
    return address is then the start of the next function, which the chain would name instead of the caller.

    The bytes before ``link`` can read as both: a ``c.jalr`` after a 4-byte instruction whose second half ends in
    ``0b11`` reads, from that half, as a 4-byte ``jal``. Then the function is decoded from its start to see which
    of the two starts an instruction (only then, and only within WALK_LIMIT bytes of its start: past them, the
    4-byte reading is taken)."""
    sites = [link - size for size in (4, 2) if _is_call(locator.instruction(link - size), size)]
    if len(sites) == 2:
        walked = _instruction_before(locator, link)
        if walked in sites:
            return walked
    return sites[0] if sites else link - 1


def _is_call(insn: Instruction, size: int) -> bool:
    return insn.size == size and insn.op in ("jal", "jalr") and insn.rd != 0


def _instruction_before(locator: Locator, link: int) -> int | None:
    """The start of the instruction that ends at ``link``, decoding the function that holds ``link - 1`` from its
    start; None outside every function, or when that decoding steps over ``link`` (data among the code)."""
    f = locator.function_at(link - 1)
    if f is None or link - f.start > WALK_LIMIT:
        return None
    at, before = f.start, None
    while at < link:
        before, at = at, at + locator.instruction(at).size
    return before if at == link else None


def illegal_detail(locator: Locator, pc: int, addr: int) -> str:
    """The detail of an illegal-instruction trap at ``pc`` (``addr``: the target reached, when a transfer reached
    it), worded alike by both engines: no code there, an entry that is not a function start (translated code enters
    functions only, so the interpreter refuses such an entry too), or the decoder's note on the encoding."""
    if not locator.in_code(pc):
        return f"no code at {pc:#x}"
    if addr == pc and pc not in locator.function_starts:
        return f"entered at {pc:#x}, which is not the start of a function"
    return locator.instruction(pc).note or ""


@dataclass(frozen=True)
class TrapInfo:
    """Everything an engine knows about a trap. ``addr`` is the faulting data or target address (or the call
    number for an unknown host call); ``detail`` completes the message core (e.g. ``"load 8 bytes"``)."""

    kind: TrapKind
    pc: int
    addr: int = 0
    detail: str = ""
    where: str = ""  # "function+0xoff", filled by the engine from the program's symbols
    region: str = ""  # for a memory fault, where the address points when that is off limits (Layout.fault_region)
    #: The call chain, innermost first: per frame (the trapping one first, the entry frame left out) the address it
    #: would have returned to, in its caller, and where that call was made as "function+0xoff" (``call_site``; the
    #: first TRACE_KEEP frames; ``unkept`` more were not kept).
    callers: tuple[tuple[int, str], ...] = ()
    unkept: int = 0

    @property
    def core(self) -> str:
        k = self.kind
        if k is TrapKind.MEMORY_FAULT:
            said = ", ".join(s for s in (self.detail, self.region) if s)
            return f"guest memory fault at {self.addr:#x}" + (f" ({said})" if said else "")
        if k is TrapKind.BAD_INDIRECT_TARGET:
            return f"indirect jump to an unknown target {self.addr:#x}"
        if k is TrapKind.BREAKPOINT:
            return "guest executed ebreak"
        if k is TrapKind.UNKNOWN_HOST_CALL:
            return f"no host function for call {self.addr}" + (f" ({self.detail})" if self.detail else "")
        if k is TrapKind.HOST_CALL_FAILED:
            return f"host call failed: {self.detail}"
        if k is TrapKind.ILLEGAL_INSTRUCTION:
            return "guest reached an illegal instruction" + (f" ({self.detail})" if self.detail else "")
        if k is TrapKind.INTERRUPTED:
            return "guest was interrupted" + (f" ({self.detail})" if self.detail else "")
        return "guest stack exhausted" + (f" ({self.detail})" if self.detail else "")

    def __str__(self) -> str:
        where = self.where or f"{self.pc:#x}"
        return f"{self.core} in {where}"

    def chain_lines(self) -> list[str]:
        """The call chain as lines for a reader, innermost first, unindented: one per caller, where it made its call.
        A line repeated more than REPEATS_SHOWN times in a row (deep recursion) is shown that many times and then
        counted, as Python's tracebacks do."""
        lines: list[str] = []
        for line, run in itertools.groupby(f"called from {where or f'{link:#x}'}" for link, where in self.callers):
            n = len(list(run))
            lines += [line] * min(n, REPEATS_SHOWN)
            if n > REPEATS_SHOWN:
                more = n - REPEATS_SHOWN
                lines.append(f"[the line above repeated {more:,} more time{'s' if more > 1 else ''}]")
        if self.unkept:
            lines.append(f"... and {self.unkept:,} more frame{'s' if self.unkept > 1 else ''}")
        return lines


class Trap(BermError):
    """A guest trapped. ``info`` says what, where and at which address; ``tool`` names the tool when known;
    ``failure`` is the ``berm.fail`` text the guest recorded before it trapped, if any: the trap decides the
    outcome (ABI §3), but a panic handler that says why and then executes ``ebreak`` (the SDK's ``berm_panic``,
    a Rust ``#[panic_handler]``) wants its reason in front of whoever reads the trap."""

    def __init__(self, info: TrapInfo, tool: str | None = None, failure: str | None = None):
        self.info = info
        self.tool = tool
        self.failure = failure
        super().__init__(self._message(str(info)))

    def _message(self, what: str) -> str:
        """One line: the guest's ``berm.fail`` text escaped (``failure`` keeps it as it was). Found by a review: its
        newlines and terminal controls went into the message as they were, so an embedder logging a trap logged
        whatever lines the guest forged."""
        message = f"harness trapped in {self.tool}: {what}" if self.tool else f"guest trapped: {what}"
        if self.failure is None:
            return message
        return f"{message} (after berm.fail: {escaped(self.failure, lines=False)})"

    def engine_neutral(self) -> str:
        """The message, less where an interrupt struck: that pc is wherever an engine checked the deadline
        (docs/SEMANTICS.md), so a text a guest reads must not carry it. Every other trap is where it is."""
        return self._message(self.info.core) if self.kind is TrapKind.INTERRUPTED else str(self)

    @property
    def kind(self) -> TrapKind:
        return self.info.kind

    @property
    def pc(self) -> int:
        return self.info.pc

    @property
    def addr(self) -> int:
        return self.info.addr


class ToolFailure(BermError):
    """The guest called ``berm.fail``: its tool failed, with this text (lossy UTF-8)."""

    def __init__(self, tool: str, message: str):
        self.tool = tool
        self.message = message
        super().__init__(message)


class HostError(BermError):
    """The host could not complete an invocation for a reason that is not a guest trap (e.g. a result that is
    not UTF-8 or points outside guest memory, or an unknown tool)."""
