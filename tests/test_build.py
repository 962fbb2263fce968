"""`berm build`: a harness directory → a checked ELF; refusals name the file and line."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
from pathlib import Path

import pytest

from berm_aot.elf import read_elf
from berm_aot.manifest import load_manifest, tool_exports
from berm_cli.main import main
from berm_sdk.build import build_harness, install_image
from berm_sdk.errors import BuildError
from berm_sdk.harness_toml import load_harness_toml
from berm_sdk.toolchain import ToolchainError
from tests.bounded import GRACE, ends_within
from tests.children import run_python
from tests.elf_samples import harness_elf, manifest_json
from tests.sdk_engines import harness as engine_harness

TOML = 'name = "tiny"\nusage = "u"\n\n[[tools]]\nname = "hello"\ndescription = "Says hello."\n'
HELLO = '#include "berm.h"\n\nBERM_TOOL(hello) { return berm_ok_str("hello"); }\n'


def harness(tmp_path, toml: str = TOML, **sources: str):
    d = tmp_path / "h"
    (d / "src").mkdir(parents=True)
    (d / "harness.toml").write_text(toml)
    for name, text in sources.items():
        (d / ("src" if name.startswith("src_") else ".") / f"{name.removeprefix('src_')}.c").write_text(text)
    return d


def test_cli_builds_a_checked_image(tmp_path, capsys):
    d = harness(tmp_path, TOML + '\n[[tools]]\nname = "two"\ndescription = "2"\n',
                tiny=HELLO, src_two='#include "berm.h"\nstatic char two[] = "2";\nBERM_TOOL(two) { two[0]++; return berm_ok(two, 1); }\n')
    out = tmp_path / "out" / "tiny.elf"
    assert main(["build", str(d), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    image = read_elf(out.read_bytes())
    assert [t.name for t in load_manifest(image).tools] == ["hello", "two"]
    assert set(tool_exports(image)) == {"hello", "two"}  # nothing else looks like a tool
    assert image.manifest_bytes == load_harness_toml(d / "harness.toml").manifest_bytes()
    assert any(r.type_name == "R_RISCV_PCREL_HI20" and r.symbol == "berm_tool_two" for r in image.relocations)
    loads = sorted(image.segments, key=lambda s: s.vaddr)
    assert loads[0].vaddr >= 0x10000 and loads[0].executable and not loads[0].writable
    assert [s.writable for s in loads] == [False, False, True]  # code, read-only data, then .data
    tools = engine_harness("interp", out.read_bytes())
    assert [tools.call("two"), tools.call("two"), tools.call("hello")] == ["3", "3", "hello"]  # .data is fresh


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_build_ended_by_a_signal_removes_its_temporary_directory(tmp_path, signum):
    """Found by a review: SIGTERM ended berm build where it stood, leaving its temporary directory (objects, the
    entry's C, the image) behind; it now ends as Ctrl-C does, saying so, with 128 + the signal. The signal comes
    midway through the build, once its own sources are compiled (the child sends it to itself there)."""
    d = harness(tmp_path, tiny=HELLO)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp), BERM_CACHE_DIR=str(tmp_path / "cache"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"))
    done = run_python("import os, sys, time\n"
                      "from berm_sdk import build\n"
                      "from berm_cli.main import main\n"
                      "def signalled(*_):\n"
                      f"    os.kill(os.getpid(), {int(signum)})\n"
                      "    time.sleep(60)  # not reached when the signal ends the build\n"
                      "build.check_tools_defined = signalled\n"
                      f"sys.exit(main(['build', {str(d)!r}, '-o', {str(tmp_path / 't.elf')!r}]))\n", env=env)
    assert (done.returncode, done.stderr.strip()) == (128 + signum,
                                                      f"berm build: stopped by {signal.Signals(signum).name}")
    assert list(temp.iterdir()) == []


def test_default_output_is_name_dot_elf_in_the_working_directory(tmp_path, monkeypatch):
    d = harness(tmp_path, tiny=HELLO)
    monkeypatch.chdir(tmp_path)
    assert build_harness(d) == tmp_path / "tiny.elf"
    assert (tmp_path / "tiny.elf").exists()


def test_an_output_that_cannot_be_written_is_an_error_and_leaves_nothing(tmp_path, capsys):
    """Found by a review: -o naming a directory, or a path under a file, was an OSError traceback that left the
    staged copy behind, and -o naming a FIFO (or, as root, /dev/full) replaced it with the image."""
    d = harness(tmp_path, tiny=HELLO)
    out = tmp_path / "out"
    (out / "adir").mkdir(parents=True)
    os.mkfifo(out / "fifo")
    (out / "file").write_text("")
    for target, message in [("adir", "is not a regular file"), ("fifo", "is not a regular file"),
                            ("file/tiny.elf", "cannot write")]:
        assert main(["build", str(d), "-o", str(out / target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("berm build: cannot write ") and message in err
    assert sorted(p.name for p in out.iterdir()) == ["adir", "fifo", "file"]  # nothing staged is left
    assert stat.S_ISFIFO((out / "fifo").stat().st_mode)
    (out / "old.elf").write_text("old")
    (out / "link.elf").symlink_to(out / "fifo")  # a link is replaced, as it always was: never written through
    assert main(["build", str(d), "-o", str(out / "link.elf")]) == 0
    assert (out / "link.elf").is_file() and not (out / "link.elf").is_symlink()
    assert stat.S_ISFIFO((out / "fifo").stat().st_mode)


def test_a_declared_tool_without_a_function_is_refused(tmp_path, capsys):
    d = harness(tmp_path, TOML + '\n[[tools]]\nname = "missing"\ndescription = "m"\n', tiny=HELLO)
    assert main(["build", str(d), "-o", str(tmp_path / "x.elf")]) == 2
    err = capsys.readouterr().err
    assert f"{d / 'harness.toml'}:9: tool 'missing' is declared but no source defines berm_tool_missing" in err
    assert not (tmp_path / "x.elf").exists()


def test_a_tool_function_not_declared_is_refused(tmp_path):
    d = harness(tmp_path, tiny=HELLO + "\n\nBERM_TOOL(extra) { return berm_ok_str(\"\"); }\n")
    with pytest.raises(BuildError, match=rf"{d / 'tiny.c'}:6: berm_tool_extra is defined but .* declares no tool"):
        build_harness(d, tmp_path / "x.elf")


def test_compiler_errors_name_the_file_and_line(tmp_path):
    d = harness(tmp_path, tiny=HELLO + "\nint broken(void) { return undefined_thing; }\n")
    with pytest.raises(ToolchainError, match=rf"{d / 'tiny.c'}:5:\d+: error: use of undeclared identifier"):
        build_harness(d, tmp_path / "x.elf")


def test_a_tool_that_falls_off_its_end_is_refused(tmp_path):
    """It built, and returned whatever a0/a1 held (the argument blob once): the profile makes it an error."""
    d = harness(tmp_path, tiny='#include "berm.h"\n\nBERM_TOOL(hello) { berm_log("no return", 9); }\n')
    with pytest.raises(ToolchainError, match=r"tiny\.c:3:.*does not return a value"):
        build_harness(d, tmp_path / "x.elf")


def test_warnings_of_a_successful_build_are_shown(tmp_path, capsys):
    d = harness(tmp_path, tiny='#include "berm.h"\n\nBERM_TOOL(hello) { int unused; return berm_ok_str("hi"); }\n')
    assert main(["build", str(d), "-o", str(tmp_path / "x.elf")]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(tmp_path / "x.elf")
    assert "tiny.c:3:" in out.err and "unused variable 'unused'" in out.err


def test_toml_errors_name_the_file_and_line(tmp_path):
    d = harness(tmp_path, 'name = "tiny"\n\n[[tools]\n', tiny=HELLO)
    with pytest.raises(BuildError, match=r"harness.toml: .*at line 3"):
        build_harness(d, tmp_path / "x.elf")


def test_an_image_with_csr_instructions_fails_its_own_check(tmp_path):
    source = HELLO.replace('return berm_ok_str("hello");',
                           'unsigned long c; __asm__ volatile("csrr %0, cycle" : "=r"(c)); return berm_ok("", c & 0);')
    d = harness(tmp_path, tiny=source)
    with pytest.raises(BuildError, match=r"fails its own check: .*csr"):
        build_harness(d, tmp_path / "x.elf")


def test_not_a_directory_and_no_sources(tmp_path):
    with pytest.raises(BuildError, match="not a directory"):
        build_harness(tmp_path / "nope")
    d = harness(tmp_path)
    with pytest.raises(BuildError, match="no C sources"):
        build_harness(d)


def test_bundled_harnesses_build_once_and_are_reused(tmp_path, monkeypatch):
    from berm_sdk import bundled
    from berm_sdk.bundled import bundled_image, bundled_names

    monkeypatch.setattr(bundled, "_cache_dir", lambda: tmp_path)  # a fresh image cache; the SDK objects stay
    assert {"fixture", "os"} <= set(bundled_names()) and "sdk" not in bundled_names()
    first = bundled_image("fixture")
    stamp = first.stat().st_mtime_ns
    assert bundled_image("fixture") == first and first.stat().st_mtime_ns == stamp
    assert [t.name for t in load_manifest(read_elf(first.read_bytes())).tools] == ["echo", "chatty", "probe", "boom"]
    with pytest.raises(BuildError, match="no bundled harness 'nope' \\(bundled: .*fixture"):
        bundled_image("nope")


def test_a_bundled_image_is_rebuilt_when_the_sdks_python_changes(tmp_path, monkeypatch):
    """Found by a review: the key covered the SDK's C but not the Python that writes the entry code, the manifest
    and the link, so an upgrade of Berm that changed them kept serving the image built before it."""
    from berm_sdk import bundled

    copy = tmp_path / "berm_sdk"
    shutil.copytree(bundled.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundled, "PACKAGE_DIR", copy)
    before = bundled._digest(bundled.HARNESSES_DIR / "fixture")
    with open(copy / "entry.py", "a") as entry:
        entry.write("# the entry code written otherwise\n")
    assert bundled._digest(bundled.HARNESSES_DIR / "fixture") != before


def test_a_bundled_image_is_rebuilt_when_the_host_call_numbers_change(monkeypatch):
    from berm_sdk import bundled

    before = bundled._digest(bundled.HARNESSES_DIR / "fixture")
    monkeypatch.setattr(bundled, "calls_header", lambda: "#define BERM_CALL_LOG 0x1ULL\n")
    assert bundled._digest(bundled.HARNESSES_DIR / "fixture") != before


def test_berm_call_builds_a_bundled_harness_named_instead_of_a_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no file named "fixture" here
    assert main(["call", "fixture", "echo", '{"a":1}', "--engine", "interp"]) == 0
    assert capsys.readouterr().out.strip() == '{"echo":{"a":1}}'


@pytest.mark.parametrize("here", ["file", "directory"])
def test_a_bundled_harnesss_name_means_the_bundled_one_whatever_the_current_directory_holds(tmp_path, monkeypatch,
                                                                                           capsys, here):
    """A file named like a bundled harness ran in its place, with the grants meant for it (a review: a checkout's
    own ``os`` wrote a git hook with ``--grant fs``); a directory of that name broke the call. A path names a file."""
    monkeypatch.chdir(tmp_path)
    if here == "file":
        (tmp_path / "fixture").write_bytes(b"not the bundled harness")
    else:
        (tmp_path / "fixture").mkdir()
    assert main(["call", "fixture", "echo", '{"a":1}', "--engine", "interp"]) == 0
    assert capsys.readouterr().out.strip() == '{"echo":{"a":1}}'
    assert main(["call", "./fixture", "echo", "--engine", "interp"]) == 2  # the file (or directory) itself
    assert "fixture" in capsys.readouterr().err


def test_a_bare_name_that_is_neither_a_file_nor_bundled_lists_the_bundled_ones(tmp_path, monkeypatch, capsys):
    """Found by a review: `berm call rust-probe ...` said only "No such file or directory"."""
    monkeypatch.chdir(tmp_path)
    assert main(["call", "rust-probe", "echo", "--engine", "interp"]) == 2
    assert capsys.readouterr().err == ("berm call: no file 'rust-probe' here, and no bundled harness of that name "
                                       "(bundled: fixture, os, reminders; an image is named by its path)\n")


def test_the_sdk_objects_key_covers_every_sdk_header_and_the_compiler_itself(tmp_path):
    """Found by a review: berm_recurring.h was no part of the key of the SDK's cached objects (they outlived a
    change to it), and the compiler counted by its command only (an upgrade of ziglang or clang-22 kept it)."""
    from berm_sdk.build import SDK_DIR, load_profile, sdk_objects_key
    from berm_sdk.toolchain import Toolchain

    sdk = tmp_path / "sdk"
    shutil.copytree(SDK_DIR, sdk)
    compiler = tmp_path / "clang-22"
    compiler.write_text("v1")
    tc = Toolchain(cc=(str(compiler), "--target=riscv64-unknown-elf"), ld=("ld.lld-22",), name="llvm")
    profile = load_profile()
    before = sdk_objects_key(tc, profile, sdk)
    with open(sdk / "berm_recurring.h", "a") as header:
        header.write("/* changed */\n")
    after_header = sdk_objects_key(tc, profile, sdk)
    compiler.write_text("version 2")
    assert len({before, after_header, sdk_objects_key(tc, profile, sdk)}) == 3


def test_what_a_build_says_names_the_authors_files(tmp_path, monkeypatch, capsys):
    """Found by a review: a source named -x.c in a directory given relatively was read by the compiler as a flag;
    a tool defined in two files was only the linker's "duplicate symbol" of deleted objects; an image failing its
    own check was named by a deleted build file."""
    d = harness(tmp_path, tiny=HELLO)
    (d / "tiny.c").rename(d / "-x.c")
    monkeypatch.chdir(d)
    assert main(["build", ".", "-o", "../a.elf"]) == 0
    (d / "src" / "again.c").write_text(HELLO)
    assert main(["build", ".", "-o", "../b.elf"]) == 2
    err = capsys.readouterr().err
    assert "src/again.c:3: berm_tool_hello is defined twice: also at " in err and "-x.c:3" in err
    (d / "src" / "again.c").write_text('#include "berm.h"\nint cycles(void) { long c; __asm__ volatile("rdcycle %0" '
                                       ': "=r"(c)); return (int)c; }\n')
    (d / "-x.c").write_text('#include "berm.h"\nint cycles(void);\nBERM_TOOL(hello) { return cycles() ? '
                            'berm_ok_str("a") : berm_ok_str("b"); }\n')
    assert main(["build", ".", "-o", "../c.elf"]) == 2
    assert capsys.readouterr().err.startswith("berm build: .: the built image fails its own check: csrrs (Zicsr)")


@pytest.mark.parametrize("name", ["a:b.c", "a\\b.c", 'a "b.c', "a\nb.c"])
def test_a_source_name_the_compiler_cannot_take_is_named(tmp_path, name):
    """Found by a review: such a name failed in zig's own dependency file, naming only that."""
    d = harness(tmp_path, tiny=HELLO)
    (d / "tiny.c").rename(d / name)
    with pytest.raises(BuildError, match="the guest compiler cannot take a file name holding"):
        build_harness(d, tmp_path / "x.elf")


