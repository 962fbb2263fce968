"""What one image may hold (berm_aot.elf's MAX_* bounds, and berm_aot.program's MAX_FUNCTIONS): at a bound an image
is read, one past it is refused with its own message. The reader and the translator run in the host process, so a
file may not make them take unbounded memory or time: each of the reader's bounds is checked from the section
headers, before the contents are read."""

from __future__ import annotations

import struct

import pytest

from berm_aot import elf, program
from berm_aot.elf import MAX_NAME_BYTES, read_elf
from berm_aot.errors import ElfError
from berm_aot.program import Program
from tests.elf_samples import (EHDR_FIELDS, PHDR_FIELDS, SHDR_FIELDS, dispatch_elf, field, harness_elf, manifest_json, patched,
                               phdr_offsets, shdr_offsets)


@pytest.fixture(scope="module")
def dispatch() -> bytes:
    return dispatch_elf()


def _size(data: bytes, section: str) -> int:
    return field(data, shdr_offsets(data)[section], SHDR_FIELDS, "sh_size")


def _at_and_past(monkeypatch, data: bytes, bound: str, value: int, message: str) -> None:
    """``data`` is read with the bound at ``value`` and refused with ``message`` at ``value - 1``."""
    monkeypatch.setattr(elf, bound, value)
    read_elf(data)
    monkeypatch.setattr(elf, bound, value - 1)
    with pytest.raises(ElfError, match=message):
        read_elf(data)


def test_code(monkeypatch, dispatch):
    code = sum(s.size for s in read_elf(dispatch).executable_sections())
    _at_and_past(monkeypatch, dispatch, "MAX_CODE_BYTES", code,
                 rf"has {code} bytes of code \(executable sections\), more than the {code - 1} Berm runs")


def test_symbols(monkeypatch, dispatch):
    entries = _size(dispatch, ".symtab") // 24  # the null symbol counts: it is read too
    _at_and_past(monkeypatch, dispatch, "MAX_SYMBOLS", entries,
                 f"has {entries} symbols, more than the {entries - 1} one may have")


def test_relocations_of_all_tables_together(monkeypatch, dispatch):
    """The bound is on the sum: .rela.text alone is under it, .rela.rodata takes the image past it."""
    total = len(read_elf(dispatch).relocations)
    assert _size(dispatch, ".rela.text") // 24 < total - 1
    _at_and_past(monkeypatch, dispatch, "MAX_RELOCATIONS", total,
                 f"more than {total - 1} relocations of its allocated sections")


def test_manifest(monkeypatch):
    data = harness_elf(manifest_json(["a"]), ["a"])
    size = _size(data, ".berm.abi")
    _at_and_past(monkeypatch, data, "MAX_MANIFEST_BYTES", size,
                 f"the .berm.abi section is {size} bytes, more than the {size - 1} it may have")


def test_build_attributes(monkeypatch, dispatch):
    size = _size(dispatch, ".riscv.attributes")
    _at_and_past(monkeypatch, dispatch, "MAX_ATTRIBUTES_BYTES", size,
                 f"the .riscv.attributes section is {size} bytes, more than the {size - 1} it may have")


def _loads(data: bytes) -> list[int]:
    """The headers of the loadable segments."""
    return [ph for ph in phdr_offsets(data) if field(data, ph, PHDR_FIELDS, "p_type") == 1]


def _unloaded(data: bytes) -> int:
    """The bytes of ``data`` that no loadable segment maps, each counted once."""
    mapped = set()
    for ph in _loads(data):
        at = field(data, ph, PHDR_FIELDS, "p_offset")
        mapped.update(range(at, at + field(data, ph, PHDR_FIELDS, "p_filesz")))
    return len(data) - len(mapped)


def test_bytes_outside_the_loadable_segments(monkeypatch, dispatch):
    """A loaded image keeps its file's bytes: 1 GiB of anything appended to a small program held 1 GiB of the
    host's memory per load. Here 4 KiB are appended."""
    data = dispatch + bytes(4096)
    unloaded = _unloaded(data)
    assert unloaded > 4096
    _at_and_past(monkeypatch, data, "MAX_UNLOADED_BYTES", unloaded,
                 f"{unloaded} bytes of the file lie outside its loadable segments .*, more than the {unloaded - 1}")


def test_file_bytes_two_segments_map_count_once(monkeypatch, dispatch):
    """A second segment mapping the first one's file bytes (at its own address) adds nothing to what is loaded:
    counted twice, the appended bytes would hide behind it."""
    first, second = _loads(dispatch)[:2]
    size = min(field(dispatch, first, PHDR_FIELDS, "p_filesz"), field(dispatch, second, PHDR_FIELDS, "p_memsz"))
    data = patched(dispatch, second + PHDR_FIELDS["p_offset"][0], "<Q", field(dispatch, first, PHDR_FIELDS, "p_offset"))
    data = patched(data, second + PHDR_FIELDS["p_filesz"][0], "<Q", size) + bytes(size)
    unloaded = _unloaded(data)
    _at_and_past(monkeypatch, data, "MAX_UNLOADED_BYTES", unloaded,
                 f"{unloaded} bytes of the file lie outside its loadable segments")


