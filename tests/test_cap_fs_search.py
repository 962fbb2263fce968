"""berm.fs.glob and berm.fs.grep: matching, ordering, caps, .gitignore, binary files, confinement, timeouts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from berm_abi.frames import encode_frame
from berm_host.capabilities import dirwalk, fs, fs_search, gitignore, grep_worker
from berm_host.capabilities._request import Deadline
from berm_host.capabilities.patterns import Glob, glob_source, literal_prefix
from berm_host.capabilities.paths import MAX_DEPTH, Root
from berm_host.linker import CapabilityError


def _tree(root, files: dict[str, bytes | str]) -> None:
    for i, (rel, data) in enumerate(files.items()):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        os.utime(p, ns=(1_000_000_000 * (i + 1), 1_000_000_000 * (i + 1)))  # later entries are newer


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    _tree(r, {
        "README.md": "# TODO write me\n",
        "src/main.c": "int main(void) {\n    return 0; // TODO\n}\n",
        "src/util/str.c": "/* nothing to do */\n",
        "src/util/str.h": "#pragma once\n",
        "build/out.c": "// TODO generated\n",
        "logo.png": b"\x89PNG\0\0TODO",
        "notes/todo.txt": "TODO one\nTODO two\nnothing\nTODO three\n",
    })
    (r / ".gitignore").write_text("build/\n*.log\n")
    (r / "debug.log").write_text("TODO in a log\n")
    return r


@pytest.fixture
def caps(root):
    return fs_search.capabilities(Root(root), timeout=10)


@pytest.fixture
def workers(monkeypatch):
    """A pool of grep workers of the test's own (none idle at first), stopped after it."""
    pool = fs_search._Workers()
    monkeypatch.setattr(fs_search, "_workers", pool)
    yield pool
    pool.close()


def _workers_running(setup: str) -> list[str]:
    """The command of a grep worker that runs ``setup`` first (to break the regex module inside it)."""
    return [sys.executable, "-c", f"{setup}\nfrom berm_host.capabilities import grep_worker\ngrep_worker.main()"]


#: The last line of a listing that left out what lies deeper than a path may reach.
TOO_DEEP = f"[truncated: directories more than {MAX_DEPTH} levels deep were not walked]"


def glob(caps, pattern: str, path: str = "") -> list[str]:
    out = caps["berm.fs.glob"](encode_frame([pattern, path])).decode()
    return out.split("\n") if out else []


def grep(caps, pattern: str, path: str = "", include: str = "", mode: str = "files") -> list[str]:
    out = caps["berm.fs.grep"](encode_frame([pattern, path, include, mode])).decode()
    return out.split("\n") if out else []


def test_glob_lists_root_relative_paths_newest_first(caps):
    assert glob(caps, "**/*.c") == ["build/out.c", "src/util/str.c", "src/main.c"]
    assert glob(caps, "src/**/*.[ch]") == ["src/util/str.h", "src/util/str.c", "src/main.c"]
    assert glob(caps, "*.c", "src") == ["src/main.c"]
    assert glob(caps, "*.{md,txt}") == ["README.md"]
    assert glob(caps, "**/*.{md,txt}") == ["notes/todo.txt", "README.md"]
    assert glob(caps, "**/nothing-*") == []


def test_glob_star_stays_inside_one_component(caps):
    assert glob(caps, "src/*.c") == ["src/main.c"]
    assert glob(caps, "s?c/util/str.?") == ["src/util/str.h", "src/util/str.c"]


def test_glob_output_is_capped_and_says_so(root):
    for i in range(12):
        (root / "many" / f"f{i:02}").parent.mkdir(exist_ok=True)
        (root / "many" / f"f{i:02}").write_bytes(b"")
    out = fs_search.glob(Root(root), "many/*", "", Deadline(10), cap=5).decode().split("\n")
    assert len(out) == 6
    assert out[-1] == "[truncated: 12 matches, showing the newest 5]"


@pytest.mark.parametrize("call", ["glob", "files", "content", "count"])
def test_a_reply_of_long_escaped_paths_is_cut_at_its_byte_cap(tmp_path, call):
    """Found by a review: only the number of lines was capped, and a name's bytes shown as ``\\xNN`` take four
    characters each: deep names of control bytes made one glob's reply 130 MB and its host 430 MB."""
    root = tmp_path / "root"
    deep = root / ("\x01" * 255) / ("\x01" * 255)
    deep.mkdir(parents=True)
    for i in range(600):  # each path shown in ~2,060 characters: 1.2 MB in all
        (deep / f"f{i:03}").write_text("needle\n")
    caps = fs_search.capabilities(Root(root), timeout=30)
    out = glob(caps, "**/f*") if call == "glob" else grep(caps, "needle", mode=call)
    size = len("\n".join(out).encode())
    assert fs_search.REPLY_BYTES - 3000 < size <= fs_search.REPLY_BYTES + 200
    assert out[-1].startswith("[truncated: ") and f"cut at {fs_search.REPLY_BYTES >> 10} KiB, after" in out[-1]
    assert all(line.startswith("\\x01" * 255 + "/") for line in out[:-1])


@pytest.mark.parametrize("call, request_fields", [
    ("berm.fs.glob", ["x" * 300 + "/*", ""]), ("berm.fs.glob", ["*", "y" * 300]),
    ("berm.fs.grep", ["a", "z" * 300, "", "files"])])
def test_an_os_error_of_a_search_names_its_path(caps, call, request_fields):
    """Found by a review: the guest was told "berm.fs.glob: File name too long", without the path (as fs.write
    was once)."""
    named = request_fields[1] or request_fields[0]
    with pytest.raises(CapabilityError, match=f"^{re.escape(f'{call}: {named}: File name too long')}$"):
        caps[call](encode_frame(request_fields))