@pytest.mark.parametrize("above", ["back\\slash", "new\nline"])
def test_a_directory_name_the_compiler_cannot_take_is_named(tmp_path, above):
    """Found by a review: a backslash or a newline in a directory above the sources failed in zig's own dependency
    file, naming a temporary file the author never saw (a ``:`` or ``"`` there it takes)."""
    d = harness(tmp_path / above, tiny=HELLO)
    with pytest.raises(BuildError, match="or a directory name holding '\\\\\\\\' or '\\\\n': rename it"):
        build_harness(d, tmp_path / "x.elf")


def test_an_output_name_of_the_longest_a_file_may_have_is_written(tmp_path):
    """Found by a review: the staged copy was named after the output, 14 bytes longer, and an output name of 242 to
    255 bytes, a legal name, was refused as too long."""
    built = tmp_path / "built.elf"
    built.write_bytes(b"\x7fELF the image")
    out = tmp_path / ("a" * 251 + ".elf")
    install_image(built, out)
    assert out.read_bytes() == built.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_berm_build_prints_an_output_name_that_is_not_utf8_escaped(tmp_path, capsys):
    """Found by a review: the image was written, then print() of its name ended the build in UnicodeEncodeError
    (exit status 1) on a UTF-8 terminal (pytest's capture is as strict)."""
    d = harness(tmp_path, tiny=HELLO)
    out = tmp_path / os.fsdecode(b"caf\xe9.elf")
    assert main(["build", str(d), "-o", str(out)]) == 0
    assert capsys.readouterr().out == str(tmp_path) + "/caf\\xe9.elf\n" and out.is_file()


