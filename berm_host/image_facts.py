"""What loading an image needs from its ELF file, kept in the code cache so a cached load skips ``read_elf``.

``read_elf`` (pyelftools, every section, symbol and relocation) costs milliseconds; running a cached translated
image needs only its loadable segments (layout and initial bytes), its tool exports and its manifest bytes. Those
are ``ElfFacts``: computed once from the full ``ElfImage``, stored under a key over the ELF digest and the source of
every module that derives them, and read back on the next load. The full ``ElfImage`` stays one call away
(``ElfFacts.elf()``: trap descriptions and compiling on a cache miss need the program model).

Stored form: ``<checksum of the rest (berm_aot/checksum.c)>\\n<JSON header>\\n<manifest bytes>``. The segments'
bytes are where each one's file offset says in the ELF the facts describe (whose digest names them), not a copy: a
stored copy doubled what a load of a 100 KB guest read and checked. Anything that does not parse or verify,
or places a segment outside the ELF, is ignored (and rewritten): the facts are a shortcut, never a source of truth.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import berm_aot
from berm_aot import _checksum as checksum
from berm_aot.cache import CodeCache, cache_key
from berm_aot.image import ElfImage, Segment, Symbol
from berm_aot.manifest import TOOL_PREFIX, lifecycle_exports, tool_exports

FACTS_NAME = "facts"
#: This module's source and the translator's (berm_aot.SOURCES_DIGEST, which covers the ELF reader and manifest
#: that decide what the facts hold), taken as it is imported, as berm_aot's is (not when first needed).
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes() + berm_aot.SOURCES_DIGEST.encode()).hexdigest()


class ElfFacts:
    """The parts of an ``ElfImage`` a load needs: ``sha256``, ``segments``, ``symbols`` (the tool and lifecycle
    exports only, so ``tool_exports``, ``lifecycle_exports`` and ``load_manifest`` accept it) and ``manifest_bytes``; ``elf()`` reads the rest."""

    __slots__ = ("sha256", "segments", "symbols", "manifest_bytes", "_raw", "_elf")

    def __init__(self, sha256: str, segments: tuple[Segment, ...], symbols: tuple[Symbol, ...],
                 manifest_bytes: bytes | None, raw: bytes, elf: ElfImage | None = None):
        self.sha256 = sha256
        self.segments = segments
        self.symbols = symbols
        self.manifest_bytes = manifest_bytes
        self._raw = raw
        self._elf = elf

    @classmethod
    def of(cls, elf: ElfImage) -> ElfFacts:
        names = {TOOL_PREFIX + name for name in tool_exports(elf)} | set(lifecycle_exports(elf))
        return cls(elf.sha256, elf.segments, tuple(s for s in elf.symbols if s.name in names), elf.manifest_bytes,
                   elf.raw, elf)

    def elf(self) -> ElfImage:
        """The full image (read from the ELF bytes on first use)."""
        if self._elf is None:
            self._elf = read_elf(self._raw)
        return self._elf

    # -- stored form --------------------------------------------------------------------------------------------

    def dump(self) -> bytes:
        header = {
            "sha256": self.sha256,
            "segments": [[s.vaddr, s.memsz, s.offset, len(s.data), s.readable, s.writable, s.executable]
                         for s in self.segments],
            "symbols": [[s.name, s.value, s.size, s.kind, s.binding, s.section] for s in self.symbols],
            "manifest": None if self.manifest_bytes is None else len(self.manifest_bytes),
        }
        body = b"".join([json.dumps(header, separators=(",", ":")).encode(), b"\n", self.manifest_bytes or b""])
        return checksum.data(body).encode() + b"\n" + body  # damage, not an attacker, is what it finds (checksum.c)

    @classmethod
    def parse(cls, stored: bytes, raw: bytes, sha256: str) -> ElfFacts | None:
        """The facts in ``stored`` when they verify and describe the ELF ``raw`` (digest ``sha256``), else None."""
        digest, _, body = stored.partition(b"\n")
        if checksum.data(body).encode() != digest:
            return None
        text, _, manifest = body.partition(b"\n")
        try:
            h = json.loads(text)
            if h["sha256"] != sha256:
                return None
            segments = []
            for vaddr, memsz, offset, n, r, w, x in h["segments"]:
                if not (type(offset) is int and type(n) is int and 0 <= offset and offset + n <= len(raw)):
                    return None
                segments.append(Segment(vaddr, memsz, raw[offset:offset + n], r, w, x, offset))
            symbols = tuple(Symbol(*fields) for fields in h["symbols"])
            if h["manifest"] is None:
                manifest = None
            elif h["manifest"] != len(manifest):
                return None
        except (ValueError, KeyError, TypeError):
            return None
        return cls(sha256, tuple(segments), symbols, manifest, raw)


def read_elf(raw: bytes) -> ElfImage:
    """``berm_aot.elf.read_elf``, imported on first use: pyelftools costs tens of milliseconds of import, which a
    process that only loads cached images never pays."""
    from berm_aot.elf import read_elf as read

    return read(raw)


def facts_key(sha256: str) -> str:
    return cache_key("berm-facts", sha256, SOURCE_DIGEST)


def load_facts(cache: CodeCache, raw: bytes, sha256: str) -> ElfFacts:
    """The facts of the ELF ``raw``: from ``cache`` when stored there, else from ``read_elf`` (then stored).
    Raises what ``read_elf`` raises for a bad file."""
    key = facts_key(sha256)
    stored = cache.read_blob(key, FACTS_NAME)
    facts = ElfFacts.parse(stored, raw, sha256) if stored is not None else None
    if facts is None:
        facts = ElfFacts.of(read_elf(raw))
        cache.write_blob(key, FACTS_NAME, facts.dump())
    return facts
