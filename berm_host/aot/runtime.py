"""The Python side of the runtime core: guest memory images and pooled regions, the host-call callback, and
turning the core's trap record into a ``TrapInfo``.

A ``MemoryImage`` is one image's layout and pristine bytes inside the core; its ``Region``s are reusable guest
memories (mmap'ed once, reset page by page between invocations by the core). A region belongs to one invocation
at a time; the pool hands them out (``list.pop``/``append`` are atomic under the GIL).
"""

from __future__ import annotations

from typing import NamedTuple

from berm_abi.names import ERROR_BIT, core_number
from berm_aot.windows import Windows
from berm_host.backend import LogSink
from berm_host.layout import DEPTH_DETAIL, SP_BELOW_STACK, Layout, budgeted_log, failure_text, log_text
from berm_host.linker import CapabilityError, Linker, exception_text, failed_detail, unknown_call_detail
from berm_host.running import NESTED_DETAIL
from berm_host.traps import HostError, TrapKind

from .objects import ENTRY_SYMBOL, LAYOUT_SYMBOL, LOCATOR_SYMBOL

try:
    from ._core import ffi, lib
    from . import _invoke
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the Berm runtime core is not built: reinstall Berm; in a source tree, run ./setup.sh "
                      f"(or `python berm_host/aot/_build.py`): {exc}") from None

# The harness fast path (invoke.c, used by AotBackend.call_tool) calls the core's berm_run through this pointer
# and reads a0, a1 and guest memory at these offsets (it refuses to bind if it was built for others).
_invoke.bind(int(ffi.cast("uintptr_t", ffi.addressof(lib, "berm_run"))),
             ffi.offsetof("berm_region", "ctx") + ffi.offsetof("berm_ctx", "regs"),
             ffi.offsetof("berm_region", "ctx") + ffi.offsetof("berm_ctx", "mem"))
run_text = _invoke.run_text

#: The core's trap kinds (berm_rt.h), by number.
KINDS = {
    1: TrapKind.MEMORY_FAULT, 2: TrapKind.BAD_INDIRECT_TARGET, 3: TrapKind.BREAKPOINT,
    4: TrapKind.UNKNOWN_HOST_CALL, 5: TrapKind.HOST_CALL_FAILED, 6: TrapKind.ILLEGAL_INSTRUCTION,
    7: TrapKind.INTERRUPTED, 8: TrapKind.STACK_EXHAUSTED,
}
_CODES = {kind: code for code, kind in KINDS.items()}
_ACCESS = {0: "load {n} bytes", 1: "store {n} bytes", 2: "misaligned {n}-byte atomic"}
_STACK = {0: DEPTH_DETAIL, 1: "the native stack translated code runs on is exhausted",
          2: NESTED_DETAIL, 3: SP_BELOW_STACK}
POOL_LIMIT = 16
LOG = core_number("berm.log")
NO_CAPABILITIES = {}.get  # the lookup of an invocation without a linker


def capability_lookup(linker: Linker | None):
    """The number -> Capability lookup a region binds for ``linker`` (a builtin ``dict.get``: no Python frame)."""
    return linker.lookup_fn if linker is not None else NO_CAPABILITIES


class Code(NamedTuple):
    """A loaded program (``load_code``): its entry point (a ``void *`` for ``berm_run``), the largest native
    stack frame of its object, in bytes, the slot holding the object's dlopen handle, closed when the last
    reference to it goes, and where its locator text lies in the object (``locator``). Every region that runs the
    code holds its image, which holds this: the object stays mapped while any of them could still run (a run in
    progress holds its region)."""

    enter: object
    frame: int
    handle: object
    locator_text: object

    def locator(self) -> str:
        """The program's ``berm_aot.locator.Locator`` as ``Locator.dumps`` wrote it into the object."""
        return ffi.string(ffi.cast("char *", self.locator_text)).decode("ascii")


