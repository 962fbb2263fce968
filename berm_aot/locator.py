"""Where a guest address is, in words: the executable section and function holding it, the instruction there.

A trap names its pc's function and offset and, for an illegal instruction, what lies at the pc. The program model
(``berm_aot.program``) knows all of that, but building it decodes every reachable instruction — seconds for a
large Rust image — which a translated image loaded from the code cache would pay at its first trap only to name
it. A ``Locator`` holds just what naming needs: the executable sections' bytes and the functions' starts and names.
The program model is built on one; the translator writes it into every object it compiles (``dumps``, in
``berm_aot.emit``) and the runtime reads it back from there (``loads``), so both engines word a trap alike.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from berm_aot.decode import decode
from berm_aot.demangle import shown_name
from berm_aot.isa import Instruction


@dataclass(frozen=True)
class Function:
    name: str
    start: int
    end: int


@dataclass(frozen=True)
class CodeSection:
    """An executable section's address and bytes."""

    addr: int
    data: bytes

    @property
    def end(self) -> int:
        return self.addr + len(self.data)

    def decode_at(self, addr: int) -> Instruction:
        return decode(self.data, addr - self.addr, addr)


class CodeSections:
    """The executable sections of an image, found by address."""

    def __init__(self, sections: Iterable[CodeSection]):
        self.sections = sorted(sections, key=lambda s: s.addr)
        self._starts = [s.addr for s in self.sections]

    def section_of(self, addr: int) -> CodeSection | None:
        k = bisect.bisect_right(self._starts, addr) - 1
        if k >= 0 and addr < self.sections[k].end:
            return self.sections[k]
        return None


class Locator:
    """The functions of a program (each executable section partitioned at the function starts) over its code."""

    def __init__(self, code: CodeSections, functions: tuple[Function, ...]):
        self.code = code
        self.functions = functions
        self.function_starts = frozenset(f.start for f in functions)
        self._starts = [f.start for f in functions]
        self._decoded: dict[int, Instruction] = {}

    def in_code(self, addr: int) -> bool:
        """Whether ``addr`` lies inside an executable section."""
        return self.code.section_of(addr) is not None

    def function_at(self, pc: int) -> Function | None:
        k = bisect.bisect_right(self._starts, pc) - 1
        if k >= 0 and pc < self.functions[k].end:
            return self.functions[k]
        return None

    def symbolize(self, pc: int) -> str:
        """``name+0x1c`` of the function containing ``pc``, ``name`` at its start, ``0x…`` outside every one; a
        Rust name demangled (``__rustc::rust_begin_unwind``, berm_aot.demangle), on one line (escaped) and cut to
        MAX_NAME characters: the image chose it, and a trap repeats it for each frame of its chain (two 8 MB names
        made 264 MB of trap text)."""
        f = self.function_at(pc)
        if f is None:
            return f"{pc:#x}"
        name = shown_name(f.name)
        return name if pc == f.start else f"{name}+{pc - f.start:#x}"

    def instruction(self, addr: int) -> Instruction:
        """The instruction at ``addr``, decoded now (an address outside every executable section gives an
        ``illegal`` instruction with note ``"not code"``; a 4-byte encoding straddling the section's end, one with
        note ``"truncated"``)."""
        insn = self._decoded.get(addr)
        if insn is None:
            sec = self.code.section_of(addr)
            insn = Instruction(addr, 2, 0, "illegal", note="not code") if sec is None else sec.decode_at(addr)
            self._decoded[addr] = insn
        return insn

    # -- the form written into a translated object ---------------------------------------------------------------

    def dumps(self) -> list[str]:
        """The lines of a JSON text, one per section, name and function (ASCII: names are escaped), for ``loads``.
        Each name is written once and functions refer to it by index: symbols may share one long name, and a
        review's 1,000 functions sharing one 300 KB name made 300 MB of it. Function ends are not written: each
        ends at the next function's start or its section's end."""
        names = {name: index for index, name in enumerate(dict.fromkeys(f.name for f in self.functions))}
        return ['{"sections": [', *_items([[s.addr, len(s.data)] for s in self.code.sections]), '],',
                '"names": [', *_items(list(names)), '],',
                '"functions": [', *_items([[f.start, names[f.name]] for f in self.functions]), ']}']

    @classmethod
    def loads(cls, text: str, read: Callable[[int, int], bytes]) -> Locator:
        """The locator ``dumps`` wrote, its sections' bytes from ``read(addr, size)`` (the image's segments)."""
        table = json.loads(text)
        code = CodeSections(CodeSection(addr, read(addr, size)) for addr, size in table["sections"])
        names = table["names"]
        return cls(code, partition(code, {start: names[index] for start, index in table["functions"]}))


def _items(rows: list) -> list[str]:
    return [json.dumps(row) + ("," if k + 1 < len(rows) else "") for k, row in enumerate(rows)]


def partition(code: CodeSections, names: dict[int, str]) -> tuple[Function, ...]:
    """Each executable section cut at the function starts (the keys of ``names``; every section's start is one),
    each piece named by ``names``."""
    ordered = sorted(names)
    functions = []
    for sec in code.sections:
        inner = ordered[bisect.bisect_left(ordered, sec.addr):bisect.bisect_left(ordered, sec.end)]
        for k, start in enumerate(inner):
            end = inner[k + 1] if k + 1 < len(inner) else sec.end
            functions.append(Function(names[start], start, end))
    return tuple(functions)
