"""``berm build`` for a Rust crate (a directory holding Cargo.toml, built with the Rust SDK, harnesses/sdk/rust):
cargo builds one of its binaries for ``riscv64imac-unknown-none-elf`` with the SDK's linker script, and the image is
checked the way the host will read it, as a C harness's is.

The toolchain is Debian's (``apt-get install rustc-web cargo-web rust-web-src lld-22``), called by path: it builds
``core`` and ``alloc`` offline from the sources rust-web-src installs (``-Zbuild-std``, enabled on a stable rustc by
``RUSTC_BOOTSTRAP=1``), which a rustup toolchain earlier on ``PATH`` lacks. These are the flags that built the
committed images in harnesses/rust-probe, whose build.sh calls this. Like any cargo build, it runs the crate's build
scripts and procedural macros on the host: build only crates you would build anyway.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from .build import check_image, check_output, install_image
from .cache import SDK_DIR, cache_root
from .errors import BuildError

RUSTC = Path("/usr/bin/rustc")
CARGO = Path("/usr/bin/cargo")
LINKER = "ld.lld-22"
TARGET = "riscv64imac-unknown-none-elf"
PACKAGES = "rustc-web cargo-web rust-web-src lld-22"
#: Where rust-web-src puts the standard library's vendored dependencies, by rustc version.
VENDOR = "/usr/src/rustc-{version}/library/vendor"
#: The lines of cargo's own output (not the compiler's) kept in an error.
_TAIL = 40


def _vendored_sources() -> Path:
    """The vendored sources -Zbuild-std reads for the installed rustc, or a BuildError saying what to install."""
    missing = [str(p) for p in (RUSTC, CARGO) if not p.is_file()] + ([LINKER] if not shutil.which(LINKER) else [])
    if missing:
        raise BuildError(f"a Rust harness is built with Debian's Rust, and {', '.join(missing)} is missing: "
                         f"apt-get install {PACKAGES}")
    said = subprocess.run([RUSTC, "--version"], capture_output=True, text=True).stdout
    found = re.match(r"rustc (\d+\.\d+\.\d+)", said)
    if not found:
        raise BuildError(f"{RUSTC} --version said {said.strip()!r}, not a rustc version")
    vendor = Path(VENDOR.format(version=found.group(1)))
    if not vendor.is_dir():
        raise BuildError(f"{vendor} is missing: -Zbuild-std builds core and alloc from it (apt-get install "
                         f"rust-web-src, the version of {RUSTC})")
    return vendor


def cargo_command(vendor: Path, binary: str) -> tuple[list[str], dict[str, str]]:
    """The cargo command line and environment that build one of a crate's binaries.

    The flags go in ``CARGO_ENCODED_RUSTFLAGS`` (one flag per field): ``RUSTFLAGS`` is split at spaces, so an SDK
    under a path with a space broke every build, and cargo prefers an encoded value it finds in the environment (it
    sets one for build scripts, so ``berm build`` run from a host crate's build.rs lost the linker script). The
    release profile is made to keep the relocations (``strip`` would take them; lld refuses it beside
    ``--emit-relocs``) and to abort on a panic, whatever the crate's Cargo.toml says (found by a review)."""
    flags = ["-C", f"linker={LINKER}", "-C", "relocation-model=static", "-C", "code-model=medium",
             "-C", "link-arg=--emit-relocs", "-C", f"link-arg=-T{SDK_DIR / 'berm.ld'}"]
    env = {**os.environ, "RUSTC_BOOTSTRAP": "1", "RUSTC": str(RUSTC), "CARGO_ENCODED_RUSTFLAGS": "\x1f".join(flags)}
    command = [str(CARGO), "build", "--offline", "--release", "-Zbuild-std=core,alloc", "--target", TARGET,
               "--message-format=json", "--config", 'source.crates-io.replace-with="std-vendor"',
               "--config", f'source.std-vendor.directory="{vendor}"', "--config", 'profile.release.strip="none"',
               "--config", 'profile.release.panic="abort"', "--bin", binary]
    return command, env


def _target_dir(directory: Path, env: dict[str, str]) -> list[str]:
    """cargo's ``--target-dir`` for the crate in ``directory``: none (its own ``target/``, or the environment's),
    but for one of the harnesses installed inside this package (a wheel carries them) the SDK cache: a build there
    left 117 MB beside the package's files that uninstalling Berm did not remove, or, for another user, failed on
    permissions (found by a review)."""
    chosen = "CARGO_TARGET_DIR" in env or "CARGO_BUILD_TARGET_DIR" in env  # the user's own choice stands
    if chosen or Path(__file__).resolve().parent not in directory.resolve().parents:
        return []
    return ["--target-dir", str(cache_root() / "cargo-target")]


def _binaries(directory: Path) -> list[str]:
    """The names of the binaries the crate in ``directory`` declares (cargo metadata, before anything is built)."""
    said = subprocess.run([str(CARGO), "metadata", "--no-deps", "--offline", "--format-version", "1"],
                          cwd=directory, capture_output=True, text=True)
    if said.returncode != 0:
        raise BuildError(f"{directory}: cargo cannot read the crate:\n" + "\n".join(said.stderr.splitlines()[-_TAIL:]))
    manifest = (directory / "Cargo.toml").resolve()
    return sorted(target["name"] for package in json.loads(said.stdout)["packages"]
                  if Path(package["manifest_path"]).resolve() == manifest
                  for target in package["targets"] if "bin" in target["kind"])


def _images(messages: str) -> tuple[dict[str, Path], list[tuple[str, str]]]:
    """From cargo's JSON messages: the executables built, by name, and the compiler's (level, rendered text)."""
    images, said = {}, []
    for line in messages.splitlines():
        try:
            message = json.loads(line)
        except ValueError:  # a build script's own output, passed through
            continue
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            images[message["target"]["name"]] = Path(message["executable"])
        elif message.get("reason") == "compiler-message":
            said.append((message["message"].get("level", ""), message["message"].get("rendered") or ""))
    return images, said


def build_rust_harness(directory: Path, out: Path | None = None, *, binary: str | None = None,
                       warn: Callable[[str], None] | None = None) -> Path:
    """Build the crate in ``directory`` into ``out`` (default ``./{binary}.elf``); returns the path written.
    ``binary`` picks one of the crate's binaries (needed when it has several); ``warn`` receives the compiler's
    warnings."""
    directory = Path(directory)
    if not (directory / "Cargo.toml").is_file():
        raise BuildError(f"{directory}: no Cargo.toml")
    vendor = _vendored_sources()
    binaries = _binaries(directory)
    if not binaries:
        raise BuildError(f"{directory}: the crate has no binary target (src/main.rs or a [[bin]]): a harness is a "
                         "binary crate (in a workspace, name a member's directory)")
    if binary is None and len(binaries) != 1:
        raise BuildError(f"{directory}: the crate has {len(binaries)} binaries ({', '.join(binaries) or 'none'}): "
                         f"name one with --bin")
    name = binary if binary is not None else binaries[0]
    if name not in binaries:
        raise BuildError(f"{directory}: the crate has no binary {name} ({', '.join(binaries) or 'none'})")
    out = Path(out) if out is not None else Path.cwd() / f"{name}.elf"
    check_output(out, directory)
    command, env = cargo_command(vendor, name)
    command += _target_dir(directory, env)
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
    images, said = _images(done.stdout)
    if done.returncode != 0:
        errors = [text.rstrip() for level, text in said if level == "error"]
        said_text = "\n".join(errors) or "\n".join(done.stderr.splitlines()[-_TAIL:])
        if "--offline" in said_text:  # cargo's advice to retry without it (found by a review): berm build cannot
            said_text += (f"\nberm build is offline, always: a dependency must be a path dependency or a crate "
                          f"vendored with Debian's Rust sources ({vendor}); crates.io is never reached")
        raise BuildError(f"{directory}: cargo build failed (exit {done.returncode}):\n" + said_text)
    if warn is not None:
        for level, text in said:
            if level == "warning":
                warn(text.rstrip())
        for line in done.stderr.splitlines():  # cargo's own, build scripts' among them (cargo::warning=…)
            if line.startswith("warning:"):
                warn(line)
    built = images.get(name)
    if built is None:  # cargo names up-to-date artifacts too
        raise BuildError(f"{directory}: cargo said it built {name}, and named no executable for it")
    check_image(built, directory)
    install_image(built, out)
    return out
