"""The code cache: a hit after a miss, corrupt or truncated entries rebuilt, every code-generation input in the
key, and two processes compiling the same image at once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from berm_aot import _checksum as checksum
from berm_aot.cache import RECORD_NAME, SO_NAME, CodeCache
from berm_aot.elf import read_elf
from berm_aot.program import Program
import berm_abi
import berm_aot
from berm_host.aot.objects import TRANSLATOR_DIGEST, cached_object, object_key, source_digest
from berm_host.backend import RunRequest
from berm_host.engine import Engine
from berm_host.layout import layout_for
from tests.guests import guest_elf

SOURCE = "unsigned long v;\nunsigned long triple(unsigned long x) { return 3 * x + v; }\nvoid _start(void) {}\n"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def elf():
    return guest_elf(SOURCE, keep=("triple",))


def windows(image):
    return layout_for(image).windows()


def triple(engine: Engine, elf: bytes) -> int:
    image = engine.load(elf)
    return image.backend.run(RunRequest(entry=image.program.symbol("triple"), int_args=(14,))).a0


def test_every_translator_module_is_in_the_key(tmp_path):
    """Editing any module of the translator or of berm_abi (whose host-call numbers the code inlines), or adding
    one, changes the key: a listed subset of modules once left the sp-group, stack-pointer and dataflow analyses
    out, so editing them reused stale objects."""
    import shutil
    copies = []
    for package in (berm_aot, berm_abi):
        copies.append(tmp_path / package.__name__)
        shutil.copytree(Path(package.__file__).resolve().parent, copies[-1],
                        ignore=shutil.ignore_patterns("__pycache__"))
    digest = lambda: source_digest(berm_aot.sources_digest(*copies))  # noqa: E731
    assert digest() == TRANSLATOR_DIGEST
    seen = {digest()}
    modules = sorted(m for copy in copies for m in copy.rglob("*.py"))
    for module in modules:
        module.write_bytes(module.read_bytes() + b"\n# edited\n")
        seen.add(digest())
    (copies[0] / "emit" / "new_pass.py").write_text("X = 1\n")
    seen.add(digest())
    assert len(seen) == len(modules) + 2


def test_the_key_is_of_the_translator_the_process_imported(tmp_path):
    """The digest was read from disk at the first compile: a process started before an upgrade filed what its old
    emitter wrote under the new translator's key, and later processes loaded that stale object. It is the source
    the process imported."""
    import shutil
    for name in ("berm_aot", "berm_abi", "berm_host"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from pathlib import Path
        import berm_host.engine  # a daemon's start: the decoder and program model, not yet the emitter
        if sys.argv[1] == "upgrade":  # lands on disk now, before the first load imports the emitter
            emitter = Path({str(tmp_path / "berm_aot" / "emit" / "insn.py")!r})
            emitter.write_text(emitter.read_text() + "# upgraded on disk\\n")
        from berm_host.aot import objects
        print(objects.TRANSLATOR_DIGEST)
    """)
    digests = [subprocess.run([sys.executable, "-c", script, step], capture_output=True, text=True, timeout=120)
               for step in ("before", "upgrade")]
    assert all(d.returncode == 0 for d in digests), [d.stderr for d in digests]
    assert digests[0].stdout == digests[1].stdout


def test_hit_after_miss(tmp_path, elf):
    image = read_elf(elf)
    cache = CodeCache(tmp_path)
    first, built = cached_object(image, windows(image), cache, lambda: Program.from_image(image))
    assert built
    second, built = cached_object(image, windows(image), cache, lambda: pytest.fail("a hit needs no program"))
    assert not built and second == first
    assert Engine(cache_dir=tmp_path).load(elf).backend.compiled is False
    assert triple(Engine(cache_dir=tmp_path), elf) == 42


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_digest", "digest_not_text", "truncate_and_record",
                                    "not_elf_and_record"])
