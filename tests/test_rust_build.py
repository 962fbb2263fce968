"""Building Rust harnesses with `berm build` (berm_sdk/rust_build.py). The committed Rust images are what their
source builds: harnesses/rust-probe's build.sh, run on a copy of the crate and the SDK's Rust crate with Debian's
Rust (setup.sh installs it as root), must give its three images byte for byte. rustc's output depends on its
version, so that holds only for the one the images were built with. README's Rust example builds and runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from berm_cli.main import main as berm_main
from berm_host.declaration import Declaration
from berm_host.engine import Engine
from berm_host.grants import linker_for

ROOT = Path(__file__).resolve().parent.parent
CRATE = ROOT / "harnesses" / "rust-probe"
IMAGES = ("rust-probe.elf", "rust-keywords.elf", "rust-sdk.elf")
RUSTC = "rustc 1.96.0 "  # what built the committed images (build.sh names its core sources' directory too)


def _rustc_version() -> str:
    try:
        return subprocess.run(["/usr/bin/rustc", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"no /usr/bin/rustc ({exc})"


@pytest.fixture
def rust():
    """Skips unless Debian's Rust is the one that built the committed images."""
    version = _rustc_version()
    if not version.startswith(RUSTC) or shutil.which("ld.lld-22") is None:
        pytest.skip(f"the committed images were built by {RUSTC.strip()} with ld.lld-22; here: {version.strip()}, "
                    f"ld.lld-22 {'found' if shutil.which('ld.lld-22') else 'missing'} (setup.sh installs both as root)")


