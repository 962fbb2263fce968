"""Errors of building a harness. ``BuildError`` messages name the file (and the line when known)."""

from berm_abi.errors import BermError


class BuildError(BermError):
    """A harness directory could not be built: bad harness.toml, a missing tool function, or a built image
    that fails its own checks."""
