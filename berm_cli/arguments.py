"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
from pathlib import Path


def path(text: str) -> Path:
    """A path argument that is not empty: ``Path("")`` is the current directory, and ``--cache-dir ""`` (an unset
    variable in a script) filled it with cache entries (found by a review)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path would be the current directory: name one, or leave the "
                                         "option out")
    return Path(text)
