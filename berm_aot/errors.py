"""Errors of reading, decoding and translating an image. All derive from ``berm_abi.errors.BermError``."""

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
