"""Declarations: what an agent grants each harness it declares (ABI.md §8, TOML ``[[harnesses]]`` entries).

A declaration grants; a manifest only requests. Nothing here reads a manifest, and nothing turns a request into
a grant. Each entry names its image file, ``{HARNESSES_DIR}/{name}.elf``; when it pins a ``sha256`` the file is
verified on every load and refused on a mismatch. ``source`` says where the installer (crabup) fetches the image
from; the host only records it: it never downloads code (RFC 0205, "The daemon does not download code").
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from berm_abi.errors import BermError
from berm_aot.elf import file_limit, read_file
from berm_aot.errors import ElfError
from berm_aot.regular_file import FileRefused, read_regular

from .capabilities.exec import check_environment
from .capabilities.http import HostList, HostListError
from .linker import CapabilityError
from .layout import DEFAULT_MEMORY, check_memory_size


class DeclarationError(BermError):
    """A declaration is malformed: an unknown key, a wrong type or value (the entry and key are named)."""


class ImageNotFound(DeclarationError):
    """The declared harness's image file does not exist."""


class ImageDigestMismatch(DeclarationError):
    """The image file's SHA-256 is not the one the declaration pins: the image is refused."""


NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1-64 of [A-Za-z0-9_.-], not starting with . or -"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MEMORY = re.compile(r"([0-9]{1,12})\s*([KMG]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_TIMEOUT = 24 * 3600.0
MAX_DECLARATIONS_BYTES = 4 << 20


def harnesses_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Where harness images live: ``override``, else ``$BERM_HARNESSES_DIR``, else the user config dir's
    ``harnesses`` (``platformdirs.user_config_dir("berm")/harnesses``)."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("BERM_HARNESSES_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_config_dir("berm")) / "harnesses"