def test_segments_may_not_map_more_file_bytes_than_the_file_has(dispatch):
    """Found by a review: each segment's bytes are copied, and 61 segments mapping one 16 MiB run of the file took
    1 GB to read. A segment's bytes mapped again by a second segment are read (the test above); a program header
    table of copies of the first segment, more than the file holds, is refused before the rest is looked at."""
    first = _loads(dispatch)[0]
    filesz = field(dispatch, first, PHDR_FIELDS, "p_filesz")
    count = len(dispatch) // filesz + 2
    table = dispatch[first:first + 56] * count  # 56 bytes: an Elf64_Phdr
    data = dispatch + table
    data = patched(data, EHDR_FIELDS["e_phoff"][0], "<Q", len(dispatch))
    data = patched(data, EHDR_FIELDS["e_phnum"][0], "<H", count)
    mapped = filesz * (len(data) // filesz + 1)
    with pytest.raises(ElfError, match=f"the loadable segments map {mapped} bytes or more of a {len(data)}-byte "
                                       "file: they map the same file bytes over and over"):
        read_elf(data)


def test_functions(monkeypatch, dispatch):
    """Counted once the analysis has found every function start: symbols, call targets, and what jumps make."""
    functions = len(Program.from_image(read_elf(dispatch)).locator.functions)
    monkeypatch.setattr(program, "MAX_FUNCTIONS", functions)
    Program.from_image(read_elf(dispatch))
    monkeypatch.setattr(program, "MAX_FUNCTIONS", functions - 1)
    with pytest.raises(ElfError, match=f"has {functions} functions or more, more than the {functions - 1} Berm runs"):
        Program.from_image(read_elf(dispatch))


def test_functions_the_symbols_name_are_counted_before_the_code_is_followed(monkeypatch, dispatch):
    """Found by a review: the bound was checked once the analysis had followed all the code and closed the set of
    starts, so a million function symbols took 35 s and 825 MB to refuse."""
    image = read_elf(dispatch)
    named = {s.value for s in image.symbols if s.kind == "func"}
    monkeypatch.setattr(program, "MAX_FUNCTIONS", len(named) // 2)

    def followed(*_):
        raise AssertionError("the code was followed before the function count was checked")

    monkeypatch.setattr(program._CodeMap, "descend", followed)
    with pytest.raises(ElfError, match="functions or more, more than the"):
        Program.from_image(image)


def test_relocation_tables_may_not_share_file_bytes(dispatch):
    """Found by a review: a section is patched by one relocation table, but one 1.5 KB table named by 32,764
    section headers, each applying it to a section of its own (empty, so every entry fits), made 2 million
    relocations and 415 MB from a 4 MiB file. Here a 96 KiB table of entries that patch nothing (R_RISCV_NONE) at
    the start of .rodata is named twice, each time applied to an empty section there: more than the file holds."""
    headers = shdr_offsets(dispatch)
    shoff, shnum = (field(dispatch, 0, EHDR_FIELDS, f) for f in ("e_shoff", "e_shnum"))
    rodata = dispatch[headers[".rodata"]:headers[".rodata"] + 64]
    at = field(rodata, 0, SHDR_FIELDS, "sh_addr")
    table = struct.pack("<QQq", at, 0, 0) * 4096
    empty = patched(rodata, SHDR_FIELDS["sh_size"][0], "<Q", 0)
    rela = patched(dispatch[headers[".rela.text"]:headers[".rela.text"] + 64], SHDR_FIELDS["sh_offset"][0], "<Q",
                   len(dispatch))
    rela = patched(rela, SHDR_FIELDS["sh_size"][0], "<Q", len(table))

    def named(times: int) -> bytes:
        added = [empty] * times + [patched(rela, SHDR_FIELDS["sh_info"][0], "<I", shnum + k) for k in range(times)]
        data = dispatch + table + dispatch[shoff:shoff + 64 * shnum] + b"".join(added)
        data = patched(data, EHDR_FIELDS["e_shoff"][0], "<Q", len(dispatch) + len(table))
        return patched(data, EHDR_FIELDS["e_shnum"][0], "<H", shnum + len(added))

    assert len(read_elf(named(1)).relocations) > len(read_elf(dispatch).relocations) + 4000
    data = named(2)
    with pytest.raises(ElfError, match=f"the relocation sections hold [0-9]+ bytes or more of a {len(data)}-byte "
                                       "file: they share file bytes"):
        read_elf(data)


@pytest.mark.parametrize("shared", [False, True], ids=["offsets", "one-offset"])
def test_names_at_many_offsets_into_one_long_run(dispatch, shared):
    """A symbol table whose names start at offsets 1, 2, 3, … of one 1 MiB run of letters: each name is the rest of
    the run, so 65 of them make 65 MiB of names from a 1 MiB table. Without the bound each was decoded: 65,535
    section names into a 100 MB run make 6.5 TB. The bound is the real one (MAX_NAME_BYTES, 64 MiB). ``shared``:
    every symbol names offset 1, one name decoded once but repeated for each entry in what the translator writes
    (found by a review: 1,000 functions sharing one 300 KB name made 600 MB of C from a 400 KB image)."""
    run = 1 << 20
    count = MAX_NAME_BYTES // (run - 64) + 1
    strtab = b"\0" + b"x" * run + b"\0"
    null = bytes(24)
    symtab = null + b"".join(struct.pack("<IBBHQQ", 1 if shared else 1 + i, 0, 0, 0, 0, 0) for i in range(count))
    data = dispatch + strtab + symtab
    headers = shdr_offsets(dispatch)
    for section, offset, size in ((".strtab", len(dispatch), len(strtab)),
                                  (".symtab", len(dispatch) + len(strtab), len(symtab))):
        data = patched(data, headers[section] + SHDR_FIELDS["sh_offset"][0], "<Q", offset)
        data = patched(data, headers[section] + SHDR_FIELDS["sh_size"][0], "<Q", size)
    with pytest.raises(ElfError, match=f"the names of the symbol-name table's entries come to more than "
                                       f"{MAX_NAME_BYTES} bytes in all"):
        read_elf(data)
