"""Guest memory layout (ABI.md §5), computed once per (image, memory size) and shared by every engine.

    [unmapped below the image][image segments][heap][guard][stack]

Addresses are valid for loads in ``[image_lo, guard_lo) ∪ [stack_lo, size)`` and for stores in
``[writable_lo, guard_lo) ∪ [stack_lo, size)``. Bytes between segments inside the image hull read as zero.
Address 0 is never valid. Both engines implement exactly these bounds; ``readable``/``writable`` are the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

from berm_aot.windows import Windows
from berm_aot.errors import ElfError
from berm_aot.image import ElfImage

PAGE = 4096
#: The stack is the top 1 MiB of guest memory (a quarter of it when memory is smaller than 4 MiB).
MAX_STACK_SIZE = 1 << 20
GUARD_SIZE = PAGE
MIN_MEMORY = 64 << 10
MAX_MEMORY = 4 << 30
DEFAULT_MEMORY = 64 << 20
#: The lowest address a segment may start at: page zero stays unmapped so a null dereference traps.
MIN_IMAGE_ADDR = PAGE
#: Frames on the shadow call stack, the entry's included, before a call is the "stack exhausted" trap: both engines
#: count the same way, so MAX_CALL_DEPTH - 1 nested calls succeed (docs/SEMANTICS.md).
MAX_CALL_DEPTH = 10_000
#: How many frames of a trap's call chain both engines report (TrapInfo.callers): the innermost.
TRACE_KEEP = 32
#: The detail of that trap.
DEPTH_DETAIL = f"more than {MAX_CALL_DEPTH - 1} nested calls"
#: The detail of the "stack exhausted" trap of an instruction that would set sp below the stack (its address is
#: the value sp would have had): a frame larger than the room left, which would otherwise skip the guard page
#: and write the heap.
SP_BELOW_STACK = "sp would fall below the stack's lowest address"
#: berm.fail keeps this many bytes of its text on every engine (the AOT core's BERM_FAIL_KEEP); see failure_text.
MAX_FAIL_TEXT = 64 << 10
#: A berm.log line reaches the log sink cut to this many bytes on every engine (BERM_LOG_KEEP); see log_text.
MAX_LOG_LINE = 64 << 10
#: An invocation's berm.log lines reach the log sink until they total this many bytes (each as ``log_text`` gives
#: it, and LOG_LINE_CHARGE more); see ``budgeted_log``.
MAX_LOG_BYTES = 1 << 20
#: What each line counts against MAX_LOG_BYTES beyond its bytes: a line costs the sink a call and a record whatever
#: its length, and empty lines, counted as nothing, reached it without end (300,000 in one invocation: found by a
#: review).
LOG_LINE_CHARGE = 64
#: What the sink receives in place of the first berm.log line over an invocation's ``MAX_LOG_BYTES``.
LOG_DROPPED = b"[... further berm.log lines of this invocation dropped: over %d bytes logged]" % MAX_LOG_BYTES
#: A tool result longer than this is refused (a HostError naming both sizes), unless the Engine sets another cap.
DEFAULT_MAX_RESULT = 16 << 20


def failure_text(head: bytes, length: int) -> bytes:
    """The recorded berm.fail text: ``head`` (its first ``MAX_FAIL_TEXT`` bytes) and, when the guest passed a
    longer text (``length`` bytes), a marker saying so — the same bytes on every engine."""
    return _kept(head, length, b"berm.fail text")


def log_text(head: bytes, length: int) -> bytes:
    """The berm.log line a log sink receives: ``head`` (its first ``MAX_LOG_LINE`` bytes) and, when the guest
    logged a longer one (``length`` bytes), a marker saying so — the same bytes on every engine."""
    return _kept(head, length, b"berm.log line")


def budgeted_log(logged: int, line: bytes) -> tuple[bytes | None, int]:
    """What the log sink receives for ``line`` when ``logged`` bytes of this invocation's lines reached it already,
    and the new count: the line while the total stays within ``MAX_LOG_BYTES``; then ``LOG_DROPPED`` once, and
    nothing (None) after — the same on every engine. A guest logging in a loop until its deadline filled a
    daemon's log at ~19 MB a second; the guest is not told (its berm.log returns 0 either way)."""
    total = logged + len(line) + LOG_LINE_CHARGE
    if total <= MAX_LOG_BYTES:
        return line, total
    if logged <= MAX_LOG_BYTES:
        return LOG_DROPPED, MAX_LOG_BYTES + 1
    return None, logged


def _kept(head: bytes, length: int, what: bytes) -> bytes:
    if length <= len(head):
        return head
    return head + b" [... %s truncated: %d of %d bytes kept]" % (what, len(head), length)


