#!/bin/sh
# Rebuild rust-probe.elf from source, so CI never needs a Rust toolchain (the ELF is committed beside this file).
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
cp target/riscv64imac-unknown-none-elf/release/rust-probe rust-probe.elf
echo "built $here/rust-probe.elf"