def test_the_staged_copy_is_a_new_file_of_a_name_no_one_can_plant(tmp_path):
    """Found by a review: the copy was staged at the fixed name .{out}.{pid}.tmp and written with copyfile, so another
    user who could write the directory planted a link there (the copy wrote through it, over a file of the builder's)
    or a file of their own (renamed into place, it stayed theirs to edit after the image's checks)."""
    built = tmp_path / "built.elf"
    built.write_bytes(b"\x7fELF the image")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("the builder's own")
    (out / f".a.elf.{os.getpid()}.tmp").symlink_to(victim)
    planted = out / f".b.elf.{os.getpid()}.tmp"
    planted.write_text("")
    umask = os.umask(0o027)
    try:
        install_image(built, out / "a.elf")
        install_image(built, out / "b.elf")
    finally:
        os.umask(umask)
    assert victim.read_text() == "the builder's own" and planted.read_text() == ""
    for name in ("a.elf", "b.elf"):
        st = os.lstat(out / name)
        assert stat.S_ISREG(st.st_mode) and (out / name).read_bytes() == built.read_bytes()
        assert stat.S_IMODE(st.st_mode) == 0o640  # a plain copy's mode under the umask, not mkstemp's 0600
    with pytest.raises(BuildError, match="cannot write"):
        install_image(tmp_path / "gone.elf", out / "c.elf")
    assert sorted(p.name for p in out.iterdir()) == sorted([f".a.elf.{os.getpid()}.tmp", planted.name, "a.elf",
                                                            "b.elf"])  # nothing staged is left


