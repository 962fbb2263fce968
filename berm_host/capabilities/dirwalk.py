"""A walk of a directory tree by descriptors that someone changing the tree meanwhile cannot lead astray.

Why not ``os.fwalk``: Python 3.11's opens each subdirectory it listed with a plain ``open(name, O_RDONLY,
dir_fd=…)``, after listing it. Found by a hostile review: a subdirectory swapped for a FIFO in between blocked the
host thread in ``open`` for good, past any time budget; swapped for a symlink, the host opened what it points to,
outside the root (and skipped it only after); swapped for a regular file, the walk failed (ENOTDIR), losing every
result. Here each subdirectory is opened relative to its parent's descriptor with ``O_DIRECTORY | O_NOFOLLOW |
O_NONBLOCK``: whatever is no longer a directory by then (or is gone) is skipped, never opened, and the walk goes on.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

from ._request import Deadline

_SUBDIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Why a subdirectory listed may not open: swapped for a non-directory (ENOTDIR) or a symlink (ELOOP), removed, or
#: not readable (EACCES, EPERM). It is skipped; any other error (out of descriptors: EMFILE) ends the walk.
_SKIPPED = frozenset({errno.ENOTDIR, errno.ELOOP, errno.ENOENT, errno.EACCES, errno.EPERM})


def _open_subdir(parent_fd: int, name: str) -> int | None:
    """The descriptor of directory ``name`` under ``parent_fd``, or None when it is not one (any longer)."""
    try:
        return os.open(name, _SUBDIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in _SKIPPED:
            return None
        raise


#: Entries read from one directory between two looks at the deadline.
CHECK_EVERY = 4096


def _listing(fd: int, deadline: Deadline) -> tuple[list[str], list[os.DirEntry[str]]]:
    """The directory ``fd``'s subdirectories (names) and its other entries (symlinks among them), each sorted. The
    deadline is checked as it reads: a directory may hold millions of entries."""
    dirs: list[str] = []
    leaves: list[os.DirEntry[str]] = []
    with os.scandir(fd) as it:
        for n, entry in enumerate(it):
            if n % CHECK_EVERY == CHECK_EVERY - 1:
                deadline.check()
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:  # gone since it was listed (only looked at when the listing does not say its kind)
                continue
            if is_dir:
                dirs.append(entry.name)
            else:
                leaves.append(entry)
    dirs.sort()
    leaves.sort(key=lambda e: e.name)
    return dirs, leaves


class _Level:
    __slots__ = ("fd", "sub", "pending")

    def __init__(self, fd: int, sub: str):
        self.fd = fd
        self.sub = sub  # its path relative to the top, "" for the top
        self.pending: Iterator[str] | None = None  # its subdirectories still to walk, once listed


def walk(top_fd: int, deadline: Deadline) -> Iterator[tuple[str, list[str], list[os.DirEntry[str]], int]]:
    """Like ``os.fwalk`` top-down without following symlinks, from the directory ``top_fd`` (which the caller keeps
    and closes): for each directory, ``(sub, dirs, leaves, fd)``: its path relative to the top ("" for the top), its
    subdirectories' names, its other entries, and its descriptor, valid until the next item. Both lists are sorted
    and read in full before the directory is yielded; the caller may prune ``dirs`` in place (it bounds the depth:
    a descriptor stays open per level being walked). Depth first, each directory before its subdirectories, the
    deadline checked before listing each and as it is read. The walk closes every descriptor it opened, however it
    ends."""
    stack = [_Level(top_fd, "")]
    try:
        while stack:
            level = stack[-1]
            if level.pending is None:
                deadline.check()
                dirs, leaves = _listing(level.fd, deadline)
                yield level.sub, dirs, leaves, level.fd
                level.pending = iter(dirs)  # as the caller left it
                continue
            name = next(level.pending, None)
            if name is None:
                stack.pop()
                if level.fd != top_fd:
                    os.close(level.fd)
                continue
            fd = _open_subdir(level.fd, name)
            if fd is not None:
                stack.append(_Level(fd, f"{level.sub}/{name}" if level.sub else name))
    finally:
        for level in stack:
            if level.fd != top_fd:
                os.close(level.fd)