def test_corrupt_entry_is_rebuilt(tmp_path, elf, damage):
    image = read_elf(elf)
    program = lambda: Program.from_image(image)  # noqa: E731
    cache = CodeCache(tmp_path)
    so, _ = cached_object(image, windows(image), cache, program)
    data = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        so.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "delete_digest":
        (so.parent / RECORD_NAME).unlink()
    elif damage == "digest_not_text":  # not UTF-8: read_text raised UnicodeDecodeError out of Engine.load
        (so.parent / RECORD_NAME).write_bytes(b"\xff\xfe")
    else:  # the record rewritten to match: a truncated object killed the process with SIGBUS in dlopen (found by a
        # hostile review), and one that is no ELF failed every load, never rebuilt
        damaged = data[: len(data) // 2] if damage == "truncate_and_record" else b"not an object"
        so.write_bytes(damaged)
        (so.parent / RECORD_NAME).write_text(checksum.data(damaged) + "\n")
    assert cache.lookup(object_key(image, windows(image))) is None
    again, built = cached_object(image, windows(image), cache, program)
    assert built
    assert cache.lookup(object_key(image, windows(image))) == again
    assert triple(Engine(cache_dir=tmp_path), elf) == 42


def test_key_covers_compiler_flags(monkeypatch, elf):
    image = read_elf(elf)
    plain = object_key(image, windows(image))
    monkeypatch.setenv("BERM_CFLAGS", "-O2")
    assert object_key(image, windows(image)) != plain
    assert object_key(image, windows(image), prefix="p_") != object_key(image, windows(image))


def test_env_overrides_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("BERM_CACHE_DIR", str(tmp_path / "env"))
    assert CodeCache().root == tmp_path / "env"


def test_an_empty_cache_dir_is_refused_not_the_current_directory(tmp_path, monkeypatch):
    """Engine refused "" and CodeCache, which every other caller (berm-compile) makes, took it as the current
    directory (found by a review)."""
    monkeypatch.chdir(tmp_path)
    for empty in ("", b""):
        with pytest.raises(ValueError, match="the cache directory is empty"):
            CodeCache(empty)
    assert CodeCache(".").root == tmp_path


def test_two_processes_compile_the_same_image(tmp_path, elf):
    elf_path = tmp_path / "g.elf"
    elf_path.write_bytes(elf)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from berm_aot.cache import CodeCache
        from berm_aot.elf import read_elf
        from berm_aot.program import Program
        from berm_host.aot.objects import cached_object
        from berm_host.layout import layout_for
        image = read_elf(open({str(elf_path)!r}, 'rb').read())
        path, built = cached_object(image, layout_for(image).windows(), CodeCache({str(tmp_path / 'cache')!r}),
                                    lambda: Program.from_image(image), jobs=1)
        print(int(built), path)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    built = sorted(int(o[0].split()[0]) for o in outs)
    paths = {o[0].split()[1] for o in outs}
    assert built == [0, 1]  # the second waited on the lock and found the first's entry
    assert len(paths) == 1
    assert triple(Engine(cache_dir=tmp_path / "cache"), elf) == 42


def test_the_headers_translated_code_needs_ship_with_the_package():
    """A wheel holds only the package data pyproject.toml names: every header the translated code is compiled
    against must match it (a wheel built without them could translate nothing)."""
    import fnmatch
    import tomllib

    from berm_host.aot.objects import HEADERS

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["berm_host"]
    package = ROOT / "berm_host"
    for header in HEADERS:
        name = str(header.relative_to(package))
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not in berm_host's package data"


def _built(tmp_path, elf) -> tuple[CodeCache, str, Path]:
    image = read_elf(elf)
    cache = CodeCache(tmp_path / "cache")
    so, built = cached_object(image, windows(image), cache, lambda: Program.from_image(image))
    assert built
    return cache, object_key(image, windows(image)), so


def test_a_failing_lookup_is_an_error_not_a_corrupt_entry(tmp_path, elf, monkeypatch):
    """A process out of file descriptors moved a valid shared entry aside as if it were corrupt."""
    import errno
    import os as os_module

    from berm_aot import cache as cache_module
    from berm_aot.errors import CompileError
    cache, key, so = _built(tmp_path, elf)
    real_open = os_module.open

    def no_descriptors(path, *args, **kwargs):
        if str(path).endswith(SO_NAME):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cache_module.os, "open", no_descriptors)
    with pytest.raises(CompileError, match="Too many open files"):
        cache.get_or_build(key, lambda out: pytest.fail("nothing to build: the entry is whole"))
    monkeypatch.undo()
    assert cache.lookup(key) == so