def test_a_search_worker_that_cannot_start_is_said_so(caps, workers, monkeypatch):
    def no_fork(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(subprocess, "Popen", no_fork)
    with pytest.raises(CapabilityError, match="^berm.fs.grep: cannot start a search worker: Resource temporarily"):
        grep(caps, "TODO")


def test_glob_does_not_leave_the_root(root, tmp_path, caps):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.c").write_text("x")
    (root / "door").symlink_to(tmp_path / "outside")
    assert "door/secret.c" not in glob(caps, "**/*.c")
    with pytest.raises(CapabilityError, match="leaves the root"):
        glob(caps, "../outside/*.c")
    with pytest.raises(CapabilityError, match="leaves the root"):
        glob(caps, "*.c", "src/../..")
    with pytest.raises(CapabilityError, match="points outside the root"):
        glob(caps, "*.c", "door")


def test_glob_lists_symlinks_as_names_without_entering_them(root, caps):
    (root / "src" / "alias").symlink_to("util")
    assert glob(caps, "src/alias") == ["src/alias"]
    assert glob(caps, "src/**/str.c") == ["src/util/str.c"]
    assert glob(caps, "*.c", "src/alias") == ["src/util/str.c"]  # a base named through a link inside is followed


def test_grep_modes(caps):
    assert grep(caps, "TODO") == ["notes/todo.txt", "src/main.c", "README.md"]
    assert grep(caps, "TODO", mode="count") == ["README.md:1", "notes/todo.txt:3", "src/main.c:1"]
    assert grep(caps, "TODO (one|three)", mode="content") == ["notes/todo.txt:1:TODO one",
                                                             "notes/todo.txt:4:TODO three"]
    assert grep(caps, r"^\s+return", mode="content") == ["src/main.c:2:    return 0; // TODO"]


def test_grep_honours_gitignore_and_skips_binary_files(caps):
    hits = grep(caps, "TODO")
    assert "build/out.c" not in hits and "debug.log" not in hits
    assert "logo.png" not in hits


def test_grep_gitignore_negation_and_nested_files(root, caps):
    (root / "src" / ".gitignore").write_text("*.c\n!main.c\n")
    (root / ".gitignore").write_text("*.log\n/notes\n")
    assert grep(caps, "TODO|nothing") == ["build/out.c", "src/main.c", "README.md"]


def test_grep_include_and_path(caps):
    assert grep(caps, "TODO", include="*.c") == ["src/main.c"]
    assert grep(caps, "to do", path="src") == ["src/util/str.c"]
    assert grep(caps, "TODO", path="notes/todo.txt", mode="count") == ["notes/todo.txt:3"]
    assert grep(caps, "TODO", include="src/*.c") == ["src/main.c"]


def test_grep_content_is_capped_and_long_lines_cut(root):
    (root / "long.txt").write_text(("x" * 2000 + "\n") * 30)
    out = fs_search.grep(Root(root), "x", "long.txt", "", "content", Deadline(10), cap=10).decode().split("\n")
    assert len(out) == 11
    assert out[0] == "long.txt:1:" + "x" * grep_worker.LINE_CAP + "…"
    assert out[-1] == "[truncated: more than 10 matching lines]"


def test_grep_files_and_count_are_capped(root):
    for i in range(7):
        (root / "many" / f"f{i}").parent.mkdir(exist_ok=True)
        (root / "many" / f"f{i}").write_text("needle\n")
        os.utime(root / "many" / f"f{i}", ns=(10**18 + i, 10**18 + i))
    r = Root(root)
    files = fs_search.grep(r, "needle", "many", "", "files", Deadline(10), cap=3).decode().split("\n")
    assert files == ["many/f6", "many/f5", "many/f4", "[truncated: 7 matching files, showing the newest 3]"]
    counts = fs_search.grep(r, "needle", "many", "", "count", Deadline(10), cap=3).decode().split("\n")
    assert counts == ["many/f0:1", "many/f1:1", "many/f2:1", "[truncated: more than 3 matching files]"]


def test_grep_does_not_follow_symlinks_out(root, tmp_path, caps):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("TODO secret\n")
    (root / "file-door").symlink_to(tmp_path / "outside" / "secret.txt")
    (root / "dir-door").symlink_to(tmp_path / "outside")
    assert not any("door" in h for h in grep(caps, "secret"))
    with pytest.raises(CapabilityError, match="points outside the root"):
        grep(caps, "secret", path="file-door")


def test_grep_refuses_bad_regex_and_mode(root, caps):
    with pytest.raises(CapabilityError, match="bad regex"):
        grep(caps, "(unclosed")
    (root / "empty").mkdir()
    with pytest.raises(CapabilityError, match="bad regex"):  # with nothing to search too
        grep(caps, "(unclosed", path="empty")
    with pytest.raises(CapabilityError, match="mode must be one of"):
        grep(caps, "x", mode="everything")


@pytest.mark.parametrize("pattern", ["a{4294967294}", "(a{1000}){1000}", "(ab){100001}", "x{1,2000000}"])
def test_a_regex_that_would_unroll_into_gigabytes_is_refused_before_compiling(caps, pattern):
    """The regex module unrolls counted repeats when it compiles, before the time budget applies: the 13
    characters a{4294967294} took the host to 6 GiB and counting (the kernel's OOM killer ended it)."""
    with pytest.raises(CapabilityError, match="counted repeats"):
        grep(caps, pattern)


@pytest.mark.parametrize("pattern", ["(?x)a{1 000000}", "(?x)a{4294967294 }", "(?x)a{1#}\n000000}", "(?ix:a{1 0000000})",
                                     "(?i)(?x)b{10 0000}"])
def test_verbose_mode_cannot_hide_a_counted_repeat(caps, pattern):
    """Found by a review: verbose mode lets whitespace and comments into a count, which the repeat check did not
    see: (?x)a{4294967294 } took the host to 3 GiB in 5 s, before the search's time budget began."""
    with pytest.raises(CapabilityError, match=r"inline flags \(\?.*verbose mode"):
        grep(caps, pattern)


def test_inline_flags_that_hide_nothing_still_search(root, caps):
    (root / "mixed.txt").write_text("Needle\n")
    assert grep(caps, "(?i)needle") == grep(caps, "(?-x:Needle)") == grep(caps, r"\(?x\)|Needle") == ["mixed.txt"]


@pytest.mark.parametrize("pattern", ["(?r)a", "(?ir)A", "(?r:a)"])
def test_the_reverse_flag_is_refused(root, caps, pattern):
    """Found by a review: the worker searches forward, so (?r)a counted one of three matching lines."""
    with pytest.raises(CapabilityError, match=r"turn on reverse searching \(r\)"):
        grep(caps, pattern)


def test_a_version_flag_is_a_tool_error_not_a_host_bug(caps):
    """Found by a review: (?V1) contradicts the VERSION0 the host compiles with, and the regex module raised a
    KeyError, which reached the guest as the host-call-failed trap."""
    with pytest.raises(CapabilityError, match="version"):
        grep(caps, "(?V1)[[a-z]--[aeiou]]")


@pytest.mark.parametrize(("pattern", "what"), [
    ("(?R){e<=1}", "recursion"), ("(?:(?R)){i<=1}", "recursion"), ("(?R)*", "recursion"), ("a(?0)?b", "recursion"),
    ("(a)(?1)", "recursion"), ("(a)(?-1)", "recursion"), ("(?P<x>a)(?&x)", "recursion"), ("(?P<x>a)(?P>x)", "recursion"),
    ("a{e<=1}", "fuzzy matching"), ("2\\G{e<=1}~~", "fuzzy matching"), ("(?:cat){i,d}", "fuzzy matching"),
    ("dog{2i+1s<=3}", "fuzzy matching"), ("x{ e }", "fuzzy matching"),
])
def test_recursion_and_fuzzy_matching_are_refused(root, caps, pattern, what):
    """Found by a hostile review: the regex module crashed the host process with a SIGSEGV on (?R){e<=1} over any
    text (one grep from a guest ended the daemon and every harness in it), (?R)* grew its stack to ~700 MiB on a
    6-byte file, and fuzzy matching raised RuntimeError ("invalid RE code") while matching 2\\G{e<=1}~~, a host-call
    trap where a bad pattern is an error reply."""
    (root / "t.txt").write_text("2~~ hello\n")
    with pytest.raises(CapabilityError, match=f"^berm.fs.grep: bad regex: grep does not support {what}"):
        grep(caps, pattern)


def test_braces_that_are_not_fuzzy_constraints_still_search(root, caps):
    (root / "t.txt").write_text("{index} {e} x{2}\n")
    assert grep(caps, r"\{index\}", mode="count") == grep(caps, r"x\{2\}", mode="count") == ["t.txt:1"]
    assert grep(caps, r"(?:ab)(?i:x)", mode="count") == []


def test_a_failure_of_the_regex_module_while_matching_is_an_error_reply(root, caps, workers, monkeypatch):
    """The regex module raises RuntimeError for its own inconsistencies; whatever pattern gets there, the guest gets
    an error reply, never the host-call-failed trap."""
    (root / "t.txt").write_text("text\n")
    monkeypatch.setattr(fs_search, "WORKER", _workers_running(
        "import regex\n"
        "class Broken:\n"
        "    def search(self, *args, **kwargs):\n"
        "        raise RuntimeError('invalid RE code')\n"
        "compile_ = regex.compile\n"
        "regex.compile = lambda p, *a, **k: Broken() if p == 'text' else compile_(p, *a, **k)\n"))
    with pytest.raises(CapabilityError, match=r"^berm.fs.grep: bad regex: the regex module failed while matching it"):
        grep(caps, "text")


def test_a_search_that_runs_out_of_memory_returns_what_it_found(root, caps):
    """Found by a review: a backtracking pattern over an 8 MiB file grows the regex module's stack to ~660 MiB, and
    its MemoryError reached the guest as the host-call-failed trap. It ends the search like a timeout now."""
    (root / "a-found.txt").write_text("7\n")
    (root / "big.txt").write_bytes(b"a" * (8 << 20))
    out = grep(caps, r"(a|b)*\d", include="*.txt", mode="count")
    assert out == ["a-found.txt:1", "[truncated: the pattern needed too much memory (it backtracks too much: "
                                    "simplify it), the results so far]"]


def test_counted_repeats_of_ordinary_size_still_search(root, caps):
    (root / "dates.txt").write_text("on 2026-12-01 and 1999-01-02\n")
    assert grep(caps, r"\d{4}-\d{2}-\d{2}", mode="content") == ["dates.txt:1:on 2026-12-01 and 1999-01-02"]
    assert grep(caps, r"x{0,60000}9", path="dates.txt") == ["dates.txt"]


def test_a_catastrophic_regex_times_out_instead_of_hanging(root):
    (root / "evil.txt").write_text("x" * 4000 + "\n")
    caps = fs_search.capabilities(Root(root), timeout=0.3)
    out = caps["berm.fs.grep"](encode_frame([r"(x+x+)+y", "evil.txt", "", "files"]))
    assert out == b"[truncated: timed out after 0.3 s, the results so far]"


def test_a_pathological_glob_matches_in_linear_time(root):
    """Found by a hostile review: the regex module took 1.7 s of CPU to find that ``*a`` ×200 then ``b`` does not
    match a name of 250 a's, and its timeout counts CPU time, so on a starved machine a glob with a 2 s budget held
    the host thread 5.4 s. RE2 answers in about a millisecond: forty such names are all looked at, well inside the
    budget (before: timed out)."""
    for i in range(40):
        (root / ("a" * 250 + f"{i:02}")).write_bytes(b"")
    (root / ("a" * 250 + "b")).write_bytes(b"")
    caps = fs_search.capabilities(Root(root), timeout=30)
    assert caps["berm.fs.glob"](encode_frame(["*a" * 200 + "b", ""])) == b"a" * 250 + b"b"
    assert len(caps["berm.fs.glob"](encode_frame(["*a" * 200 + "*[0-9]", ""])).split(b"\n")) == 40


def test_a_pathological_gitignore_rule_matches_in_linear_time(root):
    """Found by a review: .gitignore rules were matched by the regex module, as globs were before RE2 (above): ``*a``
    ×120 then ``b`` took it seconds of CPU for each long name, and a grep with a 2 s budget held the host 55 s on a
    busy machine. With RE2 every name is looked at well inside the budget (before: timed out)."""
    _tree(root, {"deep/.gitignore": "*a" * 120 + "b\n", "deep/" + "a" * 250 + "b": "needle\n",
                 **{"deep/" + "a" * 250 + f"{i:02}": "needle\n" for i in range(40)}})
    caps = fs_search.capabilities(Root(root), timeout=10)
    found = grep(caps, "needle", path="deep")
    assert len(found) == 40 and "deep/" + "a" * 250 + "b" not in found


def test_a_gitignore_rule_that_is_not_utf8_hides_the_file_it_names(root):
    """Found by a review: the .gitignore was decoded with replacement characters, so a rule naming a Latin-1 file
    name never matched it (git hides it)."""
    (root / "latin1").mkdir()
    (root / "latin1" / ".gitignore").write_bytes(b"caf\xe9.txt\n")
    for name in (b"caf\xe9.txt", b"other.txt"):
        (root / "latin1" / os.fsdecode(name)).write_text("needle\n")
    assert grep(fs_search.capabilities(Root(root), timeout=30), "needle", path="latin1") == ["latin1/other.txt"]


def test_a_search_past_its_time_returns_what_it_found(root):
    (root / "found.txt").write_text("needle\n")
    (root / "zz-slow.txt").write_text("x" * 4000 + "\n")
    # A grep worker started and idle: starting one (~70 ms, several times that on a loaded machine) is not timed here.
    assert fs_search.grep(Root(root), "needle", "found.txt", "", "files", Deadline(60)) == b"found.txt"
    out = fs_search.grep(Root(root), r"needle|(x+x+)+y", "", "*.txt", "content", Deadline(0.3)).decode()
    assert out.split("\n") == ["found.txt:1:needle", "[truncated: timed out after 0.3 s, the results so far]"]


def _ignore_rules(directory, n: int, tag: str) -> None:
    (directory / ".gitignore").write_text("".join(f"{tag}{i:x}\n" for i in range(n)))


def test_gitignore_rules_count_against_the_search_time(root, monkeypatch):
    """The .gitignore files of the directories above the search's base were parsed before its time budget was
    looked at: a guest's deep path of 256 KiB .gitignore files took a 2 s grep past 30 s. No rule is compiled
    once the budget is spent."""
    deep = root / "d0" / "d1" / "d2"
    deep.mkdir(parents=True)
    for level, directory in enumerate([root, root / "d0", root / "d0" / "d1"]):
        _ignore_rules(directory, 3000, f"r{level}x")
    (deep / "f.txt").write_text("needle\n")
    compiled = []
    monkeypatch.setattr(gitignore, "Rule", lambda *args: compiled.append(args))
    out = fs_search.grep(Root(root), "needle", "d0/d1/d2", "", "files", Deadline(0.0)).decode()
    assert out == "[truncated: timed out after 0 s, the results so far]"
    assert compiled == []


def test_grep_through_a_link_reads_the_ignore_files_above_its_target_however_they_are_named(tmp_path):
    """Found by a review: the .gitignore files above the searched directory were read by opening each again by its
    real path from the root. A directory reached through a link whose real path holds a name that is not UTF-8
    raised UnicodeEncodeError (a host bug), and one whose real path is longer than a guest path may be was refused;
    fs.read and fs.glob reached both. Each ancestor is now read through the descriptor the resolution holds."""
    root = os.fsencode(tmp_path / "root")
    os.makedirs(root + b"/d\xff/sub")
    with open(root + b"/d\xff/.gitignore", "wb") as f:
        f.write(b"skip.txt\n")
    for name in (b"f.txt", b"skip.txt"):
        with open(root + b"/d\xff/sub/" + name, "wb") as f:
            f.write(b"needle\n")
    os.symlink(b"d\xff/sub", root + b"/link")
    names = [f"{i:02d}" + "a" * 240 for i in range(20)]  # 4,840 bytes of real path, under two 2,400-byte links
    fd = os.open(root, os.O_RDONLY)  # made a directory at a time: the whole path is longer than PATH_MAX
    for i, name in enumerate(names):
        os.mkdir(name, dir_fd=fd)
        below = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
        if i == 9:
            os.symlink("/".join(names[10:]), "l2", dir_fd=fd)
    with open(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("needle\n")
    os.close(fd)
    os.symlink("/".join(names[:10]), root + b"/l1")
    caps = fs_search.capabilities(Root(os.fsdecode(root)), timeout=10)
    assert grep(caps, "needle", path="link") == ["d\\xff/sub/f.txt"]
    assert grep(caps, "needle", path="l1/l2") == ["/".join([*names, "f.txt"])]


def test_more_gitignore_rules_in_force_than_the_limit_is_an_error(root):
    caps = fs_search.capabilities(Root(root), timeout=120)  # 10,000 rules compiled per grep: ~3 s, 10 s+ under load
    (root / "d0").mkdir()
    _ignore_rules(root, gitignore.MAX_RULES // 2, "a")
    _ignore_rules(root / "d0", gitignore.MAX_RULES // 2, "b")
    (root / "d0" / "f.txt").write_text("needle\n")
    assert grep(caps, "needle", path="d0") == ["d0/f.txt"]  # exactly the limit
    with (root / "d0" / ".gitignore").open("a") as f:
        f.write("one-more\n")
    with pytest.raises(CapabilityError, match=r"d0/\.gitignore brings the \.gitignore rules in force to more than"):
        grep(caps, "needle", path="d0")
    with pytest.raises(CapabilityError, match="more than"):
        grep(caps, "needle")  # walked into from the root, the same


def test_more_gitignore_pattern_bytes_in_force_than_the_limit_is_an_error(root, monkeypatch):
    """Found by a review: what a compiled rule costs grows with its pattern, and 10,000 rules of `*a` ×500 took
    1.2 GB. The bytes of the rules' sources in force are bounded as their number is (the bound made small here)."""
    monkeypatch.setattr(gitignore, "MAX_RULE_BYTES", 4000)
    caps = fs_search.capabilities(Root(root), timeout=60)
    (root / "d0").mkdir()
    (root / ".gitignore").write_text("*a" * 400 + "\n")  # 2,400 bytes of source: [^/]*a 400 times
    (root / "d0" / "f.txt").write_text("needle\n")
    assert grep(caps, "needle", path="d0") == ["d0/f.txt"]
    (root / "d0" / ".gitignore").write_text("*b" * 300 + "\n")
    with pytest.raises(CapabilityError, match=r"d0/\.gitignore brings the \.gitignore rules in force to more than 4000 "
                                              "bytes of patterns"):
        grep(caps, "needle", path="d0")


def test_bad_glob_patterns_are_errors(caps, root):
    with pytest.raises(CapabilityError, match="bad glob pattern"):
        glob(caps, "[z-a]")
    with pytest.raises(CapabilityError, match="bad glob pattern"):
        grep(caps, "x", include="[z-a]")
    (root / ".gitignore").write_text("[z-a]\nbuild/\n")  # git skips a pattern it cannot use, and so do we
    assert "build/out.c" not in grep(caps, "TODO")


def test_malformed_search_requests(caps):
    with pytest.raises(CapabilityError, match="malformed request"):
        caps["berm.fs.grep"](encode_frame(["x", "", ""]))
    with pytest.raises(CapabilityError, match="malformed request"):
        caps["berm.fs.glob"](encode_frame(["*"])[:-1])
    with pytest.raises(CapabilityError, match="not valid UTF-8"):
        caps["berm.fs.glob"](encode_frame([b"\xff*", ""]))
    with pytest.raises(CapabilityError, match="NUL"):
        caps["berm.fs.glob"](encode_frame(["a\0*", ""]))


def test_glob_translation():
    assert literal_prefix("src/a/**/*.c") == ("src/a", "**/*.c")
    assert literal_prefix("*.c") == ("", "*.c")
    assert Glob("**").match("a/b/c")
    assert Glob("a/**/b").match("a/b") and Glob("a/**/b").match("a/x/y/b")
    assert not Glob("a/*/b").match("a/x/y/b")
    assert Glob("[!a]*").match("b") and not Glob("[!a]*").match("a")
    assert Glob(r"\*").match("*") and not Glob(r"\*").match("x")
    assert Glob("*.c", basename_if_no_slash=True).match("deep/down/x.c")
    assert glob_source("[unclosed") == r"\[unclosed"


def test_a_tree_deeper_than_paths_may_reach_is_searched_down_to_that_depth(root, caps):
    """os.fwalk recurses a level per directory: a 1,200-level tree (a guest can make one with mkdir -p through
    exec, or find one in a repository) raised RecursionError out of grep and glob, a trap instead of a reply. What
    lies deeper than a path may reach is left out, and the listing says so."""
    deep = root / "deep"
    deep.mkdir()
    path = deep
    for _ in range(1200):  # one level at a time: Path.mkdir(parents=True) recurses too
        path = path / "d"
        path.mkdir()
    (path / "f.txt").write_text("needle\n")
    (deep / "near.txt").write_text("needle\n")
    try:
        assert grep(caps, "needle")[-2:] == ["deep/near.txt", TOO_DEEP]
        assert glob(caps, "**/f.txt") == [TOO_DEEP]
    finally:  # bottom up: shutil.rmtree, pytest's cleanup of old temporary directories included, recurses too
        (path / "f.txt").unlink()
        while path != deep:
            path.rmdir()
            path = path.parent


def test_glob_names_what_it_finds_by_where_it_is_not_by_the_path_that_led_there(root, caps):
    """The base is resolved inside the root; the paths listed are root-relative to where the walk really is:
    after a `..`, and after an absolute symlink met in a subdirectory (which restarts at the root)."""
    (root / "src" / "to-notes").symlink_to(root / "notes")
    assert glob(caps, "*.txt", "src/../notes") == ["notes/todo.txt"]
    assert glob(caps, "*.txt", "src/util/../../notes") == ["notes/todo.txt"]
    assert glob(caps, "*.txt", "src/to-notes") == ["notes/todo.txt"]
    assert glob(caps, "*.md", str(root)) == ["README.md"]  # the root itself, named absolutely
    assert grep(caps, "TODO two", "src/to-notes/todo.txt", mode="content") == ["notes/todo.txt:2:TODO two"]


def test_grep_content_numbers_every_matching_line(caps):
    assert grep(caps, "TODO", path="notes", mode="content") == ["notes/todo.txt:1:TODO one",
                                                                "notes/todo.txt:2:TODO two",
                                                                "notes/todo.txt:4:TODO three"]


def test_glob_of_exactly_cap_matches_is_not_marked(root):
    for i in range(5):
        (root / "five" / f"f{i}").parent.mkdir(exist_ok=True)
        (root / "five" / f"f{i}").write_bytes(b"")
    out = fs_search.glob(Root(root), "five/*", "", Deadline(10), cap=5).decode().split("\n")
    assert sorted(out) == [f"five/f{i}" for i in range(5)]


def test_a_match_on_a_line_ending_counts_its_line_once(root, caps):
    (root / "spaces.txt").write_text("a b\nc")
    assert grep(caps, r"\s", path="spaces.txt", mode="count") == ["spaces.txt:1"]
    assert grep(caps, r"b$|\n", path="spaces.txt", mode="content") == ["spaces.txt:1:a b"]


def test_no_line_follows_a_files_last_newline(root, caps):
    """Found by a review: the search ran to the end of the text, past the last line's newline, so `^$` matched a
    third line of "x\\ny\\n" and a line of an empty file, and `^` counted three lines where GNU grep counts two."""
    _tree(root, {"lines/two.txt": "x\ny\n", "lines/empty.txt": "", "lines/blank.txt": "\n", "lines/open.txt": "x"})
    assert grep(caps, "^$", path="lines", mode="content") == ["lines/blank.txt:1:"]
    assert set(grep(caps, "^", path="lines", mode="count")) == {"lines/two.txt:2", "lines/blank.txt:1",
                                                                 "lines/open.txt:1"}
    assert grep(caps, "x$", path="lines", mode="content") == ["lines/open.txt:1:x", "lines/two.txt:1:x"]
    # a review of that fix: the last line's newline is still there to match
    _tree(root, {"ends/two.txt": "x\nx\n"})
    assert grep(caps, r"x\s", path="ends", mode="count") == grep(caps, r"x(?=\n)", path="ends", mode="count") == [
        "ends/two.txt:2"]


def test_a_line_of_exactly_line_cap_characters_is_not_cut(root, caps):
    (root / "edge.txt").write_text("y" * grep_worker.LINE_CAP + "\n")
    assert grep(caps, "y", path="edge.txt", mode="content") == ["edge.txt:1:" + "y" * grep_worker.LINE_CAP]


def test_only_the_first_8_kib_decide_whether_a_file_is_binary(root, caps):
    (root / "late-nul.txt").write_bytes(b"needle\n" + b"." * (fs_search.BINARY_PROBE - 8) + b"\n\0")
    (root / "early-nul.txt").write_bytes(b"needle\n" + b"." * (fs_search.BINARY_PROBE - 8) + b"\0\n")
    assert grep(caps, "needle", include="*-nul.txt") == ["late-nul.txt"]


def test_files_of_exactly_the_read_cap_are_searched(root, caps, monkeypatch):
    monkeypatch.setattr(fs_search, "READ_CAP", 100)
    (root / "cap").mkdir()
    (root / "cap" / "exact.txt").write_bytes(b"needle\n" + b"." * 93)
    (root / "cap" / "over.txt").write_bytes(b"needle\n" + b"." * 94)
    assert grep(caps, "needle", path="cap") == ["cap/exact.txt"]
    assert grep(caps, "needle", path="cap/exact.txt") == ["cap/exact.txt"]  # named alone, read to the cap
    assert grep(caps, "needle", path="cap/over.txt") == []


def test_git_directories_are_neither_listed_nor_searched(root, caps):
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("TODO inside git\n")
    (root / "src" / ".git").mkdir()
    (root / "src" / ".git" / "HEAD").write_text("TODO nested git\n")
    assert not any(".git/" in p for p in glob(caps, "**/*"))
    assert not any(".git/" in p for p in grep(caps, "TODO"))


def test_a_zero_count_does_not_hide_the_repeats_after_it(caps):
    with pytest.raises(CapabilityError, match="counted repeats"):
        grep(caps, "x{0}(a{1000}){1000}")


def test_a_gitignore_symlink_is_not_followed(root, tmp_path, caps):
    (tmp_path / "outside-ignore").write_text("*.md\n")
    (root / "src" / ".gitignore").symlink_to(tmp_path / "outside-ignore")
    (root / "src" / "doc.md").write_text("TODO doc\n")
    assert "src/doc.md" in grep(caps, "TODO")


def test_glob_pattern_named_absolutely_inside_the_root(root, caps):
    assert glob(caps, f"{root.resolve()}/src/*.c") == ["src/main.c"]


def test_grep_files_of_the_same_time_are_ordered_by_path(root):
    for rel in ["same/z.txt", "same/b/c.txt", "same/a.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("needle\n")
        os.utime(root / rel, ns=(10**18, 10**18))
    out = fs_search.grep(Root(root), "needle", "same", "", "files", Deadline(10)).decode().split("\n")
    assert out == ["same/a.txt", "same/b/c.txt", "same/z.txt"]


def test_glob_files_of_the_same_time_are_ordered_by_path(root, caps):
    for rel in ["same/a.txt", "same/z.txt", "same/b/c.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
        os.utime(root / rel, ns=(10**18, 10**18))
    assert glob(caps, "**/*.txt", "same") == ["same/a.txt", "same/b/c.txt", "same/z.txt"]


def test_grep_include_with_a_slash_is_relative_to_the_path_searched(caps):
    assert grep(caps, "to do", path="src", include="util/*.c") == ["src/util/str.c"]


def test_gitignore_trailing_spaces_are_dropped_unless_escaped(root, caps):
    (root / ".gitignore").write_text("build/\n*.md   \nspace\\ \n")
    (root / "space ").write_text("TODO space\n")
    (root / "space").write_text("TODO no space\n")
    assert sorted(grep(caps, "TODO")) == ["debug.log", "notes/todo.txt", "space", "src/main.c"]


def test_gitignore_anchoring_and_directory_bases(root, caps):
    (root / ".gitignore").write_text("/todo.txt\n")
    (root / "todo.txt").write_text("TODO top\n")
    (root / "src" / ".gitignore").write_text("main.c\n")
    (root / "srcx").mkdir()
    (root / "srcx" / "main.c").write_text("TODO srcx\n")
    assert grep(caps, "TODO", include="*.{txt,c}") == ["srcx/main.c", "notes/todo.txt", "build/out.c"]


def test_a_gitignore_rule_ending_in_a_slash_spares_files_of_that_name(root, caps):
    (root / ".gitignore").write_text("keep/\n")
    (root / "keep").write_text("TODO a file named keep\n")
    (root / "dir" / "keep").mkdir(parents=True)
    (root / "dir" / "keep" / "x.txt").write_text("TODO in a dir named keep\n")
    assert grep(caps, "named keep") == ["keep"]


def test_glob_classes_escapes_and_comment_lines(root, caps):
    assert Glob("[^a]*").match("b") and not Glob("[^a]*").match("a")  # ^ negates like !
    assert not Glob("x[!a]y").match("x/y") and not Glob("x[^a]y").match("x/y")  # nor a separator
    assert Glob("[]a]").match("]") and Glob("[]a]").match("a")  # ] first in a class is a member
    # a range holding '/' holds the rest of it (found by a review: "a[.-0]b" matched "a/b", and "*[.-0]*.py" let
    # one "*" match across a directory)
    assert Glob("a[.-0]b").match("a.b") and Glob("a[.-0]b").match("a0b") and not Glob("a[.-0]b").match("a/b")
    assert not Glob("*[.-0]*.py").match("src/x.py") and Glob("*[%-0]*.py").match("x.0.py")
    assert Glob("[-.]").match("-") and Glob("[.-]").match("-") and not Glob("[.-]").match("/")  # '-' is itself
    assert Glob("a\\").match("a\\")  # a trailing backslash is itself
    assert glob(caps, r"\src/*.c") == ["src/main.c"]  # an escaped component is not a literal prefix
    (root / ".gitignore").write_text("#todo\n")
    (root / "#todo").write_text("TODO hash\n")
    assert "#todo" in grep(caps, "TODO hash")  # a comment, not a pattern


def test_glob_question_mark_backslash_in_a_class_and_two_brace_groups():
    assert Glob("a?b").match("axb") and not Glob("a?b").match("a/b")
    assert Glob("[\\]").match("\\") and not Glob("[\\]").match("]")
    assert Glob("{a,b}.{c,h}").match("a.h") and Glob("{a,b}.{c,h}").match("b.c")


def test_the_walk_lists_files_as_deep_as_a_path_may_reach_and_no_deeper(tmp_path):
    """A path resolves through at most MAX_DEPTH directories: glob and grep list the files of a directory that
    deep, which a read reaches, and do not walk below it (and say so)."""
    deepest = "/".join(["d"] * MAX_DEPTH)
    _tree(tmp_path, {f"{deepest}/in.txt": "x", f"{deepest}/d/out.txt": "x"})
    c = fs_search.capabilities(Root(tmp_path), timeout=10)
    assert glob(c, "**/*.txt") == grep(c, "x") == [f"{deepest}/in.txt", TOO_DEEP]
    assert fs.capabilities(Root(tmp_path))["berm.fs.read"](encode_frame([f"{deepest}/in.txt"])) == b"x"


def test_a_large_search_waits_for_its_share_of_the_budget_within_its_time_budget(root, monkeypatch):
    monkeypatch.setattr(fs_search, "_budget", fs_search._Budget(1 << 20))
    (root / "large.txt").write_bytes(b"x" * fs_search.BIG_TEXT + b"\nneedle\n")
    with fs_search._budget.share(1 << 20, Deadline(10)):  # another grep holds it all
        held = fs_search.grep(Root(root), "needle", "large.txt", "", "files", Deadline(0.3)).decode()
        small = fs_search.grep(Root(root), "TODO", "notes", "", "files", Deadline(10)).decode()
    assert held == "[truncated: timed out after 0.3 s, the results so far]"
    assert small == "notes/todo.txt"  # a small file takes no share
    assert fs_search.grep(Root(root), "needle", "large.txt", "", "files", Deadline(10)).decode() == "large.txt"
    assert fs_search._budget.free == 1 << 20


def _must_not_compile(*args, **kwargs):
    raise AssertionError("a grep worker was asked to compile the pattern: the check let it through")


_REVIEWED = {  # the hostile review's measurements, before the check knew what a count repeats
    "(){30000}": "(){30000}",  # 26.5 s with the GIL held: the whole host process frozen
    "(()){20000}": "(()){20000}",  # 93 s
    "(){100000}": "(){100000}",  # > 290 s
    "(?:[a-z]x150){100000}": "(?:" + "[a-z]" * 150 + "){100000}",  # 2.2 GB
    "(?:(a)x300){100000}": "(?:" + "(a)" * 300 + "){100000}",  # 16.6 GB, 112 s
    "(?:(a)x300){10000}": "(?:" + "(a)" * 300 + "){10000}",  # past 1.5 GB: a MemoryError
    "(?:x18 a)+x18": "(?:" * 18 + "a" + ")+" * 18,  # no count at all: each + doubles what it repeats (165 MB)
    "(?:x14 a){2,}x14": "(?:" * 14 + "a" + "){2,}" * 14,  # 2 GB in 5 s
}


@pytest.mark.parametrize("pattern", list(_REVIEWED.values()), ids=list(_REVIEWED))
def test_a_regex_that_would_compile_for_seconds_or_into_gigabytes_is_refused_before_compiling(caps, monkeypatch,
                                                                                                pattern):
    """Found by a hostile review: the check multiplied the counts alone, whatever they repeated, and the regex
    module compiles in C with the GIL held before any time budget applies (a run of empty groups in quadratic
    time). What a pattern compiles to, written out, is bounded now; the refusal comes before any grep worker
    compiles it."""
    monkeypatch.setattr(fs_search._workers, "lend", _must_not_compile)
    with pytest.raises(CapabilityError, match=r"^berm.fs.grep: bad regex: its counted repeats \({n}, {n,m}\) and \+"):
        grep(caps, pattern)


_TEXT = "0123456789" * 20
_MISREAD = {  # each repeats a group of 200 characters 400 times, but read wrongly seems to repeat much less
    "comment": f"(?:{_TEXT})(?#c){{400}}",  # a comment is no item: the count repeats the group before it
    "inline flags": f"(?:{_TEXT})(?i){{400}}",  # nor are inline flags
    "( in a comment": f"(?:{_TEXT}(?#x(y)){{400}}",  # and a ( in a comment opens nothing
    ") in a class": f"(?:{_TEXT}[)]){{400}}",  # a ) in a class closes nothing
    "] first in a class": f"(?:{_TEXT}[](]){{400}}",  # a ] first in a class does not end it
    "] first after ^": f"(?:{_TEXT}[^](]){{400}}",
    "escaped ]": f"(?:{_TEXT}[\\](]){{400}}",  # nor does an escaped one
    "POSIX class": f"(?:{_TEXT}[[:alpha:](]){{400}}",  # nor does a POSIX class's
    "escaped (": f"(?:{_TEXT}\\(){{400}}",  # an escaped ( opens nothing
}


@pytest.mark.parametrize("pattern", list(_MISREAD.values()), ids=list(_MISREAD))
def test_the_check_reads_what_a_count_repeats_as_the_regex_module_does(caps, monkeypatch, pattern):
    """Past the limit read right; within it, read wrongly (a class read too short lets a ( in)."""
    monkeypatch.setattr(fs_search._workers, "lend", _must_not_compile)
    with pytest.raises(CapabilityError, match="bad regex: its counted repeats"):
        grep(caps, pattern)


def test_the_size_written_out():
    size = fs_search._unrolled_size
    group = fs_search.GROUP_WEIGHT
    assert size("abc") == 3 and size(r"\w[a-z]") == fs_search.ESCAPE_WEIGHT + 5
    assert size("a{1000}") == 1001 + len("{1000}")  # the module copies a repeated item n + 1 times
    assert size("x{2,7}") == 8 + len("{2,7}") and size("x{5,}") == 6 + len("{5,}")  # n the larger count
    assert size("(ab)+") == (group + 3) * 2 + 1 and size("(ab)*") == group + 4  # + copies it twice, * once
    assert size("(?:(?:a)+)+") == (group + len("?:") + (group + len("?:a)")) * 2 + 1 + 1) * 2 + 1  # multiplied
    assert size("(?:ab)(?i)(?#c){3}") == (group + len("?:ab)")) * 4 + len("(?i)(?#c)") + len("{3}")


def test_full_case_folding_is_refused(caps, monkeypatch):
    """Measured: (?fi)[a\\w] compiles to ~29 KB where (?i)[a\\w] takes ~600 bytes, and 170 of them alternated,
    with no repeat at all, took 0.44 s to compile."""
    monkeypatch.setattr(fs_search._workers, "lend", _must_not_compile)
    for pattern in [r"(?fi)[a\w]", r"(?if:[a\w])", r"(?f)(?i)x"]:
        with pytest.raises(CapabilityError, match=r"bad regex: its inline flags \(\?.*full case folding"):
            grep(caps, pattern)


def test_patterns_people_grep_with_still_search(root):
    caps = fs_search.capabilities(Root(root), timeout=120)  # (\w+\s*)+bar over the 1,000 a's: 6 s, more when loaded
    (root / "usual.rs").write_text("fn main() {\n    // TODO: foo the bar\n}\ndated 2026-12-01\n" + "a" * 1000 + "\n"
                                   + "ab" * 50 + "\n")

    def content(pattern):
        return grep(caps, pattern, path="usual.rs", mode="content")

    assert content(r"fn \w+\(") == ["usual.rs:1:fn main() {"]
    assert content("TODO|FIXME") == ["usual.rs:2:    // TODO: foo the bar"]
    assert content("[0-9]{4}-[0-9]{2}-[0-9]{2}") == content(r"\d{4}-\d{2}-\d{2}") == ["usual.rs:4:dated 2026-12-01"]
    assert grep(caps, "a{1000}", path="usual.rs", mode="count") == ["usual.rs:1"]
    assert grep(caps, "^(ab){50}$", path="usual.rs", mode="count") == ["usual.rs:1"]
    assert content(r"\b(foo|bar)\b") == ["usual.rs:2:    // TODO: foo the bar"]
    assert content(r"[[:digit:]]{4}-(?:\d{2}-?){2}|(\w+\s*)+bar") == ["usual.rs:2:    // TODO: foo the bar",
                                                                     "usual.rs:4:dated 2026-12-01"]
    assert grep(caps, r"(?i)TODO.{0,1000}BAR", path="usual.rs", mode="count") == ["usual.rs:1"]


def test_running_out_of_memory_while_compiling_is_an_error_reply(root, caps, workers, monkeypatch):
    """Found by a hostile review: a MemoryError from regex.compile (a host short of memory) left the capability as
    it was, the host-call-failed trap where a bad pattern is an error reply."""
    monkeypatch.setattr(fs_search, "WORKER", _workers_running(
        "import regex\n"
        "compile_ = regex.compile\n"
        "def short_of_memory(pattern, *args, **kwargs):\n"
        "    if pattern == 'needle':\n"
        "        raise MemoryError\n"
        "    return compile_(pattern, *args, **kwargs)\n"
        "regex.compile = short_of_memory\n"))
    with pytest.raises(CapabilityError, match=r"^berm.fs.grep: bad regex: compiling it took too much memory"):
        grep(caps, "needle")


def _count_reads(monkeypatch) -> list[int]:
    """The sizes of what grep reads with read_upto, one per call."""
    reads: list[int] = []

    def counted(fd, limit):
        data = fs.read_upto(fd, limit)
        reads.append(len(data))
        return data

    monkeypatch.setattr(fs_search, "read_upto", counted)
    return reads


def test_a_binary_file_is_skipped_having_read_only_its_first_bytes(tmp_path, monkeypatch):
    """Found by a hostile review: grep read every file under the read cap whole (up to 50 MiB) before looking at
    its first 8 KiB for a NUL byte."""
    (tmp_path / "blob.bin").write_bytes(b"\0needle\n" * (1 << 17))  # 1 MiB
    (tmp_path / "text.txt").write_bytes(b"needle\n" * (1 << 15))  # 224 KiB
    caps = fs_search.capabilities(Root(tmp_path), timeout=10)
    reads = _count_reads(monkeypatch)
    assert grep(caps, "needle") == ["text.txt"]
    probe = fs_search.BINARY_PROBE
    assert sorted(reads) == [probe, probe, (7 << 15) - probe]  # the first bytes of each, then the rest of text.txt
    reads.clear()
    assert grep(caps, "needle", path="blob.bin") == []  # named alone, the same
    assert reads == [probe]


def test_a_walk_over_skipped_files_honours_the_time_budget(tmp_path, monkeypatch):
    """Found by a hostile review: binary files were skipped without a look at the time budget (checked once a
    directory), and 200 sparse 50 MiB ones took a 1 s grep 34 s. Here the budget runs out while the first file is
    read: the others are not read, and the reply says it was cut short."""
    (tmp_path / "bin").mkdir()
    for i in range(20):
        (tmp_path / "bin" / f"blob{i:02}.bin").write_bytes(b"\0" + b"x" * 100_000)
    deadline = Deadline(10)
    reads = []

    def read_and_run_out(fd, limit):
        reads.append(limit)
        deadline.end = 0.0  # monotonic time long past
        return fs.read_upto(fd, limit)

    monkeypatch.setattr(fs_search, "read_upto", read_and_run_out)
    out = fs_search.grep(Root(tmp_path), "needle", "", "", "files", deadline).decode()
    assert out == "[truncated: timed out after 10 s, the results so far]"
    assert len(reads) == 1


# The grep workers: the matching runs in processes the host can kill at the wall-clock deadline, each within an
# address-space limit. Each test below failed before them.

_REPO = Path(__file__).resolve().parent.parent
_TIMED_OUT = "[truncated: timed out after {} s, the results so far]"


def _child_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``Z``: a zombie) while it is a child of this one; None otherwise."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0] if int(fields[1]) == os.getpid() else None


def _until(what, seconds: float = 10.0):
    """The first true value of ``what()``, trying for ``seconds``."""
    end = time.monotonic() + seconds
    while not (value := what()):
        assert time.monotonic() < end, "waited in vain"
        time.sleep(0.01)
    return value


def _run(script: str, timeout: float = 120) -> str:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          timeout=timeout, cwd=_REPO).stdout


def test_the_time_budget_is_the_wall_clocks_even_when_the_search_gets_no_cpu(tmp_path, monkeypatch):
    """The regex module's timeout counts the process's CPU time: on a loaded machine a 10 s budget lasted 62-72 s.
    Here the worker is stopped (SIGSTOP) before it searches, so it gets no CPU at all and no budget of CPU time
    would ever run out: the grep ends at its 1 s of the clock only because the host kills the worker."""
    from tests.bounded import GRACE, ends_within

    monkeypatch.setattr(fs_search, "_workers", fs_search._Workers())  # none of another test's workers
    (tmp_path / "evil.txt").write_text("x" * 4000 + "\n")
    grep = fs_search.capabilities(Root(tmp_path), timeout=1)["berm.fs.grep"]
    try:
        assert grep(encode_frame(["x", "evil.txt", "", "files"])) == b"evil.txt"  # a worker started, now idle
        [worker] = fs_search._workers._idle
        os.kill(worker.proc.pid, signal.SIGSTOP)
        out = ends_within(GRACE, lambda: grep(encode_frame([r"(x+x+)+y", "evil.txt", "", "files"])))
        assert out.decode() == _TIMED_OUT.format(1)
        assert worker.proc.returncode == -signal.SIGKILL  # killed (and reaped) by the host
    finally:
        fs_search._workers.close()


def test_a_pattern_that_needs_more_memory_than_allowed_does_not_take_it_from_the_host(tmp_path):
    """200 nested groups repeated by + took the host process to 880 MB over a 64 KiB file; the pattern-size check
    bounds compiling, not matching. A worker runs out of its own address space instead, and the host stays small."""
    script = (
        "import resource\n"
        "from pathlib import Path\n"
        "from berm_host.capabilities import fs_search\n"
        "from berm_host.capabilities._request import Deadline\n"
        "from berm_host.capabilities.paths import Root\n"
        f"root = Path({str(tmp_path)!r})\n"
        "(root / 'a.txt').write_bytes(b'a' * (64 << 10))\n"
        "out = fs_search.grep(Root(root), '(' * 200 + 'a' + ')' * 200 + '+', '', '', 'count', Deadline(60))\n"
        "print(out.decode())\n"
        "print(next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM')) >> 10)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10)\n")
    out, host_mib, worker_mib = _run(script).splitlines()
    assert out == ("[truncated: the pattern needed too much memory (it backtracks too much: simplify it), "
                   "the results so far]")
    assert int(host_mib) < 150
    assert int(worker_mib) <= grep_worker.MEMORY_LIMIT >> 20


def test_a_worker_killed_mid_search_is_an_error_reply_and_the_next_grep_works(root, workers):
    (root / "evil.txt").write_text("x" * 4000 + "\n")
    caps = fs_search.capabilities(Root(root), timeout=60)
    failures = []

    def catastrophic():
        try:
            grep(caps, r"(x+x+)+y", path="evil.txt")
        except CapabilityError as exc:
            failures.append(str(exc))

    thread = threading.Thread(target=catastrophic)
    thread.start()
    [worker] = _until(lambda: list(workers._live))
    time.sleep(0.3)  # started, and searching
    os.kill(worker.proc.pid, signal.SIGKILL)
    thread.join(30)
    assert failures == ["berm.fs.grep: the process matching the regex ended (killed by signal 9): the pattern may "
                        f"have needed more memory than grep allows ({grep_worker.MEMORY_LIMIT >> 20} MiB)"]
    assert _child_state(worker.proc.pid) is None  # reaped
    assert grep(caps, "TODO", path="notes", mode="count") == ["notes/todo.txt:3"]


def test_a_worker_holds_none_of_the_hosts_descriptors(root, workers):
    """The host holds descriptors of the granted root's directories (and a host may hold others that a child
    would inherit); a worker gets its pipes and /dev/null, nothing else."""
    inheritable = os.open(root, os.O_RDONLY)
    os.set_inheritable(inheritable, True)
    try:
        assert grep(fs_search.capabilities(Root(root), timeout=10), "TODO", path="notes") == ["notes/todo.txt"]
    finally:
        os.close(inheritable)
    [worker] = workers._idle
    fds = {int(fd): os.readlink(f"/proc/{worker.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{worker.proc.pid}/fd")}
    assert sorted(fds) == [0, 1, 2]
    assert fds[0].startswith("pipe:") and fds[1].startswith("pipe:") and fds[2] == "/dev/null"


def test_a_worker_imports_nothing_from_the_hosts_working_directory(root, caps, workers, monkeypatch):
    """The host may run in a directory a guest writes to: ``python -m`` would import a regex.py there first."""
    monkeypatch.chdir(root)
    (root / "regex.py").write_text("import pathlib\npathlib.Path('imported').touch()\n")
    assert grep(caps, "TODO", path="notes") == ["notes/todo.txt"]
    assert workers._idle and not (root / "imported").exists()


def test_an_idle_worker_exits_when_its_stdin_closes_and_is_replaced(root, caps, workers):
    assert grep(caps, "TODO", path="notes") == ["notes/todo.txt"]
    [worker] = workers._idle
    worker.proc.stdin.close()
    assert worker.proc.wait(timeout=10) == 0
    assert grep(caps, "TODO", path="notes") == ["notes/todo.txt"]
    assert [w.proc.pid for w in workers._idle] != [worker.proc.pid]


def test_idle_workers_exit_when_the_host_dies(tmp_path):
    """Killed, the host runs no clean-up: the end of their stdin ends them."""
    script = (
        "import os, signal\n"
        "from pathlib import Path\n"
        "from berm_host.capabilities import fs_search\n"
        "from berm_host.capabilities._request import Deadline\n"
        "from berm_host.capabilities.paths import Root\n"
        f"(Path({str(tmp_path)!r}) / 'f.txt').write_text('needle\\n')\n"
        f"assert fs_search.grep(Root({str(tmp_path)!r}), 'needle', '', '', 'files', Deadline(10)) == b'f.txt'\n"
        "print(*(w.proc.pid for w in fs_search._workers._idle), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=_REPO)
    [pid] = map(int, done.stdout.split())

    def ended() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # ended, for whoever adopted it to reap
        except FileNotFoundError:
            return True

    assert _until(ended)


def test_workers_are_stopped_when_the_host_exits(tmp_path):
    """At exit, idle workers and lent ones (a search still running in a daemon thread) are killed and reaped."""
    script = (
        "import threading\n"
        "from pathlib import Path\n"
        "from berm_host.capabilities import fs_search\n"
        "from berm_host.capabilities._request import Deadline\n"
        "from berm_host.capabilities.paths import Root\n"
        f"root = Path({str(tmp_path)!r})\n"
        "(root / 'evil.txt').write_text('x' * 4000 + '\\n')\n"
        "assert fs_search.grep(Root(root), 'x', '', '', 'files', Deadline(10)) == b'evil.txt'\n"
        "search = lambda: fs_search.grep(Root(root), r'(x+x+)+y', '', '', 'files', Deadline(60))\n"
        "threading.Thread(target=search, daemon=True).start()\n"
        "threading.Thread(target=search, daemon=True).start()\n"
        "while len(fs_search._workers._live) < 2: pass\n"
        "print(*(w.proc.pid for w in fs_search._workers._live), flush=True)\n")
    pids = [int(pid) for pid in _run(script, timeout=60).split()]
    assert len(pids) == 2
    assert all(not os.path.exists(f"/proc/{pid}") for pid in pids)


def test_timed_out_greps_leave_no_zombies(root, workers, monkeypatch):
    started = []
    start = fs_search._Worker.__init__

    def recorded(self):
        start(self)
        started.append(self.proc.pid)

    monkeypatch.setattr(fs_search._Worker, "__init__", recorded)
    (root / "evil.txt").write_text("x" * 4000 + "\n")
    caps = fs_search.capabilities(Root(root), timeout=0.3)
    for _ in range(8):
        assert grep(caps, r"(x+x+)+y", path="evil.txt") == [_TIMED_OUT.format(0.3)]
    assert len(started) == 8  # each killed at its deadline, the next grep starting another
    assert [_child_state(pid) for pid in started] == [None] * 8  # reaped, every one


def test_concurrent_greps_each_get_a_worker_of_their_own(tmp_path, workers):
    for i in range(8):
        (tmp_path / f"d{i}").mkdir()
        for j in range(20):
            (tmp_path / f"d{i}" / f"f{j:02}.txt").write_text(f"needle{i} {j}\n" * (j + 1) + "hay\n" * 100)
    caps = fs_search.capabilities(Root(tmp_path), timeout=60)
    outcomes: dict[int, list] = {}

    def many(i: int) -> None:
        outcomes[i] = [grep(caps, f"needle{i} ", path=f"d{i}", mode="count") for _ in range(10)]

    threads = [threading.Thread(target=many, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for i in range(8):
        assert outcomes[i] == [[f"d{i}/f{j:02}.txt:{j + 1}" for j in range(20)]] * 10
    assert len(workers._idle) <= fs_search.IDLE_WORKERS


def _swapped_tree(root: Path, tmp_path: Path, swap: str) -> tuple[Path, callable]:
    """A root holding ``a.txt`` and directory ``zz`` (with ``b.txt``), and what swaps ``zz`` for a FIFO, a symlink to
    a FIFO outside the root, or a regular file (returned: the FIFO to open for writing, which frees a reader)."""
    _tree(root, {"a.txt": "needle\n", "zz/b.txt": "needle\n"})
    fifo = tmp_path / "outside.fifo" if swap == "symlink" else root / "zz"

    def swap_it() -> None:
        (root / "zz").rename(tmp_path / "zz.moved")
        if swap == "fifo":
            os.mkfifo(root / "zz")
        elif swap == "symlink":
            os.mkfifo(fifo)
            (root / "zz").symlink_to(fifo)
        else:
            (root / "zz").write_text("needle\n")
    return fifo, swap_it


def _free_readers(fifo: Path) -> None:
    """Open ``fifo`` for writing, which lets an open() blocked reading it return (old code hung there)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no FIFO, or no reader: nothing blocked
        pass


@pytest.mark.parametrize("swap", ["fifo", "symlink", "file"])
def test_a_directory_swapped_after_its_parent_was_listed_is_skipped(tmp_path, monkeypatch, swap):
    """Found by a hostile review: os.fwalk opened each subdirectory it had listed with a plain O_RDONLY, so ``zz``
    swapped meanwhile for a FIFO blocked the host thread in open() past any time budget, for a symlink opened what
    it points to outside the root (a FIFO there hung it too), and for a file failed the whole glob (ENOTDIR). The
    swap here happens at the first file the search sees, after the root was listed, before ``zz`` is opened."""
    from tests.bounded import GRACE, ends_within

    root = tmp_path / "root"
    root.mkdir()
    fifo, swap_it = _swapped_tree(root, tmp_path, swap)
    once = [swap_it]

    class SwappingGlob(Glob):
        def match(self, path):
            while once:
                once.pop()()
            return super().match(path)

    monkeypatch.setattr(fs_search, "Glob", SwappingGlob)
    caps = fs_search.capabilities(Root(root), timeout=10)
    try:
        assert ends_within(GRACE, lambda: glob(caps, "**/*.txt")) == ["a.txt"]
        assert not once
        (root / "zz").unlink()
        (tmp_path / "zz.moved").rename(root / "zz")
        if swap == "symlink":
            fifo.unlink()
        once.append(swap_it)  # the same for grep, whose include is a Glob too
        assert ends_within(GRACE, lambda: grep(caps, "needle", include="*")) == ["a.txt"]
        assert not once
    finally:
        _free_readers(fifo)


def test_the_walk_closes_every_descriptor_it_opened_however_it_ends(tmp_path):
    _tree(tmp_path, {"/".join(["d"] * n) + "/f.txt": "x" for n in range(1, 8)})
    fds = set(os.listdir("/proc/self/fd"))
    root = Root(tmp_path)
    walk = fs_search.walk(root, ".", Deadline(10), gitignore=False)
    assert [e.rel for e in walk][-1] == "/".join(["d"] * 7) + "/f.txt"
    walk = fs_search.walk(root, ".", Deadline(10), gitignore=False)
    for e in walk:
        if e.rel.count("/") == 5:
            break
    walk.close()  # abandoned six levels down

    class Expiring(Deadline):  # passes at the fifth directory
        calls = 0

        def check(self):
            self.calls += 1
            if self.calls >= 5:
                raise TimeoutError
            return super().check()

    with pytest.raises(TimeoutError):
        list(fs_search.walk(root, ".", Expiring(10), gitignore=False))
    assert set(os.listdir("/proc/self/fd")) == fds


def test_a_name_holding_a_newline_is_listed_on_one_line_escaped(tmp_path):
    """Found by a hostile review: a file named ``z\\n[truncated: …]\\nnotes.txt`` (a guest writes one with fs.write)
    listed as three paths and a forged marker. Control characters are escaped, a backslash doubled, and a path
    starting with ``[`` shows it escaped: only the marker's line starts with one."""
    forged = "z\n[truncated: timed out after 10 s, the results so far]\nnotes.txt"
    _tree(tmp_path, {"[truncated: forged].txt": "needle\n", forged: "needle\n", "a\\x0ab.txt": "needle\n",
                     "sub/\u202eevil.txt": "needle\n"})
    caps = fs_search.capabilities(Root(tmp_path), timeout=10)
    shown = ["sub/\\u202eevil.txt", "a\\\\x0ab.txt",
             "z\\x0a[truncated: timed out after 10 s, the results so far]\\x0anotes.txt",
             "\\x5btruncated: forged].txt"]
    assert glob(caps, "**/*.txt") == shown
    assert grep(caps, "needle") == shown
    assert sorted(grep(caps, "needle", mode="count")) == sorted(f"{s}:1" for s in shown)
    assert sorted(grep(caps, "needle", mode="content")) == sorted(f"{s}:1:needle" for s in shown)


def test_an_absolute_glob_pattern_is_the_roots_whatever_the_path(root, caps):
    """Found by a hostile review: ``/root/src/*.c`` with path ``src`` was joined onto it (``src/src``: an error)."""
    assert glob(caps, f"{root}/src/*.c", "src") == ["src/main.c"]
    assert glob(caps, f"{root}/src/*.c", "notes") == ["src/main.c"]
    assert glob(caps, f"{root}/*/*.c") == ["build/out.c", "src/main.c"]


def test_a_glob_whose_literal_prefix_leads_nowhere_matches_nothing(root, caps):
    """Found by a hostile review: ``docs/*.md`` with no ``docs`` was an error where ``x*/*.md`` matched nothing."""
    assert glob(caps, "x*/*.md") == []
    assert glob(caps, "docs/*.md") == []
    assert glob(caps, "docs/more/**/*.md") == []
    assert glob(caps, "README.md/*") == []  # not a directory
    assert glob(caps, "*.c", "src/util/../../src") == ["src/main.c"]
    with pytest.raises(CapabilityError, match="no such file"):
        glob(caps, "*.md", "docs")  # the path asked for must exist
    with pytest.raises(CapabilityError, match="no such file"):
        glob(caps, "docs/*.md", "nothing")


def test_grep_of_a_single_file_honours_include(caps):
    """Found by a hostile review: a grep of one file searched it whatever ``include`` said."""
    assert grep(caps, "TODO", path="src/main.c", include="*.h") == []
    assert grep(caps, "TODO", path="src/main.c", include="*.c") == ["src/main.c"]
    assert grep(caps, "TODO", path="src/main.c", include="m*.[ch]", mode="count") == ["src/main.c:1"]


class _LooksLeft(Deadline):
    """A deadline that passes at its ``n``-th look (``check``), whatever the clock says: what a slow machine does
    to a walk, without timing one."""

    def __init__(self, n: int):
        super().__init__(60)
        self.looks = 0
        self.n = n

    def check(self) -> float:
        self.looks += 1
        if self.looks >= self.n:
            raise TimeoutError(f"took longer than {self.seconds:g} s")
        return super().check()


def test_glob_looks_at_its_deadline_per_entry_and_while_listing_a_directory(root):
    """Found by a review: the deadline was looked at only before each directory was listed, so one directory of
    300,000 files took a 0.2 s glob past 3 s (22 s on a busy machine)."""
    small, big = root / "small", root / "big"
    small.mkdir()
    big.mkdir()
    for i in range(100):
        (small / f"f{i:03}").write_bytes(b"")
    for i in range(dirwalk.CHECK_EVERY + 10):
        (big / f"f{i:05}").write_bytes(b"")
    note = b"[truncated: timed out after 60 s, the results so far]"
    # before listing, then the first entry: found; the second entry's look is the deadline's last
    out = fs_search.glob(Root(root), "small/*", "", _LooksLeft(3))
    assert out.split(b"\n") == [b"small/f000", note]
    deadline = _LooksLeft(2)  # before listing; the next look comes within the listing, before any entry
    assert fs_search.glob(Root(root), "big/*", "", deadline) == note
    assert deadline.looks == 2


def test_a_glob_prefix_that_leads_nowhere_is_found_so_within_the_deadline(root):
    """Found by a review: a literal prefix that failed was resolved again from the root for each of its components,
    with no look at the deadline: 900 "a/.." took a 0.5 s glob 3 s."""
    (root / "a").mkdir()
    deadline = _LooksLeft(5)
    with pytest.raises(TimeoutError):
        fs_search.glob(Root(root), "a/../" * 900 + "*", "", deadline)
    assert deadline.looks == 5


def test_names_that_are_not_utf8_are_shown_escaped(root, caps):
    """Found by a review: such names went out as their raw bytes, a reply that is not UTF-8 (ABI.md has every
    string UTF-8), which the guest could neither read as text nor hand back as a path."""
    (root / "odd").mkdir()
    for name in (b"\xff\n[x", b"\xed\xa0\x80", "é.txt".encode()):
        with open(os.path.join(os.fsencode(root), b"odd", name), "wb") as f:
            f.write(b"needle\n")
    shown = sorted(glob(caps, "odd/*"))
    assert shown == ["odd/\\xed\\xa0\\x80", "odd/\\xff\\x0a[x", "odd/é.txt"]
    assert sorted(grep(caps, "needle", "odd")) == shown
