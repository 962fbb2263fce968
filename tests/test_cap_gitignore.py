""".gitignore rules read and matched as git reads and matches them (dir.c, wildmatch.c), case by case against what
``git ls-files --others --exclude-standard`` lists.

git is not among what setup.sh installs, so CI may lack it: each case's expected set is literal, derived once from
git 2.39 (run this file, ``python3 tests/test_cap_gitignore.py``, with git on PATH to derive them again)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from berm_abi.frames import encode_frame
from berm_host.capabilities import fs_search, gitignore
from berm_host.capabilities._request import Deadline
from berm_host.capabilities.paths import Root

#: (.gitignore bytes, the files of the tree, those git ignores).
CASES = [
    pytest.param(b'keep\x0cme\n', ['keep', 'me', 'keep\x0cme'], ['keep\x0cme'], id='form_feed_in_a_pattern'),
    pytest.param(b'x\xc2\x85y\n', ['x', 'y', 'x\x85y'], ['x\x85y'], id='nel_in_a_pattern'),
    pytest.param(b'a\rb\n', ['a', 'b', 'a\rb'], ['a\rb'], id='lone_cr_in_a_pattern'),
    pytest.param(b'p\xe2\x80\xa8q\nv\x0bw\nf\x1cg\n',
                 ['p', 'q', 'v', 'w', 'f', 'g', 'p\u2028q', 'v\x0bw', 'f\x1cg'],
                 ['p\u2028q', 'v\x0bw', 'f\x1cg'], id='other_unicode_line_breaks'),
    pytest.param(b'a\r\nb\r\r\nc\r', ['a', 'a\r', 'b', 'b\r', 'c', 'c\r'], ['a', 'b\r', 'c'], id='crlf_drops_one_cr'),
    pytest.param(b'[!]a]x\n', ['bx', ']x', 'ax'], ['bx'], id='bracket_first_in_a_negated_class'),
    pytest.param(b'[]a]x\n', ['bx', ']x', 'ax'], [']x', 'ax'], id='bracket_first_in_a_class'),
    pytest.param(b'[[:digit:]]z\n', ['1z', 'az', ':z'], ['1z'], id='posix_class'),
    pytest.param(b'foo\\\\ \n', ['foo\\', 'foo\\ ', 'foo'], ['foo\\'], id='escaped_backslash_then_trailing_space'),
    pytest.param(b'{a,b}.txt\n', ['a.txt', 'b.txt', '{a,b}.txt'], ['{a,b}.txt'], id='braces_are_literal'),
    pytest.param(b'[\\]]x\n', [']x', '\\x', '\\]x'], [']x'], id='escaped_bracket_in_a_class'),
    pytest.param(b'a[z-a]\n', ['az', 'am', 'aa'], ['az'], id='range_start_is_a_member'),
    pytest.param(b'a[a-c-e]\n', ['aa', 'ab', 'ad', 'ae', 'a-'], ['aa', 'ab', 'ae', 'a-'], id='dash_after_a_range'),
    pytest.param(b'a[[:digit:]-z]\n', ['a1', 'a-', 'az', 'am'], ['a1', 'a-', 'az'], id='dash_after_a_posix_class'),
    pytest.param(b'a[]-b]\n', ['a]', 'a^', 'ab', 'a-', 'ac'], ['a]', 'a^', 'ab'], id='range_from_a_leading_bracket'),
    pytest.param(b'a[a-\\]]\n', ['aa', 'a]', 'a\\', 'ab'], ['aa'], id='escaped_range_end'),
    pytest.param(b'[[:alpha:][:digit:]]x\n', ['ax', '1x', ':x', '_x'], ['ax', '1x'], id='two_posix_classes'),
    pytest.param(b'a[[:alpha]x\n', ['afx', 'a:x', 'a[x', 'a]x', 'aax'], ['a:x', 'a[x', 'aax'],
                 id='unfinished_posix_class_is_a_bracket'),
    pytest.param(b'a[[:foo:]]\nb\n', ['af', 'a:', 'a[[:foo:]]', 'b'], ['b'], id='unknown_posix_class_matches_nothing'),
    pytest.param(b'a[\nb[[:digit:]\nc\n', ['a[', 'ab', 'b[[:digit:]', 'b1', 'c'], ['c'],
                 id='unclosed_class_matches_nothing'),
    pytest.param(b'foo\\\nbar\n', ['foo', 'foo\\', 'bar'], ['bar'], id='trailing_backslash_matches_nothing'),
    pytest.param(b'a[^b]\n', ['ab', 'ac', 'a^'], ['ac', 'a^'], id='caret_negates'),
    pytest.param(b'a[/]b\na[!x]c\n', ['a/b', 'a/c', 'ayc'], ['ayc'], id='slash_in_a_class_never_matches'),
    pytest.param(b'c?\nd??\n', ['cé', 'cx', 'dé', 'dx'], ['cx', 'dé'], id='question_mark_is_one_byte'),
    pytest.param(b'c[\xc3\xa9]\nd[\xc3\xa9][\xc3\xa9]\n', ['cé', 'dé'], ['dé'], id='class_of_a_multibyte_character'),
    pytest.param(b'a\x00b\n', ['a', 'b', 'ab'], ['a'], id='nul_ends_a_line'),
    pytest.param(b'\xef\xbb\xbfa\nb\n\xef\xbb\xbfc\n', ['a', 'b', 'c', '\ufeffc'], ['a', 'b', '\ufeffc'],
                 id='byte_order_mark_skipped_at_the_start_only'),
    pytest.param(b'foo//\n//bar\n', ['foo/x', 'bar', 'd/bar'], [], id='one_slash_stripped_at_each_end'),
    pytest.param(b'!\n/\n!/\n  \n', ['x'], [], id='empty_patterns'),
    pytest.param(b'**/x\n', ['x', 'd/x', 'd/e/x', 'xx', 'd/xx'], ['x', 'd/x', 'd/e/x'], id='leading_double_star'),
    pytest.param(b'x/**\n', ['x/a', 'x/b/c', 'xa', 'd/x/a'], ['x/a', 'x/b/c'], id='trailing_double_star'),
    pytest.param(b'a/**/b\n', ['a/b', 'a/c/b', 'a/c/d/b', 'a/cb', 'ca/b'], ['a/b', 'a/c/b', 'a/c/d/b'],
                 id='middle_double_star'),
    pytest.param(b'a/**b\n**c/d\n', ['a/b', 'a/xb', 'a/y/xb', 'c/d', 'xc/d', 'y/xc/d'], ['a/b', 'a/xb', 'c/d', 'xc/d'],
                 id='double_star_not_a_whole_component'),
    pytest.param(b'a**/b\n',
                 ['ab', 'a/b', 'ax/b', 'a/x/b', 'ax/y/b', 'b', 'c/ab'],
                 ['ab', 'a/b', 'ax/b', 'a/x/b', 'ax/y/b'], id='double_star_after_a_literal_prefix'),
    pytest.param(b'a/**\\/b\n', ['a/b', 'a/c/b', 'a/c/d/b'], ['a/c/b', 'a/c/d/b'],
                 id='double_star_before_an_escaped_slash'),
    pytest.param(b'a/***/b\n', ['a/b', 'a/c/b', 'a/cb'], ['a/b', 'a/c/b'], id='triple_star'),
    pytest.param(b'*.log\n!keep.log\n', ['a.log', 'keep.log', 'd/keep.log', 'd/b.log', 'x.txt'], ['a.log', 'd/b.log'],
                 id='negation'),
    pytest.param(b'build/\n', ['build/x', 'd/build/y', 'f/build'], ['build/x', 'd/build/y'], id='directory_only'),
    pytest.param(b'd/\n!d/k\n', ['d/k', 'd/j', 'e/k'], ['d/k', 'd/j'], id='no_reinclusion_in_an_ignored_directory'),
    pytest.param(b'd/*\n!d/k\n', ['d/k', 'd/j'], ['d/j'], id='reinclusion_beside_a_star'),
    pytest.param(b'/todo\n', ['todo', 'd/todo'], ['todo'], id='anchored'),
    pytest.param(b'd/x\n', ['d/x', 'e/d/x'], ['d/x'], id='slash_in_the_middle_anchors'),
    pytest.param(b'd\\/x\n', ['d/x', 'e/d/x'], ['d/x'], id='escaped_slash_anchors'),
    pytest.param(b'sp   \nesc\\ \ntab\t\n', ['sp', 'sp ', 'esc', 'esc ', 'tab', 'tab\t'], ['sp', 'esc ', 'tab\t'],
                 id='trailing_spaces'),
    pytest.param(b'\\#h\n\\!b\n#c\n #d\n', ['#h', '!b', '#c', ' #d', 'h', 'b'], ['#h', '!b', ' #d'],
                 id='escaped_hash_and_bang'),
    pytest.param(b'\\*\n\\?\n\\[a]\n', ['*', '?', '[a]', 'a', 'x'], ['*', '?', '[a]'], id='escaped_wildcards'),
    pytest.param(b'*.T\n', ['a.t', 'a.T'], ['a.T'], id='case_sensitive'),
]

CHARS = " \t\x0b\x0c\r\x7f07aFgZ_~\u00e9"
#: The characters c of CHARS whose file "c" + c the rule ``c[[:NAME:]]`` hides, as git's ASCII-only classes have it.
POSIX = {
    'alnum': '07aFgZ',
    'alpha': 'aFgZ',
    'blank': ' \t',
    'cntrl': '\t\x0b\x0c\r\x7f',
    'digit': '07',
    'graph': '07aFgZ_~',
    'lower': 'ag',
    'print': ' 07aFgZ_~',
    'punct': '_~',
    'space': ' \t\r',
    'upper': 'FZ',
    'xdigit': '07aF',
}


def _tree(top: str, ignore: bytes, files: list[str]) -> None:
    os.makedirs(top, exist_ok=True)
    with open(os.path.join(top, ".gitignore"), "wb") as f:
        f.write(ignore)
    for rel in files:
        path = os.path.join(top, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("needle\n")


def _ignored(top: str, files: list[str]) -> list[str]:
    """The files the .gitignore files under ``top`` hide, walking as fs_search does: an ignored directory is not
    entered, and each directory's .gitignore (read as fs_search reads it) adds its rules to its parent's."""
    deadline = Deadline(30)
    seen: list[str] = []

    def walk(rel: str, ignore: gitignore.Ignore) -> None:
        directory = os.path.join(top, rel)
        try:
            with open(os.path.join(directory, ".gitignore"), "rb") as f:
                ignore = ignore.extended(f.read().decode("utf-8", "replace"), rel, deadline)
        except FileNotFoundError:
            pass
        for name in sorted(os.listdir(directory)):
            sub = f"{rel}/{name}" if rel else name
            is_dir = os.path.isdir(os.path.join(top, sub))
            if name in (".git", ".gitignore") or ignore.ignored(sub, is_dir, deadline):
                continue
            if is_dir:
                walk(sub, ignore)
            else:
                seen.append(sub)

    walk("", gitignore.Ignore())
    return [rel for rel in files if rel not in seen]


@pytest.mark.parametrize(("ignore", "files", "hidden"), CASES)
def test_gitignore_hides_what_git_ignores(tmp_path, ignore, files, hidden):
    _tree(str(tmp_path), ignore, files)
    assert _ignored(str(tmp_path), files) == hidden


@pytest.mark.parametrize("name", sorted(POSIX))
def test_gitignore_posix_classes_are_gits(tmp_path, name):
    files = ["c" + ch for ch in CHARS]
    _tree(str(tmp_path), f"c[[:{name}:]]\n".encode(), files)
    assert _ignored(str(tmp_path), files) == ["c" + ch for ch in POSIX[name]]


def test_grep_searches_what_git_searches(tmp_path):
    """The hostile review's cases end to end, through berm.fs.grep (one subdirectory, and so one .gitignore, each;
    names grep shows as they are: the rest are in CASES)."""
    rules = [b"[!]a]x", b"keep\x0cme", b"x\xc2\x85y", b"a\rb", b"[[:digit:]]z", b"{a,b}.txt", b"[\\]]x"]
    files = ["bx", "]x", "ax", "keep", "me", "x", "y", "a", "b", "1z", "az", ":z", "a.txt", "b.txt", "{a,b}.txt"]
    for n, rule in enumerate(rules):
        _tree(str(tmp_path / str(n)), rule + b"\n", files)
    caps = fs_search.capabilities(Root(tmp_path), timeout=60)
    out = caps["berm.fs.grep"](encode_frame(["needle", "", "", "count"])).decode()
    searched = {line.rsplit(":", 1)[0] for line in out.split("\n") if line}
    hidden = {f"{n}/{name}" for n in range(len(rules)) for name in files} - searched
    assert sorted(hidden) == ["0/bx", "4/1z", "5/{a,b}.txt", "6/]x"]  # as git has it


def test_gitignore_patterns_compile_to_a_size_linear_in_theirs():
    """A guest writes the .gitignore: what its rules compile to stays within a small multiple of their length."""
    worst = [b"[!" + bytes(range(0x21, 0x7f, 2)) + b"]", b"[" + b"a-" * 100 + b"]", b"[[:punct:]" * 50 + b"]",
             b"**/" * 300, b"\\x" * 300, b"?*" * 300, bytes(range(0x80, 0x100))]
    for pat in worst:
        source = gitignore.wild_source(pat)
        assert source is not None and len(source) <= 16 * len(pat), pat[:40]


def _git_ignored(ignore: bytes, files: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as top:
        subprocess.run(["git", "init", "-q", top], check=True)
        _tree(top, ignore, files)
        out = subprocess.run(["git", "-C", top, "ls-files", "-z", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
    listed = {os.fsdecode(x) for x in out.split(b"\0")}
    return [rel for rel in files if rel not in listed]


if __name__ == "__main__":  # derive the expected sets from git again, printing the cases that differ
    for case in CASES:
        ignore, files, hidden = case.values
        if _git_ignored(ignore, files) != hidden:
            print(f"git differs on {case.id}: it hides {_git_ignored(ignore, files)!r}")
    for name, chars in POSIX.items():
        files = ["c" + ch for ch in CHARS]
        if _git_ignored(f"c[[:{name}:]]\n".encode(), files) != ["c" + ch for ch in chars]:
            print(f"git differs on [:{name}:]")
    sys.exit(0)
