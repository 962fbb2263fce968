"""berm_aot.elf: what a valid image yields, and each refusal of a malformed one with its own message."""

from __future__ import annotations

import hashlib
import os
import struct

import pytest

from berm_aot.elf import MAX_FILE_BYTES, MAX_LOAD_SEGMENTS, read_elf, read_elf_file, read_file, reloc_type_name
from berm_aot.errors import ElfError
from tests.elf_samples import (EHDR_FIELDS, PHDR_FIELDS, SHDR_FIELDS, dispatch_elf, field, harness_elf,
                               manifest_json, patched, phdr_offsets, shdr_offsets)


@pytest.fixture(scope="module")
def dispatch() -> bytes:
    return dispatch_elf()


@pytest.fixture(scope="module")
def image(dispatch):
    return read_elf(dispatch)


def _func(image, name):
    (sym,) = [s for s in image.symbols if s.name == name and s.kind == "func"]
    return sym


def test_header_facts(image, dispatch):
    assert image.size == len(dispatch)
    assert image.sha256 == hashlib.sha256(dispatch).hexdigest()
    assert image.raw == dispatch
    assert image.entry == _func(image, "_start").value
    assert image.flags & 0x6 == 0


def test_segments_and_sections_agree(image):
    text = [s for s in image.sections if s.name == ".text"][0]
    assert text.alloc and text.executable and not text.writable
    assert image.executable_sections() == (text,)
    (code,) = [s for s in image.segments if s.executable]
    assert code.vaddr <= text.addr and text.end <= code.end and not code.writable
    assert image.read(text.addr, text.size) == code.data[text.addr - code.vaddr:text.end - code.vaddr]
    bss = [s for s in image.sections if s.name == ".bss"][0]
    assert image.read(bss.addr, bss.size) == bytes(bss.size)


def test_symbols(image):
    for name in ("arm", "twice", "thrice", "berm_tool_dispatch", "_start"):
        sym = _func(image, name)
        assert sym.binding == "global" and sym.section == ".text" and sym.size > 0
    text = [s for s in image.sections if s.name == ".text"][0]
    (section_sym,) = [s for s in image.symbols if s.kind == "section" and s.name == ".text"]
    assert section_sym.value == text.addr


def test_jump_table_relocations_name_the_arms(image):
    arm = _func(image, "arm")
    table = [r for r in image.relocations if r.type_name == "R_RISCV_64"]
    assert len(table) == 8
    for r in table:
        assert r.section == ".rodata"
        assert arm.value < r.target < arm.value + arm.size
        assert struct.unpack("<Q", image.read(r.offset, 8))[0] == r.target


def test_function_addresses_taken_in_code_are_pcrel_hi20(image):
    named = {r.symbol: r for r in image.relocations if r.type_name == "R_RISCV_PCREL_HI20"}
    for name in ("twice", "thrice"):
        r = named[name]
        assert r.section == ".text" and r.target == _func(image, name).value == r.symbol_value
        text = [s for s in image.sections if s.name == ".text"][0]
        assert text.addr <= r.offset < text.end and image.read(r.offset, 4)[0] & 0x7F == 0x17  # an auipc
    calls = [r for r in image.relocations if r.type_name in ("R_RISCV_CALL", "R_RISCV_CALL_PLT")]
    assert any(r.target == _func(image, "arm").value for r in calls)


def test_relocation_type_names():
    assert reloc_type_name(2) == "R_RISCV_64"
    assert reloc_type_name(23) == "R_RISCV_PCREL_HI20"
    assert reloc_type_name(45) == "R_RISCV_RVC_JUMP"
    assert reloc_type_name(51) == "R_RISCV_RELAX"
    assert reloc_type_name(200) == "R_RISCV_200"


def test_manifest_bytes_are_the_section_contents():
    text = manifest_json(["hello"])
    assert read_elf(harness_elf(text, ["hello"])).manifest_bytes == text.encode()
    assert read_elf(harness_elf(None, ["hello"])).manifest_bytes is None


def test_read_elf_file(tmp_path, dispatch):
    path = tmp_path / "g.elf"
    path.write_bytes(dispatch)
    assert read_elf_file(path).sha256 == read_elf(dispatch).sha256
    with pytest.raises(ElfError, match="cannot read"):
        read_elf_file(tmp_path / "missing.elf")


