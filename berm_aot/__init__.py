"""Ahead-of-time translation of RV64IMAC harness images: ELF reading, decoding, analysis, C emission, compiling
and the content-addressed code cache. Knows nothing of capabilities, agents or the protocol."""

from __future__ import annotations

import hashlib
from pathlib import Path

import berm_abi


def sources_digest(*packages: Path) -> str:
    """SHA-256 over every module of ``packages`` (names relative to each package, and bytes)."""
    h = hashlib.sha256()
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            h.update(f"{package.name}/{path.relative_to(package)}".encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


#: The translator's sources (this package and berm_abi, whose host-call numbers translated code inlines), read as
#: this package is first imported, before any of its modules runs. Read at the first compile instead, a process
#: started before an upgrade landed on disk (a daemon imports the decoder at start and the emitter at its first
#: load) filed what its old code emitted under the new translator's key, and every process after the upgrade
#: loaded that stale object (a security fix to the emitter would not have applied to it). Read this early, the
#: digest is never newer than the code that runs; berm_abi, imported before this package, changes no emitted code
#: without an ABI change.
SOURCES_DIGEST = sources_digest(Path(__file__).resolve().parent, Path(berm_abi.__file__).resolve().parent)