@pytest.mark.parametrize("damage", ["symlink_to_device", "directory", "fifo"])
def test_an_entry_that_is_not_a_regular_file_is_rebuilt(tmp_path, elf, damage):
    """The digest followed a symlink to /dev/zero (MemoryError) and blocked forever on a FIFO."""
    import os as os_module
    cache, key, so = _built(tmp_path, elf)
    whole = so.read_bytes()
    so.unlink()
    if damage == "symlink_to_device":
        so.symlink_to("/dev/zero")
    elif damage == "directory":
        so.mkdir()
    else:
        os_module.mkfifo(so)
    assert cache.lookup(key) is None
    rebuilt, built = cache.get_or_build(key, lambda out: out.write_bytes(whole))
    assert built and rebuilt == so and so.is_file() and not so.is_symlink()


def test_an_entry_others_may_write_is_rebuilt_and_its_shard_repaired(tmp_path, elf):
    """In a cache shared with other users (a BERM_CACHE_DIR under /tmp), or one written under umask 002, an entry
    others could write or swap would be code run in this process: it is rebuilt; this user's own shard directory is
    set back to 0755 (refusing it broke every load of an old cache for good)."""
    import stat as stat_module
    cache, key, so = _built(tmp_path, elf)
    for path in (so, so.parent):
        path.chmod(path.stat().st_mode | 0o020)
        assert cache.lookup(key) is None
        again, built = cached_object(read_elf(elf), windows(read_elf(elf)), cache,
                                     lambda: Program.from_image(read_elf(elf)))
        assert built and again == so and not path.stat().st_mode & 0o022
    shard = so.parent.parent
    shard.chmod(0o777)
    assert cache.lookup(key) == so and stat_module.S_IMODE(shard.stat().st_mode) == 0o755


def test_directories_are_0755_whatever_the_umask(tmp_path, elf):
    """mkdir's mode is masked by the umask: under 077 the shard came out 0700, and a daemon running as another user
    could not read what berm-compile had filled."""
    import os as os_module
    import stat as stat_module
    old = os_module.umask(0o077)
    try:
        cache, key, so = _built(tmp_path, elf)
        cache.write_blob("cd" * 32, "facts", b"x")
    finally:
        os_module.umask(old)
    for path in (so.parent, so.parent.parent, cache.entry("cd" * 32), cache.entry("cd" * 32).parent):
        assert stat_module.S_IMODE(path.stat().st_mode) == 0o755, path


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_an_entry_another_user_owns_is_refused(tmp_path, elf):
    import os as os_module

    from berm_aot.errors import CompileError
    cache, key, so = _built(tmp_path, elf)
    os_module.chown(so, 12345, 12345)
    with pytest.raises(CompileError, match="belongs to user 12345"):
        cache.lookup(key)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_an_entry_lock_another_user_owns_is_refused_by_name(tmp_path, elf):
    """Found by a review: narrowing another user's lock file (left 0666 from a cache shared under umask 002) failed
    with a bare PermissionError naming nothing, and berm-compile printed a traceback."""
    import os as os_module

    from berm_aot.errors import CompileError
    image = read_elf(elf)
    cache, key = CodeCache(tmp_path / "cache"), object_key(image, windows(image))
    lock = cache.entry(key).parent / f"{key}.lock"
    lock.parent.mkdir(parents=True, mode=0o755)
    lock.touch(mode=0o666)
    os_module.chmod(lock, 0o666)
    os_module.chown(lock, 12345, 12345)
    with pytest.raises(CompileError, match=re.escape(f"{lock}: the lock file belongs to uid 12345")):
        cached_object(image, windows(image), cache, lambda: Program.from_image(image))


def test_entries_are_readable_by_other_users(tmp_path, elf):
    """Entries were 0700 (mkdtemp): a cache filled by berm-compile as root could not serve a daemon running as
    another user."""
    import stat as stat_module
    cache, key, so = _built(tmp_path, elf)
    for path, mode in ((so, 0o755), (so.parent, 0o755), (so.parent.parent, 0o755),
                       (so.parent / RECORD_NAME, 0o644)):
        assert stat_module.S_IMODE(path.stat().st_mode) == mode, path