def parse_memory(value: int | str, what: str = "memory") -> int:
    """A guest memory size from ``65536``, ``"64K"``, ``"64M"``, ``"1G"`` (binary units; ``MiB`` also read):
    a power of two between 64 KiB and 4 GiB (ABI.md §5)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DeclarationError(f"{what} must be a size like \"64M\", not {type(value).__name__}")
    if isinstance(value, int):
        size = value
    else:
        m = _MEMORY.fullmatch(value.strip())
        if not m:
            raise DeclarationError(f"{what} must be a size like \"64M\", not {value!r}")
        size = int(m[1]) * _UNITS[m[2].upper()]
    try:
        return check_memory_size(size)
    except ValueError as exc:
        raise DeclarationError(f"{what}: {exc}") from None


@dataclass(frozen=True)
class Declaration:
    """One harness as an agent declares it. ``capabilities`` are the grant names; ``root`` bounds fs and exec,
    ``hosts`` bounds http; ``env`` is added to every command exec runs; ``timeout`` (seconds) and ``memory``
    (bytes) override the engine's defaults for this harness (under ``berm serve`` the timeout cannot pass the
    queue's own deadline, ``--timeout``: whichever is sooner ends a run)."""

    name: str
    source: str = "builtin"
    sha256: str | None = None
    capabilities: tuple[str, ...] = ()
    root: str | None = None
    hosts: tuple[str, ...] = ()
    timeout: float | None = None
    memory: int | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        """A Declaration made in code meets the rules a declarations file's entry does (``declaration_from_table``
        checks only the TOML's types): found by reviews, one made in code with a relative root was taken from the
        current directory (a process started in / granted the whole file system), and one named ``../x`` read an
        image outside the harnesses directory. A DeclarationError names the field."""
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise DeclarationError(f"harness name {self.name!r:.80} must be {NAME_RULE}")
        if not isinstance(self.source, str):
            raise DeclarationError(f"source must be a string, not {type(self.source).__name__}")
        if self.sha256 is not None and not (isinstance(self.sha256, str) and _SHA256.fullmatch(self.sha256)):
            raise DeclarationError(f"sha256 must be 64 hex digits (lowercase), not {self.sha256!r:.80}")
        _names(self.capabilities, "capabilities")
        if self.root is not None:
            if not isinstance(self.root, str):
                raise DeclarationError(f"root must be a string, not {type(self.root).__name__}")
            if "\0" in self.root:  # no path holds one (os calls raise ValueError on it)
                raise DeclarationError("root must not contain a NUL character")
            if not os.path.isabs(os.path.expanduser(self.root)):
                raise DeclarationError(f"root must be an absolute path, not {self.root!r}")
        _names(self.hosts, "hosts")
        try:
            HostList(self.hosts)
        except HostListError as exc:
            raise DeclarationError(f"hosts: {exc}") from None
        if self.timeout is not None and not is_timeout(self.timeout):
            raise DeclarationError(f"timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], not {self.timeout!r}")
        if self.memory is not None:
            if isinstance(self.memory, bool) or not isinstance(self.memory, int):
                raise DeclarationError(f"memory must be a number of bytes, not {self.memory!r:.80}")
            parse_memory(self.memory)
        _check_env(self.env)

    @property
    def memory_size(self) -> int:
        """The guest memory the harness runs with: its declared ``memory``, else the default."""
        return self.memory or DEFAULT_MEMORY

    def image_path(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """``{name}.elf`` in the harnesses directory (the name is one of ``NAME``'s: never a path)."""
        return harnesses_dir(directory) / f"{self.name}.elf"

    def load_image(self, directory: str | os.PathLike[str] | None = None) -> bytes:
        """The image's bytes, verified against ``sha256`` when the declaration pins one."""
        path = self.image_path(directory)
        try:
            # bounded by the memory it runs with: a FIFO, a device or a file larger than that is refused, not read
            data = read_file(path, file_limit(self.memory_size))
        except ElfError as exc:
            # how one gets there: the README's example named no way (found by a review)
            reason = (f"no image at {path} (put one there: berm build DIR -o {shlex.quote(str(path))})"
                      if _absent(path) else str(exc))
            raise ImageNotFound(f"harness {self.name!r}: {reason}") from None
        if self.sha256 is not None:
            actual = hashlib.sha256(data).hexdigest()
            if actual != self.sha256:
                raise ImageDigestMismatch(f"harness {self.name!r}: refusing {path}: its sha256 is {actual}, "
                                          f"the declaration pins {self.sha256}")
        return data


def _absent(path: Path) -> bool:
    """Whether nothing is at ``path``: not a directory that may not be searched (os.path.lexists says False for that
    too, and an image behind one was said to be missing: found by a review)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _string(entry: dict, key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise DeclarationError(f"{where}: {key} must be a string, not {type(value).__name__}")
    return value


def _strings(entry: dict, key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DeclarationError(f"{where}: {key} must be a list of strings")
    return tuple(value)  # the same entry twice: the Declaration refuses it


def is_timeout(value: object) -> bool:
    """Whether ``value`` is a deadline in seconds a harness may be given: a number in (0, ``MAX_TIMEOUT``]."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= MAX_TIMEOUT


def _names(value: object, field: str) -> None:
    """``value`` is a tuple of distinct strings (a bare string is not: ``"fs"`` is not the grants f and s)."""
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise DeclarationError(f"{field} must be a tuple of strings, not {value!r:.80}")
    if len(set(value)) != len(value):
        raise DeclarationError(f"{field} lists the same entry twice")


def _env(entry: dict, where: str) -> tuple[tuple[str, str], ...]:
    """The table ``env`` as the sorted (name, value) pairs a Declaration holds."""
    value = entry.get("env", {})
    if not isinstance(value, dict):
        raise DeclarationError(f"{where}: env must be a table of strings")
    return tuple(sorted(value.items()))


def _check_env(env: object) -> None:
    """The environment exec adds to every command: variable names, and sizes checked here as exec checks them (a
    value over exec's limit passed here, and stopped the daemon's start with an error naming no harness: found by a
    review)."""
    if not isinstance(env, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in env):
        raise DeclarationError(f"env must be a tuple of (name, value) pairs, not {env!r:.80}")
    for k, v in env:
        if not isinstance(k, str) or not isinstance(v, str) or not _ENV_NAME.fullmatch(k) or "\0" in v:
            raise DeclarationError(f"env {k!r} must be a string (and its name a plain variable name)")
    if len({k for k, _ in env}) != len(env):
        raise DeclarationError("env names the same variable twice")
    try:
        check_environment(dict(env))
    except CapabilityError as exc:
        raise DeclarationError(f"env: {exc}") from None


_KEYS = frozenset({"name", "source", "sha256", "capabilities", "root", "hosts", "timeout", "memory", "env"})


def declaration_from_table(entry: Any, where: str = "harness") -> Declaration:
    """One ``[[harnesses]]`` table as a Declaration; errors name ``where`` (e.g. ``harnesses[2] "os"``). The TOML's
    types are checked here, the values by the Declaration itself."""
    if not isinstance(entry, dict):
        raise DeclarationError(f"{where}: must be a table")
    name = _string(entry, "name", where)
    if name is None:
        raise DeclarationError(f"{where}: name is required")
    where = f"{where} {name!r}" if NAME.fullmatch(name) else where  # a bad one is named once, by the Declaration
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise DeclarationError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    sha = _string(entry, "sha256", where)
    timeout = entry.get("timeout")
    fields = dict(
        name=name,
        source=_string(entry, "source", where) or "builtin",
        sha256=sha.lower() if sha is not None else None,  # "" pins nothing: refused, not taken as no pin
        capabilities=_strings(entry, "capabilities", where),
        root=_string(entry, "root", where),
        hosts=_strings(entry, "hosts", where),
        timeout=float(timeout) if is_timeout(timeout) else timeout,  # anything else: the Declaration says what
        memory=parse_memory(entry["memory"], f"{where}: memory") if "memory" in entry else None,
        env=_env(entry, where),
    )
    try:
        return Declaration(**fields)
    except DeclarationError as exc:
        raise DeclarationError(f"{where}: {exc}") from None


def parse_declarations(text: str, origin: str = "declaration") -> list[Declaration]:
    """Every ``[[harnesses]]`` entry of a TOML document (other top-level keys belong to the agent and are left
    alone). Harness names must be unique within the document."""
    try:
        doc = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer past int()'s 4,300 digits (found by a review)
        raise DeclarationError(f"{origin}: not valid TOML: {exc}") from None
    except RecursionError:
        raise DeclarationError(f"{origin}: not valid TOML: nested too deeply") from None
    entries = doc.get("harnesses", [])
    if not isinstance(entries, list):
        raise DeclarationError(f"{origin}: harnesses must be an array of tables ([[harnesses]])")
    out: list[Declaration] = []
    for i, entry in enumerate(entries):
        decl = declaration_from_table(entry, f"{origin}: harnesses[{i}]")
        if any(d.name == decl.name for d in out):
            raise DeclarationError(f"{origin}: harness {decl.name!r} is declared twice")
        out.append(decl)
    return out


def load_declarations(path: str | os.PathLike[str]) -> list[Declaration]:
    """The declarations of the file ``path``: a regular file of at most ``MAX_DECLARATIONS_BYTES`` (a FIFO kept
    ``berm serve`` and ``berm-compile`` waiting for ever: found by a review)."""
    path = Path(path)
    try:
        text = read_regular(path, MAX_DECLARATIONS_BYTES).decode("utf-8")
    except FileRefused as exc:
        most = f" (at most {MAX_DECLARATIONS_BYTES >> 20} MiB)" if exc.oversized else ""
        raise DeclarationError(f"cannot read {path}: it {exc}{most}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_declarations(text, str(path))
