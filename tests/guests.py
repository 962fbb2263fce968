"""Build small guest programs for tests, cached by content so a test run compiles each snippet once.

``guest_elf(c_source)`` compiles C text for RV64IMAC and returns the ELF bytes. The cache lives under
``$BERM_TEST_CACHE`` or ``.pytest_cache/berm-guests`` and is keyed by the source, the build options, the
toolchain command and ``berm_sdk.toolchain.GUEST_CFLAGS``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from berm_sdk.toolchain import GUEST_CFLAGS, build_program, guest_toolchain

_ROOT = Path(__file__).resolve().parent.parent


def _cache_dir() -> Path:
    d = Path(os.environ.get("BERM_TEST_CACHE", _ROOT / ".pytest_cache" / "berm-guests"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def guest_elf(source: str, *, opt: str = "-O2", suffix: str = ".c", entry: str = "_start",
              keep: tuple[str, ...] = ()) -> bytes:
    """The ELF bytes of ``source`` (C, or assembly with ``suffix=".S"``) built as a static RV64IMAC program.

    The program needs an entry symbol (``_start`` by default); ``keep`` lists further symbols to keep alive.
    """
    tc = guest_toolchain()
    parts = [source, opt, suffix, entry, *keep, *tc.cc, *tc.ld, *GUEST_CFLAGS]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    out = _cache_dir() / f"{key}.elf"
    if not out.exists():
        work = _cache_dir() / f"{key}.work{os.getpid()}"
        work.mkdir(exist_ok=True)
        src = work / f"prog{suffix}"
        src.write_text(source)
        tmp = build_program([src], work / "prog.elf", opt=opt, entry=entry, keep=keep)
        os.replace(tmp, out)
    return out.read_bytes()
