"""berm.fs.read / berm.fs.write doing their job: reads, atomic writes, parents on request, nothing lost."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from berm_abi.frames import encode_frame
from berm_host.capabilities import fs
from berm_host.capabilities.paths import Root, RootError
from berm_host.linker import CapabilityError


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return r


@pytest.fixture
def caps(root):
    return fs.capabilities(Root(root))


def test_read_returns_the_raw_bytes(root, caps):
    (root / "bin").write_bytes(bytes(range(256)))
    assert caps["berm.fs.read"](encode_frame(["bin"])) == bytes(range(256))
    (root / "empty").write_bytes(b"")
    assert caps["berm.fs.read"](encode_frame(["empty"])) == b""


def test_read_of_a_missing_file_names_it(caps):
    with pytest.raises(CapabilityError, match="berm.fs.read: nope/x: no such file"):
        caps["berm.fs.read"](encode_frame(["nope/x"]))


def test_write_creates_and_replaces(root, caps):
    write = caps["berm.fs.write"]
    assert write(encode_frame(["a.txt", b"one"])) == b""
    assert (root / "a.txt").read_bytes() == b"one"
    write(encode_frame(["a.txt", b"two, longer"]))
    assert (root / "a.txt").read_bytes() == b"two, longer"
    write(encode_frame(["a.txt", b""]))
    assert (root / "a.txt").read_bytes() == b""


def test_write_keeps_the_permission_bits_of_the_file_it_replaces(root, caps):
    (root / "script.sh").write_bytes(b"old")
    os.chmod(root / "script.sh", 0o751)
    caps["berm.fs.write"](encode_frame(["script.sh", b"new"]))
    assert stat.S_IMODE(os.stat(root / "script.sh").st_mode) == 0o751


def test_write_never_carries_setuid_setgid_or_sticky_onto_the_file_it_writes(root, caps):
    """The new file belongs to the host's user and holds the guest's bytes: keeping the old file's setuid bit
    planted a setuid program of the guest's choosing (owned by root, when the daemon runs as root)."""
    (root / "tool").write_bytes(b"old")
    os.chmod(root / "tool", 0o6755)
    caps["berm.fs.write"](encode_frame(["tool", b"#!/bin/sh\nid\n"]))
    assert stat.S_IMODE(os.stat(root / "tool").st_mode) == 0o755


def test_write_does_not_create_parents_unless_asked(root, caps):
    write = caps["berm.fs.write"]
    with pytest.raises(CapabilityError, match="no such file or directory"):
        write(encode_frame(["d1/d2/f", b"x"]))
    assert not (root / "d1").exists()
    write(encode_frame(["d1/d2/f", b"x", "parents", "1"]))
    assert (root / "d1" / "d2" / "f").read_bytes() == b"x"


def test_parents_are_made_with_the_modes_mkdir_p_gives(root, caps):
    """Directories made for a write are 0777 less the process's umask, as mkdir -p makes them (not private)."""
    old = os.umask(0o022)
    try:
        caps["berm.fs.write"](encode_frame(["p1/p2/f", b"x", "parents", "1"]))
    finally:
        os.umask(old)
    assert [stat.S_IMODE((root / d).stat().st_mode) for d in ("p1", "p1/p2")] == [0o755, 0o755]