def test_only_a_regular_file_of_image_size_is_read(tmp_path):
    """Found by a review: files were read whole first, so `berm inspect` of a 5 GB file took 32 s and 5 GB, and
    /dev/zero never ended. The size is judged before reading (the sparse file below occupies no disk)."""
    huge = tmp_path / "huge.elf"
    with open(huge, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(ElfError, match=f"is {MAX_FILE_BYTES + 1} bytes, larger than any image"):
        read_file(huge)
    with pytest.raises(ElfError, match="is not a regular file"):
        read_file("/dev/zero")
    os.mkfifo(tmp_path / "fifo.elf")  # no writer: opening it to read waited for one, for ever
    with pytest.raises(ElfError, match="is not a regular file"):
        read_file(tmp_path / "fifo.elf")
    # the sources of a harness named where its image was meant (a newcomer's walkthrough): how to make the image
    with pytest.raises(ElfError, match=r"is a directory, not a harness image \(if it holds a harness's sources, "
                                       r"`berm build .*` makes its image\)"):
        read_file(tmp_path)


def test_relocations_against_non_alloc_sections_are_ignored(dispatch):
    shdrs = shdr_offsets(dispatch)
    comment_index = (shdrs[".comment"] - shdrs[""]) // 64
    off, fmt = SHDR_FIELDS["sh_info"]
    image = read_elf(patched(dispatch, shdrs[".rela.rodata"] + off, fmt, comment_index))
    assert not [r for r in image.relocations if r.type_name == "R_RISCV_64"]
    assert [r for r in image.relocations if r.type_name == "R_RISCV_PCREL_HI20"]


def _ehdr_patch(data, name, value):
    off, fmt = EHDR_FIELDS[name]
    return patched(data, off, fmt, value)


PHDR_SIZE = 56


def _load_headers(data):
    return [p for p in phdr_offsets(data) if field(data, p, PHDR_FIELDS, "p_type") == 1]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"", "bad magic"),
    (lambda d: b"MZ" + d[2:], "bad magic"),
    (lambda d: d[:40], "shorter than the 64-byte header"),
    (lambda d: d[:4] + b"\x01" + d[5:], "not a 64-bit ELF"),
    (lambda d: d[:5] + b"\x02" + d[6:], "not a little-endian ELF"),
    (lambda d: _ehdr_patch(d, "e_machine", 62), "not a RISC-V ELF"),
    (lambda d: _ehdr_patch(d, "e_type", 3), "not an executable ELF"),
    (lambda d: _ehdr_patch(d, "e_flags", 0x5), "hardware floating-point ABI"),
    (lambda d: _ehdr_patch(d, "e_phoff", len(d) - 8), "program header table"),
    (lambda d: _ehdr_patch(d, "e_shoff", 1 << 62), "section header table"),
    (lambda d: _ehdr_patch(d, "e_shnum", 0), "no section headers"),
    (lambda d: _ehdr_patch(d, "e_shentsize", 40), "section header entries are 40 bytes"),
    (lambda d: _ehdr_patch(d, "e_shstrndx", 999), "section-name table is section 999"),
])
def test_header_refusals(dispatch, mutate, message):
    with pytest.raises(ElfError, match=message):
        read_elf(mutate(dispatch))


def _patch_load(data, index, name, value):
    off, fmt = PHDR_FIELDS[name]
    return patched(data, _load_headers(data)[index] + off, fmt, value)


def _patch_section(data, section, name, value):
    off, fmt = SHDR_FIELDS[name]
    return patched(data, shdr_offsets(data)[section] + off, fmt, value)


def _no_loads(data):
    for p in _load_headers(data):
        data = patched(data, p + PHDR_FIELDS["p_type"][0], "<I", 0)
    return data


def _overlap(data):
    first, second = _load_headers(data)[:2]
    return patched(data, second + PHDR_FIELDS["p_vaddr"][0], "<Q", field(data, first, PHDR_FIELDS, "p_vaddr") + 8)


def _many_loads(data):
    """A program header table of one more loadable segment than allowed, appended to the file (each mapping no
    file bytes: the file bytes segments map may not add up to more than the file, see test_elf_limits.py)."""
    first = _load_headers(data)[0]
    table = patched(data[first:first + PHDR_SIZE], PHDR_FIELDS["p_filesz"][0], "<Q", 0) * (MAX_LOAD_SEGMENTS + 1)
    return _ehdr_patch(_ehdr_patch(data + table, "e_phoff", len(data)), "e_phnum", MAX_LOAD_SEGMENTS + 1)


