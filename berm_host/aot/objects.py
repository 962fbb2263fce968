"""Translated code as shared objects: emit C for a program, compile it, and keep it in the code cache.

The cache key covers every input of the object: the ELF bytes (their SHA-256), the translator version and the
source of every module that shapes the emitted code (decoder, program model, analysis, emitter: editing one
invalidates the cache without anyone remembering to bump a number), the compiler's identity and flags, the
runtime header the code is compiled against, and the symbol prefix. Memory layout is runtime data (berm_ctx),
never baked into the code.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import berm_aot
from berm_aot import cc
from berm_aot.cache import CodeCache, cache_key
from berm_aot.emit import ABI_UNIT, TRANSLATOR_VERSION, emit_program
from berm_aot.image import ElfImage
from berm_aot.program import Program

RUNTIME_DIR = Path(__file__).resolve().parent
HEADER = RUNTIME_DIR / "berm_rt.h"
ENTRY_SYMBOL = "berm_enter"


def source_digest(root: Path) -> str:
    """SHA-256 over the translator version, every module of the translator package at ``root`` (decoder, program
    model, analysis, emitter and the rest: a listed subset once missed modules added later, and editing those left
    stale objects in the cache) and the runtime header."""
    h = hashlib.sha256(TRANSLATOR_VERSION.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    h.update(HEADER.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def translator_digest() -> str:
    """``source_digest`` of the installed translator (berm_aot)."""
    return source_digest(Path(berm_aot.__file__).resolve().parent)


def object_key(image: ElfImage, prefix: str = "") -> str:
    return cache_key("berm-aot", image.sha256, translator_digest(), cc.identity(), prefix)


def compile_programs(programs: list[tuple[Program, str]], out: Path, *, jobs: int = 2) -> None:
    """Emit every (program, prefix) and compile them all into the one shared object ``out``."""
    sources = [ABI_UNIT]
    for program, prefix in programs:
        sources += emit_program(program, prefix=prefix)
    cc.compile_shared(sources, out, include_dirs=(RUNTIME_DIR,), jobs=jobs)


def cached_object(image: ElfImage, cache: CodeCache, program: Callable[[], Program], *,
                  jobs: int = 2) -> tuple[Path, bool]:
    """``(path, compiled)``: the image's object from the cache, compiling ``program()`` on a miss (a hit needs
    no program model at all: that is what keeps a cached load cheap)."""
    return cache.get_or_build(object_key(image), lambda out: compile_programs([(program(), "")], out, jobs=jobs))