_OUTSIDE = "the source leads outside the harness directory"
_SRC_OUTSIDE = "the directory of sources leads outside the harness directory"


@pytest.mark.parametrize("named, make, message", [
    ("b.c", lambda p, lib: os.mkfifo(p), "not a regular file"),
    ("src/x.c", lambda p, lib: p.mkdir(), "not a regular file"),
    ("z.c", lambda p, lib: p.symlink_to("/dev/zero"), _OUTSIDE),
    ("o.c", lambda p, lib: p.symlink_to(lib / "a.c"), _OUTSIDE),
    ("src", lambda p, lib: p.symlink_to(lib), _SRC_OUTSIDE),
    ("src", lambda p, lib: p.symlink_to("/proc"), _SRC_OUTSIDE),
], ids=["fifo", "directory", "dev-zero", "file-outside", "src-outside", "src-proc"])
def test_a_source_is_a_regular_file_inside_the_harness_directory(tmp_path, named, make, message):
    """Found by a review: a source linked to /dev/zero, or a FIFO, kept the compiler reading until its 300 s timeout;
    a src/ linked into /proc ended in an OSError traceback, and one linked to / walked the whole filesystem. Run under
    a bound, so the old way fails instead of stalling."""
    d = harness(tmp_path, tiny=HELLO)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.c").write_text("int elsewhere;\n")
    if named == "src":
        shutil.rmtree(d / "src")
    make(d / named, lib)
    with pytest.raises(BuildError, match=re.escape(f"{d / named}: {message}")):
        ends_within(GRACE, lambda: build_harness(d, tmp_path / "x.elf"))
    assert not (tmp_path / "x.elf").exists()