@pytest.mark.parametrize("mutate, message", [
    (_no_loads, "no loadable"),
    (_many_loads, f"more than {MAX_LOAD_SEGMENTS} loadable"),
    (_overlap, "segments overlap"),
    (lambda d: _patch_load(d, 0, "p_filesz", 1 << 40), "more file bytes"),
    (lambda d: _patch_load(d, 0, "p_memsz", 1 << 60), "ends above 4 GiB"),
    (lambda d: _patch_load(d, 0, "p_vaddr", (1 << 64) - 16), "ends above 4 GiB"),
    (lambda d: _patch_load(d, 1, "p_offset", len(d)), "segment 2"),
    (lambda d: _patch_section(d, ".symtab", "sh_size", 1 << 60), "outside the"),
    (lambda d: _patch_section(d, ".symtab", "sh_entsize", 16), "16-byte entries"),
    (lambda d: _patch_section(d, ".symtab", "sh_link", 1), "not a string table"),
    (lambda d: _patch_section(d, ".symtab", "sh_type", 1), "no symbol table"),
    (lambda d: _patch_section(d, ".text", "sh_addr", 0x10), "not inside any loadable segment"),
    # every section start is a function start (berm_aot/program.py), and none starts at an odd address
    (lambda d: _patch_section(d, ".text", "sh_addr", field(d, shdr_offsets(d)[".text"], SHDR_FIELDS, "sh_addr") + 1),
     "executable section '.text' starts at the odd address"),
    (lambda d: _patch_section(d, ".bss", "sh_size", 0x20000), "section '.bss' .* is not inside any loadable segment"),
    (lambda d: _patch_section(_patch_section(d, ".rela.text", "sh_type", 1), ".rela.rodata", "sh_type", 1),
     "link it with --emit-relocs"),
    (lambda d: _patch_section(d, ".text", "sh_flags", 2), "has no code .*reachable"),  # nothing executable left
    (lambda d: _patch_section(d, ".rela.text", "sh_info", 500), "which does not exist"),
    (lambda d: _patch_section(d, ".rela.rodata", "sh_info", field(d, shdr_offsets(d)[".rela.text"], SHDR_FIELDS,
                                                                 "sh_info")), "more than one relocation section"),
    (lambda d: _patch_section(d, ".rela.text", "sh_size", 25), "whole number of entries"),
    (lambda d: _patch_section(d, ".shstrtab", "sh_size", 3), "section-name table is not NUL-terminated"),
    (lambda d: _patch_section(d, ".text", "sh_name", 0xFFFF), "past the end of the section-name table"),
])
def test_table_refusals(dispatch, mutate, message):
    with pytest.raises(ElfError, match=message):
        read_elf(mutate(dispatch))


def test_overlapping_sections():
    data = harness_elf(manifest_json(["a"]), ["a"])
    manifest_at = field(data, shdr_offsets(data)[".berm.abi"], SHDR_FIELDS, "sh_addr")
    with pytest.raises(ElfError, match=r"sections '.berm.abi' .* and '.rodata' .* overlap"):
        read_elf(_patch_section(data, ".rodata", "sh_addr", manifest_at + 8))


def test_code_marked_thread_local_is_refused():
    """Found by a review: the TLS flag on .text skipped the checks that sections lie in a segment and do not
    overlap, and a second executable section 2 bytes into it was taken: the functions were found twice, and the
    translated C did not compile (reported as a translator bug)."""
    data = harness_elf(manifest_json(["a"]), ["a"])
    flags = field(data, shdr_offsets(data)[".text"], SHDR_FIELDS, "sh_flags")
    with pytest.raises(ElfError, match="section '.text' is both executable and thread-local"):
        read_elf(_patch_section(data, ".text", "sh_flags", flags | 0x400))  # SHF_TLS


def test_relocation_naming_a_missing_symbol(dispatch):
    rela = shdr_offsets(dispatch)[".rela.text"]
    first = field(dispatch, rela, SHDR_FIELDS, "sh_offset")
    bad = patched(dispatch, first + 8 + 4, "<I", 10_000)  # r_info's symbol index (upper 32 bits)
    with pytest.raises(ElfError, match="names symbol 10000"):
        read_elf(bad)


def test_relocation_outside_its_section(dispatch):
    rela = shdr_offsets(dispatch)[".rela.text"]
    first = field(dispatch, rela, SHDR_FIELDS, "sh_offset")
    with pytest.raises(ElfError, match="outside '.text'"):
        read_elf(patched(dispatch, first, "<Q", 0x10))


def test_not_bytes():
    with pytest.raises(ElfError, match="bytes, not str"):
        read_elf("hello")


def test_a_section_name_in_an_error_is_quoted_on_one_line(tmp_path, capsys):
    """Found by a review: section names went into errors as they were, so a section named "X\\nberm OK" printed a
    line of its own under the CLI's "berm inspect:". They are quoted (repr), as symbol names are."""
    from berm_cli.main import main

    data = harness_elf(manifest_json(["go"]), ["go"])
    data = _patch_section(data, ".berm.abi", "sh_addr", 0x10)  # outside every segment
    i = data.index(b".berm.abi\0")
    data = data[:i] + b"X\nberm OK" + data[i + 9:]
    (tmp_path / "h.elf").write_bytes(data)
    assert main(["inspect", str(tmp_path / "h.elf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"berm inspect: {tmp_path / 'h.elf'}: section 'X\\nberm OK' [0x10, ")
