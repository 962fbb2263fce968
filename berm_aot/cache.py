"""The content-addressed code cache: one directory per key holding ``image.so`` and ``image.so.crc32c``.

- The key is a SHA-256 over everything that changes the object (``cache_key``); nothing else names an entry.
- An entry appears atomically: it is built in a temporary directory beside it and renamed into place, so a
  reader sees a whole entry or none. Builders of the same key in several processes serialise on a lock file
  (``fcntl.flock``), so the second finds the first's entry instead of compiling again. Lock files are 0600, and
  a lock held longer than a compile can take (``lock_wait``) is a CompileError naming it, not a wait for ever.
- Before an object is used its checksum (CRC-32C: what it finds is damage, and berm_aot/checksum.c says why it is
  no SHA-256) is checked against the recorded one, read through one descriptor opened without following a symlink
  (a regular file only); a corrupt or truncated entry is moved aside and rebuilt, under the key's lock (a reader
  outside it could discard an entry another process had just rebuilt). A lookup that fails for any other reason (no
  descriptors left, no permission) is an error, not a corrupt entry.
- Nothing another user could have planted or swapped is loaded: in a cache shared with other users (a
  ``BERM_CACHE_DIR`` under /tmp) that would be code run in this process. The root, shards, entries and their files
  pass berm_aot/trust.py's checks (another owner is refused: CompileError; an entry of ours others may write, from
  an old cache written under umask 002, is rebuilt). An entry just built passes the same checks before it is
  returned. Entries are readable by everyone, so a cache filled by ``berm-compile`` as root serves a daemon
  running as another user.
- A compile killed midway leaves its temporary directory (the translated C, objects: megabytes for a large image),
  a blob's writer its temporary file, beside the entry; the next compile of any key removes them, under the lock of
  the key they were for (taken without waiting: a key whose lock is held is being built, and what lies beside its
  entry is at work).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import platformdirs

from berm_aot import _checksum as checksum, cc
from berm_aot.errors import CompileError
from berm_aot.trust import Untrusted, own_dir, trusted, trusted_dir

SO_NAME = "image.so"
#: The object's checksum (berm_aot/checksum.c: CRC-32C in three lanes, 24 hex digits), beside it.
RECORD_NAME = SO_NAME + ".crc32c"
#: An object larger than this is not one the translator wrote (a 100 KB guest makes ~1 MB): a corrupt entry.
MAX_OBJECT = 1 << 30
#: An ELF program header's type for a loadable segment.
_PT_LOAD = 1
#: Seconds beyond the compile timeout to wait for an entry's lock (``lock_wait``).
LOCK_MARGIN = 120
#: What builders and discarders of a key leave beside its entry while they work: ``.KEY-…`` (a build's temporary
#: directory, ``get_or_build``) and ``.bad-KEY-…`` (a damaged entry moved aside, ``_discard``).
_AT_WORK = re.compile(r"\.(?:bad-)?([0-9a-f]{64})-")
#: What a lookup meets in a damaged entry (missing files, a symlink where a file was, a directory): it is rebuilt.
_DAMAGED = (errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR)


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


def _segments_fit(fd: int, size: int) -> bool:
    """Whether the object is a 64-bit little-endian ELF whose loadable segments lie inside its ``size`` bytes.
    dlopen maps a truncated object's segments past its end, and touching those pages kills the process with
    SIGBUS: an entry cut short whose record was rewritten to match (found by a hostile review) is rebuilt instead,
    as is a file that is no ELF at all (which dlopen refused on every load, never rebuilt)."""
    head = os.pread(fd, 64, 0)
    if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
        return False
    (table_at,) = struct.unpack_from("<Q", head, 32)  # e_phoff
    entry, count = struct.unpack_from("<HH", head, 54)  # e_phentsize, e_phnum
    if entry < 56 or table_at + entry * count > size:
        return False
    table = os.pread(fd, entry * count, table_at)
    for at in range(0, entry * count, entry):
        (kind,) = struct.unpack_from("<I", table, at)  # p_type
        offset, _, _, in_file = struct.unpack_from("<4Q", table, at + 8)  # p_offset, p_vaddr, p_paddr, p_filesz
        if kind == _PT_LOAD and offset + in_file > size:
            return False
    return True


def _lstat(path: Path) -> os.stat_result:
    try:
        return os.stat(path, follow_symlinks=False)
    except OSError as exc:
        raise CompileError(f"cannot use the code cache at {path}: {exc.strerror or exc}") from None


def _open_regular(name: str | Path, dir_fd: int | None = None) -> tuple[int, os.stat_result] | None:
    """A descriptor of the regular file ``name`` and its status, None for anything else (a FIFO would block a plain
    open, a device or a symlink's target is not what the cache wrote). OSError when it cannot be opened at all."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        return fd, st
    os.close(fd)
    return None


#: Guards every cache's root descriptor (``CodeCache.loadable``), held across a fork: a child forked while another
#: thread was in ``loadable`` inherited the lock held, and its own first load waited for ever (found by a review).
_root_fd_lock = threading.Lock()
os.register_at_fork(before=_root_fd_lock.acquire, after_in_parent=_root_fd_lock.release,
                    after_in_child=_root_fd_lock.release)

#: The checks of berm_aot/trust.py, for this cache.
_trusted = partial(trusted, cache="the code cache", error=CompileError)
_own_dir = partial(own_dir, cache="the code cache", error=CompileError)
_trusted_dir = partial(trusted_dir, cache="the code cache", error=CompileError)


class CodeCache:
    def __init__(self, root: str | os.PathLike[str] | None = None):
        """``root``: the cache directory, None for ``default_cache_dir()``. An empty one ("") is a ValueError: it
        is the current directory, which a caller's unset variable filled with cache entries. (``Path("")`` cannot
        be told from ``Path(".")``: the command line refuses "" before it becomes a Path, berm_cli/arguments.py.)"""
        if root is not None and not os.fspath(root):
            raise ValueError("the cache directory is empty: name one, or pass None for the user cache directory")
        # resolved once: a symlink its owner retargeted between the check of an object and its dlopen would load
        # another (berm_aot/trust.py)
        self.root = Path(os.path.realpath(root if root is not None else default_cache_dir()))
        self._root_fd: int | None = None

    def __del__(self) -> None:
        if getattr(self, "_root_fd", None) is not None:
            os.close(self._root_fd)

    def loadable(self, path: Path) -> str:
        """``path``, an object of this cache, as dlopen is to be given it: through a descriptor of the root, checked
        when opened. By name, a root removed after the object's checks (a /tmp cleaner) and replaced by another
        user's symlink led dlopen to their object, whose constructor ran in the host (found by a review); a
        descriptor keeps naming the directory that was checked, and what is below it is ours, which nobody else can
        swap. The descriptor is opened again when the root is no longer the directory it names.

        dlopen gives back an object already loaded under the same name without opening the file; a descriptor's
        number is reused once closed, so a name may recur across caches, but it ends in the key: the same code."""
        root, name = str(self.root), str(path)
        if not name.startswith(root + "/"):
            raise ValueError(f"{path} is not in the code cache {root}")
        with _root_fd_lock:
            if self._root_fd is not None and not os.path.samestat(os.fstat(self._root_fd), _lstat(self.root)):
                os.close(self._root_fd)
                self._root_fd = None
            if self._root_fd is None:
                self._root_fd = self._open_root()
            return f"/proc/self/fd/{self._root_fd}{name[len(root):]}"

    def _open_root(self) -> int:
        """A descriptor of the root, a directory that passes the root's checks (those of the directories above it
        were made when the object was looked up, and hold: only this user or root can change them)."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise CompileError(f"cannot use the code cache at {self.root}: {exc.strerror or exc}") from None
        try:
            _trusted_dir(os.fstat(fd), self.root, root=True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> Path | None:
        """The verified object for ``key``, or None (absent, or damaged: ``get_or_build`` rebuilds it under the
        key's lock)."""
        found = self._verified(key)
        return found if isinstance(found, Path) else None

    def _verified(self, key: str) -> Path | bool | None:
        """The verified object for ``key``; None when there is no entry; False when the entry is damaged. The entry
        directory is opened once and its files through it (a lookup is most of a cached load)."""
        d = self.entry(key)
        if not (_own_dir(self.root, create=False, root=True) and _own_dir(d.parent, create=False)):
            return None
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno in _DAMAGED:  # a symlink or a file where the entry should be
                return False
            raise CompileError(f"cannot read the code cache entry {d}: {exc.strerror or exc}") from None
        try:
            _trusted(os.fstat(dfd), d)
            return d / SO_NAME if self._object_matches(dfd, d) else False
        except (UnicodeDecodeError, Untrusted):  # a corrupt record, or an entry others may write: rebuilt
            return False
        except OSError as exc:
            if exc.errno in _DAMAGED:
                return False
            raise CompileError(f"cannot read the code cache entry {d}: {exc.strerror or exc}") from None
        finally:
            os.close(dfd)

    @staticmethod
    def _object_matches(dfd: int, d: Path) -> bool:
        """Whether the entry open as ``dfd`` holds a regular, trusted object whose checksum is the one recorded."""
        opened = _open_regular(SO_NAME, dfd)
        if opened is None:
            return False
        fd, st = opened
        try:
            if st.st_size > MAX_OBJECT:
                return False
            _trusted(st, d / SO_NAME)
            record = _open_regular(RECORD_NAME, dfd)
            if record is None:
                return False
            try:
                recorded = os.read(record[0], 200).decode().strip()
            finally:
                os.close(record[0])
            return recorded == checksum.file(fd) and _segments_fit(fd, st.st_size)
        finally:
            os.close(fd)

    def get_or_build(self, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """``(object path, built)``: the cached object, or ``build(path)`` writes a new one (under the key's lock)."""
        found = self._verified(key)
        if found:
            return found, False
        d = self.entry(key)
        _own_dir(self.root, create=True, root=True)
        _own_dir(d.parent, create=True)
        with self._locked(d.parent / f"{key}.lock"):
            found = self._verified(key)
            if found:
                return found, False
            self._sweep(key)
            self._sweep_abandoned(key)
            if found is False:
                self._discard(d)
            try:
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=d.parent))
            except OSError as exc:
                raise CompileError(f"cannot write the code cache at {d.parent}: {exc.strerror or exc}") from None
            try:
                so = tmp / SO_NAME
                build(so)
                try:
                    with open(so, "rb") as f:
                        (tmp / RECORD_NAME).write_text(checksum.file(f.fileno()) + "\n")
                    # whatever the umask: mkdtemp's 0700 would keep the entry from other users, and a group-writable
                    # one (umask 002) would be refused by every lookup (module docstring)
                    for path, mode in ((so, 0o755), (tmp / RECORD_NAME, 0o644), (tmp, 0o755)):
                        os.chmod(path, mode)
                    os.replace(tmp, d)  # atomic; d cannot exist here (we hold the lock, a damaged one was discarded)
                except OSError as exc:
                    raise CompileError(f"cannot write the code cache entry {d}: {exc.strerror or exc}") from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            built = self._verified(key)  # what is loaded passes the checks a later lookup makes
        if not built:
            raise CompileError(f"the code cache entry {d} did not verify right after it was built")
        return built, True

    def read_blob(self, key: str, name: str) -> bytes | None:
        """The bytes stored by ``write_blob(key, name, …)``, or None. Blobs are derived data the caller verifies
        itself (they carry no recorded digest here); one another user owns or may write is refused like an
        object (CompileError)."""
        d = self.entry(key)
        if not (_own_dir(self.root, create=False, root=True) and _own_dir(d.parent, create=False)):
            return None
        try:
            _trusted(os.stat(d, follow_symlinks=False), d)
            opened = _open_regular(d / name)
        except (OSError, Untrusted):  # unreadable, or others may write it: derived again and rewritten
            return None
        if opened is None:
            return None
        fd, st = opened
        with open(fd, "rb") as f:
            try:
                _trusted(st, d / name)
                return f.read()
            except (OSError, Untrusted):
                return None

    def write_blob(self, key: str, name: str, data: bytes) -> None:
        """Store ``data`` under (key, name), atomically (a temporary file beside the entry, renamed into place: one
        a killed writer left is swept like a killed build's, ``_sweep_abandoned``; inside the entry it stayed for
        ever, found by a review); best effort: a cache that cannot be written only means the next load derives the
        data again (a sweep that took the temporary file meanwhile too)."""
        d = self.entry(key)
        try:
            _own_dir(self.root, create=True, root=True)
            _own_dir(d.parent, create=True)
            _own_dir(d, create=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key}-{name}-", dir=d.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, 0o644)
                os.replace(tmp, d / name)
            except BaseException:
                os.unlink(tmp)
                raise
        except (OSError, CompileError):
            pass

    @contextmanager
    def _locked(self, path: Path, *, wait: bool = True):
        """Hold the lock file ``path`` (see ``_wait_for``); with ``wait`` false, yield whether it was free, held
        only then."""
        # 0600, and an older 0644 one narrowed: flock needs only a descriptor, and another user who could open the
        # lock read-only held it for ever, so the owner's next rebuild of the entry waited for ever in silence
        # (found by a review)
        with _lock_fds.guard:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise CompileError(f"cannot lock the code cache entry {path}: {exc}") from None
            _lock_fds.open.add(fd)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():  # (found by a review: narrowing it was a bare PermissionError)
                raise CompileError(f"cannot lock the code cache entry {path}: the lock file belongs to uid "
                                   f"{st.st_uid}, not to this user, who could hold it for ever: remove it")
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
            yield _wait_for(fd, path) if wait else _take(fd)
        finally:
            with _lock_fds.guard:
                if fd in _lock_fds.open:  # not when this is a child that closed it (a fork inside a build)
                    # no call between forgetting and closing: a KeyboardInterrupt is raised as a call returns, and
                    # one there would leave the lock held by a descriptor nobody closes (later loads of the entry
                    # by this process would wait for it for ever)
                    _lock_fds.open -= {fd}
                    os.close(fd)

    def _discard(self, d: Path) -> None:
        """Move a damaged entry out of the way (rename first: another process may be reading it), then remove it."""
        trash = d.with_name(f".bad-{d.name}-{os.getpid()}-{id(d):x}")
        try:
            os.replace(d, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self, key: str) -> None:
        """Remove what builders and discarders of ``key`` killed midway left beside its entry (called holding the
        key's lock: nobody else is writing any of it)."""
        shard = self.entry(key).parent
        for prefix in (f".{key}-", f".bad-{key}-"):
            for left in shard.glob(prefix + "*"):
                if left.is_dir() and not left.is_symlink():
                    shutil.rmtree(left, ignore_errors=True)
                else:
                    left.unlink(missing_ok=True)

    def _sweep_abandoned(self, key: str) -> None:
        """Sweep what builders of other keys, killed midway, left anywhere in the cache: a key that is never built
        again kept its killed compile's megabytes for ever. Each key's leftovers are removed under its lock, taken
        without waiting (a key being built is skipped: what lies beside its entry is at work); called by a builder,
        whose compile takes seconds, so listing the shards (at most 256) costs nothing it would notice."""
        try:
            shards = [e.path for e in os.scandir(self.root) if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for shard in shards:
            try:
                names = os.listdir(shard)
            except OSError:
                continue
            keys = {m.group(1) for m in map(_AT_WORK.match, names) if m} - {key}
            for other in sorted(k for k in keys if self.entry(k).parent == Path(shard)):
                try:
                    with self._locked(Path(shard) / f"{other}.lock", wait=False) as free:
                        if free:
                            self._sweep(other)
                except CompileError:  # its lock is another user's: not ours to judge
                    continue


def _take(fd: int) -> bool:
    """Take the lock ``fd`` if it is free, without waiting; whether it was."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _wait_for(fd: int, path: Path) -> bool:
    """Take the lock ``fd`` (the lock file ``path``), waiting at most ``lock_wait()`` seconds: a holder compiling
    is done by then, so one still holding it is stuck, stopped (a berm-compile suspended with Ctrl-Z) or someone
    keeping it on purpose, and waiting for it blocked every later rebuild of the entry with no word. True once
    taken."""
    wait = lock_wait()
    deadline, pause = time.monotonic() + wait, 0.01
    while not _take(fd):
        if time.monotonic() >= deadline:
            raise CompileError(f"the code cache entry's lock {path} is held by another process (waited "
                               f"{wait:.0f} s; a compile of it stopped or stuck?)")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    return True


def lock_wait() -> float:
    """Seconds to wait for an entry's lock: the longest a compile may take (``cc.COMPILE_TIMEOUT``), and
    ``LOCK_MARGIN`` for what its builder does around it (the program model before, the record after)."""
    return cc.COMPILE_TIMEOUT + LOCK_MARGIN


class _LockFds:
    """The lock files this process has open (``CodeCache._locked``). A flock belongs to the open file, which a
    forked child shares: while the child kept its copy, the lock outlived the parent's build, and the child's own
    load of that entry waited for it for ever (3 of 3 children forked during a compile). A child closes its copies
    at once; ``guard`` keeps a fork out of the moment between opening one and noting it."""

    def __init__(self):
        self.guard = threading.Lock()
        self.open: set[int] = set()
        os.register_at_fork(before=self.guard.acquire, after_in_parent=self.guard.release,
                            after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        try:
            for fd in self.open:
                os.close(fd)
        finally:
            self.open.clear()
            self.guard.release()


_lock_fds = _LockFds()
