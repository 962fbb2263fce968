#!/bin/sh
# Rebuild rust-probe.elf, rust-keywords.elf and rust-sdk.elf from source with `berm build` (berm_sdk/rust_build.py:
# Debian's Rust, apt-get install -y rustc-web cargo-web rust-web-src lld-22, and the SDK's linker script). They are
# committed beside this file, so running the harnesses needs no Rust toolchain; tests/test_rust_build.py rebuilds
# them where one is installed and compares. PYTHON: the Python with Berm installed (default python3).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
for image in rust-probe rust-keywords rust-sdk; do
    "${PYTHON:-python3}" -m berm_cli.main build "$here" --bin "$image" -o "$here/$image.elf"
done
