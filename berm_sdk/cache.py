"""Where built guest code is kept: SDK objects, the compiler runtime, bundled harness images (``cached_dir``)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import platformdirs

from berm_aot.trust import Untrusted, own_dir, trusted

from berm_sdk.errors import BuildError

#: The checks of berm_aot/trust.py, for this cache.
_trusted = partial(trusted, cache="the SDK cache", error=BuildError)
_own_dir = partial(own_dir, cache="the SDK cache", error=BuildError)
#: In every entry: the SHA-256 of each of its other files, by name (JSON).
RECORD = ".sha256"
#: In every kind directory: the lock builds hold (shared) while they stage an entry there (``_building``).
_LOCK = ".lock"


def _harnesses_root() -> Path:
    """harnesses/: the SDK and the bundled harnesses' sources. An installed wheel carries a copy inside this package
    (setup.py's build_py puts it there); a source tree (the editable install, the tests) has it beside the package."""
    installed = Path(__file__).resolve().parent / "harnesses"
    return installed if (installed / "sdk").is_dir() else Path(__file__).resolve().parent.parent / "harnesses"


#: harnesses/sdk: berm.h, the SDK's C sources, the compiler-runtime overrides, the linker script, the build profile.
SDK_DIR = _harnesses_root() / "sdk"


def cache_root() -> Path:
    """``$BERM_SDK_CACHE``, else the user cache directory; its real path (berm_aot/trust.py)."""
    return Path(os.path.realpath(os.environ.get("BERM_SDK_CACHE") or platformdirs.user_cache_dir("berm")))


def cached_dir(cached: Path, fill: Callable[[Path], None]) -> Path:
    """The cache directory ``cached`` (``<root>/<kind>/<name>``), made by ``fill(staging)`` into a fresh directory
    beside it and renamed into place (atomic: a directory in the cache is always complete) unless it is there
    already. When several processes build at once, the first rename wins and the others' staging is dropped.

    What is in it is linked into harnesses or run with the grants given to a bundled harness, so it passes
    berm_aot/trust.py's checks, like the code cache: another user's root, kind directory or entry is refused
    (BuildError); an entry of ours others may write, or damaged (not a directory of regular files, or one whose
    files are not those its RECORD lists), is built again. Its files reach the disk before it is renamed into place:
    after a crash, a file cut short (nothing was fsynced) was served as it was for ever (found by a review). Staging
    is private (mkdtemp's 0700) until its files are 0644 and the directory 0755."""
    _own_dir(cached.parent.parent, create=True, root=True)
    _own_dir(cached.parent, create=True)
    if _intact(cached):
        return cached
    with _building(cached.parent):
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cached.parent))
        try:
            fill(staging)
            _seal(staging)
            try:
                os.replace(staging, cached)
            except OSError:
                if not cached.is_dir():  # not another build that got there first: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if not _intact(cached):
        raise BuildError(f"the SDK cache entry {cached} did not verify right after it was built")
    return cached


def _seal(staging: Path) -> None:
    """Make the filled ``staging`` an entry: its files 0644, their digests recorded, all of it on the disk."""
    digests = {}
    for path in staging.iterdir():
        if not path.is_symlink() and path.is_file():  # anything else fails the check of the entry
            os.chmod(path, 0o644)
            digests[path.name] = _sha256(path, sync=True)
    with open(staging / RECORD, "w") as record:
        json.dump(digests, record)
        record.flush()
        os.fsync(record.fileno())
        os.fchmod(record.fileno(), 0o644)
    os.chmod(staging, 0o755)
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path, *, sync: bool = False) -> str:
    """The file's SHA-256 (an SDK entry's files are small: a few hundred KB in all); with ``sync``, the file is
    written to the disk too."""
    with open(path, "rb") as f:
        if sync:
            os.fsync(f.fileno())
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextmanager
def _building(kind: Path):
    """Held while a build stages an entry in the directory ``kind``: a shared lock on its lock file (0600: another
    user who could open it could hold it). The build first takes it exclusively when it can: no build is staging
    anything there then, so the staging directories and damaged entries moved aside that builds killed midway left
    are removed (nothing removed them: they piled up)."""
    fd = os.open(kind / _LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            for left in [*kind.glob(".staging-*"), *kind.glob(".bad-*")]:
                if left.is_dir() and not left.is_symlink():
                    shutil.rmtree(left, ignore_errors=True)
                else:
                    left.unlink(missing_ok=True)
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _intact(cached: Path) -> bool:
    """Whether ``cached`` is a trusted entry (a directory of regular files, each with the digest its RECORD lists);
    an entry of ours that is not (others may write it, or it is damaged) is moved aside and removed, and False
    returned. An entry that goes while it is looked at (another process found it untrusted too and moved it) is
    absent: False."""
    try:
        st = os.stat(cached, follow_symlinks=False)
        _trusted(st, cached)
        if not stat.S_ISDIR(st.st_mode):
            raise Untrusted(cached)
        with os.scandir(cached) as entries:
            names = set()
            for entry in entries:
                est = entry.stat(follow_symlinks=False)
                _trusted(est, Path(entry.path))
                if not stat.S_ISREG(est.st_mode):
                    raise Untrusted(entry.path)
                names.add(entry.name)
        try:
            recorded = json.loads((cached / RECORD).read_bytes())
        except (FileNotFoundError, ValueError):  # an entry of an older Berm, or a record cut short
            raise Untrusted(cached) from None
        if not isinstance(recorded, dict) or set(recorded) != names - {RECORD} or any(
                _sha256(cached / name) != digest for name, digest in recorded.items()):
            raise Untrusted(cached)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except Untrusted:
        trash = cached.with_name(f".bad-{cached.name}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.replace(cached, trash)  # first: another process may be reading it
        except FileNotFoundError:  # another process moved it first
            return False
        except OSError as exc:  # a shared cache's entry this user may not move (root's, from an old umask 002)
            raise BuildError(f"the SDK cache entry {cached} is damaged or may be written by others, and cannot be "
                             f"rebuilt by this user: {exc.strerror or exc} (its owner can remove it)") from None
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(trash, ignore_errors=True)
        else:
            trash.unlink(missing_ok=True)  # or another build's sweep removed it first (_building)
        return False
    return True
