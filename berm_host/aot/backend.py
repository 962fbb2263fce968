"""``AotBackend``: translated code as a ``berm_host.backend.Backend``.

An invocation takes a pooled guest memory region, registers it with the watchdog when it has a deadline, and
makes one call into the core (``berm_run``, GIL released) that resets the region's dirty pages from the last
invocation, zeroes the registers and runs the translated entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from berm_aot.cache import CodeCache
from berm_aot.image import ElfImage, read_segments
from berm_aot.locator import Locator
from berm_aot.program import Program
from berm_host.backend import RunRequest, RunResult
from berm_host import watchdog
from berm_host.image_facts import ElfFacts
from berm_host.layout import DEFAULT_MEMORY, Layout, layout_for
from berm_host.traps import HostError, TrapInfo, TrapKind, illegal_detail, trap_info

#: What ``call_tool`` returns when the result is not plain text: (trap, failure, result, a0, a1).
ToolOutcome = tuple[TrapInfo | None, bytes | None, bytes | None, int, int]

from .objects import cached_object, object_key
from .runtime import POOL_LIMIT, MemoryImage, Region, capability_lookup, lib, load_code, run_text

_OK, _TRAPPED, _FAILED, _BIG = lib.BERM_RUN_OK, lib.BERM_RUN_TRAPPED, lib.BERM_RUN_FAILED, lib.BERM_RUN_BIG_RESULT
_TRIM = lib.BERM_RUN_TRIM
_BUSY = lib.BERM_RUN_BUSY
_run = lib.berm_run
_trim = lib.berm_region_trim


def image_hull(image: ElfImage | ElfFacts, layout: Layout) -> bytes:
    """The initial bytes of ``[image_lo, end of the last file bytes)``: segment file bytes, zero between them.
    Zero-initialised memory above (.bss) is not included: it costs nothing, however large it claims to be."""
    end = max((seg.vaddr + min(len(seg.data), seg.memsz) for seg in image.segments if seg.data),
              default=layout.image_lo)
    hull = bytearray(max(0, end - layout.image_lo))
    for seg in image.segments:
        off = seg.vaddr - layout.image_lo
        data = seg.data[:seg.memsz]
        hull[off:off + len(data)] = data
    return bytes(hull)


class AotBackend:
    """An image translated, compiled and loaded, with ``memory_size`` bytes of guest memory per invocation.

    ``source`` is a ``Program``, or an ``ElfImage`` or ``ElfFacts`` whose program model is built only to compile
    (a trap is described from the locator the object carries). ``code`` names an already-built object and the
    prefix of the program's symbols in it; without it the object comes from ``cache`` (compiled on a miss). Either
    way the code must have been translated for this memory's layout (the core checks). ``compiled`` says whether this
    construction ran the C compiler. ``max_result``: ``call_tool`` gives no bytes for a result longer than this
    (None: no cap). ``on_compile`` receives a line saying what is compiled before a cache miss compiles.
    """

    def __init__(self, source: Program | ElfImage | ElfFacts, memory_size: int = DEFAULT_MEMORY, *,
                 cache: CodeCache | None = None, code: tuple[Path, str] | None = None, jobs: int = 2,
                 max_result: int | None = None, on_compile: Callable[[str], None] | None = None):
        self._program = source if isinstance(source, Program) else None
        self._locator: Locator | None = None
        self.image = source.image if isinstance(source, Program) else source
        self.layout = layout_for(self.image, memory_size)
        windows = self.layout.windows()  # an ElfError for a layout the checks cannot be exact for
        key = None
        if code is None:
            cache = cache or CodeCache()
            key = object_key(self.image, windows, cache=cache)
            path, self.compiled = cached_object(self.image, windows, cache, lambda: self._to_compile(on_compile),
                                                jobs=jobs, key=key)
            code, loaded = (path, ""), cache.loadable(path)
        else:
            self.compiled = False
            loaded = str(code[0])
        self.object_path = Path(code[0])
        self.memory = MemoryImage(self.layout, image_hull(self.image, self.layout),
                                  load_code(loaded, code[1], windows, key, shown_as=str(code[0])), max_result)
        watchdog.ensure_started()

    def _to_compile(self, on_compile: Callable[[str], None] | None) -> Program:
        """The program model, for a cache miss: said to ``on_compile`` first (a large image takes minutes)."""
        program = self.program
        if on_compile is not None:
            code = sum(s.size for s in program.image.sections if s.executable and s.alloc)
            on_compile(f"translating and compiling {max(1, round(code / 1024))} KB of guest code into the code cache "
                       "(once per image and memory size)")
        return program

    @property
    def program(self) -> Program:
        if self._program is None:
            image = self.image
            self._program = Program.from_image(image.elf() if isinstance(image, ElfFacts) else image)
        return self._program

    @property
    def locator(self) -> Locator:
        """Where guest addresses are, for describing traps: the program's, else read from the object."""
        if self._locator is None:
            if self._program is not None:
                self._locator = self._program.locator
            else:
                segments = self.image.segments
                self._locator = Locator.loads(self.memory.code.locator(), lambda a, n: read_segments(segments, a, n))
        return self._locator

    # -- one invocation -----------------------------------------------------------------------------------------

    def run(self, request: RunRequest) -> RunResult:
        memory = self.memory
        region = memory.acquire()
        for i, v in enumerate(request.int_args):
            region.int_args[i] = v & 0xFFFFFFFFFFFFFFFF
        args = bytes(request.args)
        region.calls.bind(request.linker, request.log)
        timeout = 0.0 if request.deadline is None else max(request.deadline - time.monotonic(), 1e-9)
        outcome = _run(region.ptr, request.entry, args, len(args), len(request.int_args), timeout)
        kind = outcome & ~_TRIM
        if kind == _BUSY:
            raise _busy()
        trap = self.trap_info(region) if kind == _TRAPPED else None
        regs = tuple(region.regs)
        result = None
        if (request.read_result and kind in (_OK, _FAILED, _BIG) and self.layout.holds_result(regs[10], regs[11])
                and (request.max_result is None or regs[11] <= request.max_result)):
            result = region.read(regs[10], regs[11])
        snapshot = tuple(region.copy_out(addr, n) for addr, n in request.snapshot)
        failure = region.failure()
        if outcome & _TRIM:
            _trim(region.ptr)
        memory.release(region)
        if trap is not None:
            region.calls.reraise()
        return RunResult(regs=regs, pc=trap.pc if trap else 0, trap=trap, failure=failure, result=result,
                         snapshot=snapshot)

    def call_tool(self, entry: int, args: bytes, linker, log, timeout: float) -> str | ToolOutcome:
        """The harness fast path: ``run`` minus the register file and snapshots, interrupted ``timeout`` seconds
        from now. Returns the result text when the tool returned a readable UTF-8 result within the backend's
        ``max_result``; otherwise (trap, failure text, result bytes — None when (a0, a1) is not readable or a1 is
        over the cap, a0, a1).

        Every step is inlined (a Python call costs ~50 ns): pool pop, one call into invoke.c's run_text (reset +
        run with the GIL released, then the result str built from guest memory), pool push. Nothing here can raise
        between taking the region and giving it back, except out of memory — and then the region is merely not
        pooled again. An idle region keeps its last linker and log (so the next invocation with the same ones
        rebinds nothing)."""
        pool = self.memory.pool
        try:
            region = pool.pop()
        except IndexError:  # empty (also when another thread took the last one after a check)
            region = Region(self.memory)
        calls = region.calls
        if linker is not calls.linker:  # calls.bind(linker, log), inlined
            calls.linker = linker
            calls.lookup = capability_lookup(linker)
        calls.log = log
        calls.detail = ""
        out = run_text(region.addr, entry, args, timeout)
        if type(out) is not str:
            regs = region.regs
            out = self._outcome(region, out, regs[10], regs[11])
        if len(pool) < POOL_LIMIT:
            pool.append(region)
        return out

    def _outcome(self, region: Region, outcome: int, a0: int, a1: int) -> ToolOutcome:
        """``call_tool``'s every other case: a trap, a failure, a result that is unreadable or over the cap, and a
        region that now keeps too much memory resident (trimmed here, after its result has been read)."""
        kind = outcome & ~_TRIM
        if kind == _BUSY:
            raise _busy()
        if kind == _TRAPPED:
            region.calls.reraise()
            out = self.trap_info(region), region.failure(), None, a0, a1
        elif kind == _FAILED:
            out = None, region.failure(), None, a0, a1
        else:
            out = None, None, region.memory[a0:a0 + a1] if kind == _OK else None, a0, a1
        if outcome & _TRIM:
            _trim(region.ptr)
        return out

    def trap_info(self, region: Region) -> TrapInfo | None:
        record = region.trap_record()
        if record is None:
            return None
        kind, pc, addr, detail = record
        if kind is TrapKind.ILLEGAL_INSTRUCTION:
            detail = illegal_detail(self.locator, pc, addr)
        return trap_info(kind, pc, addr, detail, self.locator, self.layout, region.call_chain())


def _busy() -> HostError:
    """The core refused a run on a region that is running (the pool hands a region to one run at a time, so this
    is a bug in the caller, not the guest)."""
    return HostError("internal error: a run was started on a memory region that is already running")
