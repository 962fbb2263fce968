"""The C compiler driver (berm_aot/cc.py): units compile in parallel into one shared object, a unit that does not
compile is a CompileError naming it, and a generator of units is compiled as it goes — the first unit's compile has
finished before the generator is asked for the second (the translation overlaps the compiles), and a unit that
finishes frees its place at once, whatever older unit still compiles; the disk holds a few units' C at a time. What
the environment could slip into the object stays out of it, a timeout kills every program the compiler started, and
a disk that takes no more is a CompileError."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import pytest

from berm_aot import cc
from berm_aot.errors import CompileError


def unit(k: int) -> str:
    return f"__attribute__((visibility(\"default\"))) int answer{k}(void) {{ return {k} * 7; }}\n"


@pytest.mark.parametrize("jobs", [1, 2])
def test_units_compile_into_one_object(tmp_path, jobs):
    out = tmp_path / "lib.so"
    cc.compile_shared([unit(k) for k in range(5)], out, jobs=jobs)
    lib = ctypes.CDLL(str(out))
    assert [getattr(lib, f"answer{k}")() for k in range(5)] == [0, 7, 14, 21, 28]


def test_a_unit_that_does_not_compile_is_named(tmp_path):
    with pytest.raises(CompileError, match=r"cc failed on unit2\.c"):
        cc.compile_shared([unit(0), unit(1), "int broken( {\n", unit(3)], tmp_path / "lib.so")
    assert not (tmp_path / "lib.so").exists()
    assert not list(tmp_path.glob("berm-cc-*"))  # the work directory is gone


def test_a_generator_is_compiled_as_it_goes(tmp_path):
    def units():
        yield unit(0)
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("berm-cc-*/unit0.o")):  # unit 0 compiles while this generator waits
            assert time.monotonic() < deadline, "unit 0 did not compile before unit 1 was asked for"
            time.sleep(0.01)
        yield unit(1)

    out = tmp_path / "lib.so"
    cc.compile_shared(units(), out, jobs=2)
    assert ctypes.CDLL(str(out)).answer1() == 7


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_disk_holds_a_few_units_at_a_time(tmp_path, jobs):
    """A generator is asked for its next unit only once at most one unit waits for a compiler, and a compiled unit's
    source is deleted: the C on disk is what the compilers hold and one unit more, not the whole program (all of a
    program's units were written as fast as they were translated, and kept to the end)."""
    on_disk = []

    def units():
        for k in range(8):
            on_disk.append(len(list(tmp_path.glob("berm-cc-*/unit*.c"))))
            yield unit(k)

    out = tmp_path / "lib.so"
    cc.compile_shared(units(), out, jobs=jobs)
    assert ctypes.CDLL(str(out)).answer7() == 49
    assert max(on_disk) <= jobs + 1


def test_a_finished_unit_frees_its_place_while_an_older_one_compiles(tmp_path, monkeypatch):
    """The driver waited for the oldest compile: a younger unit that finished first left its core idle until the
    oldest ended. The stand-in compiler here compiles unit 0 only once unit 2 has started, which with two at a
    time happens only if unit 1's place is taken as soon as unit 1 finishes."""
    started = tmp_path / "unit2-started"
    fake = tmp_path / "orderedcc"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for a; do case $a in *.c) src=$a;; esac; done
        if [ -n "$src" ] && grep -q WAITS "$src"; then
            i=0
            while [ ! -e {started} ]; do
                i=$((i + 1)); [ $i -gt 300 ] && {{ echo "unit 2 never started"; exit 1; }}
                sleep 0.05
            done
        fi
        if [ -n "$src" ] && grep -q STARTS "$src"; then touch {started}; fi
        exec cc "$@"
    """))
    fake.chmod(0o755)
    monkeypatch.setenv("BERM_CC", str(fake))
    out = tmp_path / "lib.so"
    cc.compile_shared(["/* WAITS */\n" + unit(0), unit(1), "/* STARTS */\n" + unit(2)], out, jobs=2)
    assert ctypes.CDLL(str(out)).answer2() == 14


def test_identity_keeps_each_flag_whole():
    """Flags joined with spaces made ["-DX=1 -O0"] and ["-DX=1", "-O0"] one identity: the second configuration
    loaded the first one's objects."""
    assert cc.identity(("-O1", "-DUNUSED=1 -O0")) != cc.identity(("-O1", "-DUNUSED=1", "-O0"))


