"""Argument types shared by the subcommands' parsers."""

from __future__ import annotations

import argparse
from pathlib import Path

from berm_host.declaration import MAX_TIMEOUT, is_timeout


def path(text: str) -> Path:
    """A path argument that is not empty: ``Path("")`` is the current directory, and ``--cache-dir ""`` (an unset
    variable in a script) filled it with cache entries (found by a review)."""
    return Path(_not_empty(text, "an empty path would be the current directory: name one, or leave the option out"))


def image(text: str) -> str:
    """``berm call``'s image, a bundled harness's name or a path, not empty either (it was the one "" still taken as
    the current directory: found by a review)."""
    return _not_empty(text, "an empty name: name a bundled harness or the path of a harness image")


def seconds(text: str) -> float:
    """A number of seconds a declaration's ``timeout`` could hold too: every command's ``--timeout`` (berm call's
    was refused as its one-entry declaration's, "command line 'name': timeout must be …": found by a review)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not is_timeout(value):
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, {MAX_TIMEOUT:g}], not {text}")
    return value


def _not_empty(text: str, why: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError(why)
    return text
