"""Hostile ELFs: valid images mutated at random must either read cleanly or fail with a BermError, never with a
library traceback, a hang or a giant allocation. Long campaigns: raise max_examples locally."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berm_abi.errors import BermError
from berm_aot.elf import read_elf
from berm_aot.manifest import load_manifest
from tests.elf_samples import (EHDR_FIELDS, PHDR_FIELDS, SHDR_FIELDS, dispatch_elf, field, harness_elf,
                               manifest_json, patched, phdr_offsets, shdr_offsets)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def bases() -> list[bytes]:
    return [dispatch_elf(), harness_elf(manifest_json(["one", "two"]), ["one", "two"])]


def _check(data: bytes) -> None:
    """Read ``data``; on success the image must be self-consistent and its manifest must load or refuse cleanly."""
    try:
        image = read_elf(data)
    except BermError:
        return
    for seg in image.segments:
        assert len(seg.data) <= seg.memsz and seg.end <= 4 << 30
    for r in image.relocations:
        assert r.type_name.startswith("R_RISCV_")
    try:
        load_manifest(image)
    except BermError:
        pass


def _odd_values(data: bytes):
    n = len(data)
    return st.sampled_from([0, 1, 2, 3, 7, 0x40, 0x7F, 0xFF, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 32, 1 << 60,
                            (1 << 63) - 1, (1 << 64) - 1, n, n - 1, n + 1, n // 2]) | st.integers(0, (1 << 64) - 1)


@st.composite
def _header_field_mutation(draw, data: bytes) -> bytes:
    """Overwrite one field of the ELF header, a program header or a section header with an odd value."""
    where = draw(st.sampled_from(["ehdr", "phdr", "shdr"]))
    if where == "ehdr":
        name = draw(st.sampled_from(["e_phoff", "e_shoff", "e_phnum", "e_shnum", "e_shstrndx", "e_phentsize",
                                     "e_shentsize", "e_type", "e_flags"]))
        at, fmt = EHDR_FIELDS[name]
    elif where == "phdr":
        base = draw(st.sampled_from(phdr_offsets(data)))
        off, fmt = PHDR_FIELDS[draw(st.sampled_from(["p_type", "p_offset", "p_vaddr", "p_filesz", "p_memsz"]))]
        at = base + off
    else:
        base = draw(st.sampled_from(sorted(shdr_offsets(data).values())))
        off, fmt = SHDR_FIELDS[draw(st.sampled_from(["sh_offset", "sh_size", "sh_link", "sh_info", "sh_name",
                                                     "sh_type", "sh_flags", "sh_addr", "sh_entsize"]))]
        at = base + off
    return patched(data, at, fmt, draw(_odd_values(data)))


@st.composite
def _overlapping_segments(draw, data: bytes) -> bytes:
    loads = [p for p in phdr_offsets(data) if field(data, p, PHDR_FIELDS, "p_type") == 1]
    a, b = draw(st.permutations(loads))[:2]
    start = field(data, a, PHDR_FIELDS, "p_vaddr")
    at, fmt = PHDR_FIELDS["p_vaddr"]
    return patched(data, b + at, fmt, start + draw(st.integers(-64, 64)))


@st.composite
def _corrupt_string_table(draw, data: bytes) -> bytes:
    shdrs = shdr_offsets(data)
    table = shdrs[draw(st.sampled_from([".shstrtab", ".strtab"]))]
    lo, size = field(data, table, SHDR_FIELDS, "sh_offset"), field(data, table, SHDR_FIELDS, "sh_size")
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        out[lo + draw(st.integers(0, size - 1))] = draw(st.sampled_from([0, 0x2E, 0x80, 0xC3, 0xFF]))
    return bytes(out)


@st.composite
def _bit_flips(draw, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 16))):
        i = draw(st.integers(0, len(out) - 1))
        out[i] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


@st.composite
def _overwrite(draw, data: bytes) -> bytes:
    at = draw(st.integers(0, len(data) - 1))
    chunk = draw(st.binary(min_size=1, max_size=16))
    return data[:at] + chunk + data[at + len(chunk):]


def _blind_mutations(data: bytes):
    """Mutations that need no structure: they apply to an image earlier mutations already broke."""
    return st.one_of(st.integers(0, len(data) - 1).map(lambda n: data[:n]), _bit_flips(data), _overwrite(data))


def _mutations(data: bytes):
    return st.one_of(_blind_mutations(data), _header_field_mutation(data), _overlapping_segments(data),
                     _corrupt_string_table(data))


@SETTINGS
@given(data=st.data())
def test_mutated_images_fail_cleanly(bases, data):
    base = data.draw(st.sampled_from(bases))
    mutated = data.draw(_mutations(base))
    # several mutations stacked, so later ones hit structures the earlier ones already broke
    for _ in range(data.draw(st.integers(0, 2))):
        mutated = data.draw(_blind_mutations(mutated)) if mutated else mutated
    _check(mutated)


@SETTINGS
@given(data=st.data())
def test_header_field_mutations_fail_cleanly(bases, data):
    base = data.draw(st.sampled_from(bases))
    _check(data.draw(_header_field_mutation(base)))


def test_a_huge_bss_is_not_allocated(bases):
    """A segment claiming nearly 4 GiB reads instantly: memsz is a number, never a buffer."""
    data = bases[0]
    (bss,) = [p for p in phdr_offsets(data) if field(data, p, PHDR_FIELDS, "p_type") == 1
              and field(data, p, PHDR_FIELDS, "p_filesz") == 0]
    at, fmt = PHDR_FIELDS["p_memsz"]
    huge = (4 << 30) - field(data, bss, PHDR_FIELDS, "p_vaddr")
    image = read_elf(patched(data, bss + at, fmt, huge))
    (seg,) = [s for s in image.segments if s.memsz == huge]
    assert seg.data == b"" and seg.end == 4 << 30


def test_mutated_images_go_through_every_loading_step_to_a_berm_error_or_a_run():
    """A review of the tests: the mutations above stop at the ELF reader and the manifest. One round of the
    campaign tools/fuzz_elf.py (a fixed seed): 150 mutated images through the program model, C emission,
    Engine.load and a call of every tool, on the interpreter, and every third translated, compiled and run too,
    in a child process with a time limit (a hang or a crash is a finding, as a raw exception is)."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "tools/fuzz_elf.py", "--rounds", "1", "--seed", "11", "--per-child", "150",
                          "--aot-every", "3"], cwd=root, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0 and out.stdout.endswith(" 0 findings\n"), out.stdout + out.stderr
    counts = {how: int(n) for n, how in re.findall(r"^ +(\d+)  (.+)$", out.stdout, re.M)}
    assert counts.get("ran", 0) >= 5 and counts.get("loaded", 0) >= 10, counts  # far enough, often enough
