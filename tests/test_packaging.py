"""What a built (non-editable) berm_sdk carries: a wheel has no source tree beside it, so setup.py's build_py copies
harnesses/ (the SDK and the bundled harnesses) into it, and berm_sdk/cache.py looks there first."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def build_lib(tmp_path_factory) -> Path:
    out, egg = tmp_path_factory.mktemp("build_lib"), tmp_path_factory.mktemp("egg")
    # egg_info's output goes to a temporary directory, not into the checkout
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(egg), "build_py",
                           "--build-lib", str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_built_berm_sdk_carries_the_sdk_and_the_bundled_harnesses(build_lib):
    copied = build_lib / "berm_sdk" / "harnesses"
    for name in ("sdk/berm.h", "sdk/berm.ld", "sdk/profile.toml", "os/harness.toml", "reminders/harness.toml"):
        assert (copied / name).is_file(), name
    sources = {p.relative_to(ROOT / "harnesses") for p in (ROOT / "harnesses").rglob("*.c")}
    assert sources and sources <= {p.relative_to(copied) for p in copied.rglob("*.c")}


def test_the_installed_layout_finds_its_own_copy(build_lib):
    """berm_sdk/cache.py of the built tree, loaded from there: its SDK is the copy inside the package."""
    spec = importlib.util.spec_from_file_location("built_berm_sdk_cache", build_lib / "berm_sdk" / "cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SDK_DIR == (build_lib / "berm_sdk" / "harnesses" / "sdk").resolve()
    assert (module.SDK_DIR / "berm.h").is_file()


def test_the_source_tree_uses_harnesses_beside_the_package():
    from berm_sdk.cache import SDK_DIR

    assert SDK_DIR == ROOT / "harnesses" / "sdk"
