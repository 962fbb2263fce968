"""The harnesses that ship with Berm (``harnesses/<name>/``), built on first use and cached afterwards.

``bundled_image("os")`` returns the path of a built ``os.elf``, building it only when no image exists for the
current sources: the key is a digest of the harness directory, the SDK and the guest toolchain, so editing any
of them builds afresh and nothing stale is ever served.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import platformdirs

from .build import SDK_DIR, build_harness
from .errors import BuildError
from .harness_toml import TOML_NAME
from .toolchain import guest_toolchain

#: harnesses/: one directory per bundled harness (sdk/ is the SDK, not a harness).
HARNESSES_DIR = SDK_DIR.parent


def bundled_names() -> list[str]:
    return sorted(d.name for d in HARNESSES_DIR.iterdir() if (d / TOML_NAME).is_file())


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in (".c", ".h", ".toml", ".ld"))


def _digest(harness: Path) -> str:
    digest = hashlib.sha256("\0".join(guest_toolchain().cc).encode())
    for root in (SDK_DIR, harness):
        for path in _files(root):
            digest.update(f"\0{path.relative_to(root)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:20]


def _cache_dir() -> Path:
    return Path(os.environ.get("BERM_SDK_CACHE") or platformdirs.user_cache_dir("berm")) / "harnesses"


def bundled_image(name: str) -> Path:
    """The built image of bundled harness ``name``; a BuildError lists the bundled names when it is not one."""
    if name not in bundled_names():
        raise BuildError(f"no bundled harness {name!r} (bundled: {', '.join(bundled_names())})")
    harness = HARNESSES_DIR / name
    out = _cache_dir() / f"{name}-{_digest(harness)}.elf"
    if not out.is_file():
        build_harness(harness, out)  # writes atomically: concurrent first uses each build, one rename wins
    return out
