"""Errors of reading, decoding and translating an image. All derive from ``berm_abi.errors.BermError``."""

import contextlib
import os
from collections.abc import Iterator

from berm_abi.errors import BermError


class ElfError(BermError):
    """The file is not an ELF this host can run: unreadable, malformed, wrong class, machine, type or ABI."""


class ManifestError(BermError):
    """The ``.berm.abi`` manifest is missing, malformed, or disagrees with the image (ABI.md §4)."""


class NoManifestError(ManifestError):
    """The image has no ``.berm.abi`` section."""


class ManifestEncodingError(ManifestError):
    """The manifest bytes are not UTF-8."""


class ManifestJsonError(ManifestError):
    """The manifest is not valid JSON, or not the schema of ABI.md §4."""


class AbiVersionError(ManifestError):
    """The manifest names an ABI version this host does not speak."""


class MissingExportError(ManifestError):
    """A tool the manifest declares is not exported as ``berm_tool_<name>``, or no tool is exported at all."""


class DecodeError(BermError):
    """Code reachable in the image cannot run here: F/D, CSR or privileged instructions, or undecodable bytes."""


class CompileError(BermError):
    """The C compiler failed on emitted code, or the cache could not be written."""


@contextlib.contextmanager
def about_file(path: str | os.PathLike) -> Iterator[None]:
    """What is wrong with the image in the file ``path``, or with its compile (an ElfError, ManifestError,
    DecodeError or CompileError), said with the file's name first, whichever command reads it (found by a review:
    ``berm inspect`` and ``berm run`` said "not an ELF file (bad magic)" where ``berm call`` named the file)."""
    try:
        yield
    except (ElfError, ManifestError, DecodeError, CompileError) as exc:
        raise type(exc)(f"{os.fspath(path)}: {exc}") from None