def killed_writing(cache: CodeCache, key: str, name: str) -> None:
    """A process writing the blob (key, name) killed before its temporary file is renamed into place."""
    import os
    pid = os.fork()
    if pid == 0:  # the child never returns into the test runner, whatever it meets
        try:
            os.replace = lambda *_: os._exit(0)
            cache.write_blob(key, name, b"half")
        finally:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_what_a_killed_compile_left_is_swept_by_the_next_builder(tmp_path, elf):
    """What builders of this key left, and (found by a review) what builders of any other key left, which stayed
    for ever when that key was never built again; but not what a build at work holds (its key's lock is held)."""
    import fcntl
    cache, key, so = _built(tmp_path, elf)
    shard = so.parent.parent
    (shard / f".{key}-left1").mkdir()
    (shard / f".{key}-left1" / "unit0.c").write_text("partial")
    (shard / f".bad-{key}-99-1").mkdir()
    gone, busy = "f1" + "0" * 62, "f2" + "0" * 62
    for other in (gone, busy):
        (cache.entry(other).parent / f".{other}-x1").mkdir(parents=True)
        (cache.entry(other).parent / f".{other}-x1" / "unit3.o").write_bytes(b"\0" * 1000)
        (cache.entry(other).parent / f".bad-{other}-7-1").mkdir()
    (shard / f".{'0' * 64}-elsewhere").mkdir()  # not in its key's shard: no builder's, left alone
    blob = "f3" + "0" * 62
    cache.write_blob(blob, "facts", b"stored")
    killed_writing(cache, blob, "facts")
    (so.parent / RECORD_NAME).write_text("0" * 24 + "\n")  # corrupt: the next load rebuilds
    whole = so.read_bytes()
    with open(cache.entry(busy).parent / f"{busy}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: to flock, another process
        _, built = cache.get_or_build(key, lambda out: out.write_bytes(whole))
    assert built
    assert sorted(p.name for p in shard.iterdir() if p.name.startswith(".")) == [f".{'0' * 64}-elsewhere"]
    assert not [p for p in cache.entry(gone).parent.iterdir() if p.name.startswith(".")]
    assert not list(cache.entry(blob).parent.rglob(".*"))  # beside the blob's entry, and in it
    assert cache.read_blob(blob, "facts") == b"stored"
    assert sorted(p.name for p in cache.entry(busy).parent.iterdir() if p.name.startswith(".")) == [
        f".bad-{busy}-7-1", f".{busy}-x1"]


def test_a_blob_others_may_write_is_derived_again(tmp_path):
    """Stored image facts (segments, exports, manifest) decide what a cached load runs: they pass the same checks
    as an object (one others may write is not read: the facts are derived from the ELF again and rewritten), and
    are readable by other users."""
    import stat as stat_module
    cache, key = CodeCache(tmp_path / "cache"), "ab" * 32
    cache.write_blob(key, "facts", b"stored")
    blob = cache.entry(key) / "facts"
    assert cache.read_blob(key, "facts") == b"stored"
    assert stat_module.S_IMODE(blob.stat().st_mode) == 0o644
    for path in (blob, blob.parent):
        mode = path.stat().st_mode
        path.chmod(mode | 0o020)
        assert cache.read_blob(key, "facts") is None
        path.chmod(mode)
    assert cache.read_blob(key, "facts") == b"stored"


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="playing another user needs root")
def test_a_shard_or_root_another_user_owns_is_refused_before_building(tmp_path, elf):
    """Another user created the shard (in a shared 1777 cache root) and swapped the entry this process had just
    built, before it was loaded: a shard or root another user owns is refused, and a fresh entry is verified
    before it is returned."""
    import os as os_module

    from berm_aot.errors import CompileError
    image = read_elf(elf)
    key = object_key(image, windows(image))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os_module.chmod(shared, 0o1777)
    (shared / key[:2]).mkdir()
    os_module.chown(shared / key[:2], 12345, 12345)
    with pytest.raises(CompileError, match="belongs to user 12345"):
        cached_object(image, windows(image), CodeCache(shared), lambda: Program.from_image(image))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os_module.chown(theirs, 12345, 12345)
    with pytest.raises(CompileError, match="belongs to user 12345"):
        cached_object(image, windows(image), CodeCache(theirs), lambda: Program.from_image(image))
    os_module.rmdir(shared / key[:2])
    so, built = cached_object(image, windows(image), CodeCache(shared), lambda: Program.from_image(image))
    assert built and so.is_file()  # a sticky root anyone may write is fine: others cannot move what is ours


