"""``berm.fs.read`` and ``berm.fs.write``: whole-file reads and atomic writes confined to a root.

Reads are capped (a request for a bigger file is refused, not truncated). Writes go to a temporary file in the
target's directory, are flushed to disk and renamed over the target, so a failure at any point leaves the old
content whole; an existing file keeps its permission bits (read, write, execute: never setuid, setgid or sticky,
which the new file would carry with the host user's ownership and the guest's content), set before any of the new
content is written. The new file is the host user's: a file another user owned becomes the host's (a daemon running
as root makes it root's). Missing parent directories are an error unless the request asks for them with the pair
``parents = 1``.
"""

from __future__ import annotations

import os
import secrets
import stat

from berm_host.linker import CapabilityError, CapabilityFn

from ._request import capability, fields, text
from .paths import Root

READ_CAP = 50 * 1024 * 1024
WRITE_CAP = 50 * 1024 * 1024
_MIB = 1024 * 1024


def read_upto(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of the open file ``fd``, read in pieces sized by the file's size (so a small file
    never costs a buffer the size of the limit)."""
    chunks: list[bytes] = []
    total = 0
    want = min(os.fstat(fd).st_size + 1, limit)
    while total < limit:
        chunk = os.read(fd, max(want - total, min(65536, limit - total)))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_file(root: Root, path: str, cap: int = READ_CAP) -> bytes:
    fd, _ = root.open_file(path)
    try:
        if os.fstat(fd).st_size > cap:
            raise CapabilityError(f"{path}: larger than the {cap // _MIB} MiB read cap")
        data = read_upto(fd, cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise CapabilityError(f"{path}: larger than the {cap // _MIB} MiB read cap")
    return data


def write_file(root: Root, path: str, content: bytes, *, parents: bool = False) -> None:
    if len(content) > WRITE_CAP:
        raise CapabilityError(f"{path}: {len(content)} bytes is over the {WRITE_CAP // _MIB} MiB write cap")
    if path.rsplit("/", 1)[-1] in ("", ".", ".."):  # "new/", "a/.": refused before `parents` makes anything
        raise CapabilityError(f"{path}: names a directory")
    with root.resolve(path, create_dirs=parents) as r:
        if r.leaf is None:
            raise CapabilityError(f"{path}: is a directory")
        mode = None
        try:
            st = os.stat(r.leaf, dir_fd=r.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                raise CapabilityError(f"{path}: exists and is not a regular file")
            mode = stat.S_IMODE(st.st_mode) & 0o777
        tmp = f".berm-write-{secrets.token_hex(8)}.tmp"
        # a file rewritten keeps its mode, set before any content is written: the new content of a 0600 file sat in
        # a temp file of the umask's mode (0644) while it was written, for another user to open (found by a review)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600 if mode is not None else 0o666, dir_fd=r.dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                if mode is not None:
                    os.fchmod(f.fileno(), mode)
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, r.leaf, src_dir_fd=r.dir_fd, dst_dir_fd=r.dir_fd)
            os.fsync(r.dir_fd)  # the rename itself, durable once the call returns
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=r.dir_fd)
            except OSError:
                pass
            raise


def _flag(value: bytes, what: str) -> bool:
    word = text(value, what).strip().lower()
    if word in ("1", "true", "yes"):
        return True
    if word in ("0", "false", "no", ""):
        return False
    raise CapabilityError(f"{what} must be 1 or 0, not {word[:20]!r}")


def capabilities(root: Root) -> dict[str, CapabilityFn]:
    """``berm.fs.read`` and ``berm.fs.write`` over ``root``."""

    @capability("berm.fs.read")
    def fs_read(request: bytes) -> bytes:
        (path,), _ = fields(request, ("path",))
        return read_file(root, text(path, "path"))

    @capability("berm.fs.write")
    def fs_write(request: bytes) -> bytes:
        (path, content), options = fields(request, ("path", "content"), pairs=True)
        parents = False
        for key, value in options:
            if key != b"parents":
                raise CapabilityError(f"unknown option {key[:40]!r} (known: parents)")
            parents = _flag(value, "parents")
        write_file(root, text(path, "path"), content, parents=parents)
        return b""

    return {"berm.fs.read": fs_read, "berm.fs.write": fs_write}
