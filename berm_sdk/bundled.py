"""The harnesses that ship with Berm (``harnesses/<name>/``), built on first use and cached afterwards.

``bundled_image("os")`` returns the path of a built ``os.elf``, building it only when no image exists for the
current sources: the key is a digest of the harness directory, the SDK (its C and the Python of this package,
which writes the entry code, the manifest and the link), the generated host-call header (the numbers of
berm_abi/names.py), the guest toolchain and flags and the compiler runtime (berm_sdk.runtime), so editing any of
them builds afresh.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .build import build_harness
from .cache import SDK_DIR, cache_root, cached_dir
from .errors import BuildError
from .harness_toml import TOML_NAME
from .header import calls_header
from .runtime import runtime_key
from .toolchain import GUEST_CFLAGS, guest_toolchain

#: harnesses/: one directory per bundled harness (sdk/ is the SDK, not a harness).
HARNESSES_DIR = SDK_DIR.parent
#: This package's Python, which turns a harness directory into an image: part of the key (an upgrade of Berm that
#: changed the entry code it writes kept serving the image built before it: found by a review).
PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_names() -> list[str]:
    return sorted(d.name for d in HARNESSES_DIR.iterdir() if (d / TOML_NAME).is_file())


def _files(directory: Path, suffixes: tuple[str, ...] = (".c", ".h", ".toml", ".ld")) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in suffixes)


def _digest(harness: Path) -> str:
    # The generated host-call header and the fixed guest flags go into every object, like the files below; the
    # compiler runtime into every image.
    tc = guest_toolchain()
    parts = [*tc.cc, tc.identity(), *GUEST_CFLAGS, calls_header(), runtime_key()]
    digest = hashlib.sha256("\0".join(parts).encode())
    for root, paths in ((SDK_DIR, _files(SDK_DIR)), (harness, _files(harness)), (PACKAGE_DIR, key_sources())):
        for path in paths:
            digest.update(f"\0{path.relative_to(root)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:20]


def key_sources() -> list[Path]:
    """The Python files of this package, which the key covers."""
    return _files(PACKAGE_DIR, (".py",))


def _cache_dir() -> Path:
    return cache_root() / "harnesses"


def bundled_image(name: str) -> Path:
    """The built image of bundled harness ``name``; a BuildError lists the bundled names when it is not one."""
    if name not in bundled_names():
        raise BuildError(f"no bundled harness {name!r} (bundled: {', '.join(bundled_names())})")
    harness = HARNESSES_DIR / name
    built = cached_dir(_cache_dir() / f"{name}-{_digest(harness)}", lambda staging: build_harness(
        harness, staging / f"{name}.elf"))  # concurrent first uses each build, one rename wins
    return built / f"{name}.elf"