def test_an_entry_renamed_under_another_images_key_is_refused(tmp_path):
    """Every entry was internally consistent, but nothing tied it to its key: with write access to a shard, a valid
    object of one image renamed under another's key ran in its place. The object carries its key, checked at load.

    The image is this test's own: dlopen gives back an object the process has loaded under the same name without
    opening the file, and the name (``CodeCache.loadable``: the root's descriptor number, the key) recurs when an
    earlier test of the worker loaded the module's image and its cache's descriptor number was reused (CI failed so).
    Harmless in use (a name carries its key, so it is that image's code), but it would skip the check tested here."""
    import shutil

    from berm_host.traps import HostError
    elf = guest_elf(SOURCE.replace("3 * x", "7 * x"), keep=("triple",))
    other = guest_elf(SOURCE.replace("3 * x", "5 * x"), keep=("triple",))
    assert triple(Engine(cache_dir=tmp_path), other) == 70
    cache, image = CodeCache(tmp_path), read_elf(elf)
    theirs = cache.entry(object_key(read_elf(other), windows(read_elf(other))))
    mine = cache.entry(object_key(image, windows(image)))
    mine.parent.mkdir(mode=0o755, exist_ok=True)
    shutil.copytree(theirs, mine)
    assert cache.lookup(object_key(image, windows(image))) == mine / SO_NAME  # it verifies as an entry...
    # ... but is not this image's code; the error names the file to remove (it named /proc/self/fd/N/…: a review)
    with pytest.raises(HostError, match=re.escape(f"{mine / SO_NAME} was compiled for another image")):
        Engine(cache_dir=tmp_path).load(elf)


def test_a_new_process_loads_a_cached_image_without_running_the_compiler(tmp_path, elf):
    """The compiler's version line, part of the key, is kept in the cache (berm_aot/cc.py, ``version``): running
    ``cc --version`` was most of a process's first cached load. A process keeps the line in each cache it uses (in
    one that lacks it, it asks the compiler again: its own memo may be of a compiler replaced since); a new process
    then loads from the second cache with every way to start a program taken away."""
    for cache in ("first", "second"):
        assert triple(Engine(cache_dir=tmp_path / cache), elf) == 42
    child = textwrap.dedent("""
        import subprocess, sys
        def refused(*args, **kwargs):
            raise AssertionError(f"a cached load started {args[0]!r}")
        subprocess.run = subprocess.Popen = refused
        from pathlib import Path
        from berm_host.engine import Engine
        image = Engine(cache_dir=Path(sys.argv[1])).load(Path(sys.argv[2]).read_bytes())
        assert image.backend.compiled is False
    """)
    (tmp_path / "image.elf").write_bytes(elf)
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "second"), str(tmp_path / "image.elf")],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr


def test_the_root_may_be_a_symlink(tmp_path, elf):
    """A cache directory chosen as a symlink (to another disk) is followed; nothing below the root is."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert triple(Engine(cache_dir=tmp_path / "link"), elf) == 42
    assert Engine(cache_dir=tmp_path / "link").load(elf).backend.compiled is False


def test_a_root_under_a_directory_others_may_write_is_refused(tmp_path, elf):
    """The root passed every check, but its parent was writable by another user, who swapped the root for a
    look-alike between the check of an object and its dlopen (which opens it by path again): the review's own
    constructor ran in the host. A sticky parent (/tmp) is fine: others cannot move what is ours."""
    import os as os_module

    from berm_aot.errors import CompileError
    image = read_elf(elf)
    parent = tmp_path / "team"
    parent.mkdir()
    os_module.chmod(parent, 0o777)
    with pytest.raises(CompileError, match=r"team above it may be written by others \(mode 777\) and is not sticky"):
        cached_object(image, windows(image), CodeCache(parent / "cache"), lambda: Program.from_image(image))
    assert not (parent / "cache").exists()  # refused before anything was made
    os_module.chmod(parent, 0o1777)
    so, built = cached_object(image, windows(image), CodeCache(parent / "cache"), lambda: Program.from_image(image))
    assert built and so.is_file()


def test_a_symlinked_root_is_resolved_once(tmp_path):
    """Retargeting the symlink later (its owner may) does not move a cache made through it."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    cache = CodeCache(tmp_path / "link")
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    assert cache.entry("ab" * 32).parent.parent == tmp_path / "real"


