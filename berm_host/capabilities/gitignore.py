"""``.gitignore`` rules, as far as a grep needs them: comments, ``!`` negation, a trailing ``/`` for directories
only, anchoring by a ``/`` anywhere but the end, ``**``, and the last matching rule deciding. Rules of a deeper
``.gitignore`` come after (and so override) those of its ancestors. An ignored directory is not entered, so its
contents cannot be re-included (as in git)."""

from __future__ import annotations

from dataclasses import dataclass

import regex

from berm_host.linker import CapabilityError

from ._request import Deadline
from .patterns import MAX_PATTERN, glob_source

#: A .gitignore larger than this is read only this far (it is guest-writable data).
MAX_IGNORE_FILE = 256 * 1024
#: At most this many rules in force in one directory (its .gitignore and its ancestors'): a guest can write a
#: .gitignore of tens of thousands of rules into every directory of a deep path, and each rule is a compiled
#: pattern (~2 KB) matched against every entry.
MAX_RULES = 10_000


@dataclass(frozen=True)
class Rule:
    base: str  # the root-relative directory of the .gitignore ("" at the root)
    rx: regex.Pattern
    negate: bool
    dir_only: bool


def parse(text: str, base: str, deadline: Deadline, room: int = MAX_RULES) -> list[Rule]:
    """The rules of one .gitignore in directory ``base``: TimeoutError once ``deadline`` passes (compiling them is
    the search's time too), CapabilityError past ``room`` rules."""
    rules: list[Rule] = []
    for raw in text.splitlines():
        deadline.check()
        line = raw.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        negate = line.startswith("!")
        if negate or line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line or len(line) > MAX_PATTERN:
            continue
        source = glob_source(line.lstrip("/"))
        try:
            rx = regex.compile(source if "/" in line else "(?:.*/)?" + source, regex.DOTALL)
        except (regex.error, ValueError, OverflowError, RecursionError):
            continue  # git ignores a pattern it cannot use; so do we
        rules.append(Rule(base, rx, negate, dir_only))
        if len(rules) > room:
            where = f"{base}/.gitignore" if base else ".gitignore"
            raise CapabilityError(f"{where} brings the .gitignore rules in force to more than {MAX_RULES}")
    return rules


class Ignore:
    """The rules in force in one directory of a walk."""

    def __init__(self, rules: tuple[Rule, ...] = ()):
        self.rules = rules

    def extended(self, text: str, base: str, deadline: Deadline) -> "Ignore":
        more = parse(text, base, deadline, MAX_RULES - len(self.rules))
        return Ignore(self.rules + tuple(more)) if more else self

    def ignored(self, rel: str, is_dir: bool, deadline: Deadline) -> bool:
        verdict = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.base:
                if not rel.startswith(rule.base + "/"):
                    continue
                sub = rel[len(rule.base) + 1:]
            else:
                sub = rel
            if rule.rx.fullmatch(sub, timeout=deadline.check()):
                verdict = not rule.negate
        return verdict
