"""The SDK cache (SDK objects, the compiler runtime, bundled harness images) trusts nothing another user could have
planted or changed: what it holds is linked into harnesses, or run with the grants given to a bundled harness, so
a swapped bundled ``os`` image would read and write the granted files."""

from __future__ import annotations

import os
import stat

import pytest

from berm_sdk.cache import RECORD, cached_dir
from berm_sdk.errors import BuildError

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


class Builds:
    """A ``fill`` that writes one file and counts its calls."""

    def __init__(self):
        self.count = 0
        self.modes: list[int] = []

    def __call__(self, staging):
        self.count += 1
        self.modes.append(stat.S_IMODE(staging.stat().st_mode))
        (staging / "thing.o").write_bytes(b"built %d" % self.count)


@pytest.fixture
def entry(tmp_path):
    return tmp_path / "root" / "kind" / "name"


def test_an_entry_is_built_once_private_until_sealed(entry):
    fill = Builds()
    old = os.umask(0o002)  # a group-writable umask must not make a group-writable entry
    try:
        assert cached_dir(entry, fill) == entry
    finally:
        os.umask(old)
    assert cached_dir(entry, fill) == entry and fill.count == 1
    assert fill.modes == [0o700]  # nobody else can reach the staging directory while it is filled
    assert stat.S_IMODE(entry.stat().st_mode) == 0o755
    assert stat.S_IMODE((entry / "thing.o").stat().st_mode) == 0o644


@pytest.mark.parametrize("loosen", ["entry", "file"])
def test_an_entry_of_ours_others_may_write_is_built_again(entry, loosen):
    fill = Builds()
    cached_dir(entry, fill)
    os.chmod(entry if loosen == "entry" else entry / "thing.o", 0o777 if loosen == "entry" else 0o666)
    cached_dir(entry, fill)
    assert fill.count == 2 and (entry / "thing.o").read_bytes() == b"built 2"


@pytest.mark.parametrize("damage", ["symlink", "subdirectory", "file entry"])
def test_a_damaged_entry_is_built_again(entry, tmp_path, damage):
    fill = Builds()
    cached_dir(entry, fill)
    if damage == "symlink":  # a link to a file elsewhere, in place of the object
        (tmp_path / "elsewhere.o").write_bytes(b"planted")
        (entry / "thing.o").unlink()
        (entry / "thing.o").symlink_to(tmp_path / "elsewhere.o")
    elif damage == "subdirectory":
        (entry / "nested").mkdir()
    else:
        for path in entry.iterdir():
            path.unlink()
        entry.rmdir()
        entry.write_bytes(b"not a directory")
    assert cached_dir(entry, fill) == entry
    assert fill.count == 2 and (entry / "thing.o").read_bytes() == b"built 2"
    if damage == "symlink":  # what the link pointed at is left alone
        assert (tmp_path / "elsewhere.o").read_bytes() == b"planted"


def test_an_entry_another_process_moves_away_while_it_is_checked_is_built_again(entry, tmp_path, monkeypatch):
    """Two processes meeting one untrusted entry (an old cache) both discard it: the one whose scan found it gone
    raised FileNotFoundError out of cached_dir (21 of 150 trials of two processes, in a review)."""
    fill = Builds()
    cached_dir(entry, fill)
    real = os.scandir

    def moved_first(path):
        if path == entry and not (tmp_path / "moved").exists():  # once: the other process's discard lands
            os.replace(entry, tmp_path / "moved")  # between this one's stat and its scan
        return real(path)

    monkeypatch.setattr("berm_sdk.cache.os.scandir", moved_first)
    assert cached_dir(entry, fill) == entry and fill.count == 2


def test_our_kind_directory_is_made_private_to_write(entry):
    entry.parent.mkdir(parents=True)
    os.chmod(entry.parent, 0o777)
    cached_dir(entry, Builds())
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o755


@as_root
@pytest.mark.parametrize("theirs", ["entry", "file", "kind", "root"])
def test_what_another_user_owns_is_refused(entry, theirs):
    fill = Builds()
    cached_dir(entry, fill)
    path = {"entry": entry, "file": entry / "thing.o", "kind": entry.parent, "root": entry.parent.parent}[theirs]
    os.chown(path, 12345, 12345)
    with pytest.raises(BuildError, match=r"refusing the SDK cache .*belongs to user 12345"):
        cached_dir(entry, fill)
    assert fill.count == 1


