"""The program model of docs/SEMANTICS.md "Program model": functions, legal indirect targets and reachable code.

Both engines (the reference interpreter and the translator) work from a ``Program`` so that they agree on what a
function is, which indirect jumps are legal and which bytes are code. ``Program.from_image`` decodes by recursive
descent from the known entries — never by a linear sweep, so data inside ``.text`` is never mistaken for code.

Decisions this module makes where SEMANTICS leaves room:

- Descent stops after an unconditional ``jal x0``, any ``jalr x0`` (return, indirect jump, tail call), ``ebreak``
  (it traps; compilers put it, or an illegal word, after calls that never return) and an illegal or unsupported
  encoding. It continues after calls (``jal``/``jalr`` with rd ≠ x0) and ``ecall``.
- Fall-through off the end of an executable section reaches no code; a 4-byte encoding that would straddle the
  section end decodes as illegal ("truncated").
- No instruction starts at an odd address: a ``jalr`` clears bit 0 of its target, and every other transfer is an
  even offset from an even pc. An odd function symbol or relocation target starts nothing (an executable section
  at an odd address is refused with the ELF).
"""

from __future__ import annotations

import bisect
from types import MappingProxyType
from typing import Mapping

from berm_aot.decode import decode
from berm_aot.errors import DecodeError, ElfError
from berm_aot.image import ElfImage, Symbol
from berm_aot.isa import BRANCHES, NO_FALL_THROUGH, Instruction
from berm_aot.locator import CodeSection, CodeSections, Function, Locator, partition

#: Relocation types of a ``call``/``tail``: unrelaxed, an ``auipc``/``jalr`` pair (an indirect call or tail call),
#: so its ``S + A`` is a legal indirect target; relaxed or not, a function entry, so also a function start.
CALL_RELOCATIONS = frozenset({"R_RISCV_CALL", "R_RISCV_CALL_PLT"})

#: Relocation types whose ``S + A`` names a legal indirect target by itself (ABI.md §6).
TARGET_RELOCATIONS = frozenset({"R_RISCV_64", "R_RISCV_32", "R_RISCV_PCREL_HI20"}) | CALL_RELOCATIONS

_BINDING_RANK = {"global": 0, "weak": 1, "local": 2}

#: The longest RV64IMAC encoding, in bytes.
_MAX_INSN_SIZE = 4
#: The most functions an image may have. Each costs the analysis ~2 KB of host memory and ~40 µs before any compile
#: starts, and its C a fixed part, so 4 MiB of code as a million one-instruction functions would have taken ~2 GB
#: and ~45 s up front (berm_aot.elf bounds the code, not how finely it is cut). rust-probe has 154 functions in
#: 58 KB of code, so an image at the code bound has ~11,000 of that size.
MAX_FUNCTIONS = 1 << 16


class _CodeMap(CodeSections):
    """The executable sections of an image, found by address, and recursive descent over them."""

    def __init__(self, image: ElfImage):
        sections = []
        for sec in image.executable_sections():
            try:
                sections.append(CodeSection(sec.addr, image.read(sec.addr, sec.size)))
            except ValueError:
                raise DecodeError(f"executable section {sec.name!r} at {sec.addr:#x} is not inside one loadable "
                                  "segment") from None
        super().__init__(sections)
        self.names = frozenset(s.name for s in image.executable_sections())

    def descend(self, roots: set[int]) -> dict[int, Instruction]:
        """Every instruction reachable from ``roots`` through fall-through and direct branches and jumps."""
        code: dict[int, Instruction] = {}
        work = list(roots)
        while work:
            addr = work.pop()
            sec = self.section_of(addr)
            if sec is None:
                continue
            base, end, data = sec.addr, sec.end, sec.data
            while base <= addr < end and addr not in code:
                insn = code[addr] = decode(data, addr - base, addr)
                op = insn.op
                if op in NO_FALL_THROUGH or (op == "jalr" and insn.rd == 0):
                    break
                if op == "jal":
                    if insn.rd == 0:
                        work.append(addr + insn.imm)
                        break
                    work.append(addr + insn.imm)
                elif op in BRANCHES:
                    work.append(addr + insn.imm)
                addr += insn.size
        return code


def _legal_targets(image: ElfImage) -> set[int]:
    """``S + A`` of every target-naming relocation, and of each ``ADD32`` paired with a ``SUB32`` at its offset
    (a jump-table entry written as a label difference). Not yet filtered to executable sections."""
    sub32 = {(r.section, r.offset) for r in image.relocations if r.type_name == "R_RISCV_SUB32"}
    return {r.target for r in image.relocations
            if r.type_name in TARGET_RELOCATIONS
            or (r.type_name == "R_RISCV_ADD32" and (r.section, r.offset) in sub32)}


