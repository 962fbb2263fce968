"""The content-addressed code cache: one directory per key holding ``image.so`` and ``image.so.sha256``.

- The key is a SHA-256 over everything that changes the object (``cache_key``); nothing else names an entry.
- An entry appears atomically: it is built in a temporary directory beside it and renamed into place, so a
  reader sees a whole entry or none. Builders of the same key in several processes serialise on a lock file
  (``fcntl.flock``), so the second finds the first's entry instead of compiling again.
- Before an object is used its SHA-256 is checked against the recorded one; a corrupt or truncated entry is moved
  aside and rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from berm_aot.errors import CompileError

SO_NAME = "image.so"
#: Objects up to this size are hashed from one read; larger ones stream (hashlib.file_digest).
_WHOLE_READ = 64 << 20


def default_cache_dir() -> Path:
    """``$BERM_CACHE_DIR``, else the user cache directory (``platformdirs.user_cache_dir("berm")``)."""
    env = os.environ.get("BERM_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("berm")) / "code"


def cache_key(*parts: str | bytes) -> str:
    """SHA-256 over ``parts``, each length-prefixed so no two part lists collide."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    # One read of exactly the file's size: chunked f.read(1 MiB) allocates (and faults in) a megabyte per call,
    # which made verifying a 19 KB object cost ~0.5 ms.
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest() if os.fstat(f.fileno()).st_size > _WHOLE_READ \
            else hashlib.sha256(f.read()).hexdigest()


class CodeCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> Path | None:
        """The verified object for ``key``, or None (absent, or corrupt: then it is moved aside)."""
        d = self.entry(key)
        so, digest = d / SO_NAME, d / (SO_NAME + ".sha256")
        try:
            recorded = digest.read_text().strip()
            if recorded == _file_sha256(so):
                return so
        except OSError:
            if not d.exists():
                return None
        except UnicodeDecodeError:  # a corrupt record: discarded like a wrong one
            pass
        self._discard(d)
        return None

    def get_or_build(self, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """``(object path, built)``: the cached object, or ``build(path)`` writes a new one (under the key's lock)."""
        found = self.lookup(key)
        if found is not None:
            return found, False
        d = self.entry(key)
        try:
            d.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CompileError(f"cannot create the code cache at {d.parent}: {exc}") from None
        with self._locked(d.parent / f"{key}.lock"):
            found = self.lookup(key)
            if found is not None:
                return found, False
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=d.parent))
            try:
                so = tmp / SO_NAME
                build(so)
                (tmp / (SO_NAME + ".sha256")).write_text(_file_sha256(so) + "\n")
                os.replace(tmp, d)  # atomic; d cannot exist here (we hold the lock, lookup discarded a bad one)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return d / SO_NAME, True

    def read_blob(self, key: str, name: str) -> bytes | None:
        """The bytes stored by ``write_blob(key, name, …)``, or None. Blobs are derived data the caller verifies
        itself (they carry no recorded digest here)."""
        try:
            return (self.entry(key) / name).read_bytes()
        except OSError:
            return None

    def write_blob(self, key: str, name: str, data: bytes) -> None:
        """Store ``data`` under (key, name), atomically (a temporary file renamed into place); best effort: a cache
        that cannot be written only means the next load derives the data again."""
        d = self.entry(key)
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=d)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, d / name)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass

    @contextmanager
    def _locked(self, path: Path):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CompileError(f"cannot lock the code cache entry {path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _discard(self, d: Path) -> None:
        """Move a bad entry out of the way (rename first: another process may be reading it)."""
        trash = d.with_name(f".bad-{d.name}-{os.getpid()}-{id(d):x}")
        try:
            os.replace(d, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)
