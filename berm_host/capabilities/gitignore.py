"""``.gitignore`` rules, as far as a grep needs them, read the way git reads them (dir.c and wildmatch.c): lines
end at ``\\n`` only (one ``\\r`` before it is dropped; form feeds, lone ``\\r``, U+0085 and U+2028 are pattern
characters), a leading UTF-8 byte order mark is skipped, ``#`` starts a comment, unescaped trailing spaces are
dropped, ``!`` negates, a trailing ``/`` means directories only, a ``/`` anywhere else anchors the rule to its
``.gitignore``'s directory (else it matches a path's last component), and the last matching rule decides. Rules of a
deeper ``.gitignore`` come after (and so override) those of its ancestors. An ignored directory is not entered, so
its contents cannot be re-included (as in git).

Patterns are git's wildmatch, not ``patterns.Glob``'s syntax: ``*``, ``?``, ``[...]`` (``!`` or ``^`` negates, a
``]`` first is a member, ranges, backslash escapes, POSIX classes such as ``[:digit:]``), ``\\x`` for a literal x,
``**`` as git documents it, and no ``{a,b}``. Matching is on the UTF-8 bytes of names, as git's is (``?`` is one
byte). A pattern git could never match (an unclosed class, an unknown POSIX class, a trailing backslash) is
dropped.

Rules are compiled for RE2, which matches in time linear in the path, as globs are (patterns.py says why): with
the backtracking ``regex`` module, whose timeout counts CPU time, a 241-byte rule a guest wrote held a grep with a
2 s budget for 55 s on a busy machine (found by a review)."""

from __future__ import annotations

from dataclasses import dataclass

from berm_host.linker import CapabilityError

from ._request import Deadline
from .patterns import MAX_PATTERN, re2_module

#: A .gitignore larger than this is read only this far (it is guest-writable data).
MAX_IGNORE_FILE = 256 * 1024
#: At most this many rules in force in one directory (its .gitignore and its ancestors'): a guest can write a
#: .gitignore of tens of thousands of rules into every directory of a deep path, and each rule is a compiled
#: pattern (~2 KB) matched against every entry.
MAX_RULES = 10_000
#: At most this many bytes of compiled pattern source in force in one directory: what a rule costs grows with it,
#: and 10,000 rules of ``*a`` ×500 took 1.2 GB (found by a review); ordinary rules are tens of bytes each.
MAX_RULE_BYTES = 1 << 20

_SLASH = ord("/")
_ASCII_GRAPH = set(range(0x21, 0x7F))
_DIGIT = set(b"0123456789")
_UPPER = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_LOWER = set(b"abcdefghijklmnopqrstuvwxyz")
#: wildmatch's POSIX classes, which hold ASCII bytes only (git's own ctype: its space is not \v or \f).
_POSIX: dict[bytes, set[int]] = {
    b"alnum": _DIGIT | _UPPER | _LOWER,
    b"alpha": _UPPER | _LOWER,
    b"blank": set(b" \t"),
    b"cntrl": set(range(0x20)) | {0x7F},
    b"digit": _DIGIT,
    b"graph": _ASCII_GRAPH,
    b"lower": _LOWER,
    b"print": _ASCII_GRAPH | {0x20},
    b"punct": _ASCII_GRAPH - _DIGIT - _UPPER - _LOWER,
    b"space": set(b" \t\n\r"),
    b"upper": _UPPER,
    b"xdigit": _DIGIT | set(b"ABCDEFabcdef"),
}


@dataclass(frozen=True)
class Rule:
    base: str  # the root-relative directory of the .gitignore ("" at the root)
    rx: object  # an RE2 pattern over the UTF-8 bytes of a path relative to base (its last component, with basename)
    negate: bool
    dir_only: bool
    basename: bool = False
    size: int = 0  # bytes of its pattern's source, counted against MAX_RULE_BYTES


def _byte(value: int) -> bytes:
    """The regex matching the one byte ``value``."""
    return b"\\x%02x" % value


