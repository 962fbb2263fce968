#!/usr/bin/env bash
# One command to install everything Berm needs, development tools included, on a fresh Debian 12 machine:
#   ./setup.sh
# The guest toolchain (clang/lld for riscv64) comes from PyPI's ziglang, so no root is needed for it. Root is used
# only to apt-install llvm (llvm-objdump, which the disassembler tests compare against) when it is missing.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v llvm-objdump >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq llvm >/dev/null
    else
        echo "setup.sh: llvm-objdump is missing; install Debian's 'llvm' package for the disassembler tests" >&2
    fi
fi

python3 -m pip install --quiet -e '.[dev]'
echo "Berm is installed: try 'berm --help'"