def test_src_may_link_inside_the_harness_directory_and_no_link_below_it_is_followed(tmp_path):
    d = harness(tmp_path, TOML + '\n[[tools]]\nname = "two"\ndescription = "2"\n', tiny=HELLO)
    (d / "src").rmdir()
    (d / "lib").mkdir()
    (d / "lib" / "two.c").write_text('#include "berm.h"\nBERM_TOOL(two) { return berm_ok_str("2"); }\n')
    (d / "src").symlink_to("lib")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "again.c").write_text(HELLO)  # would define hello twice
    (d / "lib" / "elsewhere").symlink_to(tmp_path / "elsewhere")
    tools = engine_harness("interp", build_harness(d, tmp_path / "x.elf").read_bytes())
    assert [tools.call("hello"), tools.call("two")] == ["hello", "2"]


def test_a_directory_of_sources_that_cannot_be_listed_is_named(tmp_path, monkeypatch):
    """Found by a review: an error listing a directory under src/ was skipped (a directory the builder may not read)
    or a traceback (one in /proc); a build from part of the sources is not the author's."""
    d = harness(tmp_path, tiny=HELLO)
    deep = d / "src" / "deep"
    deep.mkdir()
    scandir = os.scandir

    def refuse(path="."):
        if path == str(deep):  # os.walk's own string; rmtree passes descriptors
            raise PermissionError(13, "Permission denied", str(deep))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)
    with pytest.raises(BuildError, match=re.escape(f"{deep}: cannot list the harness's sources: Permission denied")):
        build_harness(d, tmp_path / "x.elf")


