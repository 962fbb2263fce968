"""One guest image on both engines, for tests that run it with arguments at the edges of guest memory and compare
how each run ends (tests/test_aot_groups.py, tests/test_aot_loops.py)."""

from __future__ import annotations

from berm_aot.elf import read_elf
from berm_host.engine import Engine
from berm_host.layout import DEFAULT_MEMORY, layout_for, stack_size

#: The end of default guest memory and the bottom of its stack.
TOP = DEFAULT_MEMORY
LOW = DEFAULT_MEMORY - stack_size(DEFAULT_MEMORY)


def both_engines(elf: bytes, cache_dir):
    """``(symbol addresses by name, memory layout, backend by engine kind)`` for ``elf`` on ``aot`` and ``interp``."""
    image = read_elf(elf)
    symbols = {s.name: s.value for s in image.symbols}
    backends = {kind: Engine(kind=kind, cache_dir=cache_dir).load(elf).backend for kind in ("aot", "interp")}
    return symbols, layout_for(image), backends


def outcome(result):
    """What the tests compare of a run: its a0, or the trap's kind, pc and address; and any tool failure."""
    trap = result.trap
    return (result.a0 if trap is None else None, trap and (trap.kind, trap.pc, trap.addr), result.failure)
