"""What a cache may trust: directories and files nobody but this user (or root) could have planted or changed.

Two caches hold code the host runs or links: the code cache (translated objects, dlopened into the host) and the SDK
cache (guest objects linked into harnesses, bundled harness images run with the grants given to them). Either may be
shared with other users (a cache directory under /tmp). A cache's root must belong to this user or root and be
writable by no one else, unless it is sticky (/tmp: others cannot move what is ours); so must every directory above
it (its real path: callers resolve a configured symlink once and use what it named): a user who may write one could
swap the root for a look-alike between the check of an object and its dlopen, which opens it by path again (a review
ran its own constructor in the host that way). Every directory and file below the root must belong to this user or
root and be writable by no one else. This user's own directories are set to 0755 whatever the umask (077 would hide
them from a daemon running as another user); a file of ours others may write (written under umask 002) is
``Untrusted``: the caller builds it again rather than use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class Untrusted(Exception):
    """A directory or file of ours that others may write: built again, like a damaged one."""


def trusted(st: os.stat_result, what: Path, *, cache: str, error: type[Exception]) -> None:
    """Check a cache entry or a file in it (``st``, best from its open descriptor): ``error`` when another user
    owns it, ``Untrusted`` when others may write it. ``cache`` names the cache in the message ("the code cache")."""
    if st.st_uid not in (os.geteuid(), 0):
        raise error(f"refusing {cache} entry {what}: it belongs to user {st.st_uid}")
    if st.st_mode & 0o022:
        raise Untrusted(what)


def own_dir(path: Path, *, create: bool, root: bool = False, cache: str, error: type[Exception]) -> bool:
    """Check (and with ``create``, make) a directory of the cache named ``cache``: ``root`` for the cache's root,
    which may be sticky, and whose every directory above must be as trustworthy. The root is named by its real path
    (callers resolve a configured symlink once): a symlink found there since is refused. In a shared /tmp, a root
    that did not exist yet when its path was resolved, or that a cleaner removed, could be replaced by another
    user's symlink to a directory that passes every check, and the host then dlopened what they put there (found by
    a review). Our own directories lose group and other write (a root) or become 0755 (any other). False when
    ``path`` does not exist and ``create`` is false; ``error`` when it cannot be trusted or made."""
    try:
        if create:
            if root:  # nothing made under a directory others could swap
                _check_above(path, cache=cache, error=error, missing_ok=True)
            _make_dirs(path)
        st = os.stat(path, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise error(f"refusing {cache} {path}: it is a symlink now (its path was resolved when the cache was "
                        "opened), which anyone who could put it there could point elsewhere")
        if not stat.S_ISDIR(st.st_mode):
            raise error(f"{cache} {path} is not a directory")
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == os.geteuid() and not mode & stat.S_ISVTX:
            wanted = mode & ~0o022 if root else 0o755
            if mode != wanted:
                os.chmod(path, wanted)
                st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        if create:
            raise error(f"cannot create {cache} at {path}") from None
        return False
    except OSError as exc:
        raise error(f"cannot use {cache} at {path}: {exc.strerror or exc}") from None
    trusted_dir(st, path, root=root, cache=cache, error=error)
    if root:
        _check_above(path, cache=cache, error=error)
    return True


def trusted_dir(st: os.stat_result, path: Path, *, root: bool, cache: str, error: type[Exception]) -> None:
    """``error`` unless the directory ``st`` (of ``path``) belongs to this user or root and no one else may write it
    (a root may be sticky instead)."""
    if st.st_uid not in (os.geteuid(), 0):
        raise error(f"refusing {cache} {path}: it belongs to user {st.st_uid}")
    if st.st_mode & 0o022 and not (root and st.st_mode & stat.S_ISVTX):
        raise error(f"refusing {cache} {path}: others may write it (mode {stat.S_IMODE(st.st_mode):o})")


def _make_dirs(path: Path) -> None:
    """Make ``path`` and the directories above it that do not exist, each 0755 whatever the umask: ``mkdir -p``
    gives the parents it makes the umask's mode, which under umask 002 others could write, and the checks then
    refused the cache on every run (found by a review)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:  # made meanwhile by another process: checked like any other
            continue
        os.chmod(d, 0o755)


#: Paths whose directories above have passed _check_above: only this user or root can change such a directory, so
#: they stay trustworthy, and a cached load need not pay the ~20 µs of walking them again.
_SAFE_ABOVE: set[str] = set()


def _check_above(path: Path, *, cache: str, error: type[Exception], missing_ok: bool = False) -> None:
    """``error`` unless every directory above the real path of ``path`` belongs to this user or root and is
    writable by no one else or sticky (``missing_ok``: those that do not exist yet are skipped)."""
    if str(path) in _SAFE_ABOVE:
        return
    real = Path(os.path.realpath(path))
    for above in real.parents:
        try:
            st = os.stat(above)
        except FileNotFoundError:
            if missing_ok:
                continue
            raise error(f"cannot use {cache} at {path}: {above} does not exist") from None
        except OSError as exc:
            raise error(f"cannot use {cache} at {path}: {above}: {exc.strerror or exc}") from None
        if st.st_uid not in (os.geteuid(), 0):
            why = f"belongs to user {st.st_uid}"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            why = f"may be written by others (mode {stat.S_IMODE(st.st_mode):o}) and is not sticky"
        else:
            continue
        raise error(f"refusing {cache} {path}: {above} above it {why}, so another directory could be put in its place")
    if not missing_ok and real == Path(path):  # a path through a symlink could be pointed elsewhere later
        _SAFE_ABOVE.add(str(path))
