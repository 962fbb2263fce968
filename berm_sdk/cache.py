"""Where built guest code is kept: SDK objects, the compiler runtime, bundled harness images."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import platformdirs


def _harnesses_root() -> Path:
    """harnesses/: the SDK and the bundled harnesses' sources. An installed wheel carries a copy inside this package
    (setup.py's build_py puts it there); a source tree (the editable install, the tests) has it beside the package."""
    installed = Path(__file__).resolve().parent / "harnesses"
    return installed if (installed / "sdk").is_dir() else Path(__file__).resolve().parent.parent / "harnesses"


#: harnesses/sdk: berm.h, the SDK's C sources, the compiler-runtime overrides, the linker script, the build profile.
SDK_DIR = _harnesses_root() / "sdk"


def cache_root() -> Path:
    """``$BERM_SDK_CACHE``, else the user cache directory."""
    return Path(os.environ.get("BERM_SDK_CACHE") or platformdirs.user_cache_dir("berm"))


def cached_dir(cached: Path, fill: Callable[[Path], None]) -> Path:
    """The cache directory ``cached``, made by ``fill(staging)`` into a fresh directory beside it and renamed into
    place (atomic: a directory in the cache is always complete) unless it is there already. When several processes
    build at once, the first rename wins and the others' staging is dropped."""
    if cached.is_dir():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cached.parent))
    try:
        fill(staging)
        try:
            os.replace(staging, cached)
        except OSError:
            if not cached.is_dir():  # not another build that got there first: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cached
