"""Which ISA extensions an image was compiled for, from its RISC-V build attributes (``.riscv.attributes``).

An image built for extensions the host does not run (Zbb's ``rol``, F's ``fadd.s``) would load and then trap with
"illegal instruction" at the first such instruction, deep in some library function; its attributes say so up
front, so it is refused when it is read, naming the extensions.

The section's format (RISC-V ELF psABI, "Attributes"): ``A``, then subsections — a uint32 length counting itself,
a NUL-terminated vendor name, then sub-subsections: a tag byte, a uint32 length counting the tag and itself, then
attributes, each a ULEB128 tag and a value: a ULEB128 integer for even tags, a NUL-terminated string for odd ones.
Only vendor ``riscv``, ``Tag_File`` (1) and ``Tag_RISCV_arch`` (5) matter here; the whole section is read, every
arch tag is checked, and anything malformed is an ElfError. The section is read in one pass and an arch string is
at most ``MAX_ARCH`` characters (a hostile one of 200,000 digits took a backtracking pattern minutes).
"""

from __future__ import annotations

import re

from berm_abi.text import escaped
from berm_aot.errors import ElfError

TAG_FILE = 1
TAG_ARCH = 5
#: What the host runs: RV64IMAC and the named subsets of it (Zmmul, Zaamo, Zalrsc, Zca), extensions whose only
#: instructions are hints encoded as instructions RV64IMAC has (Zihintpause, Zihintntl, Zicbop), and Zicsr and
#: Zifencei, which compilers list by default and use only when the source asks (the host treats CSR access and
#: fence.i as any other illegal instruction, when reached). RV64E is RV64I with fewer registers.
RUNS = frozenset({"i", "e", "m", "a", "c", "zicsr", "zifencei", "zmmul", "zaamo", "zalrsc", "zca", "zihintpause",
                  "zihintntl", "zicbop"})
#: The longest arch string accepted (every extension there is, with versions, is a few hundred characters).
MAX_ARCH = 1024
_VERSION = re.compile(r"(?<!\d)\d+(p\d+)?$")  # anchored to the start of a digit run: linear, not quadratic
_LETTER = re.compile(r"([a-z])(?:\d+(?:p\d+)?)?")


def arches(section: bytes) -> list[str]:
    """Every ``Tag_RISCV_arch`` string of a ``.riscv.attributes`` section, in order (usually one)."""
    if not section.startswith(b"A"):
        raise ElfError("the .riscv.attributes section does not start with format version 'A'")
    found: list[str] = []
    pos = 1
    while pos < len(section):
        length = _u32(section, pos, "subsection")
        end = pos + length
        name_end = section.find(b"\0", pos + 4, end)
        if length < 5 or end > len(section) or name_end < 0:
            raise ElfError(f"the .riscv.attributes section has a malformed subsection at byte {pos}")
        if section[pos + 4:name_end] == b"riscv":
            _file_arches(section, name_end + 1, end, found)
        pos = end
    return found


def _file_arches(data: bytes, pos: int, end: int, found: list[str]) -> None:
    while pos < end:
        tag, length = data[pos], _u32(data, pos + 1, "sub-subsection")
        stop = pos + length
        if length < 5 or stop > end:
            raise ElfError(f"the .riscv.attributes section has a malformed sub-subsection at byte {pos}")
        if tag == TAG_FILE:
            at = pos + 5
            while at < stop:
                attr, at = _uleb(data, at, stop)
                if attr % 2:
                    nul = data.find(b"\0", at, stop)
                    if nul < 0:
                        raise ElfError("the .riscv.attributes section has an unterminated string")
                    if attr == TAG_ARCH:
                        if nul - at > MAX_ARCH:
                            raise ElfError(f"the .riscv.attributes section has an arch string of {nul - at} "
                                           f"characters (at most {MAX_ARCH})")
                        found.append(data[at:nul].decode("ascii", "replace"))
                    at = nul + 1
                else:
                    _, at = _uleb(data, at, stop)
        pos = stop


def _u32(data: bytes, pos: int, what: str) -> int:
    if pos + 4 > len(data):
        raise ElfError(f"the .riscv.attributes section ends inside a {what} length")
    return int.from_bytes(data[pos:pos + 4], "little")


def _uleb(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ElfError("the .riscv.attributes section has a malformed ULEB128 number")


def extensions(arch_string: str) -> list[str]:
    """The extensions an arch string names, in its order: ``rv64i2p1_m2p0_c2p0_zicsr2p0`` or ``rv64imac_zicsr``."""
    text = arch_string.lower()
    if not text.startswith(("rv32", "rv64")):
        raise ElfError(f"the image's architecture {arch_string!r} is not an RV32/RV64 arch string")
    out = []
    for token in text[4:].split("_"):
        if token[:1] in ("z", "s", "x"):
            out.append(_VERSION.sub("", token))
        else:
            out.extend(m.group(1) for m in _LETTER.finditer(token))
    return out


def check(arch_string: str) -> None:
    """Refuse an image built for RV32, or for extensions the host does not run (ElfError naming them)."""
    shown = escaped(arch_string, lines=False)  # the image's text: a newline in it forged lines (found by a review)
    if arch_string.lower().startswith("rv32"):
        raise ElfError(f"the image was built for RV32 ({shown}); build for rv64imac, the lp64 ABI")
    unknown = [e for e in extensions(arch_string) if e not in RUNS]
    if unknown:
        raise ElfError(f"the image was built for RISC-V extensions this host does not run: "
                       f"{escaped(', '.join(unknown), lines=False)} (its attributes say {shown}); build for rv64imac, "
                       "the lp64 ABI")
