"""A cached load runs from the ELF facts stored in the code cache: the same manifest, exports, layout and initial
bytes as a full read, no ELF parse on a hit, and damaged facts ignored (derived again) rather than trusted."""

from __future__ import annotations

import dataclasses
import json

import pytest

import berm_host.image_facts as image_facts
from berm_aot.elf import read_elf
from berm_aot.errors import ElfError
from berm_aot.manifest import load_manifest, tool_exports
from berm_host.aot.backend import image_hull
from berm_host.engine import Engine
from berm_host.image_facts import FACTS_NAME, ElfFacts, facts_key
from berm_host.layout import layout_for
from berm_host.traps import Trap
from tests.guests import guest_elf

SOURCE = r"""
typedef unsigned long u64;
typedef struct { u64 ptr, len; } Pair;
static char greeting[] = "hello";
static u64 scratch[64];
Pair berm_tool_hi(void) { scratch[3] = 1; Pair p = { (u64)greeting, 5 }; return p; }
Pair berm_tool_boom(void) { __builtin_trap(); }
Pair helper_not_a_tool(void) { Pair p = { 0, 0 }; return p; }
__attribute__((section(".berm.abi"), used, retain)) static const char manifest[] = MANIFEST;
void _start(void) {}
"""


@pytest.fixture(scope="module")
def elf() -> bytes:
    manifest = json.dumps({"abi_version": 0, "tools": [{"name": t, "description": "", "parameters": {}}
                                                        for t in ("hi", "boom")]})
    return guest_elf(SOURCE.replace("MANIFEST", json.dumps(manifest)),
                     keep=("berm_tool_hi", "berm_tool_boom", "helper_not_a_tool"))


def _stored(cache_dir, elf: bytes):
    return Engine(cache_dir=cache_dir).cache.entry(facts_key(read_elf(elf).sha256)) / FACTS_NAME


def test_stored_facts_match_a_full_read(tmp_path, elf):
    full = read_elf(elf)
    Engine(cache_dir=tmp_path).load(elf)
    facts = ElfFacts.parse(_stored(tmp_path, elf).read_bytes(), elf, full.sha256)
    assert facts is not None
    assert facts.segments == full.segments and facts.manifest_bytes == full.manifest_bytes
    assert tool_exports(facts) == tool_exports(full) == {"hi": tool_exports(full)["hi"],
                                                          "boom": tool_exports(full)["boom"]}
    assert load_manifest(facts) == load_manifest(full)
    layout = layout_for(full)
    assert layout_for(facts) == layout and image_hull(facts, layout) == image_hull(full, layout)
    assert facts.elf() == full


def test_cached_load_reads_no_elf(tmp_path, elf, monkeypatch):
    Engine(cache_dir=tmp_path).load(elf)
    calls = []
    real = image_facts.read_elf
    monkeypatch.setattr(image_facts, "read_elf", lambda data: calls.append(1) or real(data))
    image = Engine(cache_dir=tmp_path).load(elf)
    assert image.backend.compiled is False and calls == []
    assert image.harness().call("hi") == "hello"
    with pytest.raises(Trap) as err:  # a trap is described from the object's locator: still no ELF read
        image.harness().call("boom")
    assert err.value.info.where.startswith("berm_tool_boom") and calls == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_elf", "segment_outside"])
def test_damaged_facts_are_derived_again(tmp_path, elf, damage):
    Engine(cache_dir=tmp_path).load(elf)
    path = _stored(tmp_path, elf)
    good = path.read_bytes()
    if damage == "flip":
        path.write_bytes(good[:-3] + bytes([good[-3] ^ 1]) + good[-2:])
    elif damage == "truncate":
        path.write_bytes(good[:len(good) // 2])
    elif damage == "other_elf":  # verifies, but describes another image
        other = ElfFacts.parse(good, elf, read_elf(elf).sha256)
        other.sha256 = "0" * 64
        path.write_bytes(other.dump())
    else:  # verifies, but a segment's bytes would lie past the ELF's end (they are read from the ELF, not stored)
        other = ElfFacts.parse(good, elf, read_elf(elf).sha256)
        other.segments = (dataclasses.replace(other.segments[0], offset=len(elf) - 2), *other.segments[1:])
        path.write_bytes(other.dump())
    assert Engine(cache_dir=tmp_path).load(elf).harness().call("hi") == "hello"
    assert path.read_bytes() == good


def test_bad_elf_still_refused_with_a_cache(tmp_path, elf):
    with pytest.raises(ElfError):
        Engine(cache_dir=tmp_path).load(elf[:40])
    with pytest.raises(ElfError):
        Engine(cache_dir=tmp_path).load(b"\x7fELF" + elf[4:5] + b"\x00" * 80)