def test_a_symlink_put_where_the_root_was_missing_is_refused(tmp_path, elf):
    """Found by a review: a root that did not exist when the cache was made (or that a /tmp cleaner removed) stays a
    plain path; another user put a symlink there to a root-owned sticky directory, which passed every check, and
    the host dlopened the object they put in its place: its constructor ran in the host."""
    from berm_aot.errors import CompileError

    image = read_elf(elf)
    cache = CodeCache(tmp_path / "cache")  # no such directory yet
    (tmp_path / "theirs").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "theirs")
    with pytest.raises(CompileError, match="cache: it is a symlink now"):
        cached_object(image, windows(image), cache, lambda: Program.from_image(image))
    assert not any((tmp_path / "theirs").iterdir())


def test_an_object_is_loaded_through_the_root_it_was_checked_in(tmp_path, elf):
    """Found by a review: the object was dlopened by path after its checks, so a root removed meanwhile and replaced
    by another user's symlink loaded their object. dlopen's name goes through a descriptor of the checked root:
    whatever is put at the root's path afterwards, it names the object checked (here the root is renamed away,
    so that it still exists to compare with); and a root replaced before is opened again, or refused."""
    import os as os_module

    from berm_aot.errors import CompileError

    cache, key, so = _built(tmp_path, elf)
    checked = so.read_bytes()
    name = cache.loadable(so)
    assert name.startswith("/proc/self/fd/") and Path(name).read_bytes() == checked
    os_module.rename(tmp_path / "cache", tmp_path / "moved")
    (tmp_path / "theirs" / so.relative_to(tmp_path / "cache")).parent.mkdir(parents=True)
    (tmp_path / "theirs" / so.relative_to(tmp_path / "cache")).write_bytes(b"their object")
    (tmp_path / "cache").symlink_to(tmp_path / "theirs")
    assert Path(name).read_bytes() == checked  # what dlopen opens now: the object checked
    with pytest.raises(CompileError, match="cannot use the code cache at .*cache: Not a directory"):
        cache.loadable(so)  # the next load: the root is no longer the directory its descriptor names
    (tmp_path / "cache").unlink()
    os_module.rename(tmp_path / "moved", tmp_path / "cache")
    assert Path(cache.loadable(so)).read_bytes() == checked


def test_directories_made_above_the_root_are_not_writable_by_others_under_umask_002(tmp_path, elf):
    """Found by a review: ``mkdir -p`` gave the parents it made the umask's mode, 0775 under umask 002, and the
    checks then refused the cache they had just made, on every run ("may be written by others")."""
    import os as os_module
    import stat as stat_module

    image = read_elf(elf)
    old = os_module.umask(0o002)
    try:
        so, built = cached_object(image, windows(image), CodeCache(tmp_path / "home" / ".cache" / "berm" / "code"),
                                  lambda: Program.from_image(image))
    finally:
        os_module.umask(old)
    assert built
    for d in (tmp_path / "home", tmp_path / "home" / ".cache", tmp_path / "home" / ".cache" / "berm"):
        assert stat_module.S_IMODE(d.stat().st_mode) == 0o755, d


def test_an_entrys_lock_file_is_private(tmp_path):
    """Lock files were 0644, and flock needs only a descriptor opened for reading: another local user could hold an
    entry's lock for as long as they liked (found by a review). They are 0600."""
    import stat as stat_module

    from berm_aot.errors import CompileError
    cache, key = CodeCache(tmp_path / "cache"), "ab" * 32
    with pytest.raises(CompileError, match="did not verify"):  # not an object; the lock was taken all the same
        cache.get_or_build(key, lambda out: out.write_bytes(b"x"))
    lock = cache.entry(key).parent / f"{key}.lock"
    assert stat_module.S_IMODE(lock.stat().st_mode) == 0o600