def test_another_compiler_earlier_on_path_is_another_identity(tmp_path, monkeypatch):
    """Only the command and its version line were the identity: a ``cc`` wrapper earlier on PATH that answered
    --version alike but compiled at -O0 shared the key, and a later load with the usual PATH ran its object."""
    wrapper = tmp_path / "bin" / "cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {cc.shutil.which("cc")} "$@"\n')
    wrapper.chmod(0o755)
    before, line = cc.identity(), cc._ask_version(("cc",))
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    assert cc._ask_version(("cc",)) == line  # the same version line...
    assert cc.identity() != before  # ... and yet another compiler


def test_another_assembler_earlier_on_path_is_another_identity(tmp_path, monkeypatch):
    """gcc runs the ``as`` and ``ld`` it finds on PATH: with the compiler named by its absolute path, so that the
    command stays the same, an ``as`` earlier on PATH is another identity (the files ``_programs`` adds)."""
    monkeypatch.setenv("BERM_CC", cc.shutil.which("cc"))
    wrapper = tmp_path / "bin" / "as"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {cc.shutil.which("as")} "$@"\n')
    wrapper.chmod(0o755)
    before = cc.identity()
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    assert cc.identity() != before


@pytest.fixture
def fresh_versions(monkeypatch):
    """What a new process knows of compilers: nothing (the memos emptied, and put back after the test)."""
    monkeypatch.setattr(cc, "_found_versions", {})
    monkeypatch.setattr(cc, "_toolchains", {})
    memos = (cc._found, cc._version, cc._absolute)  # (a test may replace cc._version)
    for memo in memos:
        memo.cache_clear()
    yield
    for memo in memos:
        memo.cache_clear()


def _copy_of_cc(tmp_path: Path, name: str = "mycc") -> Path:
    """The real compiler's ELF under another name: --version answers as cc does."""
    copy = tmp_path / "bin" / name
    copy.parent.mkdir(exist_ok=True)
    copy.write_bytes(Path(os.path.realpath(cc.shutil.which("cc"))).read_bytes())
    copy.chmod(0o755)
    return copy


def _key(cmd: tuple[str, ...]) -> str | None:
    return cc._version_key(cmd, cc._program(cmd[0]))


def test_the_version_line_is_kept_in_the_cache_for_the_next_process(tmp_path, monkeypatch, fresh_versions):
    """A process's first cached load ran ``cc --version`` (~2 ms of 3) for the key: the line is kept in the code
    cache under the compiler file's status, which a later process reads instead; a compiler replaced is asked."""
    from berm_aot.cache import CodeCache
    compiler = _copy_of_cc(tmp_path)
    cmd, store = (str(compiler),), CodeCache(tmp_path / "cache")
    line = cc.version(cmd, store)
    assert line.startswith("mycc ") and store.read_blob(_key(cmd), cc.VERSION_BLOB) == line.encode()
    runs = []
    monkeypatch.setattr(cc, "_ask_version", lambda cmd: runs.append(cmd) or "replaced 1.0")
    monkeypatch.setattr(cc, "_found_versions", {})  # the next process
    assert cc.version(cmd, store) == line and not runs
    compiler.write_bytes(compiler.read_bytes() + b"\0")  # another compiler in its place
    monkeypatch.setattr(cc, "_found_versions", {})
    cc._found.cache_clear()
    assert cc.version(cmd, store) == "replaced 1.0" and runs == [cmd]
    assert cc.version(cmd, store) == "replaced 1.0" and runs == [cmd]  # once per process


def test_one_compiler_by_two_names_keeps_two_lines(tmp_path, fresh_versions):
    """gcc prints the name it is run by, and /usr/bin/cc and /usr/bin/gcc are one file: the first name asked
    decided the other's line, and so its cache key (found by a review)."""
    from berm_aot.cache import CodeCache
    compiler, store = _copy_of_cc(tmp_path), CodeCache(tmp_path / "cache")
    (tmp_path / "bin" / "othercc").symlink_to(compiler)
    assert cc.version((str(compiler),), store).startswith("mycc ")
    assert cc.version((str(tmp_path / "bin" / "othercc"),), store).startswith("othercc ")