class MemoryImage:
    """An image's memory layout and initial bytes, owned by the core; the factory of its regions, which all run
    ``code``."""

    def __init__(self, layout: Layout, hull: bytes, code: Code, max_result: int | None = None):
        self.layout = layout
        self.code = code
        self.max_result = max_result  # None: no cap (see berm_run's BERM_RUN_BIG_RESULT)
        self._keep = hull
        self._owner = _slot("berm_image **", lib.berm_image_release)
        if not lib.berm_image_new(self._owner, layout.size, layout.image_lo, layout.writable_lo, layout.image_end,
                                  layout.heap_start, layout.guard_lo, layout.stack_lo, hull, len(hull)):
            raise HostError("out of host memory for the image")
        self.ptr = self._owner[0]
        #: idle regions; the hot path pops and appends directly (both atomic under the GIL)
        self.pool: list[Region] = []

    def acquire(self) -> Region:
        pool = self.pool
        try:
            return pool.pop()
        except IndexError:  # empty (also when another thread took the last one after a check)
            return Region(self)

    def release(self, region: Region) -> None:
        if len(self.pool) < POOL_LIMIT:
            self.pool.append(region)


class Region:
    """One guest memory: the core's region (owned here, freed with this object), cached views of it, and its
    ``HostCalls``, whose ``serve`` the core calls for berm.log and capabilities. The core only borrows that
    callable; this object owns it (``serve``), so when the last linker or log sink refers back to whatever owns
    this region (a harness, its engine, a queue), the cycle is one the garbage collector sees and frees."""

    __slots__ = ("image", "owner", "ptr", "addr", "ctx", "regs", "memory", "int_args", "calls", "serve",
                 "__weakref__")

    def __init__(self, image: MemoryImage):
        self.image = image  # keeps the core's berm_image alive as long as the region
        self.owner = _slot("berm_region **", lib.berm_region_release)
        if not lib.berm_region_new(self.owner, image.ptr):
            raise HostError(f"cannot map {image.layout.size} bytes of guest memory")
        self.ptr = raw = self.owner[0]  # alive as long as owner
        self.addr = int(ffi.cast("uintptr_t", raw))  # for run_text (invoke.c); alive as long as ptr
        if not lib.berm_region_code(raw, image.code.enter, image.code.frame):
            raise HostError(f"translated code needs native stack frames of {image.code.frame} bytes: more than an "
                            f"eighth of the {lib.BERM_NATIVE_STACK >> 20} MiB native stack")
        if image.max_result is not None:
            raw.max_result = image.max_result
        self.ctx = raw.ctx
        # Cached views: a cffi attribute chain costs ~0.1 us per step, a cffi array index ~50 ns and ffi.unpack of
        # a pointer sum ~0.25 us; a memoryview index or a slice of ffi.buffer is a plain buffer operation.
        self.regs = memoryview(ffi.buffer(self.ctx.regs)).cast("Q")  # x0..x31 as ints
        self.memory = ffi.buffer(ffi.cast("char *", self.ctx.mem), image.layout.size)  # memory[a:b]: a bytes copy
        self.int_args = raw.int_args
        self.calls = HostCalls(raw)
        self.serve = self.calls.serve  # a bound method: kept here, as long as the region, for the core to borrow
        lib.berm_region_serve(raw, id(self.serve))

    # -- reading guest memory after a run -----------------------------------------------------------------------

    def read(self, addr: int, n: int) -> bytes:
        return self.memory[addr:addr + n]

    def copy_out(self, addr: int, n: int) -> bytes:
        """``[addr, addr+n)`` with bytes outside guest memory as zero (never a fault)."""
        out = bytearray(n)
        lo, hi = max(addr, 0), min(addr + n, self.image.layout.size)
        if lo < hi:
            out[lo - addr:hi - addr] = self.memory[lo:hi]
        return bytes(out)

    # -- the trap record ----------------------------------------------------------------------------------------

    def trap_record(self) -> tuple[TrapKind, int, int, str] | None:
        """The trap of the last run as (kind, pc, addr, detail), None after a normal return (its call chain:
        ``call_chain``)."""
        ctx = self.ctx
        code = ctx.trap_kind
        if not code:
            return None
        kind = KINDS[code]
        d = ctx.trap_detail
        if kind is TrapKind.MEMORY_FAULT:
            detail = _ACCESS[d >> 8].format(n=d & 0xFF)
        elif kind is TrapKind.STACK_EXHAUSTED:
            detail = _STACK[d]
        elif kind is TrapKind.INTERRUPTED:
            detail = "deadline passed"
        else:
            msg = ffi.string(self.ptr.trap_msg)
            # the core's message is cut at 199 bytes, maybe inside a character
            detail = msg.decode("utf-8", "replace") if msg else self.calls.detail
        return kind, ctx.trap_pc, ctx.trap_addr, detail

    def call_chain(self) -> tuple[tuple[int, ...], int]:
        """The last trap's call chain as berm_host.traps.trap_info takes it: the return addresses the translated
        code's trap blocks recorded, innermost first (berm_code.h, berm_trace), less the entry frame's (0, the last
        one recorded), and how many more than BERM_TRACE_KEEP there were."""
        ctx = self.ctx
        callers = max(ctx.trace_frames - 1, 0)
        kept = min(callers, lib.BERM_TRACE_KEEP)
        return tuple(ctx.trace[0:kept]), callers - kept

    def failure(self) -> bytes | None:
        """The last berm.fail text (the core keeps its first BERM_FAIL_KEEP bytes and its full length)."""
        p = self.ptr
        if not p.has_fail:
            return None
        n = p.fail_len
        return failure_text(ffi.buffer(p.fail, min(n, lib.BERM_FAIL_KEEP))[:], n)


