"""Translated code as shared objects: emit C for a program, compile it, and keep it in the code cache.

The cache key covers every input of the object: the ELF bytes (their SHA-256), the translator version and the
source of every module that shapes the emitted code (decoder, program model, analysis, emitter, and berm_abi,
whose host-call numbers the code inlines: editing one invalidates the cache without anyone remembering to bump a
number), the compiler's identity and flags, the runtime headers the code is compiled against, the memory layout it
is specialised to (its bounds windows, from the image and the memory size: berm_aot/windows.py) and the symbol
prefix. The object carries its key, which the runtime checks when it loads it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path

import berm_aot
from berm_aot import cc
from berm_aot.cache import CodeCache, cache_key
from berm_aot.errors import CompileError
from berm_aot.emit import ABI_UNIT, TRANSLATOR_VERSION, emit_units
from berm_aot.windows import Windows
from berm_aot.image import ElfImage
from berm_aot.program import Program

RUNTIME_DIR = Path(__file__).resolve().parent
HEADERS = (RUNTIME_DIR / "berm_rt.h", RUNTIME_DIR / "berm_code.h")
#: The headers as this process imported them: what the key covers (``TRANSLATOR_DIGEST``), and what the compiler
#: is given (written into its directory). Read from disk again at each compile, a header changed in between (an
#: upgrade landing under a running daemon) was compiled into an object filed under the old one's key (found by a
#: review).
HEADER_BYTES = {header.name: header.read_bytes() for header in HEADERS}
#: The exports of a program's code, after its prefix: the entry point, the layout it is specialised to, and its
#: functions by name (berm_aot.locator).
ENTRY_SYMBOL = "berm_enter"
LAYOUT_SYMBOL = "berm_layout"
LOCATOR_SYMBOL = "berm_locator"


def source_digest(sources: str) -> str:
    """SHA-256 over the translator version, the digest of its sources (``berm_aot.sources_digest``) and the runtime
    headers the code is compiled against (``HEADER_BYTES``)."""
    h = hashlib.sha256(TRANSLATOR_VERSION.encode() + sources.encode())
    for data in HEADER_BYTES.values():
        h.update(data)
    return h.hexdigest()


#: ``source_digest`` of the translator this process imported (``berm_aot.SOURCES_DIGEST``, read as it was imported).
TRANSLATOR_DIGEST = source_digest(berm_aot.SOURCES_DIGEST)


def object_key(image: ElfImage, windows: Windows, prefix: str = "", cache: CodeCache | None = None) -> str:
    """The code cache key of ``image``'s object for memory with ``windows``; ``cache`` keeps what identifies the C
    compiler across processes (``cc.identity``: the toolchain found on PATH and its version line)."""
    layout = ",".join(f"{v:#x}" for v in windows.values())
    return cache_key("berm-aot", image.sha256, TRANSLATOR_DIGEST, cc.identity(store=cache), layout, prefix)


def compile_programs(programs: list[tuple[Program, Windows, str]], out: Path, *, jobs: int = 2,
                     key: str | None = None) -> None:
    """Emit every (program, windows, prefix) and compile them all into the one shared object ``out``: each unit
    starts compiling as soon as it is emitted. ``key``: the cache key the object is for (checked at load)."""
    sources = itertools.chain([ABI_UNIT], *(emit_units(program, windows=windows, prefix=prefix)
                                            for program, windows, prefix in programs))
    cc.compile_shared(sources, out, headers=HEADER_BYTES, jobs=jobs, key=key, supervisor=_supervisor())


def _supervisor() -> Path:
    """berm-supervise, which exec's commands run under too: the compilers die with the host."""
    from berm_host.capabilities.exec import SUPERVISOR, SUPERVISOR_MISSING

    if not os.access(SUPERVISOR, os.X_OK):
        raise CompileError(SUPERVISOR_MISSING)
    return SUPERVISOR


def cached_object(image: ElfImage, windows: Windows, cache: CodeCache, program: Callable[[], Program], *,
                  jobs: int = 2, key: str | None = None) -> tuple[Path, bool]:
    """``(path, compiled)``: the image's object for memory with ``windows``, from the cache, compiling
    ``program()`` on a miss (a hit needs no program model at all: that is what keeps a cached load cheap).
    ``key``: its ``object_key``, when the caller has it already (to check the object against when it loads it)."""
    key = key or object_key(image, windows, cache=cache)
    return cache.get_or_build(key, lambda out: compile_programs([(program(), windows, "")], out, jobs=jobs, key=key))