def test_only_a_line_asked_of_the_file_the_key_describes_is_kept(tmp_path, monkeypatch, fresh_versions):
    """The line stored was the process's memo, which may be of a compiler replaced since (found by a review); and
    a compiler replaced while it answered is not the one the key describes."""
    from berm_aot.cache import CodeCache
    compiler, store = _copy_of_cc(tmp_path), CodeCache(tmp_path / "cache")
    cmd = (str(compiler),)
    monkeypatch.setattr(cc, "_version", lambda cmd: "stale 0.1")
    assert cc.version(cmd, store).startswith("mycc ")
    assert store.read_blob(_key(cmd), cc.VERSION_BLOB).startswith(b"mycc ")
    asked = cc._ask_version

    def replaced_while_asked(cmd):
        line = asked(cmd)
        compiler.write_bytes(compiler.read_bytes() + b"\0")
        return line

    monkeypatch.setattr(cc, "_ask_version", replaced_while_asked)
    compiler.write_bytes(compiler.read_bytes() + b"\0")
    cc._found.cache_clear()
    before = _key(cmd)
    assert cc.version(cmd, store).startswith("mycc ")
    assert store.read_blob(before, cc.VERSION_BLOB) is None


def test_a_fifo_on_path_is_no_program_to_read(tmp_path, monkeypatch, fresh_versions):
    """``shutil.which`` finds an executable FIFO; reading its head raised OSError (illegal seek) out of every
    cache key (found by a review)."""
    fifo = tmp_path / "bin" / "as"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    fifo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fifo.parent}{os.pathsep}{os.environ['PATH']}")
    assert cc.identity() and cc._found(tuple(cc.compiler()), os.environ["PATH"])[1].elf is False


def _next_process() -> None:
    """Forget what this process found of compilers, as a new process knows nothing of them."""
    cc._toolchains.clear()
    cc._found_versions.clear()
    for memo in (cc._found, cc._version, cc._absolute):
        memo.cache_clear()


@pytest.fixture
def early_path(tmp_path, monkeypatch, fresh_versions):
    """PATH of the test's own: an empty directory, then one holding links to this machine's cc, as and ld (whatever
    the machine's PATH holds); and a code cache: (the empty directory, the cache)."""
    from berm_aot.cache import CodeCache
    early, tools = tmp_path / "early", tmp_path / "tools"
    early.mkdir()
    tools.mkdir()
    for name in ("cc", "as", "ld"):
        (tools / name).symlink_to(os.path.realpath(cc.shutil.which(name)))
    monkeypatch.setenv("PATH", f"{early}{os.pathsep}{tools}")
    monkeypatch.delenv("BERM_CC", raising=False)
    return early, CodeCache(tmp_path / "cache")


def test_the_toolchain_is_kept_for_the_next_process(early_path, monkeypatch):
    """A fresh process's first cached load found cc, as and ld on PATH and read the version line the cache keeps: a
    third of its time. The next process reads what the first found, checked against the file system, and comes to
    the same identity without a PATH search."""
    _, store = early_path
    first = cc.identity(store=store)
    assert first == cc.identity()  # what a process finds with no cache
    _next_process()
    monkeypatch.setattr(cc, "_found_toolchain", lambda store: pytest.fail("the toolchain was searched again"))
    assert cc.identity(store=store) == first != cc.identity(("-O0",), store=store)


def test_a_compiler_put_earlier_on_path_is_seen_by_the_next_process(early_path):
    early, store = early_path
    first = cc.identity(store=store)
    wrapper = early / "cc"
    wrapper.write_text(f'#!/bin/sh\nexec {cc.shutil.which("cc")} "$@"\n')
    wrapper.chmod(0o755)
    _next_process()
    assert cc.identity(store=store) != first
    assert json.loads(cc.identity(store=store))[0] == [str(wrapper)]


