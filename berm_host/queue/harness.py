"""The queue's binding to the engines: a loaded harness image as a queue ``Target``.

A tool call enters ``berm_tool_<tool>``; a wake enters the export ``on_wake``, an event ``on_notify`` — plain
global functions that return like a tool (ABI.md §3), which is how the SDK declares them (berm_recurring.h).
Each invocation runs in fresh guest memory with the harness's linker, under the executor's deadline (or the
declaration's own ``timeout`` when shorter); its outcome follows ABI.md §3: a trap, else a ``berm.fail`` text,
else the UTF-8 result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from berm_aot.elf import read_elf
from berm_aot.manifest import load_manifest, tool_exports
from berm_aot.program import Program
from berm_host.backend import Backend, LogSink, RunRequest
from berm_host.declaration import Declaration
from berm_host.layout import DEFAULT_MEMORY
from berm_host.linker import Linker
from berm_host.traps import HostError, ToolFailure, Trap

from .invocation import EXPORT_OF, Invocation, Trigger

guest_log = logging.getLogger("berm.guest")

EXPORTS = tuple(EXPORT_OF.values())


def _backend(kind: str, program: Program, memory: int) -> Backend:
    if kind == "aot":
        from berm_host.aot.backend import AotBackend
        return AotBackend(program, memory)
    if kind == "interp":
        from berm_host.interp.backend import InterpBackend
        return InterpBackend(program, memory)
    raise ValueError(f"the engine is 'aot' or 'interp', not {kind!r}")


class HarnessTarget:
    """One declared harness, loaded: entries resolved once, invoked any number of times, concurrently."""

    def __init__(self, name: str, backend: Backend, entries: dict[str, int], linker: Linker, *,
                 timeout: float | None = None, log: LogSink | None = None):
        self.name = name
        self.backend = backend
        self._entries = entries  # "tool:<name>" / "on_wake" / "on_notify" -> guest address
        self.tools = frozenset(k[5:] for k in entries if k.startswith("tool:"))
        self.exports = frozenset(k for k in entries if k in EXPORTS)
        self.linker = linker
        self.timeout = timeout
        self._log = log or self._default_log

    @classmethod
    def load(cls, decl: Declaration, image: bytes | Path, linker: Linker, *, engine: str = "aot",
             log: LogSink | None = None) -> "HarnessTarget":
        """Read, check and load ``image`` (bytes, or a path) for ``decl`` on ``engine``."""
        data = image if isinstance(image, bytes) else Path(image).read_bytes()
        elf = read_elf(data)
        load_manifest(elf)  # refuses a bad manifest or a declared tool that is not exported
        program = Program.from_image(elf)
        entries = {f"tool:{name}": addr for name, addr in tool_exports(elf).items()}
        entries |= {e: addr for e in EXPORTS if (addr := program.symbol(e)) is not None}
        backend = _backend(engine, program, decl.memory or DEFAULT_MEMORY)
        return cls(decl.name, backend, entries, linker, timeout=decl.timeout, log=log)

    def _default_log(self, line: bytes) -> None:
        guest_log.info("[%s] %s", self.name, line.decode("utf-8", "replace"))

    def invoke(self, inv: Invocation, deadline: float) -> str:
        if inv.trigger is Trigger.CALL:
            key, label = f"tool:{inv.tool}", inv.tool or ""
        else:
            key = label = EXPORT_OF[inv.trigger]
        entry = self._entries.get(key)
        if entry is None:
            raise HostError(f"harness {self.name!r} has no {'tool ' + label if inv.trigger is Trigger.CALL else label}")
        if self.timeout is not None:
            deadline = min(deadline, time.monotonic() + self.timeout)
        result = self.backend.run(RunRequest(entry=entry, args=inv.args, linker=self.linker, deadline=deadline,
                                             log=self._log, read_result=True))
        if result.trap is not None:
            raise Trap(result.trap, tool=label)
        if result.failure is not None:
            raise ToolFailure(label, result.failure.decode("utf-8", "replace"))
        if result.result is None:
            raise HostError(f"{label} returned ({result.a0:#x}, {result.a1}), which is not in guest memory")
        try:
            return result.result.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HostError(f"{label} returned bytes that are not UTF-8 (byte {exc.start})") from None


def harness_target(decl: Declaration, linker: Linker, *, harnesses_dir: Path | None = None, engine: str = "aot",
                   log: Callable[[bytes], None] | None = None) -> HarnessTarget:
    """The declared harness's image (verified against its sha256 when pinned), loaded as a queue target."""
    return HarnessTarget.load(decl, decl.load_image(harnesses_dir), linker, engine=engine, log=log)