def _call_targets(image: ElfImage) -> set[int]:
    """``S + A`` of every ``call``/``tail`` relocation: a function entry even without a ``FUNC`` symbol there (an
    assembler-local ``.L`` label, as zig's compiler-rt names internal functions), which an unrelaxed call reaches
    by ``jalr`` — and only a function start is a legal indirect call. Not yet filtered to executable sections."""
    return {r.target for r in image.relocations if r.type_name in CALL_RELOCATIONS}


def _symbol_rank(sym: Symbol) -> tuple:
    """Sort key of the symbols naming one address: global over weak over local, FUNC over other kinds."""
    return (_BINDING_RANK.get(sym.binding, 3), sym.kind != "func", sym.name)


def _is_label(sym: Symbol) -> bool:
    """A symbol that may name a function: defined, named, and not a section/file symbol, a RISC-V mapping
    symbol (``$x``, ``$d``) or an assembler-local label (``.L…``)."""
    return (sym.section is not None and bool(sym.name) and sym.kind not in ("section", "file")
            and not sym.name.startswith(("$", ".L")))


class Program:
    """Functions, legal indirect targets and reachable code of one image (docs/SEMANTICS.md)."""

    image: ElfImage
    functions: tuple[Function, ...]
    function_starts: frozenset[int]
    indirect_targets: frozenset[int]
    code: Mapping[int, Instruction]

    def __init__(self, image: ElfImage, locator: Locator, indirect_targets: frozenset[int],
                 code: dict[int, Instruction]):
        self.image = image
        self.locator = locator
        self.functions = locator.functions
        self.function_starts = locator.function_starts
        self.indirect_targets = indirect_targets
        self.code = MappingProxyType(code)
        self._globals: dict[str, int] = {}
        for sym in sorted(image.symbols, key=_symbol_rank, reverse=True):  # the best definition is written last
            if sym.binding in ("global", "weak") and sym.section is not None:
                self._globals[sym.name] = sym.value

    @classmethod
    def from_image(cls, image: ElfImage) -> Program:
        """Analyse ``image``. Raises ``DecodeError`` when reachable code holds an F/D, CSR or privileged
        instruction, and ``ElfError`` when it has more than ``MAX_FUNCTIONS`` functions."""
        codemap = _CodeMap(image)

        def may_start(addr: int) -> bool:
            """Whether an instruction may start at ``addr``: in an executable section, and even (a jalr clears the
            target's bit 0, so no jump reaches an odd address; code entered at an odd FUNC symbol made a call whose
            link was odd, which translated code took for the return the interpreter refused: found by a review)."""
            return not addr & 1 and bool(codemap.section_of(addr))

        targets = frozenset(t for t in _legal_targets(image) if may_start(t))
        starts = {s.value for s in image.symbols
                  if s.kind == "func" and s.section in codemap.names and _is_label(s) and may_start(s.value)}
        starts |= {s.addr for s in codemap.sections}  # all even: the ELF reader refuses an odd one
        starts |= _call_targets(image) & targets
        _check_function_count(starts)
        code = codemap.descend(starts | targets)
        starts = _close_starts(starts, code, codemap)
        program = cls(image, Locator(codemap, _functions(image, codemap, starts)), targets, code)
        program._refuse_unsupported()
        return program

    def _refuse_unsupported(self) -> None:
        bad = [insn for insn in self.code.values() if insn.op == "unsupported"]
        if bad:
            insn = min(bad, key=lambda i: i.addr)
            raise DecodeError(f"{insn.note} at {insn.addr:#x} in {self.symbolize(insn.addr)}: "
                              "Berm runs RV64IMAC only")

    # -- queries -------------------------------------------------------------------------------------------------

    def in_code(self, addr: int) -> bool:
        """Whether ``addr`` lies inside an executable section."""
        return self.locator.in_code(addr)

    def function_at(self, pc: int) -> Function | None:
        return self.locator.function_at(pc)

    def symbolize(self, pc: int) -> str:
        """``name+0x1c`` of the function containing ``pc`` (``Locator.symbolize``)."""
        return self.locator.symbolize(pc)

    def symbol(self, name: str) -> int | None:
        """The address of the global (else weak) symbol ``name``, None when the image defines none."""
        return self._globals.get(name)

    def global_names(self) -> list[str]:
        """The names ``symbol`` knows, sorted."""
        return sorted(self._globals)

    def instruction(self, addr: int) -> Instruction:
        """The instruction at ``addr``: from ``code``, else decoded now (``Locator.instruction``)."""
        return self.code.get(addr) or self.locator.instruction(addr)

    def check_indirect(self, src_pc: int, target: int, is_call: bool) -> str | None:
        """How the ``jalr`` at ``src_pc`` may reach ``target``: ``"call"`` (an indirect call to a function start),
        ``"tail"`` (an indirect jump to a function start), ``"local"`` (an indirect jump strictly inside the
        jumping function), or None when the bad-indirect-target trap applies."""
        if target not in self.indirect_targets:
            return None
        if target in self.function_starts:
            return "call" if is_call else "tail"
        if is_call:
            return None
        f = self.function_at(src_pc)
        return "local" if f is not None and f.start < target < f.end else None


