"""Files that hold harnesses' data (the kv store, the due-set's payloads): this user's only, whatever the umask.

Found by two reviews: under ``berm serve`` with umask 022 the state directory was 0755 and both databases 0644, so
any local user could read every harness's storage and every wake's payload, though the control socket is 0600.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: SQLite's files beside a database in WAL mode; it creates them with the database file's mode.
_COMPANIONS = ("-wal", "-shm", "-journal")


def private_database(path: Path) -> None:
    """Make ``path``'s directory (0700 when created here) and the database file itself (0600), or narrow an
    existing file and its SQLite companions to 0600, before SQLite opens it. An OSError when that cannot be done."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _narrow(path, create=True)
    for suffix in _COMPANIONS:
        _narrow(path.with_name(path.name + suffix), create=False)


def _narrow(path: Path, *, create: bool) -> None:
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        if create:
            raise
        return
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