def test_a_file_made_executable_earlier_on_path_is_seen_by_the_next_process(early_path):
    """``shutil.which`` passes over a ``cc`` that is not executable, and making it so changes no directory's status:
    with one there, no memo is kept."""
    early, store = early_path
    wrapper = early / "as"
    wrapper.write_text(f'#!/bin/sh\nexec {cc.shutil.which("as")} "$@"\n')
    first = cc.identity(store=store)
    wrapper.chmod(0o755)
    _next_process()
    assert cc.identity(store=store) != first


def test_a_memo_written_by_a_process_that_looked_before_is_of_the_files_there_now(tmp_path, monkeypatch,
                                                                                    fresh_versions):
    """Found by a review: a process whose memo no longer matched (here: its working directory changed) searched
    again through its own lookups, of the compiler replaced since, and wrote them beside the new file's status:
    every later process took the old compiler's identity for the new one's."""
    from berm_aot.cache import CodeCache
    compiler, store = _copy_of_cc(tmp_path), CodeCache(tmp_path / "cache")
    monkeypatch.setenv("BERM_CC", str(compiler))
    first = cc.identity(store=store)
    compiler.write_bytes(compiler.read_bytes() + b"\0")
    monkeypatch.chdir(tmp_path)
    now = cc.identity(store=store)
    _next_process()
    assert now != first and cc.identity(store=store) == now == cc.identity()


def test_a_compiler_replaced_in_place_is_seen_by_the_next_process(tmp_path, monkeypatch, fresh_versions):
    from berm_aot.cache import CodeCache
    compiler, store = _copy_of_cc(tmp_path), CodeCache(tmp_path / "cache")
    monkeypatch.setenv("BERM_CC", str(compiler))
    first = cc.identity(store=store)
    compiler.write_bytes(compiler.read_bytes() + b"\0")
    _next_process()
    assert cc.identity(store=store) != first


def test_a_damaged_toolchain_memo_is_found_again(early_path):
    _, store = early_path
    first = cc.identity(store=store)
    (memo,) = store.root.rglob(cc.TOOLCHAIN_BLOB)
    lying = json.dumps({"found": [["/usr/bin/true"], "other 1.0", [["/x", 1, 2]] * 3], "statuses": []}).encode()
    for damaged in (b"{", b'{"found": [["cc"], "two\\nlines", []], "statuses": []}', b"[]", lying, b"[" * 100_000):
        memo.write_bytes(damaged)
        _next_process()
        assert cc.identity(store=store) == first


def test_a_stored_line_that_no_compiler_printed_is_asked_again(tmp_path, fresh_versions):
    from berm_aot.cache import CodeCache
    cmd, store = (str(_copy_of_cc(tmp_path)),), CodeCache(tmp_path / "cache")
    for stored in (b"two\nlines", b"\xff\xfe", b""):
        store.write_blob(_key(cmd), cc.VERSION_BLOB, stored)
        cc._found_versions.clear()
        assert cc.version(cmd, store).startswith("mycc ")


def test_a_wrappers_version_line_is_not_kept(tmp_path, monkeypatch, fresh_versions):
    """ccache's file stays the same when the compiler it runs (the next cc on PATH) is replaced, and so does a
    script's: their line is asked once per process, never kept; so is that of a command of several words."""
    from berm_aot.cache import CodeCache
    script = tmp_path / "bin" / "wrapcc"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nexec {cc.shutil.which("cc")} "$@"\n')
    script.chmod(0o755)
    commands = [(str(script),), (str(_copy_of_cc(tmp_path, "ccache")),), (str(_copy_of_cc(tmp_path)), "-O0")]
    for cmd in commands:
        store = CodeCache(tmp_path / "cache")
        assert _key(cmd) is None
        assert cc.version(cmd, store)
    assert not (tmp_path / "cache").exists()


def test_a_version_line_that_is_not_utf8_is_read(tmp_path, monkeypatch):
    fake = tmp_path / "fakecc"
    fake.write_bytes(b"#!/bin/sh\nprintf 'cc \\377 1.0\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BERM_CC", str(fake))
    assert cc.identity()  # no UnicodeDecodeError
    assert "cc \ufffd 1.0" in cc._version((str(fake),))