def test_build_sh_rebuilds_the_committed_images(tmp_path, rust):
    # the crate, in a copy of its workspace (harnesses/Cargo.toml): the SDK's Rust crate and linker script beside it
    crate = tmp_path / "rust-probe"
    shutil.copytree(CRATE, crate, ignore=shutil.ignore_patterns("target", "*.elf"))
    shutil.copytree(CRATE.parent / "sdk", tmp_path / "sdk")
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy(CRATE.parent / name, tmp_path / name)
    built = subprocess.run(["sh", str(crate / "build.sh")], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHON": sys.executable})
    assert built.returncode == 0, built.stderr[-4000:]
    for name in IMAGES:
        assert (crate / name).read_bytes() == (CRATE / name).read_bytes(), f"{name} differs from its source's build"


@pytest.fixture(scope="module")
def cargo_target(tmp_path_factory):
    """One cargo target directory for the crates below: core and alloc are built once (half a minute)."""
    return tmp_path_factory.mktemp("cargo-target")


def _crate(tmp_path: Path, cargo_target: Path, monkeypatch, main_rs: str) -> Path:
    """A crate of one binary, greeter, with ``main_rs`` and a manifest declaring the tool greet."""
    monkeypatch.setenv("CARGO_TARGET_DIR", str(cargo_target))
    crate = tmp_path / "greeter"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(f"""[package]
name = "greeter"
version = "0.1.0"
edition = "2021"

[dependencies]
berm = {{ path = "{ROOT / 'harnesses' / 'sdk' / 'rust'}" }}

[profile.release]
panic = "abort"
""")
    (crate / "src" / "main.rs").write_text(main_rs)
    (crate / "src" / "manifest.json").write_text(
        '{"abi_version": 0, "tools": [{"name": "greet", "description": "", "parameters": {}}]}')
    return crate


def _readme_example() -> str:
    """The Rust code block of README.md."""
    return re.search(r"```rust\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]


def test_the_readme_rust_example_builds_and_runs(tmp_path, rust, cargo_target, monkeypatch):
    crate = _crate(tmp_path, cargo_target, monkeypatch, _readme_example())
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 0
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("hello\n")
    linker = linker_for(Declaration(name="greeter", capabilities=("fs",), root=str(root)))
    harness = Engine().load((tmp_path / "greeter.elf").read_bytes()).harness(linker, name="greeter")
    assert harness.call("greet", b'{"path": "a.txt"}') == "a.txt: 6 bytes"


@pytest.mark.parametrize(("argv", "message"), [
    (["harnesses/fixture", "--bin", "x"], "--bin names a Rust binary, and this is a C harness (harness.toml)"),
    (["harnesses/sdk"], "neither harness.toml (a C harness) nor Cargo.toml (a Rust crate)"),
    (["harnesses"], "the crate has no binary target (src/main.rs or a [[bin]]): a harness is a binary crate (in a "
                    "workspace, name a member's directory)"),  # the workspace: no package
    (["harnesses/rust-probe"], "the crate has 3 binaries (rust-keywords, rust-probe, rust-sdk): name one with --bin"),
    (["harnesses/rust-probe", "--bin", "nope"], "the crate has no binary nope (rust-keywords, rust-probe, rust-sdk)"),
])
def test_berm_build_says_what_it_cannot_build(argv, message, rust, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert berm_main(["build", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_crate_that_does_not_compile_is_a_build_error_with_rustcs_message(tmp_path, rust, cargo_target,
                                                                            monkeypatch, capsys):
    broken = "#![no_std]\n#![no_main]\nfn greet() -> u32 { \"text\" }\n"
    crate = _crate(tmp_path, cargo_target, monkeypatch, broken)
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 2
    err = capsys.readouterr().err
    assert "cargo build failed (exit 101)" in err and "error[E0308]: mismatched types" in err


def test_a_harness_installed_inside_the_package_is_built_into_the_sdk_cache(tmp_path, monkeypatch):
    """A wheel carries the bundled harnesses inside berm_sdk: cargo wrote their target/ there (117 MB that pip
    uninstall left, or a permission error for another user: found by a review). A crate elsewhere keeps its own."""
    from berm_sdk import rust_build
    from berm_sdk.cache import cache_root
    from berm_sdk.errors import BuildError

    monkeypatch.delenv("CARGO_TARGET_DIR", raising=False)
    monkeypatch.delenv("CARGO_BUILD_TARGET_DIR", raising=False)
    inside = Path(rust_build.__file__).resolve().parent / "harnesses" / "rust-probe"
    assert rust_build._target_dir(inside, dict(os.environ)) == ["--target-dir", str(cache_root() / "cargo-target")]
    assert rust_build._target_dir(inside, {"CARGO_TARGET_DIR": "/t"}) == []
    assert rust_build._target_dir(inside, {"CARGO_BUILD_TARGET_DIR": "/t"}) == []
    assert rust_build._target_dir(ROOT / "harnesses" / "rust-probe", dict(os.environ)) == []
    # and the build passes it on
    ran = []
    monkeypatch.setattr(rust_build, "_target_dir", lambda directory, env: ["--target-dir", "/chosen"])
    monkeypatch.setattr(rust_build, "_vendored_sources", lambda: Path("/v"))
    monkeypatch.setattr(rust_build, "_binaries", lambda directory: ["h"])
    monkeypatch.setattr(rust_build.subprocess, "run", lambda command, **kw: ran.append(command) or
                        subprocess.CompletedProcess(command, 101, "", "error: stopped here"))
    (tmp_path / "Cargo.toml").write_text("")
    with pytest.raises(BuildError, match="stopped here"):
        rust_build.build_rust_harness(tmp_path, tmp_path / "h.elf")
    assert ran[-1][-2:] == ["--target-dir", "/chosen"]


def test_a_crates_io_dependency_is_said_to_be_out_of_reach(tmp_path, rust, cargo_target, monkeypatch, capsys):
    """Found by a review: cargo's advice to retry without --offline was all a crates.io dependency got, and berm
    build always passes --offline."""
    crate = _crate(tmp_path, cargo_target, monkeypatch, "#![no_std]\n#![no_main]\n")
    with (crate / "Cargo.toml").open("a") as manifest:
        manifest.write('\n[dependencies.no-such-crate-anywhere]\nversion = "1"\n')
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 2
    assert "berm build is offline, always: a dependency must be a path dependency or a crate vendored with " \
           "Debian's Rust sources (/usr/src/rustc-" in capsys.readouterr().err


def test_an_image_that_fails_the_hosts_check_is_a_build_error(tmp_path, rust, cargo_target, monkeypatch, capsys):
    """A tool the manifest declares but the image does not export (not listed in harness!, so dropped)."""
    crate = _crate(tmp_path, cargo_target, monkeypatch, _readme_example())
    (crate / "src" / "manifest.json").write_text(
        '{"abi_version": 0, "tools": [{"name": "greet"}, {"name": "wave"}]}')
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 2
    assert "the built image fails its own check: the manifest declares tool 'wave'" in capsys.readouterr().err
    assert not (tmp_path / "greeter.elf").exists()


def test_an_image_is_refused_for_what_a_harness_toml_would_be(tmp_path, rust, cargo_target, monkeypatch, capsys):
    """Found by a review: a crate whose manifest.json requests capabilities = ["filesystem"], or which exports a
    berm_tool_<name> its manifest does not declare, built with exit 0, where a C harness is refused."""
    extra = ('#[no_mangle]\npub extern "C" fn berm_tool_extra() -> berm::Pair { '
             'berm::ok(alloc::string::String::new()) }\n')
    crate = _crate(tmp_path, cargo_target, monkeypatch, _readme_example().replace(
        "tools: [berm_tool_greet]", "tools: [berm_tool_greet, berm_tool_extra]") + extra)
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 2
    assert ("the built image fails its own check: it exports berm_tool_extra, which its manifest does not declare"
            in capsys.readouterr().err)
    (crate / "src" / "main.rs").write_text(_readme_example())
    (crate / "src" / "manifest.json").write_text('{"abi_version": 0, "tools": [{"name": "greet"}], '
                                                 '"requests": {"capabilities": ["filesystem"]}}')
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 2
    assert ("the built image fails its own check: requests.capabilities: unknown capability 'filesystem'"
            in capsys.readouterr().err)
    assert not (tmp_path / "greeter.elf").exists()


def test_an_output_over_the_crates_own_sources_is_refused(tmp_path, rust, cargo_target, monkeypatch, capsys):
    """Found by a review: -o crate/src/main.rs (or Cargo.toml, manifest.json) wrote the image over it."""
    crate = _crate(tmp_path, cargo_target, monkeypatch, _readme_example())
    for name in ("src/main.rs", "Cargo.toml", "src/manifest.json"):
        before = (crate / name).read_bytes()
        assert berm_main(["build", str(crate), "-o", str(crate / name)]) == 2
        assert f"{crate / name}: refusing to write the image over its own source" in capsys.readouterr().err
        assert (crate / name).read_bytes() == before


def test_a_strip_profile_an_inherited_encoded_rustflags_and_a_build_scripts_warning(tmp_path, rust, cargo_target,
                                                                                      monkeypatch, capsys):
    """Found by a review: ``strip = true`` (a common release setting) made lld refuse ``--emit-relocs``; an empty
    ``CARGO_ENCODED_RUSTFLAGS`` inherited (cargo sets one for build scripts, so any berm build run from a host
    crate's build.rs) took precedence over berm build's RUSTFLAGS, linking with no linker script; and a build
    script's ``cargo::warning`` was never shown."""
    crate = _crate(tmp_path, cargo_target, monkeypatch, _readme_example())
    (crate / "Cargo.toml").write_text((crate / "Cargo.toml").read_text() + 'strip = true\n')
    (crate / "build.rs").write_text('fn main() { println!("cargo::warning=hello from build.rs"); }\n')
    monkeypatch.setenv("CARGO_ENCODED_RUSTFLAGS", "")
    assert berm_main(["build", str(crate), "-o", str(tmp_path / "greeter.elf")]) == 0
    assert "hello from build.rs" in capsys.readouterr().err
    harness = Engine().load((tmp_path / "greeter.elf").read_bytes()).harness(name="greeter")
    assert harness.tools == ("greet",)


def test_the_flags_are_one_field_each_whatever_the_sdks_path():
    """Found by a review: RUSTFLAGS is split at spaces, so an SDK under a path with a space broke every build
    ("multiple input filenames provided")."""
    from berm_sdk import rust_build

    _, env = rust_build.cargo_command(Path("/v"), "greeter")
    flags = env["CARGO_ENCODED_RUSTFLAGS"].split("\x1f")
    assert f"link-arg=-T{rust_build.SDK_DIR / 'berm.ld'}" in flags and "link-arg=--emit-relocs" in flags


def test_the_rust_sdk_serves_host_calls_natively_for_cargo_test(tmp_path, rust):
    """Built for the host, the SDK serves the host calls itself (berm::testing::Host): rust-sdk's own tests call its
    tools natively with stand-in capabilities."""
    done = subprocess.run(["/usr/bin/cargo", "test", "--offline", "--locked", "--bin", "rust-sdk"], cwd=CRATE,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RUSTC": "/usr/bin/rustc", "CARGO_TARGET_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"test result: ok\. [1-9]\d* passed; 0 failed", done.stdout), done.stdout[-3000:]
