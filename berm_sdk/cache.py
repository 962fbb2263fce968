"""Where built guest code is kept: SDK objects, the compiler runtime, bundled harness images."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """``$BERM_SDK_CACHE``, else the user cache directory."""
    return Path(os.environ.get("BERM_SDK_CACHE") or platformdirs.user_cache_dir("berm"))