def test_a_newline_in_the_output_directory_does_not_break_the_stack_usage_report(tmp_path):
    out = tmp_path / "odd\nname" / "lib.so"
    out.parent.mkdir()
    cc.compile_shared([unit(2)], out)
    assert ctypes.CDLL(str(out)).answer2() == 14


def test_the_compilers_environment_cannot_change_the_object(tmp_path, monkeypatch):
    """CPATH (and gcc's other include, prefix and run-path variables) changed the object without changing its key:
    a header it shadowed went into an object a later process, without it, loaded from the cache."""
    poisoned = tmp_path / "include"
    poisoned.mkdir()
    (poisoned / "stdint.h").write_text('#error "the compiler read CPATH"\n')
    for name in ("CPATH", "C_INCLUDE_PATH"):
        monkeypatch.setenv(name, str(poisoned))
    out = tmp_path / "lib.so"
    cc.compile_shared(["#include <stdint.h>\n" + unit(6)], out)
    assert ctypes.CDLL(str(out)).answer6() == 42


@pytest.mark.parametrize("name", ["CCC_OVERRIDE_OPTIONS", "OBJCPLUS_INCLUDE_PATH", "ZIG_LIB_DIR"])
def test_clangs_and_zigs_environment_cannot_change_the_object(tmp_path, monkeypatch, name):
    """Found by a review: clang (a BERM_CC, or zig cc) edits its command line by CCC_OVERRIDE_OPTIONS, and takes
    include directories and zig's own library from others gcc has no use for; none reaches the compiler. The
    stand-in compiler fails when it is given one, as clang would have read it."""
    fake = tmp_path / "clanglike"
    fake.write_text(f'#!/bin/sh\nif [ -n "${{{name}+set}}" ]; then echo "given {name}" >&2; exit 1; fi\n'
                    'exec cc "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("BERM_CC", str(fake))
    monkeypatch.setenv(name, "+-O0")
    out = tmp_path / "lib.so"
    cc.compile_shared([unit(6)], out)
    assert ctypes.CDLL(str(out)).answer6() == 42


def _slow_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in compiler that starts a child which would run for a minute, writes its pid and waits for it."""
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "slowcc"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = --version ]; then echo "slowcc 1"; exit 0; fi
        sleep 60 &
        echo $! > {pid_file}
        wait
    """))
    fake.chmod(0o755)
    return fake, pid_file