def test_berm_build_of_what_is_no_directory_says_so(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["build", str(tmp_path / "missing")]) == 2
    assert "missing: no such directory (berm build takes a harness's source directory)" in capsys.readouterr().err
    assert main(["build", str(tmp_path / "file")]) == 2
    assert "file: not a directory (berm build takes a harness's source directory)" in capsys.readouterr().err


def test_an_image_whose_tool_parameters_are_no_json_schema_fails_its_check(tmp_path):
    """What berm build checks of a Rust crate's image, whose manifest.json is written by hand: a typo in a schema
    reached the manifest without a word (a newcomer's walkthrough)."""
    from berm_sdk.build import check_image
    from berm_sdk.errors import BuildError
    from tests.guests import raw_harness_elf

    elf = tmp_path / "x.elf"
    elf.write_bytes(raw_harness_elf("Pair berm_tool_x(void) { Pair p = {(u64)\"x\", 1}; return p; }", ("x",),
                                    parameters={"type": "object", "properties": {"n": {"type": "strin"}}}))
    with pytest.raises(BuildError, match=r"^crate: the built image fails its own check: tool 'x': parameters are "
                                         r"not a JSON Schema: 'strin' is not valid under any of the given schemas "
                                         r"\(at properties/n/type\)$"):
        check_image(elf, Path("crate"))