def _byte_class(members: set[int]) -> bytes:
    """A regex class of exactly ``members`` (never '/', which no wildmatch class matches in a path); its size
    grows with the number of runs, so with the length of the class it came from."""
    runs: list[bytes] = []
    values = sorted(members - {_SLASH})
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        runs.append(_byte(values[i]) + (b"-" + _byte(values[j]) if j > i else b""))
        i = j + 1
    return b"[" + b"".join(runs) + b"]" if runs else b"[^\\x00-\\xff]"  # an empty class: it matches nothing


def _wild_class(pat: bytes, i: int) -> tuple[bytes, int] | None:
    """wildmatch's bracket expression at ``pat[i] == '['``: (regex, index after it), or None when git could never
    match it (unclosed, or an unknown ``[:name:]``). Follows wildmatch.c step by step: a range's first character
    is a member even when the range is empty (``[z-a]`` holds z), and a ``-`` after a range or a POSIX class is
    itself."""
    n = len(pat)
    p = i + 1
    negated = p < n and pat[p] in b"!^"
    if negated:
        p += 1
    members: set[int] = set()
    prev: int | None = None
    while True:
        if p >= n:
            return None
        ch: int | None = pat[p]
        if ch == ord("\\"):
            p += 1
            if p >= n:
                return None
            ch = pat[p]
            members.add(ch)
        elif ch == ord("-") and prev is not None and p + 1 < n and pat[p + 1] != ord("]"):
            p += 1
            end = pat[p]
            if end == ord("\\"):
                p += 1
                if p >= n:
                    return None
                end = pat[p]
            members.update(range(prev, end + 1))
            ch = None
        elif ch == ord("[") and p + 1 < n and pat[p + 1] == ord(":"):
            s = q = p + 2
            while q < n and pat[q] != ord("]"):
                q += 1
            if q >= n:
                return None
            if q == s or pat[q - 1] != ord(":"):  # no ":]": an ordinary '['
                members.add(ch)
            else:
                named = _POSIX.get(pat[s:q - 1])
                if named is None:
                    return None
                members |= named
                ch = None
                p = q
        else:
            members.add(ch)
        prev = ch
        p += 1
        if p >= n:
            return None
        if pat[p] == ord("]"):
            break
    return _byte_class(set(range(256)) - members if negated else members), p + 1


def wild_source(pat: bytes, start: int = 0) -> bytes | None:
    """The regex source matching exactly the paths wildmatch (with WM_PATHNAME) matches with ``pat``, or None when
    it matches none. ``start`` is where wildmatch's pattern begins for the ``**`` rule: git compares a rule's
    literal prefix itself and hands only the rest to wildmatch, so ``a**/b`` ignores ``ab`` and ``a/x/b``."""
    out: list[bytes] = []
    n = len(pat)
    i = 0
    while i < n:
        c = pat[i]
        if c == ord("\\"):
            if i + 1 >= n:
                return None  # a trailing backslash matches nothing
            out.append(_byte(pat[i + 1]))
            i += 2
        elif c == ord("?"):
            out.append(b"[^/]")
            i += 1
        elif c == ord("*"):
            j = i
            while j < n and pat[j] == ord("*"):
                j += 1
            after_slash = i == start or pat[i - 1] == _SLASH
            if j - i >= 2 and after_slash and (j == n or pat[j] == _SLASH or pat[j:j + 2] == b"\\/"):
                if j < n and pat[j] == _SLASH:
                    out.append(b"(?:.*/)?")  # "**/": any number of whole directories, none included
                    j += 1
                else:
                    out.append(b".*")
            else:
                out.append(b"[^/]*")
            i = j
        elif c == ord("["):
            cls = _wild_class(pat, i)
            if cls is None:
                return None
            out.append(cls[0])
            i = cls[1]
        else:
            out.append(_byte(pat[i]))
            i += 1
    return b"".join(out)


