"""The embedding API: an ``Engine`` loads images, an ``Image`` makes harnesses, a ``Harness`` calls tools.

    engine = Engine()                                  # translated code ("aot"), or kind="interp"
    image = engine.load("harness.elf")                 # compiles on a cache miss
    harness = image.harness(linker, name="os")         # the linker is the capability set
    text = harness.call("read", b"...")                # ToolFailure / Trap / HostError otherwise

Every invocation runs in fresh guest memory under the engine's deadline (one watchdog thread for all).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from pathlib import Path

from berm_abi.errors import BermError
from berm_aot.cache import CodeCache
from berm_aot.elf import file_limit, read_file
from berm_aot.errors import ManifestError, NoManifestError, about_file
from berm_aot.image import ElfImage
from berm_aot.manifest import Manifest, lifecycle_exports, load_manifest, tool_exports
from berm_aot.program import Program
from berm_host.backend import Backend, RunRequest
from berm_host.declaration import MAX_TIMEOUT, is_timeout
from berm_host.image_facts import ElfFacts, load_facts, read_elf
from berm_host.layout import DEFAULT_MAX_RESULT, DEFAULT_MEMORY, check_memory_size
from berm_host.linker import Linker
from berm_host.traps import HostError, ToolFailure, Trap, TrapInfo

#: Receives (harness name, raw log line) for every ``berm.log``.
EngineLog = Callable[[str, bytes], None]
KINDS = ("aot", "interp")
#: The shortest run a caller's deadline can leave an invocation, in seconds.
MIN_TIMEOUT = 0.001


class Engine:
    def __init__(self, *, kind: str = "aot", memory_size: int = DEFAULT_MEMORY, cache_dir: Path | None = None,
                 deadline: float = 60.0, log: EngineLog | None = None, jobs: int | None = None,
                 max_result: int = DEFAULT_MAX_RESULT, on_compile: Callable[[str], None] | None = None):
        """``max_result``: the longest tool result (bytes) ``Harness.call`` accepts; a longer one is a HostError
        (fixed per image when it loads). ``on_compile``: told in a line what a load is about to compile, before
        a cache miss compiles (seconds for a small image, minutes for a large one)."""
        if kind not in KINDS:
            raise ValueError(f"engine kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if log is not None and not callable(log):
            raise ValueError(f"log must be a callable taking (harness name, line), not {log!r:.60}")
        if not is_timeout(deadline):
            raise ValueError(f"the deadline must be a number of seconds in (0, {MAX_TIMEOUT:g}], not {deadline!r}")
        if jobs is not None and (type(jobs) is not int or jobs < 1):
            raise ValueError(f"jobs must be a positive number of compilers, not {jobs!r}")
        if type(max_result) is not int or not 0 <= max_result < 1 << 64:
            raise ValueError(f"the result cap must be a number of bytes, not {max_result!r}")
        if kind == "aot":  # imported here, not at the first load, which may run in a thread: a child forked while
            importlib.import_module("berm_host.aot.backend")  # another thread imported it waited for ever to as well
        self._kind = kind
        self._max_result = max_result
        self._memory_size = check_memory_size(memory_size)
        self.cache = CodeCache(cache_dir)
        self._deadline = deadline
        self.log = log
        self.on_compile = on_compile
        self.jobs = jobs or min(2, os.cpu_count() or 1)
        #: loaded images while anyone holds them (an image, a harness of it, a region running its code): an image
        #: nobody holds is unloaded, its translated object closed, so an engine that loads image after image does
        #: not grow without bound
        self._images: weakref.WeakValueDictionary[str, Image] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()  # guards the two dicts, never held while an image loads
        self._loading: dict[str, _Gate] = {}
        _ENGINES.add(self)

    # Read-only, checked once: found by a review, an engine's deadline set to 0 after it was made (a plain attribute
    # then) let a spinning guest run for ever on translated code (the core reads 0 as "no deadline").
    kind = property(lambda self: self._kind, doc="aot or interp")
    memory_size = property(lambda self: self._memory_size, doc="bytes of guest memory each invocation gets")
    deadline = property(lambda self: self._deadline, doc="seconds an invocation may run")
    max_result = property(lambda self: self._max_result, doc="the longest tool result accepted, in bytes")

    def _after_fork_in_child(self) -> None:
        """A forked child has only the thread that forked: locks other threads held (a load in progress holds its
        digest's gate for the whole compile) would stay held for ever, and the child's own load of that image
        would wait on them (83 of 100 children of a process loading in another thread hung). The child starts
        with fresh ones and no load in progress."""
        self._lock = threading.Lock()
        self._loading = {}

    def load(self, source: str | Path | bytes) -> Image:
        """The image in ``source`` (ELF bytes or a path), translated and loaded; the same bytes load once while
        the image is held (a later load of an image dropped since is a cached load again).

        Loads of different images proceed side by side (a cold compile takes seconds); concurrent loads of the
        same bytes wait for the one that is compiling and share its image."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            return self._load(bytes(source))
        data = read_file(source, file_limit(self.memory_size))  # its errors name the file
        with about_file(source):  # which file, for whoever reads the message
            return self._load(data)

    def _load(self, data: bytes) -> Image:
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            image = self._images.get(digest)
            if image is not None:
                return image
            gate = self._loading.setdefault(digest, _Gate())
            gate.users += 1
        try:
            with gate.lock:
                with self._lock:
                    image = self._images.get(digest)
                if image is not None:  # another thread loaded it while this one waited at the gate
                    return image
                if gate.failure is not None:  # ... or failed to: waiting threads share that, not each retry it
                    raise gate.failure
                try:
                    image = Image(self, self._facts(data, digest))
                except Exception as exc:  # not a KeyboardInterrupt of this thread's: the waiting threads load
                    gate.failure = exc    # themselves then (it was raised in each of them: found by a review)
                    raise
                with self._lock:
                    self._images[digest] = image
                return image
        finally:
            with self._lock:  # the last thread out removes the gate, after a failed load too (not before: a
                gate.users -= 1  # thread waiting on it and one coming later would then load the same bytes at once)
                if not gate.users and self._loading.get(digest) is gate:  # (a fork's child forgot it: above)
                    del self._loading[digest]

    def _facts(self, data: bytes, digest: str) -> ElfFacts:
        """Translated code keeps the ELF's facts in its cache (a cached load never parses the ELF); the
        interpreter needs the whole program model anyway."""
        if self.kind == "aot":
            return load_facts(self.cache, data, digest)
        return ElfFacts.of(read_elf(data))


#: Every live Engine, for the fork handler.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for engine in list(_ENGINES):
        engine._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Gate:
    """The load of one digest in progress: its lock, how many threads hold or wait for it, and the error it ended
    with, which the threads that waited for it raise too (one failing compile is not rerun by every waiter; a load
    that starts after the last waiter left tries again)."""

    __slots__ = ("lock", "users", "failure")

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0
        self.failure: BaseException | None = None


class Image:
    """A loaded image: its program, digest, manifest (None without ``.berm.abi``) and execution backend.

    The ELF file and the program model are read on first use: a cached translated image runs from its stored
    facts (the full ELF serves trap descriptions and compiling on a cache miss), which keeps loading it cheap."""

    def __init__(self, engine: Engine, facts: ElfFacts):
        self.engine = engine
        self.facts = facts
        self.digest = facts.sha256
        self._manifest_error: ManifestError | None = None
        try:
            self.manifest: Manifest | None = load_manifest(facts)
        except ManifestError as exc:  # no or a bad manifest: the image still runs by symbol (berm run)
            self.manifest, self._manifest_error = None, exc
        self._program: Program | None = None
        self.backend: Backend = self._backend()

    @property
    def elf(self) -> ElfImage:
        return self.facts.elf()

    @property
    def program(self) -> Program:
        if self._program is None:
            self._program = getattr(self.backend, "program", None) or Program.from_image(self.elf)
        return self._program

    def _backend(self) -> Backend:
        e = self.engine
        if e.kind == "interp":
            from berm_host.interp import InterpBackend
            self._program = Program.from_image(self.elf)
            return InterpBackend(self._program, e.memory_size)
        from berm_host.aot.backend import AotBackend
        return AotBackend(self.facts, e.memory_size, cache=e.cache, jobs=e.jobs, max_result=e.max_result,
                          on_compile=e.on_compile)

    def harness(self, linker: Linker | None = None, *, name: str | None = None) -> Harness:
        if self.manifest is None:
            raise self._manifest_error or NoManifestError("the image has no .berm.abi manifest")
        if linker is not None and not isinstance(linker, Linker):  # found by a review: the engines failed apart
            raise HostError(f"the linker must be a berm_host.Linker, not {type(linker).__name__}")
        return Harness(self, Linker() if linker is None else linker, name or self.digest[:12])


class Harness:
    """An image with a capability set and a name, ready to call tools (from any number of threads)."""

    def __init__(self, image: Image, linker: Linker, name: str):
        self.image = image
        self._engine = image.engine
        self.linker = linker
        self.name = name
        exports = tool_exports(image.facts)
        self._entries = {t.name: exports[t.name] for t in image.manifest.tools}
        self._lifecycle = lifecycle_exports(image.facts)
        log = image.engine.log
        self._log = partial(log, name) if log is not None else None
        #: translated code has a fast path that skips the register file (the interpreter does not)
        self._call_tool = getattr(image.backend, "call_tool", None)
        self._max_result = image.engine.max_result

    @property
    def tools(self) -> tuple[str, ...]:
        return tuple(self._entries)

    @property
    def exports(self) -> frozenset[str]:
        """Which lifecycle exports (``on_wake``, ``on_notify``) the image has: what it takes part in."""
        return frozenset(self._lifecycle)

    def call(self, tool: str, args: bytes | str = b"", *, deadline: float | None = None) -> str:
        """Run ``tool`` and return its result text. ``deadline`` (a ``time.monotonic()`` instant) can only
        shorten the engine's own deadline."""
        entry = self._entries.get(tool) if type(tool) is str else None
        if entry is None:
            shown = repr(tool[:80] if type(tool) is str else tool)[:90]  # any object a caller passed
            raise HostError(f"harness {self.name} has no tool {shown} (it has: {', '.join(self._entries)})")
        blob = args if type(args) is bytes else tool_args(args)
        timeout = self._engine._deadline if deadline is None else self._timeout(deadline)  # the common case inline
        if self._call_tool is not None:
            out = self._call_tool(entry, blob, self.linker, self._log, timeout)
            if type(out) is str:
                return out
            trap, failure, data, a0, a1 = out
        else:
            r = self.image.backend.run(RunRequest(entry=entry, args=blob, linker=self.linker, log=self._log,
                                                  deadline=time.monotonic() + timeout, read_result=True,
                                                  max_result=self._max_result))
            trap, failure, data, a0, a1 = r.trap, r.failure, r.result, r.a0, r.a1
        if trap is not None or failure is not None:
            _raise_outcome(trap, failure, tool)
        if data is None:
            cap = self._max_result
            if a1 > cap and self.image.backend.layout.readable(a0, a1):
                raise HostError(f"tool {tool} returned a result of {a1} bytes, over the cap of {cap} bytes")
            raise HostError(f"tool {tool} returned a result at {a0:#x} ({a1} bytes) that is not inside guest memory")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HostError(f"tool {tool} returned a result that is not UTF-8 (byte {exc.start})") from None

    def enter(self, export: str, args: bytes | str = b"", *, deadline: float | None = None) -> None:
        """Run the lifecycle export ``export`` (``on_wake``/``on_notify``) with ``args``; what it returns is not
        read (nobody waits for a wake's result). Raises Trap or ToolFailure like ``call``."""
        entry = self._lifecycle.get(export)
        if entry is None:
            raise HostError(f"harness {self.name} does not export {export}")
        r = self.image.backend.run(RunRequest(entry=entry, args=tool_args(args), linker=self.linker, log=self._log,
                                              deadline=time.monotonic() + self._timeout(deadline)))
        _raise_outcome(r.trap, r.failure, export)

    def _timeout(self, deadline: float | None) -> float:
        """Seconds this invocation may run: the engine's deadline, shortened by the caller's. Never zero or less
        (which the core reads as "no deadline"): a deadline already past leaves a millisecond, then the interrupt."""
        timeout = self._engine._deadline
        if deadline is None:
            return timeout
        if type(deadline) not in (int, float) or deadline != deadline:  # nan: min() would have ignored it
            raise ValueError(f"the deadline must be a time.monotonic() instant, not {deadline!r:.40}")
        try:
            left = deadline - time.monotonic()
        except OverflowError:  # an int past a float's range
            raise ValueError(f"the deadline must be a time.monotonic() instant, not {deadline!r:.40}") from None
        return max(MIN_TIMEOUT, min(timeout, left))


def _raise_outcome(trap: TrapInfo | None, failure: bytes | None, name: str) -> None:
    """An invocation's outcome as the exception ABI §3 orders: a trap first (carrying a ``berm.fail`` text the guest
    recorded before it: a panic handler's message), then a ``berm.fail`` text."""
    if trap is not None:
        raise Trap(trap, name, failure.decode("utf-8", "replace") if failure is not None else None)
    if failure is not None:
        raise ToolFailure(name, failure.decode("utf-8", "replace"))


def tool_args(args: bytes | str | object) -> bytes:
    """Tool arguments as bytes: str as UTF-8, any bytes-like object copied (an int is not one: ``bytes(5)`` would
    hand the guest five zero bytes)."""
    try:
        return args.encode("utf-8") if isinstance(args, str) else memoryview(args).tobytes()
    except (UnicodeEncodeError, TypeError) as exc:
        raise HostError(f"tool arguments are not valid UTF-8 text or bytes: {exc}") from None


__all__ = ["BermError", "Engine", "EngineLog", "Harness", "Image", "tool_args"]
