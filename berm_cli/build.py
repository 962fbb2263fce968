"""``berm build DIR [-o OUT.elf] [--bin NAME]``: build a harness directory into a checked harness ELF: C sources with
a harness.toml (berm_sdk.build), or a Rust crate, a Cargo.toml (berm_sdk.rust_build)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from berm_cli import arguments
from berm_cli.terminal import shown
from berm_sdk.build import build_harness
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import TOML_NAME
from berm_sdk.rust_build import build_rust_harness


def _image_file(text: str) -> Path:
    """-o's argument, a file: Path drops a trailing slash, and -o newdir/ wrote a file named newdir (found by a
    review)."""
    if text.endswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r} names a directory: name the image file (e.g. {text}NAME.elf)")
    return Path(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=arguments.path,
                        help="the harness directory: harness.toml and C sources, or a Rust crate (Cargo.toml)")
    parser.add_argument("-o", "--output", type=_image_file, default=None,
                        help="the ELF to write (default ./{name}.elf: the harness's name, or the Rust binary's)")
    parser.add_argument("--bin", default=None, help="the Rust binary to build, when the crate has several")


def run(args: argparse.Namespace) -> int:
    def warn(text: str) -> None:
        print(shown(text), file=sys.stderr)

    # lexists: a harness.toml that is a dangling link or a FIFO was "neither harness.toml nor Cargo.toml" (a review);
    # building says what is wrong with it
    if os.path.lexists(args.directory / TOML_NAME):
        if args.bin is not None:
            raise BuildError(f"{args.directory}: --bin names a Rust binary, and this is a C harness ({TOML_NAME})")
        out = build_harness(args.directory, args.output, warn=warn)
    elif (args.directory / "Cargo.toml").is_file():
        out = build_rust_harness(args.directory, args.output, binary=args.bin, warn=warn)
    elif not args.directory.is_dir():
        what = "not a directory" if args.directory.exists() else "no such directory"
        raise BuildError(f"{args.directory}: {what} (berm build takes a harness's source directory)")
    else:
        raise BuildError(f"{args.directory}: neither {TOML_NAME} (a C harness) nor Cargo.toml (a Rust crate)")
    print(shown(os.fspath(out)))  # a name that is not UTF-8 shown escaped, not a UnicodeEncodeError after the build
    return 0
