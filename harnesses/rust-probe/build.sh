#!/bin/sh
# Rebuild rust-probe.elf and rust-keywords.elf from source (both are committed beside this file, so running the
# harnesses needs no Rust toolchain; tests/test_rust_build.py rebuilds them where one is installed and compares).
# Needs Debian's rustc-web, cargo-web, rust-web-src and lld-22 (apt-get install -y rustc-web cargo-web
# rust-web-src lld-22): /usr/bin/rustc 1.96 builds core and alloc from /usr/src/rustc-1.96.0 offline.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc \
RUSTFLAGS="-C linker=ld.lld-22 -C relocation-model=static -C code-model=medium -C link-arg=--emit-relocs -C link-arg=-T$here/../sdk/berm.ld" \
    /usr/bin/cargo build --offline --release -Zbuild-std=core,alloc --target riscv64imac-unknown-none-elf \
    --config 'source.crates-io.replace-with="std-vendor"' \
    --config 'source.std-vendor.directory="/usr/src/rustc-1.96.0/library/vendor"'
for image in rust-probe rust-keywords rust-sdk; do
    cp "../target/riscv64imac-unknown-none-elf/release/$image" "$image.elf"
    echo "built $here/$image.elf"
done