def stack_size(memory_size: int) -> int:
    return min(MAX_STACK_SIZE, memory_size // 4)


def round_up(value: int, align: int) -> int:
    return (value + align - 1) & ~(align - 1)


def check_memory_size(size: int) -> int:
    """``size`` if it is a power of two in [64 KiB, 4 GiB]; otherwise a ValueError that says what is allowed."""
    if type(size) is not int or size < MIN_MEMORY or size > MAX_MEMORY or size & (size - 1):
        raise ValueError(f"guest memory must be a power of two between 64 KiB and 4 GiB, not {size}")
    return size


@dataclass(frozen=True, slots=True)
class Layout:
    size: int
    image_lo: int
    writable_lo: int
    image_end: int
    heap_start: int
    guard_lo: int
    stack_lo: int

    @property
    def heap_size(self) -> int:
        return self.guard_lo - self.heap_start

    @property
    def initial_sp(self) -> int:
        return self.size - 16

    def readable(self, addr: int, n: int) -> bool:
        end = addr + n
        return (self.image_lo <= addr and end <= self.guard_lo) or (self.stack_lo <= addr and end <= self.size)

    def holds_result(self, addr: int, n: int) -> bool:
        """Whether a tool's result ``(addr, n)`` can be read: readable memory, or no bytes at all wherever it points
        (as a host call's empty buffer; a Rust empty String points at the dangling address 1)."""
        return n == 0 or self.readable(addr, n)

    def writable(self, addr: int, n: int) -> bool:
        end = addr + n
        return (self.writable_lo <= addr and end <= self.guard_lo) or (self.stack_lo <= addr and end <= self.size)

    def fault_region(self, addr: int, store: bool) -> str:
        """Where a faulting access at ``addr`` points, when that place is itself off limits (for a trap message:
        "in the guard page below the stack" tells an author their stack overflowed); "" for an access that starts
        in valid memory and runs past its end."""
        if addr < PAGE:
            return "in the null page"
        if addr < self.image_lo:
            return "below the image"
        if store and addr < self.writable_lo:
            return "in read-only memory, code or constants"
        if self.guard_lo <= addr < self.stack_lo:
            return "in the guard page below the stack, where a stack overflow lands"
        if addr >= self.size:
            return "past the end of guest memory"
        return ""

    def windows(self) -> Windows:
        """The bounds windows translated code checks against (as constants: berm_host/aot/berm_code.h): exactly
        ``readable`` and ``writable`` (an empty window repeats the stack's). One compare per window is exact only
        for windows of 0 or at least 8 bytes, which ``layout_for`` makes sure of."""
        stack = (self.stack_lo, self.size - self.stack_lo - 8)
        spans = [(lo, self.guard_lo - lo - 8) if self.guard_lo - lo >= 8 else stack
                 for lo in (self.image_lo, self.writable_lo)]
        return Windows(*spans[0], *spans[1], *stack)


def layout_for(image: ElfImage, size: int = DEFAULT_MEMORY) -> Layout:
    """The layout of ``image`` in ``size`` bytes of guest memory, or an ElfError saying why it cannot fit."""
    check_memory_size(size)
    segs = [s for s in image.segments if s.memsz]
    if not segs:
        raise ElfError("the image has no loadable segment")
    image_lo = min(s.vaddr for s in segs)
    image_end = max(s.end for s in segs)
    if image_lo < MIN_IMAGE_ADDR:
        raise ElfError(f"a segment starts at {image_lo:#x}, below {MIN_IMAGE_ADDR:#x}: page zero must stay unmapped")
    writable = [s for s in segs if s.writable]
    heap_start = round_up(image_end, PAGE)
    writable_lo = min((s.vaddr for s in writable), default=heap_start)
    for s in segs:
        if not s.writable and s.end > writable_lo:
            raise ElfError(f"read-only segment at {s.vaddr:#x} lies above writable data at {writable_lo:#x}")
    stack_lo = size - stack_size(size)
    guard_lo = stack_lo - GUARD_SIZE
    if heap_start > guard_lo:
        raise ElfError(f"the image ends at {image_end:#x}, too large for {size} bytes of guest memory "
                       f"(the stack and guard start at {guard_lo:#x})")
    # translated code's bounds windows (Layout.windows) cannot hold 1..7 bytes: refused on both engines alike (the
    # interpreter ran what translated code refused, found by a review)
    for what, lo in (("image", image_lo), ("writable data", writable_lo)):
        if 0 < guard_lo - lo < 8:
            raise ElfError(f"the {what} at {lo:#x} leaves only {guard_lo - lo} bytes before the guard page")
    return Layout(size=size, image_lo=image_lo, writable_lo=writable_lo, image_end=image_end,
                  heap_start=heap_start, guard_lo=guard_lo, stack_lo=stack_lo)
