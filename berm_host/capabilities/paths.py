"""Confining paths to a root: every capability path is walked one component at a time from a directory
descriptor of the root, the way ``openat2(RESOLVE_IN_ROOT)`` would, but refusing instead of clamping.

Why not ``realpath`` and a prefix check: between checking a path and opening it, a component can be swapped for
a symlink that points out. Here every step is an ``openat`` relative to the descriptor of the directory already
reached, with ``O_NOFOLLOW``; a symlink is never followed by the kernel but read with ``readlinkat`` and spliced
into the remaining components; ``..`` pops our own stack of descriptors and refuses to pop the root. A swap
between resolving and opening makes the final ``O_NOFOLLOW`` open fail, and the walk starts over. Absolute
paths (and absolute symlink targets) are accepted only when they name something inside the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from berm_abi.errors import BermError
from berm_host.linker import CapabilityError

#: Like the kernel's limit on symlinks followed while resolving one path.
MAX_SYMLINKS = 40
#: How often a leaf swapped for a symlink between resolving and opening is resolved again before giving up.
MAX_RETRIES = 8
#: Longer guest paths are refused before any work (PATH_MAX).
MAX_PATH_BYTES = 4096
#: The deepest directory a path may reach below the root: a walk keeps a descriptor open per level (for ``..``),
#: and 2,000 levels of ``a/a/…`` took the process past its descriptor limit, failing other harnesses' calls. At
#: 128, the daemon's four workers resolving at once stay well inside a soft limit of 1024.
MAX_DEPTH = 128

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RootError(BermError):
    """A declared root is not an existing directory."""


@dataclass(frozen=True)
class Resolved:
    """A path resolved inside the root: the descriptor of its directory and the leaf's name there (``None``
    when the path names the root itself or, with ``want_dir``, the directory ``dir_fd`` itself). ``rel`` is the
    root-relative path, for messages and listings. ``path_fds`` are the descriptors of the root and of each
    directory of ``rel`` in turn, down to ``dir_fd`` (the last): open until the resolution ends."""

    path_fds: tuple[int, ...]
    leaf: str | None
    rel: str

    @property
    def dir_fd(self) -> int:
        return self.path_fds[-1]


class Root:
    """A directory that bounds every path of the capabilities built over it."""

    def __init__(self, path: str | os.PathLike[str]):
        if "\0" in os.fspath(path):  # realpath raises ValueError on it
            raise RootError(f"root {os.fspath(path)!r} contains a NUL character")
        given = os.path.abspath(os.path.expanduser(os.fspath(path)))
        real = os.path.realpath(given)
        if not os.path.isdir(real):
            raise RootError(f"root {given} is not an existing directory")
        self.path = Path(real)
        # A guest may name paths under the declared spelling or the resolved one; both mean the root.
        self._prefixes = tuple(dict.fromkeys(p.rstrip("/") for p in (real, given)))

    def __repr__(self) -> str:
        return f"Root({str(self.path)!r})"

    def open_root(self) -> int:
        return os.open(self.path, _DIR_FLAGS)

    def components(self, path: str) -> list[str]:
        """A guest path as components relative to the root; absolute paths must lie under it."""
        if "\0" in path:
            raise CapabilityError("path contains a NUL byte")
        if len(path.encode()) > MAX_PATH_BYTES:
            raise CapabilityError(f"path is longer than {MAX_PATH_BYTES} bytes")
        if path.startswith("/"):
            rest = self._inside(path)
            if rest is None:
                raise CapabilityError(f"{path}: absolute path outside the root")
            return rest
        return path.split("/")

    def _inside(self, absolute: str) -> list[str] | None:
        for prefix in self._prefixes:
            if absolute == prefix or absolute.startswith(prefix + "/"):
                return absolute[len(prefix):].split("/")
        return None

    @contextlib.contextmanager
    def resolve(self, path: str, *, want_dir: bool = False, create_dirs: bool = False) -> Iterator[Resolved]:
        """Walk ``path`` inside the root. The leaf is not followed by the kernel: when it is a symlink, its target
        is walked in turn, so the yielded leaf is a non-symlink entry or does not exist. With ``want_dir`` every
        component, the last included, must be a directory (``leaf`` is then None). With ``create_dirs`` (for a path to a
        file) missing directories on the way are created, once the walk is known to reach a file through them. The
        descriptor is closed on exit."""
        stack = [self.open_root()]
        names: list[str] = []
        try:
            leaf = self._walk(path, stack, names, want_dir=want_dir, create_dirs=create_dirs)
            rel = "/".join(names + ([leaf] if leaf else [])) or "."
            yield Resolved(tuple(stack), leaf, rel)
        finally:
            for fd in stack:
                os.close(fd)

    def _walk(self, path: str, stack: list[int], names: list[str], *, want_dir: bool, create_dirs: bool) -> str | None:
        queue = deque(self.components(path))
        links = 0
        # Directories found missing are noted, not made, until the walk reaches the file they lead to; then they are
        # walked again and made. Found by a review: a write with parents=1 to a link to "made/by/write/" made the
        # three directories, then was refused because the path names a directory.
        missing: list[str] = []
        creating = False
        while queue:
            comp = queue.popleft()
            if comp in ("", "."):
                continue
            if comp == "..":
                if missing:
                    missing.pop()
                    continue
                if len(stack) == 1:
                    raise CapabilityError(f"{path}: leaves the root")
                os.close(stack.pop())
                names.pop()
                continue
            slash = False  # a last component followed by "/" (or "/."), which names a directory, as in POSIX
            while queue and queue[0] in ("", "."):
                queue.popleft()
                slash = True
            last = not queue
            top = stack[-1]
            leaf = last and not want_dir and not slash
            if not leaf and len(stack) + len(missing) > MAX_DEPTH:
                raise CapabilityError(f"{path[:200]}: more than {MAX_DEPTH} directories deep")
            if missing:  # nothing exists inside a directory that does not
                if leaf:
                    queue.extend([*missing, comp])
                    missing.clear()
                    creating = True
                else:
                    missing.append(comp)
                continue
            if leaf:
                try:
                    st = os.stat(comp, dir_fd=top, follow_symlinks=False)
                except FileNotFoundError:
                    return comp
                if not stat.S_ISLNK(st.st_mode):
                    return comp
            else:
                try:
                    fd = self._open_step(path, top, comp, creating)
                except FileNotFoundError:
                    if not create_dirs or creating:
                        raise CapabilityError(f"{path}: no such file or directory ({comp})") from None
                    missing.append(comp)
                    continue
                if fd is not None:
                    stack.append(fd)
                    names.append(comp)
                    continue
            links += 1
            if links > MAX_SYMLINKS:
                raise CapabilityError(f"{path}: too many levels of symbolic links")
            target = os.readlink(comp, dir_fd=top)
            if target.startswith("/"):
                rest = self._inside(target)
                if rest is None:
                    raise CapabilityError(f"{path}: symbolic link {'/'.join(names + [comp])} points outside the root")
                while len(stack) > 1:
                    os.close(stack.pop())
                names.clear()
                queue.extendleft(reversed(rest))
            else:
                queue.extendleft(reversed(target.split("/")))
            if last and slash:
                queue.append("")  # what the link leads to must be a directory too
        if missing:  # only a path to a file has missing directories made
            raise CapabilityError(f"{path}: names a directory")
        return None

    @staticmethod
    def _open_step(path: str, top: int, comp: str, create: bool) -> int | None:
        """Open directory ``comp`` under ``top`` without following it: its descriptor, or None when it is a
        symlink (the caller splices the target). FileNotFoundError when it is missing and not to be created."""
        try:
            return os.open(comp, _DIR_FLAGS, dir_fd=top)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(comp, 0o777, dir_fd=top)
            return os.open(comp, _DIR_FLAGS, dir_fd=top)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        if stat.S_ISLNK(os.stat(comp, dir_fd=top, follow_symlinks=False).st_mode):
            return None
        raise CapabilityError(f"{path}: {comp} is not a directory")

    @contextlib.contextmanager
    def open_dir(self, path: str) -> Iterator[Resolved]:
        """The directory ``path`` names inside the root (descriptor in ``dir_fd``)."""
        with self.resolve(path, want_dir=True) as r:
            yield r

    def open_file(self, path: str, flags: int = os.O_RDONLY) -> tuple[int, str]:
        """Open an existing regular file inside the root; returns ``(fd, root-relative path)``. FIFOs, devices
        and directories are refused: before opening when they are seen (opening a device can act on it, e.g. a tape
        rewinds), and after, for one swapped in meanwhile (opened non-blocking, so a FIFO cannot hang the call, and
        without becoming the process's controlling terminal)."""
        for _ in range(MAX_RETRIES):
            with self.resolve(path) as r:
                if r.leaf is None:
                    raise CapabilityError(f"{path}: is a directory")
                try:
                    seen = os.stat(r.leaf, dir_fd=r.dir_fd, follow_symlinks=False).st_mode
                    if not (stat.S_ISREG(seen) or stat.S_ISLNK(seen)):  # a symlink: O_NOFOLLOW's ELOOP, below
                        kind = "is a directory" if stat.S_ISDIR(seen) else "not a regular file"
                        raise CapabilityError(f"{path}: {kind}")
                    fd = os.open(r.leaf, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                                 dir_fd=r.dir_fd)
                except FileNotFoundError:
                    raise CapabilityError(f"{path}: no such file") from None
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue  # swapped for a symlink since we looked: resolve again
                    raise
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd, r.rel
            os.close(fd)
            raise CapabilityError(f"{path}: {'is a directory' if stat.S_ISDIR(mode) else 'not a regular file'}")
        raise CapabilityError(f"{path}: kept changing while being opened")
