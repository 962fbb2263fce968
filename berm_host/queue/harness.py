"""The queue's binding to the engine: a loaded harness (``berm_host.engine.Harness``) as a queue ``Target``.

A tool call is ``Harness.call``; a wake enters the export ``on_wake`` and an event ``on_notify`` (plain global
functions the SDK declares, berm_recurring.h) through ``Harness.enter``. Both run in fresh guest memory with the
harness's linker, under the executor's deadline or the declaration's ``timeout``, whichever is sooner.
"""

from __future__ import annotations

from pathlib import Path

from berm_host.declaration import Declaration
from berm_host.engine import Engine, EngineLog, Harness
from berm_host.linker import Linker

from .executor import DEFAULT_TIMEOUT
from .invocation import EXPORT_OF, Invocation, Trigger


class HarnessTarget:
    """One loaded harness: its tools, and which of ``on_wake``/``on_notify`` it exports."""

    def __init__(self, harness: Harness):
        self.harness = harness
        self.tools = frozenset(harness.tools)
        self.exports = harness.exports

    def invoke(self, inv: Invocation, deadline: float) -> str:
        if inv.trigger is Trigger.CALL:
            return self.harness.call(inv.tool or "", inv.args, deadline=deadline)
        self.harness.enter(EXPORT_OF[inv.trigger], inv.args, deadline=deadline)
        return ""


class Loader:
    """Loads declared harnesses on one engine kind. Harnesses whose declarations ask for the same memory size and
    timeout share an ``Engine``, so the same image bytes are translated and loaded once for all of them."""

    def __init__(self, kind: str = "aot", *, timeout: float = DEFAULT_TIMEOUT, log: EngineLog | None = None,
                 cache_dir: Path | None = None):
        self.kind = kind
        self.timeout = timeout
        self.log = log
        self.cache_dir = cache_dir
        self._engines: dict[tuple[int, float], Engine] = {}

    def load(self, decl: Declaration, image: bytes | Path, linker: Linker) -> HarnessTarget:
        key = (decl.memory_size, decl.timeout or self.timeout)
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = Engine(kind=self.kind, memory_size=key[0], deadline=key[1], log=self.log,
                                                 cache_dir=self.cache_dir)
        return HarnessTarget(engine.load(image).harness(linker, name=decl.name))