@pytest.mark.parametrize("manifest, tools, message", [
    (manifest_json(["a"], requests={"capabilities": ["fs", "filesystem"]}), ["a"],
     "requests.capabilities: unknown capability 'filesystem' (known: "),
    (manifest_json(["a"], hosts=[""]), ["a"], "requests.hosts: bad host entry ''"),
    (manifest_json(["a"], requests={"hosts": ["*"]}), ["a"], "requests.hosts: bad host entry '*'"),
    (manifest_json(["a"]), ["a", "b"], "it exports berm_tool_b, which its manifest does not declare"),
])
def test_an_image_checks_what_a_harness_toml_is_checked_for(tmp_path, manifest, tools, message):
    """Found by a review: a Rust crate, which writes its own manifest, built with unknown capabilities, a host no
    declaration could list, or a berm_tool_ export its manifest does not declare, all of which a harness.toml is
    refused for: the checks are the image's, whoever wrote its manifest."""
    from berm_sdk.build import check_image

    elf = tmp_path / "x.elf"
    elf.write_bytes(harness_elf(manifest_json(["a"], requests={"capabilities": ["fs"], "hosts": ["*.example.org"]}),
                                ["a"]))
    assert [t.name for t in check_image(elf, Path("crate"))[1].tools] == ["a"]
    elf.write_bytes(harness_elf(manifest, tools))
    with pytest.raises(BuildError, match=re.escape(f"crate: the built image fails its own check: {message}")):
        check_image(elf, Path("crate"))


def test_an_output_over_the_harnesss_own_sources_is_refused(tmp_path, monkeypatch, capsys):
    """Found by a review: -o h/tiny.c built, and tiny.c was the image; -o h/harness.toml too."""
    d = harness(tmp_path, tiny=HELLO)
    (tmp_path / "link").symlink_to(d)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    for out in [d / "tiny.c", d / "harness.toml", d / "src" / "new.c", d / "new.h", tmp_path / "link" / "tiny.c"]:
        assert main(["build", str(d), "-o", str(out)]) == 2
        assert f"{out}: refusing to write the image over its own source" in capsys.readouterr().err
    monkeypatch.chdir(d)
    with pytest.raises(BuildError, match="^tiny.c: refusing to write the image over its own source"):
        build_harness(Path("."), Path("tiny.c"))
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    assert build_harness(Path("."), Path("tiny.elf")) == Path("tiny.elf")  # an image may sit beside its sources


def test_a_harness_toml_linked_outside_the_harness_directory_is_refused(tmp_path):
    """Found by a review: it was read (its description built into the image), though a source linked outside is
    refused."""
    d = harness(tmp_path, tiny=HELLO)
    (tmp_path / "elsewhere.toml").write_text(TOML.replace("Says hello.", "read from elsewhere"))
    (d / "harness.toml").unlink()
    (d / "harness.toml").symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(BuildError, match=re.escape(f"{d / 'harness.toml'}: harness.toml leads outside the harness "
                                                   f"directory")):
        build_harness(d, tmp_path / "x.elf")
    assert not (tmp_path / "x.elf").exists()
    (d / "real.toml").write_text(TOML)  # a link inside is followed, as a source's is
    (d / "harness.toml").unlink()
    (d / "harness.toml").symlink_to("real.toml")
    assert build_harness(d, tmp_path / "x.elf").exists()


def test_a_blank_description_is_warned_about(tmp_path, capsys):
    """Found by a review: a tool described by "" or blanks was built without a word (an agent sees only its name)."""
    d = harness(tmp_path, TOML.replace('"Says hello."', '" \\n"'), tiny=HELLO)
    assert main(["build", str(d), "-o", str(tmp_path / "x.elf")]) == 0
    assert f"{d / 'harness.toml'}:5: tool 'hello' has no description" in capsys.readouterr().err


def test_a_diagnostic_naming_a_source_whose_path_is_no_utf8_is_shown(tmp_path):
    """Found by a review: the compiler's message, decoded as UTF-8, was a UnicodeDecodeError traceback."""
    d = harness(tmp_path / os.fsdecode(b"bad\xff"), tiny="int broken(void) { return undefined_thing; }\n")
    with pytest.raises(ToolchainError, match="bad\ufffd/h/tiny.c:1:.*use of undeclared identifier 'undefined_thing'"):
        build_harness(d, tmp_path / "x.elf")


