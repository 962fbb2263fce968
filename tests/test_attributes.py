"""An image's build attributes name the extensions it was compiled for: one built for extensions the host does not
run is refused when it is read, naming them (a Rust harness built with +zba,+zbb loaded, then trapped "illegal
instruction" inside core::fmt at its first call), and a malformed attributes section is an ElfError, never a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berm_aot import attributes
from berm_aot.elf import read_elf
from berm_aot.errors import ElfError
from tests.elf_samples import SHDR_FIELDS, field, patched, shdr_offsets
from tests.guests import guest_elf

RUST_PROBE = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe" / "rust-probe.elf"


def _file(attributes_: bytes) -> bytes:
    """A Tag_File sub-subsection holding ``attributes_``."""
    return b"\x01" + (5 + len(attributes_)).to_bytes(4, "little") + attributes_


def _subsection(body: bytes, vendor: bytes = b"riscv") -> bytes:
    return (4 + len(vendor) + 1 + len(body)).to_bytes(4, "little") + vendor + b"\0" + body


@pytest.fixture(scope="module")
def elf() -> bytes:
    source = """unsigned long f(unsigned long x) { return x + 1; }
unsigned long (*volatile table[])(unsigned long) = {f};  /* a relocation: every loadable image has some */"""
    return guest_elf(source, keep=("f", "table"))


def test_what_the_toolchains_write_is_accepted(elf):
    for data in (elf, RUST_PROBE.read_bytes()):
        read_elf(data)
    section = _section(RUST_PROBE.read_bytes())
    assert attributes.arches(section) == ["rv64i2p1_m2p0_a2p1_c2p0_zmmul1p0_zaamo1p0_zalrsc1p0_zca1p0"]


@pytest.mark.parametrize("text, expected", [
    ("rv64i2p1_m2p0_a2p1_c2p0_zicsr2p0_zifencei2p0", ["i", "m", "a", "c", "zicsr", "zifencei"]),
    ("rv64imac_zicsr", ["i", "m", "a", "c", "zicsr"]),
    ("RV64GC", ["g", "c"]),
    ("rv64i2p1_zbb1p0_zba1p0", ["i", "zbb", "zba"]),
])
def test_arch_strings_name_their_extensions(text, expected):
    assert attributes.extensions(text) == expected


@pytest.mark.parametrize("replacement, named", [
    (b"zbb1p0", "zbb"),  # Zbb's rotates, clz, min/max: new encodings
    (b"f2p2_d", "f, d"),  # hardware floating point over a soft-float ABI
])
def test_an_image_built_for_extensions_the_host_does_not_run_is_refused(elf, replacement, named):
    patched = _arch_patched(elf, b"zca1p0", replacement)
    with pytest.raises(ElfError, match=f"extensions this host does not run: {named} .*build for rv64imac"):
        read_elf(patched)


def test_a_second_attributes_section_is_refused(elf):
    """Section headers may alias one large blob many times over (200 of them over 1 MB took 42 s to read)."""
    offsets = shdr_offsets(elf)
    name = field(elf, offsets[".riscv.attributes"], SHDR_FIELDS, "sh_name")
    other = next(s for s in offsets if s not in (".riscv.attributes", ".text", ".berm.abi", "") and
                 not s.startswith((".rela", ".sym", ".str", ".shstr")))
    doubled = patched(elf, offsets[other] + SHDR_FIELDS["sh_name"][0], SHDR_FIELDS["sh_name"][1], name)
    with pytest.raises(ElfError, match="2 .riscv.attributes sections"):
        read_elf(doubled)


def test_rv32_is_refused():
    with pytest.raises(ElfError, match="built for RV32"):
        attributes.check("rv32imac")


@pytest.mark.parametrize("arch", ["rv32imac\nberm inspect: FORGED", "rv64imac_zfoo\nberm inspect: FORGED"])
def test_an_arch_string_cannot_write_lines_of_its_own_into_the_error(arch):
    """Found by a review: the image's arch string went into the message as it was, so a newline in it wrote a line
    of the image's choosing into berm inspect's or berm-compile's error output."""
    with pytest.raises(ElfError) as refused:
        attributes.check(arch)
    assert "\n" not in str(refused.value) and "\\x0a" in str(refused.value)


@pytest.mark.parametrize("section", [
    b"B",  # another format version
    b"A\x00\x00\x00\x00riscv\x00",  # a subsection of length 0 (a naive reader loops on it)
    b"A\x40\x00\x00\x00riscv\x00",  # longer than the section
    b"A\x10\x00\x00\x00riscv\x00\x01\x00\x00\x00\x00",  # a sub-subsection of length 0
    b"A\x13\x00\x00\x00riscv\x00\x01\x09\x00\x00\x00\x05rv",  # an unterminated arch string
    b"A\x13\x00\x00\x00riscv\x00\x01\x09\x00\x00\x00\x04\xff\xff",  # a ULEB128 number that never ends
    _file(b"\x05rv64imac\x00\xff\xff\xff\xff"),  # trailing garbage after the arch string
    _file(b"\x05rv64i_z" + b"1" * 5000 + b"\x00"),  # an arch string longer than any real one
])
def test_a_malformed_section_is_an_elf_error(section):
    with pytest.raises(ElfError, match=r"\.riscv\.attributes"):
        attributes.arches(section)


def test_every_arch_tag_is_checked(elf):
    """A second arch string (or a second Tag_File, or subsection) after an acceptable one was never read."""
    section = b"A" + _subsection(_file(b"\x05rv64imac\x00") + _file(b"\x05rv64gc_zbb\x00"))
    assert attributes.arches(section) == ["rv64imac", "rv64gc_zbb"]
    with pytest.raises(ElfError, match="extensions this host does not run: g, zbb"):
        for arch in attributes.arches(section):
            attributes.check(arch)


def test_a_long_run_of_digits_is_checked_in_linear_time():
    """A backtracking version pattern made a 200,000-digit extension name take minutes (the arch string came
    from a 265 KB hostile ELF): the pattern is anchored, and arch strings are capped anyway."""
    assert attributes.extensions("rv64i_z" + "1" * 200_000 + "x") == ["i", "z" + "1" * 200_000 + "x"]


def test_other_vendors_and_tags_are_skipped():
    vendor = b"\x0e\x00\x00\x00acme\x00" + b"\x01\x05\x00\x00\x00"
    ours = b"\x1b\x00\x00\x00riscv\x00" + b"\x01\x11\x00\x00\x00" + b"\x04\x10" + b"\x05rv64imac\x00"
    assert attributes.arches(b"A" + vendor + ours) == ["rv64imac"]


def _section(data: bytes) -> bytes:
    from elftools.elf.elffile import ELFFile
    import io

    sec = ELFFile(io.BytesIO(data)).get_section_by_name(".riscv.attributes")
    return sec.data()


def _arch_patched(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with ``old`` replaced by ``new`` (the same length) inside its arch string."""
    assert len(old) == len(new)
    section = _section(data)
    at = data.index(section)
    return data[:at] + section.replace(old, new) + data[at + len(section):]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_arch_strings_or_an_elf_error(data):
    try:
        found = attributes.arches(b"A" + data)
    except ElfError:
        return
    assert all(isinstance(arch, str) for arch in found)
