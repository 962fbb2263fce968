"""``berm build DIR [-o OUT.elf]``: build a harness directory into a checked harness ELF."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from berm_cli.terminal import shown
from berm_sdk.build import build_harness


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="the harness directory (holds harness.toml)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="the ELF to write (default ./{name}.elf)")


def run(args: argparse.Namespace) -> int:
    out = build_harness(args.directory, args.output, warn=lambda text: print(shown(text), file=sys.stderr))
    print(out)
    return 0
