#!/usr/bin/env bash
# One command to install everything Berm needs, development tools included, on a fresh Debian 12 machine:
#   ./setup.sh
# It installs into the Python on PATH, unless that is one pip may not install into (Debian's own python3 is
# "externally managed", PEP 668): then into a virtual environment it makes in .venv, to activate with
# `. .venv/bin/activate`. The guest toolchain (clang/lld for riscv64) comes from PyPI's ziglang, so no root is needed
# for it. Root is used only to apt-install what is missing: Debian's python3-venv and python3-dev (the headers the
# runtime's C extensions compile against), llvm (llvm-objdump, which the disassembler tests compare against),
# qemu-user (qemu-riscv64, a peer the benchmark compares against) and Debian's Rust (rustc-web, cargo-web,
# rust-web-src, lld-22: a test rebuilds the committed Rust images from their source and compares).
set -euo pipefail
cd "$(dirname "$0")"

missing=()
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || missing+=(python3-dev)
managed=0
python3 -c 'import sysconfig, os, sys
sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(sysconfig.get_path("stdlib") + "/EXTERNALLY-MANAGED")))' \
    && managed=1
venv_works() { [ -x .venv/bin/python3 ] && .venv/bin/python3 -m pip --version >/dev/null 2>&1; }
if [ "$managed" = 1 ] && ! venv_works; then
    python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
fi
command -v llvm-objdump >/dev/null 2>&1 || missing+=(llvm)
command -v qemu-riscv64 >/dev/null 2>&1 || missing+=(qemu-user)
rust=(rustc-web cargo-web rust-web-src lld-22)  # Debian's Rust, which rebuilds harnesses/rust-probe's images
[ -x /usr/bin/rustc ] && [ -x /usr/bin/cargo ] && compgen -G '/usr/src/rustc-*/library/vendor' >/dev/null \
    && command -v ld.lld-22 >/dev/null 2>&1 || missing+=("${rust[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "setup.sh: missing Debian packages ${missing[*]}: run 'sudo apt-get install ${missing[*]}' first" >&2
        for package in "${missing[@]}"; do  # these serve only some tests and the benchmark
            case "$package" in llvm | qemu-user | rustc-web | cargo-web | rust-web-src | lld-22) ;; *) exit 1 ;; esac
        done
    fi
fi

python=python3
if [ "$managed" = 1 ]; then
    venv_works || python3 -m venv --clear .venv  # (again, if a first try stopped halfway)
    python=.venv/bin/python3
fi
"$python" -m pip install --quiet -e '.[dev]'
if [ "$managed" = 1 ]; then
    echo "Berm is installed in .venv: run '. .venv/bin/activate', then try 'berm --help'"
else
    echo "Berm is installed: try 'berm --help'"
fi
