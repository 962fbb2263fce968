"""Read and validate an RV64 harness ELF into the ``berm_aot.image`` data model (ABI.md §4–§6, DESIGN.md "Read").

The input is untrusted, so every table is checked against the file before it is touched: header sizes and
counts, each range inside the file, segments that neither overlap nor wrap nor claim more than 4 GiB, string
tables that are NUL-terminated, symbols and relocations that name existing entries. Nothing is allocated in
proportion to a size the file *claims* (``.bss`` stays a number); all work is proportional to the file's length.

pyelftools parses the ELF header and the program/section headers (its own struct definitions, applied to slices
this module has bounds-checked first, so none of its lazy readers ever runs). Symbol and relocation tables are
unpacked with ``struct.iter_unpack``: they hold tens of thousands of entries in a real image, and parsing them
one by one through pyelftools would take seconds rather than milliseconds.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct

from elftools.common.exceptions import ELFError
from elftools.construct.core import ConstructError
from elftools.elf.elffile import ELFFile

from berm_aot import attributes
from berm_aot.errors import ElfError, about_file
from berm_aot.image import ElfImage, Relocation, Section, Segment, Symbol
from berm_aot.regular_file import FileRefused, read_regular

#: Guest memory is at most 4 GiB (ABI.md §5), so no segment may end above it.
MAX_IMAGE_END = 4 << 30
#: At most this many loadable segments: a linker writes a handful (code, read-only data, data); every section and
#: every constant-address load the translator resolves is looked up among them (32,000 one-byte segments made a
#: 3.9 MB file take 27 s to read, and its translation 22 s).
MAX_LOAD_SEGMENTS = 64
#: What a file may hold besides the bytes its loadable segments map (headers, symbols, relocations, debug
#: information). A loaded image keeps its file's bytes as long as it is held (to read the program model when it is
#: needed), so without this a 1 GiB file of a 60 KB program held 1 GiB of the host's memory per load. Symbols and
#: relocations at their bounds come to 72 MiB.
MAX_UNLOADED_BYTES = 256 << 20
#: The largest ELF file read: its loaded bytes fit guest memory (``MAX_IMAGE_END``), plus ``MAX_UNLOADED_BYTES``.
#: `berm inspect` of a 5 GB file read it all first (32 s, 5 GB of memory), and /dev/zero never ended. An engine
#: reads at most its own memory size plus ``MAX_UNLOADED_BYTES`` (berm_host.engine).
MAX_FILE_BYTES = MAX_IMAGE_END + MAX_UNLOADED_BYTES
#: What one image may hold at most, so that no file makes the reader or the translator, which run in the host
#: process, take memory or time out of all proportion to its size (each bound is far above what real harnesses
#: carry: rust-probe has 58 KB of code, 1,374 symbols and 1,715 relocations). Code: every byte of the executable
#: sections is decoded and analysed up front (~150 bytes of host memory per byte of code) and the first load
#: compiles all of it (10–30 s per 100 KB on 2 cores), so 4 MiB is already a compile of minutes.
MAX_CODE_BYTES = 4 << 20
#: Symbols and relocations (relocations of allocated sections, in all): each becomes an object of ~100-300 bytes
#: (a 45 MB file of two million symbols took 590 MB and 9 s to read, and a 4 GiB file would have taken ~50 GB).
MAX_SYMBOLS = 1 << 20
MAX_RELOCATIONS = 1 << 21
#: The bytes of the names of one string table's entries, in all, a name counted once for every entry naming it:
#: names at many offsets into one long unterminated run would each copy it (65,535 section names into a 100 MB run:
#: 6.5 TB), and a name many entries share is theirs in whatever repeats it per entry. A backstop: the translator
#: writes each name once (berm_aot/locator.py) and cuts it in comments (a review found a 400 KB image of 1,000
#: functions sharing one 300 KB name making 600 MB of C before it did).
MAX_NAME_BYTES = 64 << 20
#: The manifest and the build attributes are parsed whole: a real manifest is a few KB, real attributes ~100
#: bytes (a 100 MB manifest of empty JSON objects makes two GB of them).
MAX_MANIFEST_BYTES = 1 << 20
MAX_ATTRIBUTES_BYTES = 64 << 10
#: The manifest section (ABI.md §4).
MANIFEST_SECTION = ".berm.abi"
#: The RISC-V build attributes: the extensions the image was compiled for (berm_aot/attributes.py).
ATTRIBUTES_SECTION = ".riscv.attributes"

_EHDR_SIZE, _PHDR_SIZE, _SHDR_SIZE, _SYM_SIZE, _RELA_SIZE = 64, 56, 64, 24, 24
_EF_RISCV_FLOAT_ABI = 0x6
_PF_X, _PF_W, _PF_R = 1, 2, 4
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR, _SHF_TLS = 0x1, 0x2, 0x4, 0x400
_SHN_UNDEF, _SHN_LORESERVE, _SHN_ABS, _SHN_COMMON, _SHN_XINDEX = 0, 0xFF00, 0xFFF1, 0xFFF2, 0xFFFF
_SYM_KINDS = {0: "notype", 1: "object", 2: "func", 3: "section", 4: "file", 6: "tls"}
_SYM_BINDINGS = {0: "local", 1: "global", 2: "weak"}
_U64 = 1 << 64

#: Relocation type numbers of the RISC-V psABI (pyelftools does not name them).
RISCV_RELOC_NAMES: dict[int, str] = {n: f"R_RISCV_{s}" for n, s in {
    0: "NONE", 1: "32", 2: "64", 3: "RELATIVE", 4: "COPY", 5: "JUMP_SLOT", 6: "TLS_DTPMOD32",
    7: "TLS_DTPMOD64", 8: "TLS_DTPREL32", 9: "TLS_DTPREL64", 10: "TLS_TPREL32", 11: "TLS_TPREL64",
    12: "TLSDESC", 16: "BRANCH", 17: "JAL", 18: "CALL", 19: "CALL_PLT", 20: "GOT_HI20", 21: "TLS_GOT_HI20",
    22: "TLS_GD_HI20", 23: "PCREL_HI20", 24: "PCREL_LO12_I", 25: "PCREL_LO12_S", 26: "HI20", 27: "LO12_I",
    28: "LO12_S", 29: "TPREL_HI20", 30: "TPREL_LO12_I", 31: "TPREL_LO12_S", 32: "TPREL_ADD", 33: "ADD8",
    34: "ADD16", 35: "ADD32", 36: "ADD64", 37: "SUB8", 38: "SUB16", 39: "SUB32", 40: "SUB64",
    41: "GOT32_PCREL", 43: "ALIGN", 44: "RVC_BRANCH", 45: "RVC_JUMP", 51: "RELAX", 52: "SUB6", 53: "SET6",
    54: "SET8", 55: "SET16", 56: "SET32", 57: "32_PCREL", 58: "IRELATIVE", 59: "PLT32", 60: "SET_ULEB128",
    61: "SUB_ULEB128", 62: "TLSDESC_HI20", 63: "TLSDESC_LOAD_LO12", 64: "TLSDESC_ADD_LO12", 65: "TLSDESC_CALL",
}.items()}

#: What pyelftools and the struct module raise on malformed input; turned into ElfError at the boundary.
_LIBRARY_ERRORS = (ELFError, ConstructError, struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError,
                   OverflowError)


def reloc_type_name(rtype: int) -> str:
    """``R_RISCV_<NAME>`` for a known RISC-V relocation number, ``R_RISCV_<n>`` otherwise."""
    return RISCV_RELOC_NAMES.get(rtype, f"R_RISCV_{rtype}")


def read_elf_file(path: str | os.PathLike) -> ElfImage:
    """Read and validate the ELF file at ``path``; an unreadable file is an ElfError too, and every error names the
    file."""
    data = read_file(path)
    with about_file(path):
        return read_elf(data)


def read_file(path: str | os.PathLike, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the image file at ``path``: a regular file of at most ``limit`` bytes, else an ElfError (as for
    a file that cannot be read)."""
    try:
        return read_regular(path, limit)
    except FileRefused as exc:
        raise ElfError(f"{os.fspath(path)} {exc}{f', {too_large(limit)}' if exc.oversized else ''}") from None
    except IsADirectoryError:  # most often a harness's sources, named where its image was meant
        raise ElfError(f"{os.fspath(path)} is a directory, not a harness image (if it holds a harness's sources, "
                       f"`berm build {os.fspath(path)}` makes its image)") from None
    except OSError as exc:
        raise ElfError(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from None


def file_limit(memory_size: int) -> int:
    """The largest image file worth reading for guest memory of ``memory_size`` bytes: no more loaded bytes than
    that memory holds, and ``MAX_UNLOADED_BYTES`` besides (a larger file is refused before it is read)."""
    return min(memory_size, MAX_IMAGE_END) + MAX_UNLOADED_BYTES


def too_large(limit: int) -> str:
    """Why a file of more than ``limit`` bytes is refused (the end of its ElfError)."""
    return (f"larger than any image read here ({limit} bytes at most: as many loaded bytes as guest memory holds, "
            f"and {MAX_UNLOADED_BYTES} besides; strip debug information with `llvm-strip --strip-debug`)")


def read_elf(data: bytes) -> ElfImage:
    """Validate ``data`` as an RV64 soft-float executable linked with ``--emit-relocs`` and describe it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ElfError(f"an ELF image is bytes, not {type(data).__name__}")
    data = bytes(data)
    try:
        return _Reader(data).image()
    except ElfError:
        raise
    except _LIBRARY_ERRORS as exc:
        raise ElfError(f"malformed ELF: {exc}") from None


def _in_file(data: bytes, offset: int, size: int, what: str) -> None:
    if offset < 0 or size < 0 or offset + size > len(data):
        raise ElfError(f"{what} ({size} bytes at file offset {offset:#x}) lies outside the "
                       f"{len(data)}-byte file")


class _StringTable:
    """NUL-terminated names at offsets into one string-table section, each decoded when first asked for (decoding
    every name up front cost the same time on real images, and ~95 bytes of memory per byte of a table of tiny
    names: 800 MB for an 8 MB file)."""

    def __init__(self, raw: bytes, what: str):
        self._raw, self._what = raw, what
        self._names: dict[int, tuple[str, int]] = {}  # by offset: the name and its bytes
        self._read = 0  # bytes of the names decoded so far (MAX_NAME_BYTES)

    def get(self, offset: int) -> str:
        """The name at ``offset``, for one entry: every call counts its length (MAX_NAME_BYTES)."""
        known = self._names.get(offset)
        if known is None:
            if offset >= len(self._raw):
                raise ElfError(f"a name at offset {offset:#x} lies past the end of {self._what} "
                               f"({len(self._raw)} bytes)")
            end = self._raw.find(b"\0", offset)
            if end < 0:
                raise ElfError(f"{self._what} is not NUL-terminated")
            self._count(end - offset)
            try:
                known = self._names[offset] = (self._raw[offset:end].decode("utf-8"), end - offset)
            except UnicodeDecodeError:
                raise ElfError(f"a name in {self._what} at offset {offset:#x} is not UTF-8") from None
        else:
            self._count(known[1])
        return known[0]

    def _count(self, size: int) -> None:
        self._read += size
        if self._read > MAX_NAME_BYTES:
            raise ElfError(f"the names of {self._what}'s entries come to more than {MAX_NAME_BYTES} bytes in all "
                           "(a name counts once for every entry naming it)")


class _Reader:
    """One pass over one file: header, segments, sections, symbols, relocations, manifest — in that order."""

    def __init__(self, data: bytes):
        self.data = data

    def image(self) -> ElfImage:
        self._check_ident()
        self.elf = ELFFile(io.BytesIO(self.data))
        hdr = self.elf.header
        if hdr["e_machine"] != "EM_RISCV":
            raise ElfError(f"not a RISC-V ELF (machine {hdr['e_machine']})")
        if hdr["e_type"] != "ET_EXEC":
            raise ElfError(f"not an executable ELF (type {hdr['e_type']}); link the harness as a static executable")
        if hdr["e_flags"] & _EF_RISCV_FLOAT_ABI:
            raise ElfError(f"the image uses a hardware floating-point ABI (e_flags {hdr['e_flags']:#x}); "
                           "build for the soft-float lp64 ABI")
        segments = self._segments()
        self.shdrs = self._section_headers()
        self.names = self._section_names()
        sections = self._sections(segments)
        code = sum(s.size for s in sections if s.executable and s.alloc)
        if code > MAX_CODE_BYTES:
            raise ElfError(f"the image has {code} bytes of code (executable sections), more than the {MAX_CODE_BYTES} "
                           "Berm runs: it decodes all of it when the image is read, and the first load compiles all "
                           "of it; build the harness for size (opt-level \"s\" or \"z\"), or split it")
        self._check_arch()
        symbols, raw_symbols = self._symbols()
        if not code:
            raise ElfError("the image has no code (no executable section with anything in it): with --gc-sections, "
                           "code nothing reaches from the entry point is dropped, tools included — keep them "
                           "reachable (the SDK's entry, or a _start that takes every export's address as "
                           "harnesses/rust-probe does)")
        relocations = self._relocations(raw_symbols)
        return ElfImage(
            sha256=hashlib.sha256(self.data).hexdigest(), size=len(self.data), entry=hdr["e_entry"],
            flags=hdr["e_flags"], segments=segments, sections=sections, symbols=symbols,
            relocations=relocations, manifest_bytes=self._manifest(), raw=self.data)

    def _check_ident(self) -> None:
        d = self.data
        if len(d) < 4 or d[:4] != b"\x7fELF":
            raise ElfError("not an ELF file (bad magic)")
        if len(d) < _EHDR_SIZE:
            raise ElfError(f"truncated ELF: {len(d)} bytes, shorter than the 64-byte header")
        if d[4] != 2:
            raise ElfError("not a 64-bit ELF")
        if d[5] != 1:
            raise ElfError("not a little-endian ELF")

    # -- segments ------------------------------------------------------------------------------------------

    def _segments(self) -> tuple[Segment, ...]:
        hdr = self.elf.header
        phnum, phoff = hdr["e_phnum"], hdr["e_phoff"]
        if phnum and hdr["e_phentsize"] != _PHDR_SIZE:
            raise ElfError(f"program header entries are {hdr['e_phentsize']} bytes, not {_PHDR_SIZE}")
        _in_file(self.data, phoff, phnum * _PHDR_SIZE, "the program header table")
        parse = self.elf.structs.Elf_Phdr.parse
        loads, ph_loads, mapped = [], [], 0
        for i in range(phnum):
            ph = parse(self.data[phoff + i * _PHDR_SIZE:phoff + (i + 1) * _PHDR_SIZE])
            if ph["p_type"] == "PT_LOAD":
                if len(loads) == MAX_LOAD_SEGMENTS:
                    raise ElfError(f"the image has more than {MAX_LOAD_SEGMENTS} loadable (PT_LOAD) segments")
                loads.append(self._segment(i, ph))
                # Each segment's bytes are a copy: segments mapping the same file bytes again and again made a
                # 16 MiB file take 1 GB before anything else was checked (found by a review). Now the copies
                # come to at most twice the file.
                mapped += ph["p_filesz"]
                if mapped > len(self.data):
                    raise ElfError(f"the loadable segments map {mapped} bytes or more of a {len(self.data)}-byte "
                                   "file: they map the same file bytes over and over")
                ph_loads.append((ph["p_offset"], ph["p_offset"] + ph["p_filesz"]))
        if not loads:
            raise ElfError("the image has no loadable (PT_LOAD) segment")
        self._check_unloaded(ph_loads)
        ordered = sorted((s for s in loads if s.memsz), key=lambda s: s.vaddr)
        for a, b in zip(ordered, ordered[1:]):
            if b.vaddr < a.end:
                raise ElfError(f"segments overlap: [{a.vaddr:#x}, {a.end:#x}) and [{b.vaddr:#x}, {b.end:#x})")
        return tuple(loads)

    def _check_unloaded(self, ranges: list[tuple[int, int]]) -> None:
        """At most ``MAX_UNLOADED_BYTES`` of the file lie outside every loadable segment's file bytes (``ranges``,
        which may overlap: each byte counts once)."""
        loaded = end = 0
        for lo, hi in sorted(ranges):
            loaded += max(0, hi - max(lo, end))
            end = max(end, hi)
        unloaded = len(self.data) - loaded
        if unloaded > MAX_UNLOADED_BYTES:
            raise ElfError(f"{unloaded} bytes of the file lie outside its loadable segments (headers, symbols, "
                           f"relocations, debug information), more than the {MAX_UNLOADED_BYTES} an image may "
                           "carry: strip debug information with `llvm-strip --strip-debug`")

    def _segment(self, i: int, ph) -> Segment:
        vaddr, memsz, filesz, offset = ph["p_vaddr"], ph["p_memsz"], ph["p_filesz"], ph["p_offset"]
        if filesz > memsz:
            raise ElfError(f"segment {i} has more file bytes ({filesz:#x}) than memory bytes ({memsz:#x})")
        if vaddr + memsz > MAX_IMAGE_END:
            raise ElfError(f"segment {i} [{vaddr:#x}, +{memsz:#x}) ends above 4 GiB, the largest guest memory")
        _in_file(self.data, offset, filesz, f"segment {i}")
        flags = ph["p_flags"]
        return Segment(vaddr=vaddr, memsz=memsz, data=self.data[offset:offset + filesz],
                       readable=bool(flags & _PF_R), writable=bool(flags & _PF_W), executable=bool(flags & _PF_X),
                       offset=offset)

    # -- sections ------------------------------------------------------------------------------------------

    def _section_headers(self) -> list:
        hdr = self.elf.header
        shnum, shoff = hdr["e_shnum"], hdr["e_shoff"]
        if shnum == 0:
            raise ElfError("the image has no section headers (stripped, or extended numbering); "
                           "link with --emit-relocs and do not strip")
        if hdr["e_shentsize"] != _SHDR_SIZE:
            raise ElfError(f"section header entries are {hdr['e_shentsize']} bytes, not {_SHDR_SIZE}")
        _in_file(self.data, shoff, shnum * _SHDR_SIZE, "the section header table")
        parse = self.elf.structs.Elf_Shdr.parse
        shdrs = [parse(self.data[shoff + i * _SHDR_SIZE:shoff + (i + 1) * _SHDR_SIZE]) for i in range(shnum)]
        for i, sh in enumerate(shdrs):
            if sh["sh_type"] != "SHT_NOBITS" and sh["sh_type"] != "SHT_NULL":
                _in_file(self.data, sh["sh_offset"], sh["sh_size"], f"section {i}")
            if sh["sh_flags"] & _SHF_ALLOC and sh["sh_addr"] + sh["sh_size"] > _U64:
                raise ElfError(f"section {i} [{sh['sh_addr']:#x}, +{sh['sh_size']:#x}) wraps around the "
                               "address space")
        return shdrs

    def _contents(self, index: int) -> bytes:
        sh = self.shdrs[index]
        if sh["sh_type"] == "SHT_NOBITS":
            return b""
        return self.data[sh["sh_offset"]:sh["sh_offset"] + sh["sh_size"]]

    def _string_table(self, index: int, what: str) -> _StringTable:
        if not 0 < index < len(self.shdrs):
            raise ElfError(f"{what} is section {index}, which does not exist")
        if self.shdrs[index]["sh_type"] != "SHT_STRTAB":
            raise ElfError(f"{what} (section {index}) is not a string table")
        return _StringTable(self._contents(index), what)

    def _section_names(self) -> list[str]:
        shstrndx = self.elf.header["e_shstrndx"]
        if shstrndx == _SHN_XINDEX:
            raise ElfError("extended section-name table index is not supported")
        table = self._string_table(shstrndx, "the section-name table")
        return [table.get(sh["sh_name"]) if i else "" for i, sh in enumerate(self.shdrs)]

    def _sections(self, segments: tuple[Segment, ...]) -> tuple[Section, ...]:
        out, loaded = [], []
        for i, sh in enumerate(self.shdrs):
            if i == 0:
                continue
            flags = sh["sh_flags"]
            sec = Section(name=self.names[i], addr=sh["sh_addr"], size=sh["sh_size"], alloc=bool(flags & _SHF_ALLOC),
                          executable=bool(flags & _SHF_EXECINSTR), writable=bool(flags & _SHF_WRITE))
            if sec.executable and flags & _SHF_TLS:  # code is code: a TLS flag skipped the checks below (a review)
                raise ElfError(f"section {sec.name!r} is both executable and thread-local: no image has code there")
            if sec.executable and sec.addr & 1:  # its start would start a function no instruction can start
                raise ElfError(f"executable section {sec.name!r} starts at the odd address {sec.addr:#x}: no "
                               "instruction starts at one")
            if sec.alloc and sec.size and not flags & _SHF_TLS:
                self._check_loaded(sec, segments)
                loaded.append(sec)
            out.append(sec)
        loaded.sort(key=lambda s: s.addr)
        for a, b in zip(loaded, loaded[1:]):
            if b.addr < a.end:
                raise ElfError(f"sections {a.name!r} [{a.addr:#x}, {a.end:#x}) and {b.name!r} [{b.addr:#x}, {b.end:#x}) "
                               "overlap")
        return tuple(out)

    @staticmethod
    def _check_loaded(sec: Section, segments: tuple[Segment, ...]) -> None:
        """An allocated section must lie in one loadable segment; code in an executable one — else the code
        the translator decodes from the section would not be the code in guest memory."""
        for seg in segments:
            if seg.vaddr <= sec.addr and sec.end <= seg.end:
                if sec.executable and not seg.executable:
                    raise ElfError(f"executable section {sec.name!r} lies in a non-executable segment")
                return
        raise ElfError(f"section {sec.name!r} [{sec.addr:#x}, {sec.end:#x}) is not inside any loadable segment")

    # -- symbols -------------------------------------------------------------------------------------------

    def _symbols(self) -> tuple[tuple[Symbol, ...], list[tuple[str, int]]]:
        """The symbols (without the null entry), and for relocations every entry's (name, final value)."""
        tables = [i for i, sh in enumerate(self.shdrs) if sh["sh_type"] == "SHT_SYMTAB"]
        if not tables:
            raise ElfError("the image has no symbol table; link with --emit-relocs and do not strip")
        if len(tables) > 1:
            raise ElfError("the image has more than one symbol table")
        self.symtab = tables[0]
        sh = self.shdrs[self.symtab]
        if sh["sh_size"] // _SYM_SIZE > MAX_SYMBOLS:
            raise ElfError(f"the image has {sh['sh_size'] // _SYM_SIZE} symbols, more than the {MAX_SYMBOLS} one "
                           "may have")
        raw = self._table(self.symtab, _SYM_SIZE, "the symbol table")
        strings = self._string_table(sh["sh_link"], "the symbol-name table")
        symbols, by_index, names, nsections = [], [("", 0)], self.names, len(self.shdrs)
        entries = struct.iter_unpack("<IBBHQQ", raw)
        next(entries, None)  # the null symbol
        for index, (name_off, info, _other, shndx, value, size) in enumerate(entries, 1):
            kind = _SYM_KINDS.get(info & 0xF, "other")
            name = strings.get(name_off)
            section = None
            if _SHN_UNDEF < shndx < _SHN_LORESERVE:
                if shndx >= nsections:
                    raise ElfError(f"symbol {index} ({name!r}) is defined in section {shndx}, which does not exist")
                section = names[shndx]
                if kind == "section":
                    name, value = name or section, self.shdrs[shndx]["sh_addr"]
            elif shndx == _SHN_XINDEX:
                raise ElfError(f"symbol {index} ({name!r}) uses an extended section index, which is not supported")
            symbols.append(Symbol(name, value, size, kind, _SYM_BINDINGS.get(info >> 4, "local"), section))
            by_index.append((name, value if shndx else 0))
        return tuple(symbols), by_index

    def _table(self, index: int, entsize: int, what: str) -> bytes:
        sh = self.shdrs[index]
        if sh["sh_entsize"] != entsize:
            raise ElfError(f"{what} (section {self.names[index]!r}) has {sh['sh_entsize']}-byte entries, "
                           f"not {entsize}")
        if sh["sh_size"] % entsize:
            raise ElfError(f"{what} (section {self.names[index]!r}) is not a whole number of entries")
        return self._contents(index)

    # -- relocations ---------------------------------------------------------------------------------------

    def _relocations(self, symbols: list[tuple[str, int]]) -> tuple[Relocation, ...]:
        """Every relocation that patched an allocated section; those against debug sections are ignored. A section
        is patched by one relocation section, as linkers write them (headers may alias one large table many times
        over, and each alias would be read in full)."""
        out, patched, read = [], set(), 0
        for i, sh in enumerate(self.shdrs):
            if sh["sh_type"] != "SHT_RELA":
                continue
            target = sh["sh_info"]
            if not 0 < target < len(self.shdrs):
                raise ElfError(f"relocation section {self.names[i]!r} applies to section {target}, "
                               "which does not exist")
            tsh = self.shdrs[target]
            if not tsh["sh_flags"] & _SHF_ALLOC:
                continue
            if target in patched:
                raise ElfError(f"section {self.names[target]!r} has more than one relocation section")
            patched.add(target)
            if sh["sh_link"] != self.symtab:
                raise ElfError(f"relocation section {self.names[i]!r} does not use the symbol table")
            if len(out) + sh["sh_size"] // _RELA_SIZE > MAX_RELOCATIONS:
                raise ElfError(f"the image has more than {MAX_RELOCATIONS} relocations of its allocated sections")
            read += sh["sh_size"]
            if read > len(self.data):  # found by a review: one 1.5 KB table, 32,764 headers, 2M relocations
                raise ElfError(f"the relocation sections hold {read} bytes or more of a {len(self.data)}-byte file: "
                               "they share file bytes (one table named by several section headers)")
            out.extend(self._rela_table(i, self.names[target], tsh["sh_addr"], tsh["sh_size"], symbols))
        if not patched:
            raise ElfError("the image carries no relocations for its code; link it with --emit-relocs "
                           "(the host needs them to know the legal indirect-jump targets)")
        return tuple(out)

    def _rela_table(self, index: int, section: str, lo: int, size: int,
                    symbols: list[tuple[str, int]]) -> list[Relocation]:
        raw = self._table(index, _RELA_SIZE, "a relocation table")
        hi, nsyms, out, known = lo + size, len(symbols), [], RISCV_RELOC_NAMES
        append = out.append  # the hot loop of reading a large image: keep it lean
        for offset, info, addend in struct.iter_unpack("<QQq", raw):
            sym, rtype = info >> 32, info & 0xFFFFFFFF
            if sym >= nsyms:
                raise ElfError(f"a relocation in {self.names[index]!r} names symbol {sym}; "
                               f"the symbol table has {nsyms}")
            if not lo <= offset <= hi:
                raise ElfError(f"a relocation in {self.names[index]!r} patches {offset:#x}, outside {section!r} "
                               f"[{lo:#x}, {hi:#x})")
            name, value = symbols[sym]
            append(Relocation(offset, rtype, known.get(rtype) or reloc_type_name(rtype), name, value, addend,
                              section))
        return out

    # -- build attributes and manifest: one section each -----------------------------------------------------

    def _only(self, name: str) -> int | None:
        """The index of the section ``name``, None without one; more than one is refused (linkers write one, and
        section headers may alias one large blob many times over)."""
        found = [i for i, n in enumerate(self.names) if n == name]
        if len(found) > 1:
            raise ElfError(f"the image has {len(found)} {name} sections")
        return found[0] if found else None

    def _check_arch(self) -> None:
        """Refuse an image its build attributes say was compiled for extensions the host does not run."""
        section = self._small_section(ATTRIBUTES_SECTION, MAX_ATTRIBUTES_BYTES)
        if section is not None:
            for arch in attributes.arches(section):
                attributes.check(arch)

    def _manifest(self) -> bytes | None:
        return self._small_section(MANIFEST_SECTION, MAX_MANIFEST_BYTES)

    def _small_section(self, name: str, most: int) -> bytes | None:
        """The contents of the one section ``name`` (None without one), which may hold at most ``most`` bytes."""
        index = self._only(name)
        if index is None:
            return None
        size = self.shdrs[index]["sh_size"]
        if size > most:
            raise ElfError(f"the {name} section is {size} bytes, more than the {most} it may have")
        return self._contents(index)