def _check_function_count(starts: set[int]) -> None:
    """Refuse an image with more than ``MAX_FUNCTIONS`` function starts, as soon as that many are known: checked only
    once the analysis had found them all, a million function symbols took 35 s and 825 MB to refuse, a million
    ``jal`` targets 25 s (found by a review)."""
    if len(starts) > MAX_FUNCTIONS:
        raise ElfError(f"the image has {len(starts)} functions or more, more than the {MAX_FUNCTIONS} Berm runs (each "
                       "one costs the host's analysis and the compile a fixed part)")


def _close_starts(starts: set[int], code: dict[int, Instruction], codemap: _CodeMap) -> set[int]:
    """Add direct call targets, then close: a direct jump or branch whose target lies in another function than its
    source makes the target a function start; adding a start splits a function, so a start may make more jumps
    cross a boundary. Fall-through counts as a jump: an instruction straddling a function start (a symbol or a
    relocation may name the middle of a 4-byte instruction) falls into the middle of that function, so its
    fall-through address becomes a start too — a call's as well, since its callee returns there.

    Both ends of a jump lie in code, and every section start is a function start, so a jump crosses a boundary
    when a start lies in (min(src, target), max(src, target)]. Starts only grow, so each jump needs to fire once:
    every start is visited once, and finds the jumps whose interval holds it in a segment tree over the addresses
    that can become starts (each jump stored in O(log n) nodes, a node's jumps fired and dropped together). Time
    O((jumps + starts) log n): rescanning every jump until nothing changed took one pass per link of a chain of
    backward jumps — quadratic, 30 s for 32 KB of such code. The tree's leaves are the starts, the jumps' targets
    and what straddling makes starts of them, not every instruction: indexing every byte inside every instruction
    (for the few starts that ever land inside one) took 0.2 s of the 0.7 s a 98 KB guest's translation spent before
    its first unit could start compiling."""
    starts = set(starts)
    jumps: list[tuple[int, int]] = []  # (source, target) of a jump or branch that is not a call
    for insn in code.values():
        if insn.op == "jal" or insn.op in BRANCHES:
            target = insn.addr + insn.imm
            if codemap.section_of(target) is None:
                continue
            if insn.op == "jal" and insn.rd != 0:
                starts.add(target)
            else:
                jumps.append((insn.addr, target))
    _check_function_count(starts)

    def falls_into(point: int) -> list[int]:
        """The fall-through address of each decoded instruction holding ``point`` at a byte after its first."""
        return [insn.next_pc for insn in map(code.get, range(point - _MAX_INSN_SIZE + 1, point))
                if insn is not None and point < insn.next_pc and insn.falls_through
                and codemap.section_of(insn.next_pc) is not None]

    can_start = starts | {t for _, t in jumps}
    work = list(can_start)
    while work:
        for fall in falls_into(work.pop()):
            if fall not in can_start:
                can_start.add(fall)
                work.append(fall)
    points = sorted(can_start)
    size = 1 << max(0, (len(points) - 1).bit_length())
    cover: list[list[int]] = [[] for _ in range(2 * size)]  # segment tree node → jumps whose interval covers it
    for k, (src, target) in enumerate(jumps):
        if target in starts:
            continue
        lo = bisect.bisect_right(points, min(src, target)) + size
        hi = bisect.bisect_right(points, max(src, target)) + size
        while lo < hi:
            if lo & 1:
                cover[lo].append(k)
                lo += 1
            if hi & 1:
                hi -= 1
                cover[hi].append(k)
            lo, hi = lo >> 1, hi >> 1
    todo = sorted(starts)
    while todo:
        start = todo.pop()
        node = bisect.bisect_left(points, start) + size
        new = falls_into(start)
        while node:
            new += (jumps[k][1] for k in cover[node])
            cover[node] = []
            node >>= 1
        for target in new:
            if target not in starts:
                starts.add(target)
                todo.append(target)
        _check_function_count(starts)
    return starts


def _functions(image: ElfImage, codemap: _CodeMap, starts: set[int]) -> tuple[Function, ...]:
    """Partition each executable section at ``starts``; name each piece after the best symbol at its start."""
    names: dict[int, Symbol] = {}
    for sym in image.symbols:
        if sym.value in starts and sym.section in codemap.names and _is_label(sym):
            best = names.get(sym.value)
            if best is None or _symbol_rank(sym) < _symbol_rank(best):
                names[sym.value] = sym
    return partition(codemap, {start: names[start].name if start in names else f"fn_{start:x}" for start in starts})