def _gone_within(pid: int, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("supervised", [False, True])
def test_a_timeout_kills_what_the_compiler_started(tmp_path, monkeypatch, supervised):
    """Killing the driver alone left cc1 and as running, orphaned."""
    from berm_host.capabilities.exec import SUPERVISOR

    fake, pid_file = _slow_compiler(tmp_path)
    monkeypatch.setenv("BERM_CC", str(fake))
    monkeypatch.setattr(cc, "COMPILE_TIMEOUT", 5)  # room for a loaded machine to start the shell and its child
    with pytest.raises(CompileError, match="longer than 5 s"):
        cc.compile_shared([unit(0)], tmp_path / "lib.so", supervisor=SUPERVISOR if supervised else None)
    _gone_within(int(pid_file.read_text()), 10, "the compiler's child outlived the timeout")


def test_compilers_die_with_a_host_killed_mid_compile(tmp_path):
    """A host SIGKILLed mid-compile left its compilers running to their end (a review: minutes of cc1 for a large
    image), bound by a timeout nobody enforced any more. Under the supervisor they die with it."""
    fake, pid_file = _slow_compiler(tmp_path)
    host = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        from pathlib import Path
        from berm_aot import cc
        from berm_host.capabilities.exec import SUPERVISOR
        cc.compile_shared(["int x;"], Path({str(tmp_path / "lib.so")!r}), supervisor=SUPERVISOR)
    """)], env={**os.environ, "BERM_CC": str(fake)})
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert host.poll() is None and time.monotonic() < deadline, "the stand-in compiler never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        host.kill()
        host.wait()
        _gone_within(child, 10, "the compiler's child outlived its host")
    finally:
        if host.poll() is None:
            host.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for init to reap it is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_full_disk_is_a_compile_error(tmp_path):
    """Writing the translation into a full disk raised a bare OSError (berm-compile printed a traceback and left
    the other images). A file size limit stands in for the full disk."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from berm_aot import cc
        from berm_aot.errors import CompileError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            cc.compile_shared(["/*" + "x" * 10000 + "*/"], Path({str(tmp_path / "lib.so")!r}))
        except CompileError as exc:
            print("CompileError:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("CompileError: cannot write the translation into"), out.stdout + out.stderr


def test_a_reaped_compiler_is_never_killed_by_its_number(monkeypatch):
    """A failing unit's driver was reaped, then its session killed by number in the cleanup: by then the number
    could name an unrelated process group (a review killed one, forcing the pid's reuse)."""
    proc = subprocess.Popen(["true"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc.communicate()
    killed = []
    monkeypatch.setattr(cc.os, "killpg", lambda pid, sig: killed.append(pid))
    cc._kill(proc)
    assert killed == []


@pytest.mark.parametrize("variable, value, message", [
    ("BERM_CFLAGS", '-O1 "', "BERM_CFLAGS is not a list of shell words"),
    ("BERM_CC", 'gcc "', "BERM_CC is not a list of shell words"),
    ("BERM_CC", "", "BERM_CC is empty"),
])
def test_bad_compiler_settings_are_compile_errors(tmp_path, monkeypatch, variable, value, message):
    """Found by a review: a quote left open was a ValueError traceback in every command that compiles, and an
    empty BERM_CC said the program '--version' could not be run."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(CompileError, match=message):
        cc.compile_shared(["int x;"], tmp_path / "x.so")


def test_a_compiler_killed_at_the_timeout_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Found by a review: gcc writes its assembly to ``$TMPDIR/cc*.s`` and a driver killed at the timeout never
    removes it; hundreds of KB a unit piled up in /tmp. The compilers' TMPDIR is the compile's own directory, which
    goes with it. The stand-in writes a file there as gcc does, then hangs."""
    fake = tmp_path / "tempcc"
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        if [ "$1" = --version ]; then echo "tempcc 1"; exit 0; fi
        mktemp "${TMPDIR:-/tmp}/ccXXXXXX.s" > /dev/null
        exec sleep 60
    """))
    fake.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("BERM_CC", str(fake))
    monkeypatch.setattr(cc, "COMPILE_TIMEOUT", 3)
    (tmp_path / "out").mkdir()
    with pytest.raises(CompileError, match="longer than 3 s"):
        cc.compile_shared([unit(0)], tmp_path / "out" / "lib.so")
    assert list((tmp_path / "tmp").iterdir()) == [] and list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("supervised", [False, True])
def test_a_relative_compiler_is_found_from_the_units_directory(tmp_path, monkeypatch, supervised):
    """Found by a review: BERM_CC=bin/mycc answered --version, then every unit (compiled in a directory of its own)
    failed to find it, and the error blamed the translator. The program is made an absolute path."""
    from berm_host.capabilities.exec import SUPERVISOR

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mycc").write_text('#!/bin/sh\nexec cc "$@"\n')
    (tmp_path / "bin" / "mycc").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BERM_CC", "bin/mycc -w")
    assert cc.compiler() == [str(tmp_path / "bin" / "mycc"), "-w"]
    cc.compile_shared([unit(3)], tmp_path / "lib.so", supervisor=SUPERVISOR if supervised else None)
    assert ctypes.CDLL(str(tmp_path / "lib.so")).answer3() == 21


def test_a_compiler_that_cannot_be_started_is_said_so(tmp_path, monkeypatch):
    """Under the supervisor, a compiler that could not be started was reported as a unit that did not compile,
    which "emitted code is a translator bug"."""
    from berm_host.capabilities.exec import SUPERVISOR

    monkeypatch.setenv("BERM_CC", str(tmp_path / "gone" / "cc"))
    said = r"the C compiler could not be started: berm-supervise: cannot run .*gone/cc"
    with pytest.raises(CompileError, match=said) as raised:
        cc.compile_shared([unit(0)], tmp_path / "lib.so", supervisor=SUPERVISOR)
    assert "translator" not in str(raised.value)


@pytest.mark.parametrize("supervised", [False, True])
def test_a_compiler_killed_by_a_signal_is_not_blamed_on_the_translation(tmp_path, monkeypatch, supervised):
    """Found by a review: cc1 killed (the OOM killer) was reported as "emitted code is a translator bug". gcc runs
    cc1 under a wrapper that kills it, as the OOM killer would; and a compiler that dies by SIGKILL itself."""
    from berm_host.capabilities.exec import SUPERVISOR

    supervisor = SUPERVISOR if supervised else None
    killer = tmp_path / "killer.sh"
    killer.write_text('#!/bin/sh\ncase "$1" in *cc1) kill -9 $$;; esac\nexec "$@"\n')
    killer.chmod(0o755)
    monkeypatch.setenv("BERM_CC", f"cc -wrapper {killer}")
    with pytest.raises(CompileError, match=r"a program of the C compiler was killed by SIGKILL compiling "
                                           r"unit0\.c \(out of memory\? the translated code is not at fault\)"
                                           r"(.|\n)*Killed signal") as raised:
        cc.compile_shared([unit(0)], tmp_path / "lib.so", supervisor=supervisor)
    assert "translator bug" not in str(raised.value)

    suicidal = tmp_path / "cc"
    suicidal.write_text("#!/bin/sh\nkill -9 $$\n")
    suicidal.chmod(0o755)
    monkeypatch.setenv("BERM_CC", str(suicidal))
    with pytest.raises(CompileError, match=r"^the C compiler was killed by SIGKILL compiling unit0\.c") as raised:
        cc.compile_shared([unit(0)], tmp_path / "lib.so", supervisor=supervisor)
    assert "translator bug" not in str(raised.value)

    # a crash may be the translated code's doing: found by a review, gcc's report of one was taken for a kill
    crashing = tmp_path / "crashing"
    crashing.write_text("#!/bin/sh\necho 'cc: internal compiler error: Segmentation fault signal terminated program "
                        "cc1' >&2\nexit 4\n")
    crashing.chmod(0o755)
    monkeypatch.setenv("BERM_CC", str(crashing))
    with pytest.raises(CompileError, match=r"^cc failed on unit0\.c .*translator bug"):
        cc.compile_shared([unit(0)], tmp_path / "lib.so", supervisor=supervisor)



def test_one_compiler_through_a_linked_directory_is_one_identity(tmp_path, monkeypatch, fresh_versions):
    """Found by a review: on Debian /bin is a link to /usr/bin, and with /bin first on PATH the cache key named
    /bin/cc: a daemon whose PATH had /usr/bin first missed every object berm-compile had built. The compiler's
    directory is named by its real path; and the toolchain memo is still kept with the linked directory first."""
    from berm_aot.cache import CodeCache

    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("cc", "as", "ld"):
        (tools / name).symlink_to(os.path.realpath(cc.shutil.which(name)))
    (tmp_path / "linked").symlink_to(tools)
    monkeypatch.delenv("BERM_CC", raising=False)
    identities = []
    for path in (f"{tmp_path / 'linked'}{os.pathsep}{tools}", f"{tools}{os.pathsep}{tmp_path / 'linked'}"):
        monkeypatch.setenv("PATH", path)
        _next_process()
        store = CodeCache(tmp_path / f"cache{len(identities)}")
        identities.append(cc.identity(store=store))
        assert list((store.root).rglob(cc.TOOLCHAIN_BLOB)), path  # the memo kept
    assert identities[0] == identities[1]


def test_a_compile_with_no_path_finds_the_tools_identity_found(tmp_path, monkeypatch, fresh_versions):
    """Found by a review: with PATH unset, identity() found as and ld on os.defpath, and the compiler, given no PATH,
    found no ld (collect2: cannot find 'ld')."""
    monkeypatch.delenv("PATH")
    monkeypatch.setenv("BERM_CC", os.path.realpath(cc.shutil.which("cc", path="/usr/bin")))
    cc.compile_shared([unit(5)], tmp_path / "lib.so")
    assert ctypes.CDLL(str(tmp_path / "lib.so")).answer5() == 35
