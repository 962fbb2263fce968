"""Files that hold harnesses' data (the kv store, the due-set's payloads): this user's only, whatever the umask.

Found by two reviews: under ``berm serve`` with umask 022 the state directory was 0755 and both databases 0644, so
any local user could read every harness's storage and every wake's payload, though the control socket is 0600.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: SQLite's files beside a database in WAL mode; it creates them with the database file's mode.
_COMPANIONS = ("-wal", "-shm", "-journal")


def private_directory(path: Path) -> None:
    """Make ``path`` and each missing parent 0700, whatever the umask, and refuse ``path`` unless it is this user's
    and no one else can write to it (another user could plant a file or a symbolic link there for this user's
    data). A PermissionError (an OSError) when it is refused, another OSError when it cannot be made."""
    _make_directories(path)
    st = os.stat(path)
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
                              "refusing to keep harnesses' data there")
    if st.st_mode & 0o022:
        raise PermissionError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): refusing "
                              "to keep harnesses' data there (chmod go-w it)")


def _make_directories(path: Path) -> None:
    """``mkdir -p`` with every directory it makes 0700: ``Path.mkdir(parents=True)`` makes the parents with the
    umask's mode (0777 under umask 0)."""
    if path.is_dir():
        return
    _make_directories(path.parent)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return  # made meanwhile, or not a directory: the caller's checks tell
    os.chmod(path, 0o700)  # the umask may have taken even the owner's bits


def private_database(path: Path) -> None:
    """Make ``path``'s directory (``private_directory``) and the database file itself (0600), or narrow an existing
    file and its SQLite companions to 0600, before SQLite opens it. An OSError when that cannot be done, a
    PermissionError when one of them is not a regular file of this user's.

    Found by a review: a symbolic link planted as the database or a companion was followed, and its target (any
    file or directory of this user's, outside the data directory too) narrowed to 0600."""
    private_directory(path.parent)
    _narrow(path, create=True)
    for suffix in _COMPANIONS:
        _narrow(path.with_name(path.name + suffix), create=False)


def _narrow(path: Path, *, create: bool) -> None:
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # what O_NOFOLLOW makes of a symbolic link
            raise PermissionError(f"{path} is a symbolic link: refusing to follow it for harnesses' data") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{path} is not a regular file of this user's: refusing it for harnesses' data")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