class HostCalls:
    """The host calls of one region served in Python: berm.log and every capability (the core serves the other
    core calls). The core calls ``serve`` (its Region keeps it alive) through the CPython C API, on the thread
    running the region, with the GIL taken for the call."""

    __slots__ = ("raw", "ctx", "linker", "lookup", "log", "detail", "pending")

    def __init__(self, raw: object):
        self.raw = raw  # the core's region, not owned (Region.owner is what frees it)
        self.ctx = raw.ctx
        # The capability set of the current (or last) invocation and its bound lookup: rebound only when another
        # linker comes, so the hot paths pay an identity test instead of building a bound method per call.
        self.linker: Linker | None = None
        self.lookup = NO_CAPABILITIES
        self.log: LogSink | None = None
        self.detail = ""  # detail of a trap raised from Python
        #: A KeyboardInterrupt, SystemExit or other BaseException that is not an Exception, raised while serving a
        #: host call: the run ends in a trap (nothing unwinds through guest code), then the backend raises it
        #: (``reraise``), as the interpreter lets it through. Set by ``serve`` and, for one raised as ``serve`` is
        #: entered, by the core (core.c, ``python_trap``, by this attribute's name).
        self.pending: BaseException | None = None

    def bind(self, linker: Linker | None, log: LogSink | None) -> None:
        """Serve the next invocation's host calls with ``linker`` and ``log`` (AotBackend.call_tool inlines this)."""
        if linker is not self.linker:
            self.linker = linker
            self.lookup = capability_lookup(linker)
        self.log = log
        self.detail = ""

    def serve(self, number, request, _bytes=bytes, _error=CapabilityError, _error_bit=ERROR_BIT):
        """berm.log or capability ``number`` with the guest buffer ``request`` (bytes the core copied, or None when
        it is not readable guest memory). Returns a capability's reply (bytes: the core stages it and the guest's
        a0 is its length) or the guest's a0 (an int). The capability path is inlined (each Python call on it costs
        ~60 ns) and its globals are default arguments (a local read instead of a global one)."""
        try:
            cap = self.lookup(number)
            if cap is None:  # berm.log is a core number, so never a capability
                if number == LOG:
                    return self.log_line(request)
                return self.trap(TrapKind.UNKNOWN_HOST_CALL, number, unknown_call_detail(number))
            if request is None:
                return self._buffer_trap(cap.name)
            try:
                reply = cap.fn(request)
                return reply if type(reply) is _bytes else _reply_bytes(reply)
            except _error as exc:
                text = exception_text(exc).encode("utf-8", "replace")
                return lib.berm_region_stage(self.raw, text, len(text)) | _error_bit
            except Exception as exc:  # noqa: BLE001 - a capability bug is a trap, never an escape
                return self.trap(TrapKind.HOST_CALL_FAILED, number, failed_detail(cap.name, exc))
        except BaseException as exc:  # noqa: BLE001 - nothing may unwind through guest code
            if not isinstance(exc, Exception):
                self.pending = exc
            return self.trap(TrapKind.HOST_CALL_FAILED, number, f"{type(exc).__name__}: {exception_text(exc)}")

    def reraise(self) -> None:
        """After a run that trapped: raise the ``pending`` exception, if a host call left one."""
        exc, self.pending = self.pending, None
        if exc is not None:
            raise exc

    def trap(self, kind: TrapKind, addr: int, detail: str) -> int:
        """Record a trap raised on the Python side of a host call (the core adds the ecall's pc); returns the
        (ignored) a0."""
        ctx = self.ctx
        ctx.trap_kind = _CODES[kind]
        ctx.trap_addr = addr
        self.detail = detail
        return 0

    def log_line(self, request: bytes | None) -> int:
        if request is None:
            return self._buffer_trap("berm.log")
        if self.log is not None:
            raw = self.raw
            line, raw.logged = budgeted_log(raw.logged, log_text(request, raw.call_len))
            if line is None:
                return 0
            try:
                self.log(line)
            except Exception as exc:  # noqa: BLE001 - a broken sink must not escape into guest code
                return self.trap(TrapKind.HOST_CALL_FAILED, LOG, failed_detail("berm.log", exc))
        return 0

    def _buffer_trap(self, call: str) -> int:
        ptr, n = self.raw.call_ptr, self.raw.call_len
        return self.trap(TrapKind.HOST_CALL_FAILED, ptr,
                         f"{call}: the buffer at {ptr:#x} ({n} bytes) is not readable guest memory")