def test_our_root_loses_group_and_other_write_unless_sticky(entry):
    root = entry.parent.parent
    root.mkdir(parents=True)
    os.chmod(root, 0o777)
    cached_dir(entry, Builds())
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    os.chmod(root, 0o1777)  # sticky, like /tmp: others cannot move what is ours
    assert cached_dir(entry, Builds()) == entry and stat.S_IMODE(root.stat().st_mode) == 0o1777


def test_a_fill_that_leaves_a_symlink_is_refused_without_touching_its_target(entry, tmp_path):
    """Sealing the staging directory sets its files' modes: a symlink there (no fill of ours makes one) is left
    alone — never followed to chmod what it points at — and the entry fails its check."""
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x")
    os.chmod(target, 0o600)
    with pytest.raises(BuildError, match="did not verify"):
        cached_dir(entry, lambda staging: (staging / "link.o").symlink_to(target))
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_entry_this_user_cannot_move_aside_is_a_build_error(entry, monkeypatch):
    """Found by a review: an entry others may write that this user may not move (root's, in a shared cache written
    under umask 002) was a PermissionError traceback out of berm build, not an error naming it."""
    cached_dir(entry, Builds())
    os.chmod(entry, 0o775)  # others may write it: to be rebuilt

    def refused(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(BuildError, match="may be written by others, and cannot be rebuilt by this user: Permission"):
        cached_dir(entry, Builds())


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped"])
def test_an_entry_whose_file_is_not_what_was_built_is_built_again(entry, damage):
    """Found by a review: an entry recorded nothing of what it held, so a file cut short (a crash before its data
    reached the disk) was served as it was, for ever. Each file's SHA-256 is recorded and checked at every use."""
    fill = Builds()
    cached_dir(entry, fill)
    thing = entry / "thing.o"
    data = thing.read_bytes()
    thing.write_bytes({"empty": b"", "truncated": data[:-1], "flipped": data[:-1] + bytes([data[-1] ^ 1])}[damage])
    assert cached_dir(entry, fill) == entry
    assert fill.count == 2 and thing.read_bytes() == b"built 2"
    assert cached_dir(entry, fill) == entry and fill.count == 2


def test_an_entry_reaches_the_disk_before_it_is_renamed_into_place(entry, monkeypatch):
    """Nothing was fsynced: after a crash, the renamed entry could hold files cut short."""
    synced, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        synced.append("renamed")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    cached_dir(entry, Builds())
    assert "renamed" in synced
    before = synced[:synced.index("renamed")]
    assert {"thing.o", RECORD} <= set(before), synced


def test_what_killed_builds_left_is_swept_by_the_next_build(entry):
    """Found by a review: a build killed midway left its staging directory (and a discard killed midway its damaged
    entry moved aside), and nothing ever removed them. The next build removes them when no build is staging."""
    kind = entry.parent
    kind.mkdir(parents=True)
    (kind / ".staging-killed").mkdir()
    (kind / ".staging-killed" / "half.o").write_bytes(b"half")
    (kind / ".bad-name-1-2").mkdir()
    (kind / ".bad-other-1-2").write_bytes(b"")
    cached_dir(entry, Builds())
    assert sorted(p.name for p in kind.iterdir()) == [".lock", "name"]
    assert stat.S_IMODE((kind / ".lock").stat().st_mode) == 0o600


def test_a_build_in_progress_keeps_its_staging(entry):
    """The sweep leaves what a live build is staging: a build started while another fills its entry sweeps
    nothing."""
    other = entry.with_name("other")

    def fill(staging):
        (staging / "first.o").write_bytes(b"1")
        cached_dir(other, Builds())  # meanwhile, another build in the same kind directory
        (staging / "second.o").write_bytes(b"2")

    cached_dir(entry, fill)
    assert sorted(p.name for p in entry.iterdir()) == [RECORD, "first.o", "second.o"]
    assert (other / "thing.o").read_bytes() == b"built 1"