def test_a_lock_held_for_too_long_is_an_error_naming_it(tmp_path, monkeypatch):
    """Found by a review: another user holding an entry's lock (or a berm-compile stopped with Ctrl-Z) made the
    owner's next rebuild of it wait for ever, in silence. The wait is bounded, and the error names the lock; an old
    lock file others could read is narrowed to 0600."""
    import os as os_module
    import stat as stat_module

    from berm_aot import cache as cache_module
    from berm_aot import cc as cc_module
    from berm_aot.errors import CompileError
    cache, key = CodeCache(tmp_path / "cache"), "cd" * 32
    lock = cache.entry(key).parent / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    lock.touch(mode=0o644)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fcntl.flock(os.open({str(lock)!r}, os.O_RDONLY), fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(300)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(cc_module, "COMPILE_TIMEOUT", 0)
        monkeypatch.setattr(cache_module, "LOCK_MARGIN", 0.3)
        with pytest.raises(CompileError, match=f"lock {lock} is held by another process"):
            cache.get_or_build(key, lambda out: pytest.fail("built without the lock"))
    finally:
        holder.kill()
        holder.wait()
    assert stat_module.S_IMODE(lock.stat().st_mode) == 0o600
    assert not os_module.path.exists(cache.entry(key))


def test_the_headers_compiled_are_those_the_key_covers(tmp_path, elf):
    """Found by a review: the key covered the runtime headers as the process imported them, but the compiler read
    them from disk when it compiled, so a header changed in between (an upgrade landing under a running daemon) went
    into an object filed under the old header's key. The compiler is given the bytes the key covers."""
    import shutil
    for name in ("berm_aot", "berm_abi", "berm_host"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "g.elf").write_bytes(elf)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from pathlib import Path
        from berm_host.aot import objects  # the key's header bytes are taken now
        from berm_host.backend import RunRequest
        from berm_host.engine import Engine
        header = Path({str(tmp_path / "berm_host" / "aot" / "berm_code.h")!r})
        header.write_text(header.read_text() + '#error "the header as it is on disk now"\\n')  # the upgrade lands
        image = Engine(cache_dir={str(tmp_path / "cache")!r}).load({str(tmp_path / "g.elf")!r})
        print(image.backend.run(RunRequest(entry=image.program.symbol("triple"), int_args=(14,))).a0)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["42"]


def test_a_child_forked_while_another_thread_opens_an_object_can_open_one(tmp_path, elf):
    """Found by a review: a fork while another thread was in ``loadable`` (every cached load) left the child's copy
    of its lock held, and the child's own first load waited for ever (3 of 3 children)."""
    import os
    import threading
    import time

    cache, key, so = _built(tmp_path, elf)
    stop = threading.Event()

    def opening() -> None:
        while not stop.is_set():
            cache.loadable(so)

    opener = threading.Thread(target=opening)
    opener.start()
    statuses = []
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # the child: open it too, or be killed after 10 s (a hang); never back into the runner
                try:
                    signal.alarm(10)
                    cache.loadable(so)
                    os._exit(0)
                finally:
                    os._exit(1)
            statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            time.sleep(0.002)
    finally:
        stop.set()
        opener.join()
    assert statuses == [0] * 20


def test_a_load_in_a_removed_working_directory_finds_the_cached_object(tmp_path, elf, monkeypatch):
    """Found by a review: in a process whose working directory was removed (a daemon started in a temporary
    directory), every load failed with a bare FileNotFoundError from os.getcwd(), cached ones included."""
    from berm_aot import cc

    assert triple(Engine(cache_dir=tmp_path / "cache"), elf) == 42
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    monkeypatch.setattr(cc, "_toolchains", {})  # as a fresh process's first load
    cc._absolute.cache_clear()
    engine = Engine(cache_dir=tmp_path / "cache")
    assert triple(engine, elf) == 42
    assert engine.load(elf).backend.compiled is False
