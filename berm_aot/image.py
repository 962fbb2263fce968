"""What an ELF file is, once read: the data model every later step works from.

``berm_aot.elf.read_elf`` produces an ``ElfImage``; nothing downstream touches pyelftools. All addresses are guest
virtual addresses; all byte strings are copies, so an ``ElfImage`` is immutable and safe to share across threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Segment:
    """One ``PT_LOAD`` segment: ``data`` is its ``filesz`` file bytes; ``[vaddr+filesz, vaddr+memsz)`` is zero.
    ``offset``: where ``data`` starts in the ELF file, when it was read from one."""

    vaddr: int
    memsz: int
    data: bytes
    readable: bool
    writable: bool
    executable: bool
    offset: int | None = None

    @property
    def end(self) -> int:
        return self.vaddr + self.memsz


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    addr: int
    size: int
    alloc: bool
    executable: bool
    writable: bool

    @property
    def end(self) -> int:
        return self.addr + self.size


@dataclass(frozen=True, slots=True)
class Symbol:
    name: str
    value: int
    size: int
    kind: str  # "func", "object", "notype", "section", "file", "tls", "other"
    binding: str  # "local", "global", "weak"
    section: str | None  # name of the section it is defined in; None when undefined, absolute or common


@dataclass(frozen=True, slots=True)
class Relocation:
    """One relocation kept by ``--emit-relocs``.

    ``offset`` is the guest address it patched; ``section`` the name of the section patched; ``target`` is
    ``S + A`` (the symbol's final address plus the addend) — the address the relocation names.
    """

    offset: int
    type: int
    type_name: str  # "R_RISCV_64", "R_RISCV_PCREL_HI20", …
    symbol: str
    symbol_value: int
    addend: int
    section: str

    @property
    def target(self) -> int:
        return (self.symbol_value + self.addend) & 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class ElfImage:
    """A validated RV64 executable: its loadable segments, sections, symbols, relocations and manifest bytes."""

    sha256: str
    size: int  # bytes of the file
    entry: int
    flags: int  # e_flags (RVC, float ABI)
    segments: tuple[Segment, ...]
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    relocations: tuple[Relocation, ...]
    manifest_bytes: bytes | None  # contents of .berm.abi, None when absent
    raw: bytes = field(repr=False)

    def executable_sections(self) -> tuple[Section, ...]:
        return tuple(s for s in self.sections if s.alloc and s.executable and s.size)

    def read(self, addr: int, n: int) -> bytes:
        """``n`` bytes of the initial image at ``addr`` (``read_segments``)."""
        return read_segments(self.segments, addr, n)


def read_segments(segments: tuple[Segment, ...], addr: int, n: int) -> bytes:
    """``n`` bytes of the initial image ``segments`` at ``addr`` (zero-filled for .bss); ValueError outside every
    segment."""
    for seg in segments:
        if seg.vaddr <= addr and addr + n <= seg.end:
            off = addr - seg.vaddr
            chunk = seg.data[off:off + n]
            return chunk + bytes(n - len(chunk))
    raise ValueError(f"{n} bytes at {addr:#x} are not inside one loadable segment")
