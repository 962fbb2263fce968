"""The committed Rust images are what their source builds: harnesses/rust-probe's build.sh, run on a copy of the
crate and the SDK's Rust crate with Debian's Rust (setup.sh installs it as root), must give its three images byte
for byte. rustc's output depends on its version, so this holds only for the one the images were built with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CRATE = Path(__file__).resolve().parent.parent / "harnesses" / "rust-probe"
IMAGES = ("rust-probe.elf", "rust-keywords.elf", "rust-sdk.elf")
RUSTC = "rustc 1.96.0 "  # what built the committed images (build.sh names its core sources' directory too)


def _rustc_version() -> str:
    try:
        return subprocess.run(["/usr/bin/rustc", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"no /usr/bin/rustc ({exc})"


def test_build_sh_rebuilds_the_committed_images(tmp_path):
    version = _rustc_version()
    if not version.startswith(RUSTC) or shutil.which("ld.lld-22") is None:
        pytest.skip(f"the committed images were built by {RUSTC.strip()} with ld.lld-22; here: {version.strip()}, "
                    f"ld.lld-22 {'found' if shutil.which('ld.lld-22') else 'missing'} (setup.sh installs both as root)")
    # the crate, in a copy of its workspace (harnesses/Cargo.toml): the SDK's Rust crate and linker script beside it
    crate = tmp_path / "rust-probe"
    shutil.copytree(CRATE, crate, ignore=shutil.ignore_patterns("target", "*.elf"))
    shutil.copytree(CRATE.parent / "sdk", tmp_path / "sdk")
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy(CRATE.parent / name, tmp_path / name)
    built = subprocess.run(["sh", str(crate / "build.sh")], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    for name in IMAGES:
        assert (crate / name).read_bytes() == (CRATE / name).read_bytes(), f"{name} differs from its source's build"
