"""``berm.fs.read`` and ``berm.fs.write``: whole-file reads and atomic writes confined to a root.

Reads are capped (a request for a bigger file is refused, not truncated). Writes go to a temporary file in the
target's directory, are flushed to disk and renamed over the target, so a failure at any point leaves the old
content whole; the target's directory must therefore be writable by the host user, even to rewrite a file it may
write. An existing file is replaced only if the host user may write it (a 0444 file, or another user's without a
write bit for it, is refused, although the rename alone would be allowed). It keeps its group and its permission
bits (read, write, execute: never setuid, setgid or sticky, which the new file would carry with the host user's
ownership and the guest's content), both set before any of the new content is written. When the host user may not
give the new file the old one's group (it is not a member), the file keeps the group it was made with (the host
user's, or a setgid directory's), and its group and other bits are both cut to what the old file granted both, so
that nobody gains access: 0640 becomes 0600, 0664 becomes 0644. A file another user owned keeps its owner where the
host user may give it (a host running as root: a file it made root's locked its owner out of a 0600 file, found by a
review), and otherwise becomes the host user's. Missing parent directories are an error unless the request asks for
them with the pair ``parents = 1``.
"""

from __future__ import annotations

import os
import secrets
import stat

from berm_host.linker import CapabilityError, CapabilityFn

from ._request import capability, fields, naming, text
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
        try:
            old = os.stat(r.leaf, dir_fd=r.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        else:
            if not stat.S_ISREG(old.st_mode):
                raise CapabilityError(f"{path}: exists and is not a regular file")
            # Found by a review: the rename needs only the directory's write permission, so a 0444 file, or another
            # user's without a write bit, was replaced where an open for writing is refused.
            if not os.access(r.leaf, os.W_OK, dir_fd=r.dir_fd, effective_ids=True, follow_symlinks=False):
                raise CapabilityError(f"{path}: permission denied (the file is not writable)")
        tmp = f".berm-write-{secrets.token_hex(8)}.tmp"
        try:
            # a rewritten file's temp file starts private, until it has the old file's group and mode (below)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600 if old is not None else 0o666, dir_fd=r.dir_fd)
        except PermissionError:
            # Found by a review: a writable file in an unwritable directory failed with a bare "Permission denied",
            # although an ordinary write to it works.
            raise CapabilityError(f"{path}: permission denied: its directory is not writable (a write replaces the "
                                  f"file atomically, through a new file beside it)") from None
        try:
            with os.fdopen(fd, "wb") as f:
                if old is not None:
                    _take_access(f.fileno(), old, _acl(r.dir_fd, r.leaf))
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


#: The extended attribute holding a file's POSIX access ACL.
_ACL = "system.posix_acl_access"


def _acl(dir_fd: int, leaf: str) -> bytes | None:
    """The POSIX access ACL of the file ``leaf`` in ``dir_fd``, None when it has none (or its file system none)."""
    try:
        return os.getxattr(f"/proc/self/fd/{dir_fd}/{leaf}", _ACL, follow_symlinks=False)
    except OSError:
        return None


def _take_access(fd: int, old: os.stat_result, acl: bytes | None) -> None:
    """Give the empty temp file ``fd`` the owner (where the host may), group, permission bits and ACL (``acl``) of
    the file ``old`` it is to replace, before any content is written: the new content of a 0600 file sat in a temp
    file of the umask's mode (0644) while it was written, for another user to open (found by a review). Without its
    ACL, a file's group bits (the ACL's mask) went to its owning group, which the ACL may have denied (found by
    another); an ACL that cannot be set leaves the group nothing."""
    mode = stat.S_IMODE(old.st_mode) & 0o777
    made = os.fstat(fd)
    if made.st_uid != old.st_uid:
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
            made = os.fstat(fd)
        except OSError:  # only root may give a file away: it stays the host user's
            pass
    group_kept = True
    if made.st_gid != old.st_gid:
        # Found by a review: a 0640 file of group G came back 0640 of the host user's group, readable by its members.
        try:
            os.fchown(fd, -1, old.st_gid)
        except OSError:  # not a member of G (EPERM), or G is unmapped in this user namespace (EINVAL)
            # Members of our group would get the group bits, and G's members the other bits (0604 denied them):
            # both get only what the old file granted both.
            group_kept = False
            both = mode >> 3 & mode & 0o7
            mode = mode & 0o700 | both << 3 | both
    os.fchmod(fd, mode)
    if acl is not None and not (group_kept and _set_acl(fd, acl)):
        os.fchmod(fd, mode & ~0o070)  # the ACL's owning-group entry was G's: our group gets none of it


def _set_acl(fd: int, acl: bytes) -> bool:
    """Give the file ``fd`` the access ACL ``acl`` (an xattr's bytes); whether it took it."""
    try:
        os.setxattr(fd, _ACL, acl)
        return True
    except OSError:  # a file system without ACLs, an ACL naming an id unmapped here
        return False


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
        (field,), _ = fields(request, ("path",))
        path = text(field, "path")
        with naming(path):
            return read_file(root, path)

    @capability("berm.fs.write")
    def fs_write(request: bytes) -> bytes:
        (field, content), options = fields(request, ("path", "content"), pairs=True)
        parents = False
        for key, value in options:
            if key != b"parents":
                raise CapabilityError(f"unknown option {key[:40]!r} (known: parents)")
            parents = _flag(value, "parents")
        path = text(field, "path")
        with naming(path):
            write_file(root, path, content, parents=parents)
        return b""

    return {"berm.fs.read": fs_read, "berm.fs.write": fs_write}