def _reply_bytes(reply: object) -> bytes:
    if not isinstance(reply, (bytes, bytearray, memoryview)):
        raise TypeError(f"returned {type(reply).__name__}, not bytes")
    return bytes(reply)


def load_code(path: str, prefix: str, windows: Windows, key: str | None = None, shown_as: str | None = None) -> Code:
    """dlopen a translated object and return its program ``prefix``, once the core has checked it was translated
    for memory with ``windows`` and, given ``key``, compiled under that cache key (an entry renamed under another
    image's key is refused). ``shown_as`` names the object in errors instead of ``path``: a code cache's object is
    opened through a descriptor (``/proc/self/fd/N/…``), a name that means nothing outside this process (found by
    a review: an error said to remove such a path)."""
    err = ffi.new("char[512]")
    layout = ffi.new("uint64_t[]", list(windows.values()))  # BERM_LAYOUT_WORDS of them (tests/test_aot_layout.py)
    frame = ffi.new("uint64_t *")
    handle = _slot("void **", lib.berm_unload)
    enter = lib.berm_load(path.encode(), (prefix + ENTRY_SYMBOL).encode(), (prefix + LAYOUT_SYMBOL).encode(),
                          layout, key.encode() if key is not None else ffi.NULL, frame, handle, err, 512)
    shown = shown_as or path
    if enter == ffi.NULL:
        raise HostError(f"cannot load translated code: {ffi.string(err).decode(errors='replace').replace(path, shown)}")
    locator = lib.berm_object_symbol(handle[0], (prefix + LOCATOR_SYMBOL).encode())
    if locator == ffi.NULL:
        raise HostError(f"cannot load translated code: {shown} has no {prefix + LOCATOR_SYMBOL}")
    return Code(enter, frame[0], handle, locator)


def _slot(ctype: str, release):
    """An owner for what a core constructor makes (core.h): a pointer slot, empty until the constructor fills it,
    whose contents ``release`` frees when the slot goes — also when an exception, a KeyboardInterrupt raised as
    the constructor returns, unwinds the frame that made it."""
    return ffi.gc(ffi.new(ctype), release)
