"""berm.fs.write against file permissions: the write runs in a child process of uid 0 stripped of every capability
(util-linux setpriv), so the kernel's permission checks apply to it as to an ordinary user."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

SETPRIV = shutil.which("setpriv")
OTHER = 65534  # nobody / nogroup: a user and a group the writer is not

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                                reason="needs root and util-linux setpriv to write as uid 0 without capabilities")

_WRITE = """
import sys
from berm_abi.frames import encode_frame
from berm_host.capabilities import fs
from berm_host.capabilities.paths import Root
from berm_host.linker import CapabilityError
root, path, content = sys.argv[1:]
try:
    fs.capabilities(Root(root))["berm.fs.write"](encode_frame([path, content]))
except CapabilityError as exc:
    print(exc)
"""


def write_unprivileged(root, path: str, content: str, *, groups: str = "0") -> str:
    """berm.fs.write of ``content`` to ``path`` by uid 0 without capabilities, in the groups ``groups``: the
    error message, or '' when the write succeeded."""
    done = subprocess.run([SETPRIV, "--regid=0", f"--groups={groups}", "--bounding-set=-all", "--inh-caps=-all",
                           sys.executable, "-c", _WRITE, str(root), path, content],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _file(path, *, mode: int, uid: int = 0, gid: int = 0):
    path.write_text("old")
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


def test_a_rewrite_keeps_the_group_of_the_file_it_replaces(tmp_path):
    """Found by a review: a 0640 file of group G came back 0640 of the writer's primary group, so the group read
    bit applied to other users than before."""
    f = _file(tmp_path / "team-secret.txt", mode=0o640, gid=OTHER)
    assert write_unprivileged(tmp_path, "team-secret.txt", "new", groups=f"0,{OTHER}") == ""
    st = f.stat()
    assert (f.read_text(), st.st_gid, stat.S_IMODE(st.st_mode)) == ("new", OTHER, 0o640)


@pytest.mark.parametrize("before, after", [(0o640, 0o600), (0o604, 0o600), (0o664, 0o644), (0o666, 0o666)],
                         ids=lambda mode: f"{mode:04o}")
def test_a_rewrite_that_cannot_keep_the_group_grants_nobody_more(tmp_path, before, after):
    """A writer outside the old file's group cannot give the new file that group: the group and other bits are cut
    to what the old file granted both, so neither the writer's group (0640) nor the old group (0604 denied it
    what others had) gains access."""
    f = _file(tmp_path / "f", mode=before, gid=OTHER)
    assert write_unprivileged(tmp_path, "f", "new") == ""
    st = f.stat()
    assert (f.read_text(), st.st_gid, oct(stat.S_IMODE(st.st_mode))) == ("new", 0, oct(after))


def _with_acl(path):
    """Give ``path`` the access ACL user::rw- user:OTHER:rw- group::--- mask::rw- other::--- (only OTHER may use it
    besides its owner); its bytes. Skips the test on a file system without ACLs."""
    import struct
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 6, OTHER), (0x04, 0, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF),
               (0x20, 0, 0xFFFFFFFF)]
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", acl)
    except OSError as exc:
        pytest.skip(f"no POSIX ACLs here: {exc}")
    return os.getxattr(path, "system.posix_acl_access")


def test_a_rewrite_keeps_the_acl_of_the_file_it_replaces(tmp_path):
    """Found by a review: a rewrite kept the mode bits and dropped the ACL, so the group bits (the ACL's mask, rw)
    became the owning group's, which the ACL had denied everything."""
    f = _file(tmp_path / "f", mode=0o600)
    acl = _with_acl(f)
    assert stat.S_IMODE(f.stat().st_mode) == 0o660  # the mask shows as the group bits
    assert write_unprivileged(tmp_path, "f", "new") == ""
    assert (f.read_text(), os.getxattr(f, "system.posix_acl_access")) == ("new", acl)


def test_a_rewrite_that_cannot_keep_the_group_of_a_file_with_an_acl_gives_the_group_nothing(tmp_path):
    """The ACL's owning-group entry was the old group's: set on a file of the writer's group it would be theirs."""
    f = _file(tmp_path / "f", mode=0o600, gid=OTHER)
    _with_acl(f)
    assert write_unprivileged(tmp_path, "f", "new") == ""
    st = f.stat()
    assert (f.read_text(), st.st_gid, stat.S_IMODE(st.st_mode) & 0o070) == ("new", 0, 0)


def test_a_file_the_writer_may_not_write_is_not_replaced(tmp_path):
    """Found by a review: the rename needs only the directory's write permission, so a read-only file, or another
    user's without a write bit for others, was replaced where an ordinary open for writing is refused."""
    refused = [_file(tmp_path / "read-only", mode=0o444), _file(tmp_path / "theirs", mode=0o644, uid=OTHER)]
    for f in refused:
        msg = write_unprivileged(tmp_path, f.name, "new")
        assert msg == f"berm.fs.write: {f.name}: permission denied (the file is not writable)"
        assert f.read_text() == "old"
    shared = _file(tmp_path / "shared", mode=0o666, uid=OTHER)
    assert write_unprivileged(tmp_path, "shared", "new") == ""
    assert shared.read_text() == "new"


def test_a_writable_file_in_an_unwritable_directory_is_refused_saying_why(tmp_path):
    """Found by a review: the temp file cannot be made where the directory is not writable, and the guest was told
    only "Permission denied" about a file it may write."""
    d = tmp_path / "theirs"
    d.mkdir()
    f = _file(d / "shared.txt", mode=0o666, uid=OTHER)
    os.chown(d, OTHER, OTHER)
    msg = write_unprivileged(d, "shared.txt", "new")
    assert msg == ("berm.fs.write: shared.txt: permission denied: its directory is not writable (a write replaces "
                   "the file atomically, through a new file beside it)")
    assert f.read_text() == "old"


def test_a_host_running_as_root_keeps_the_owner_of_a_file_it_rewrites(tmp_path):
    """Found by a review: root's rewrite made another user's 0600 file root's, and its owner could no longer read
    it. (This write runs in the test's own process, as root.)"""
    from berm_abi.frames import encode_frame
    from berm_host.capabilities import fs
    from berm_host.capabilities.paths import Root

    f = _file(tmp_path / "theirs.txt", mode=0o600, uid=OTHER, gid=OTHER)
    fs.capabilities(Root(tmp_path))["berm.fs.write"](encode_frame(["theirs.txt", "new"]))
    st = f.stat()
    assert (f.read_text(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == ("new", OTHER, OTHER, 0o600)