def test_a_source_whose_name_is_no_utf8_is_refused_by_name(tmp_path):
    """Found by a review: it compiled, and the image's own check then failed ("a name in the symbol-name table is
    not UTF-8"), naming no file."""
    d = harness(tmp_path, tiny=HELLO)
    (d / os.fsdecode(b"bad\xff.c")).write_text("int other;\n")
    with pytest.raises(BuildError, match=r"h/bad\\xff\.c: a source's name must be UTF-8: rename it"):
        build_harness(d, tmp_path / "x.elf")


def test_hidden_files_are_no_sources(tmp_path):
    """Found by a review: Emacs's lock beside a file with unsaved edits (a dangling link ``.#tiny.c``) was taken
    for a source, and stopped the build; a shell's ``*.c`` leaves hidden names out, and so does the build."""
    d = harness(tmp_path, tiny=HELLO)
    (d / ".#tiny.c").symlink_to("someone@host.1234:1700000000")
    (d / "src" / ".cache").mkdir()
    (d / "src" / ".cache" / "old.c").write_text("this is no C\n")
    build_harness(d, tmp_path / "x.elf")
    assert engine_harness("interp", (tmp_path / "x.elf").read_bytes()).call("hello") == "hello"


def test_a_link_error_names_the_authors_source_not_its_object(tmp_path):
    """Found by a review: the linker's message cited /tmp/berm-build-…/own/000-tiny.o, gone once it showed."""
    d = harness(tmp_path, tiny='#include "berm.h"\nint missing(void);\n'
                               'BERM_TOOL(hello) { return berm_ok_str(missing() ? "a" : "b"); }\n')
    with pytest.raises(ToolchainError, match="undefined symbol: missing") as caught:
        build_harness(d, tmp_path / "x.elf")
    assert str(d / "tiny.c") in str(caught.value) and ".o" not in str(caught.value).replace("tiny.c", "")


def test_a_global_named_like_a_tool_that_is_no_function_is_refused_by_line(tmp_path):
    """Found by a review: ``int berm_tool_hello;`` counted as the tool, and the image's check failed at the end of
    the build, naming no file."""
    d = harness(tmp_path, tiny='#include "berm.h"\n\nint berm_tool_hello = 3;\n')
    with pytest.raises(BuildError, match=rf"{d / 'tiny.c'}:3: berm_tool_hello is not a function"):
        build_harness(d, tmp_path / "x.elf")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.symlink_to(p.parent / "gone.toml"), "harness.toml: cannot read: No such file or directory"),
    (lambda p: os.mkfifo(p), "harness.toml is not a regular file"),
])
def test_berm_build_of_a_harness_toml_it_cannot_read_says_so(tmp_path, capsys, make, message):
    """Found by a review: a harness.toml that is a dangling link or a FIFO was "neither harness.toml nor
    Cargo.toml"."""
    d = harness(tmp_path, tiny=HELLO)
    (d / "harness.toml").unlink()
    make(d / "harness.toml")
    assert ends_within(GRACE, lambda: main(["build", str(d), "-o", str(tmp_path / "x.elf")])) == 2
    assert message in capsys.readouterr().err


def test_an_output_ending_in_a_slash_is_refused(tmp_path, capsys):
    """Found by a review: -o newdir/ wrote a file named newdir (Path drops the slash)."""
    d = harness(tmp_path, tiny=HELLO)
    with pytest.raises(SystemExit) as usage:
        main(["build", str(d), "-o", f"{tmp_path / 'newdir'}/"])
    assert usage.value.code == 2
    assert "names a directory: name the image file" in capsys.readouterr().err
    assert not (tmp_path / "newdir").exists()