def test_a_failed_write_loses_nothing_and_leaves_no_temporary_file(root, caps, monkeypatch):
    (root / "keep").write_bytes(b"precious")

    def disk_error(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", disk_error)  # the disk fails after the new content was written
    with pytest.raises(CapabilityError, match="Input/output error"):
        caps["berm.fs.write"](encode_frame(["keep", b"replacement"]))
    assert (root / "keep").read_bytes() == b"precious"
    assert [p.name for p in root.iterdir()] == ["keep"]


def test_a_write_is_durable_when_it_returns_its_rename_included(root, caps, monkeypatch):
    """The new content is synced before the rename, and the directory after it (session 15's mutation gap: the
    directory's fsync could go unnoticed): a crash after the call returns keeps the new file under its name."""
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        st = os.fstat(fd)
        synced.append("directory" if stat.S_ISDIR(st.st_mode) else "file")
        if stat.S_ISDIR(st.st_mode):
            synced.append(sorted(os.listdir(fd)))  # what the directory holds when it is synced
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    (root / "sub").mkdir()
    caps["berm.fs.write"](encode_frame(["sub/new.txt", b"content"]))
    assert synced == ["file", "directory", ["new.txt"]]


def test_write_through_a_file_component_is_an_error(root, caps):
    (root / "file").write_bytes(b"")
    with pytest.raises(CapabilityError, match="not a directory"):
        caps["berm.fs.write"](encode_frame(["file/child", b"x"]))


@pytest.mark.parametrize("path", ["file/", "file/.", "file//", "link/"])
def test_a_trailing_slash_after_a_file_is_not_a_directory(root, caps, path):
    """As in POSIX, a path ending in "/" names a directory: "file/" read the file, and a write to "new/" created a
    file named new."""
    (root / "file").write_bytes(b"data")
    (root / "link").symlink_to("file")
    with pytest.raises(CapabilityError, match="file is not a directory"):
        caps["berm.fs.read"](encode_frame([path]))
    for target in ("new/", "new/.", "new/..", "", "."):  # refused before parents=1 makes any directory
        with pytest.raises(CapabilityError, match=f"berm.fs.write: {target}: names a directory"):
            caps["berm.fs.write"](encode_frame([target, b"x", "parents", "1"]))
    assert sorted(p.name for p in root.iterdir()) == ["file", "link"]
    (root / "dir").mkdir()
    (root / "dir" / "x").write_bytes(b"x")
    assert caps["berm.fs.read"](encode_frame(["dir/./x"])) == b"x"  # inside a path, "/" and "/." are nothing new


def test_root_must_be_a_directory(tmp_path):
    with pytest.raises(RootError):
        Root(tmp_path / "missing")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(RootError):
        Root(tmp_path / "f")


def test_a_root_given_through_a_symlink_is_the_same_root(tmp_path, root):
    (tmp_path / "alias").symlink_to(root)
    (root / "f").write_bytes(b"ok")
    read = fs.capabilities(Root(tmp_path / "alias"))["berm.fs.read"]
    assert read(encode_frame([str(tmp_path / "alias" / "f")])) == b"ok"
    assert read(encode_frame([str(root / "f")])) == b"ok"


@pytest.mark.parametrize("size", [0, 1, 100, 65536, 65537, 200_000])
@pytest.mark.parametrize("limit", [1, 100, 65536, 1 << 30])
def test_read_upto_reads_exactly_the_prefix(tmp_path, size, limit):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert fs.read_upto(fd, limit) == data[:limit]
    finally:
        os.close(fd)


@pytest.mark.parametrize("word, made", [("1", True), ("yes", True), (" TRUE ", True), ("0", False), ("no", False),
                                        ("", False)])
def test_the_parents_option_takes_the_usual_spellings(root, caps, word, made):
    write = caps["berm.fs.write"]
    if made:
        write(encode_frame(["d/f", b"x", "parents", word]))
        assert (root / "d" / "f").read_bytes() == b"x"
    else:
        with pytest.raises(CapabilityError, match="no such file or directory"):
            write(encode_frame(["d/f", b"x", "parents", word]))
        assert not (root / "d").exists()


def test_a_bad_parents_option_is_named_briefly(caps):
    with pytest.raises(CapabilityError) as info:
        caps["berm.fs.write"](encode_frame(["d/f", b"x", "parents", "maybe" * 1000]))
    assert str(info.value) == "berm.fs.write: parents must be 1 or 0, not 'maybemaybemaybemaybe'"


def test_a_file_whose_size_the_filesystem_does_not_report_is_held_to_the_cap(tmp_path):
    """/proc's regular files say st_size 0 whatever they hold: the cap must still apply to what is read."""
    status = (Path("/proc/self/status")).read_bytes()
    proc = Root("/proc/self")
    assert fs.read_file(proc, "status", cap=len(status) + 4096).startswith(b"Name:")
    with pytest.raises(CapabilityError, match="larger than the 0 MiB read cap"):
        fs.read_file(proc, "status", cap=10)


def test_a_file_of_exactly_the_cap_is_read(root):
    (root / "f").write_bytes(b"x" * 100)
    assert fs.read_file(Root(root), "f", cap=100) == b"x" * 100


def test_a_rewrite_never_shows_its_new_content_under_a_wider_mode(root, caps, monkeypatch):
    """Found by a review: the temp file holding a rewrite's content was created with the umask's mode (0644) and
    given the old file's mode (0600) only after the content was written, so another local user could open it
    meanwhile and read the new content. The mode is now set before any byte is written."""
    (root / "private.key").write_bytes(b"old")
    os.chmod(root / "private.key", 0o600)
    modes = []
    real_fdopen = os.fdopen

    class Watched:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def write(self, data):
            modes.append(stat.S_IMODE(os.fstat(self.f.fileno()).st_mode))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Watched(real_fdopen(fd, *a, **k)))
    old = os.umask(0o022)
    try:
        caps["berm.fs.write"](encode_frame(["private.key", b"-----BEGIN PRIVATE KEY-----"]))
    finally:
        os.umask(old)
    assert modes == [0o600]
    assert stat.S_IMODE((root / "private.key").stat().st_mode) == 0o600


def test_a_write_refused_because_its_path_leads_to_a_directory_makes_no_directories(root, caps):
    """Found by a review: with parents=1, a write to a link to "made/by/write/" made the chain of directories, then
    was refused as a directory. Missing directories are now made only once the walk is known to reach a file."""
    (root / "l").symlink_to("made/by/write/")
    with pytest.raises(CapabilityError, match="berm.fs.write: l: names a directory"):
        caps["berm.fs.write"](encode_frame(["l", b"x", "parents", "1"]))
    assert sorted(p.name for p in root.iterdir()) == ["l"]
    (root / "f").symlink_to("made/by/file")
    caps["berm.fs.write"](encode_frame(["f", b"x", "parents", "1"]))
    assert (root / "made" / "by" / "file").read_bytes() == b"x"


@pytest.mark.parametrize("name, request_fields", [("berm.fs.read", ["z" * 256]), ("berm.fs.write", ["z" * 256, b"x"])])
def test_an_os_error_names_the_path(caps, name, request_fields):
    """Found by a review: the guest was told "berm.fs.write: File name too long", without the path."""
    with pytest.raises(CapabilityError) as info:
        caps[name](encode_frame(request_fields))
    assert str(info.value) == f"{name}: {'z' * 256}: File name too long"