def _lines(text: str) -> list[str]:
    """The lines of a .gitignore as git's add_patterns_from_buffer has them: split at '\\n' only, one '\\r' before
    it dropped, each cut at a NUL (git's lines are C strings), a byte order mark skipped at the start."""
    lines = text.removeprefix("\ufeff").split("\n")
    return [line.removesuffix("\r").split("\0", 1)[0] for line in lines]


def _trim_trailing_spaces(line: str) -> str:
    """git's trim_trailing_spaces: drop the spaces ending a line, unless the first of them is escaped."""
    last_space = None
    i = 0
    while i < len(line):
        c = line[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= len(line):
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def _simple_length(pattern: str) -> int:
    """How many leading characters of ``pattern`` git compares literally (none of ``*?[\\``)."""
    for i, c in enumerate(pattern):
        if c in "*?[\\":
            return i
    return len(pattern)


def parse(text: str, base: str, deadline: Deadline, room: int = MAX_RULES,
          room_bytes: int = MAX_RULE_BYTES) -> list[Rule]:
    """The rules of one .gitignore in directory ``base``: TimeoutError once ``deadline`` passes (compiling them is
    the search's time too), CapabilityError past ``room`` rules or ``room_bytes`` bytes of their sources."""
    rules: list[Rule] = []
    where = f"{base}/.gitignore" if base else ".gitignore"
    for line in _lines(text):
        deadline.check()
        if not line or line.startswith("#"):
            continue
        line = _trim_trailing_spaces(line)
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        if dir_only:
            line = line[:-1]  # one slash: "a//" leaves "a/", which no path matches (as in git)
        if not line or len(line) > MAX_PATTERN:
            continue
        basename = "/" not in line
        if not basename and line.startswith("/"):
            line = line[1:]  # one slash: "//a" matches nothing (as in git)
        literal = 0 if basename else len(line[:_simple_length(line)].encode("utf-8", "surrogateescape"))
        source = wild_source(line.encode("utf-8", "surrogateescape"), literal)
        if source is None:
            continue  # git can never match it; nor can we
        room_bytes -= len(source)
        if room_bytes < 0:
            raise CapabilityError(f"{where} brings the .gitignore rules in force to more than {MAX_RULE_BYTES} bytes "
                                  "of patterns")
        re2, options = re2_module(latin1=True)
        try:
            rx = re2.compile(source, options)
        except re2.error:
            continue  # git ignores a pattern it cannot use; so do we
        rules.append(Rule(base, rx, negate, dir_only, basename, len(source)))
        if len(rules) > room:
            raise CapabilityError(f"{where} brings the .gitignore rules in force to more than {MAX_RULES}")
    return rules


class Ignore:
    """The rules in force in one directory of a walk."""

    def __init__(self, rules: tuple[Rule, ...] = ()):
        self.rules = rules
        self.size = sum(rule.size for rule in rules)

    def extended(self, text: str, base: str, deadline: Deadline) -> "Ignore":
        more = parse(text, base, deadline, MAX_RULES - len(self.rules), MAX_RULE_BYTES - self.size)
        return Ignore(self.rules + tuple(more)) if more else self

    def ignored(self, rel: str, is_dir: bool, deadline: Deadline) -> bool:
        verdict = False
        path = rel.encode("utf-8", "surrogateescape")
        name = path.rsplit(b"/", 1)[-1]
        subs: dict[str, bytes | None] = {}  # a rule's base -> the path relative to it (None: not below it)
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.base not in subs:
                if not rule.base:
                    subs[""] = path
                elif rel.startswith(rule.base + "/"):
                    subs[rule.base] = path[len(rule.base.encode("utf-8", "surrogateescape")) + 1:]
                else:
                    subs[rule.base] = None
            sub = subs[rule.base]
            if sub is None:
                continue
            deadline.check()
            if rule.rx.fullmatch(name if rule.basename else sub):
                verdict = not rule.negate
        return verdict
