"""Rust symbol names (the v0 mangling, ``_R…``) as a reader writes them: ``__rustc::rust_begin_unwind`` for
``_RNvCsfgHYwM92fyn_7___rustc17rust_begin_unwind``. Real harnesses are Rust, and a trap message naming the second
tells its author little.

A subset of the scheme (the Rust reference's "Symbol name mangling", v0): paths (crate roots, nested paths,
inherent and trait impls, generic arguments, back-references) and the types and constants that appear in generic
arguments — basic types, paths, references, raw pointers, slices, arrays and tuples. Crate disambiguators are left
out, as ``rustc-demangle``'s alternate form does. Anything else (punycode identifiers, function pointer and ``dyn``
types, …) leaves the name as it is: a name is demangled whole or not at all, never guessed.
"""

from __future__ import annotations

import functools

from berm_abi.text import escaped

_BASIC = {"a": "i8", "b": "bool", "c": "char", "d": "f64", "e": "str", "f": "f32", "h": "u8", "i": "isize",
          "j": "usize", "l": "i32", "m": "u32", "n": "i128", "o": "u128", "s": "i16", "t": "u16", "u": "()",
          "v": "...", "x": "i64", "y": "u64", "z": "!", "p": "_"}
_INTEGERS = set("ahijlmnostxy")
#: How deep back-references and nesting may go, how many nodes a name may expand to, and how many characters of
#: identifiers and constants it may show: a hostile name must not cost the host a recursion error, nor, through
#: back-references to back-references, exponential time, nor, through back-references to a long identifier or
#: constant, a name thousands of times its size (4,033 characters demangled to 10.8 million, kept in the cache
#: below; a constant of 3,300 hex digits, uncounted, 3.9 KB to 13.1 MB: found by a review).
_MAX_DEPTH = 64
_MAX_NODES = 10_000
#: ... and fewer for a short name: the work on one is then in proportion to its length (the names of rust-probe's
#: three images take at most 0.4 nodes per character). Found by a review: 4,000 functions with distinct 190-character
#: names of back-references to back-references took 9 ms each to give up on, 30 s to translate an 857 KB image.
_NODES_PER_CHARACTER = 4
_MAX_SHOWN = 4096
#: Base-62 numbers (positions, disambiguators, lifetimes) fit 64 bits, 11 digits; constants 128 bits, 32 hex
#: digits. Longer ones are not names rustc writes, and reading one again at every back-reference to it cost
#: seconds (2,300 digits: 4.1 s for a 2.9 KB name, found by a review).
_MAX_BASE62_DIGITS = 11
_MAX_CONST_DIGITS = 32


#: Characters of a function's name that a message or a listing shows.
MAX_NAME = 256


def shown_name(name: str) -> str:
    """A function's name as messages and listings show it: demangled, then ``shown_text``."""
    return shown_text(demangle(name))


def shown_text(whole: str) -> str:
    """A name the image chose as messages and listings show it: on one line (escaped) and cut to MAX_NAME
    characters, a "…" saying so."""
    text = escaped(whole[:MAX_NAME], lines=False)
    return text[:MAX_NAME] + "…" if len(whole) > MAX_NAME or len(text) > MAX_NAME else text


class _Unsupported(Exception):
    pass


@functools.lru_cache(maxsize=1024)
def demangle(name: str) -> str:
    """``name`` demangled when it is a v0 Rust symbol this module reads whole, else ``name`` itself."""
    if not name.startswith("_R") or len(name) > 4096:
        return name
    try:
        parser = _Parser(name[2:])
        if parser.peek().isdigit():  # an encoding version: only 0 (absent) is defined
            raise _Unsupported
        out = parser.path()
        if parser.pos < len(parser.text) and parser.peek() in "CNMXYIB":  # the instantiating crate: not shown
            parser.path()
        if parser.pos != len(parser.text) and not parser.text[parser.pos] == ".":
            raise _Unsupported
        return out
    except (_Unsupported, IndexError, ValueError, RecursionError):
        return name


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.depth = 0
        self.nodes = 0
        self.budget = min(_MAX_NODES, 64 + _NODES_PER_CHARACTER * len(text))
        self.shown = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        c = self.text[self.pos]
        self.pos += 1
        return c

    def base62(self) -> int:
        """``{0-9a-zA-Z} "_"``: ``_`` is 0, otherwise the digits' value plus one."""
        if self.peek() == "_":
            self.pos += 1
            return 0
        value = digits = 0
        while (c := self.take()) != "_":
            digits += 1
            if digits > _MAX_BASE62_DIGITS:
                raise _Unsupported
            if c.isdigit():
                digit = ord(c) - ord("0")
            elif "a" <= c <= "z":
                digit = ord(c) - ord("a") + 10
            elif "A" <= c <= "Z":
                digit = ord(c) - ord("A") + 36
            else:
                raise _Unsupported
            value = value * 62 + digit
        return value + 1

    def disambiguator(self) -> int:
        if self.peek() == "s":
            self.pos += 1
            return self.base62() + 1
        return 0

    def identifier(self) -> tuple[int, str]:
        which = self.disambiguator()
        if self.peek() == "u":
            raise _Unsupported  # punycode
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise _Unsupported
        n = int(self.text[start:self.pos])
        if self.peek() == "_":
            self.pos += 1
        if self.pos + n > len(self.text):
            raise _Unsupported
        word = self.text[self.pos:self.pos + n]
        self.pos += n
        self._show(n)
        return which, word

    def _show(self, n: int) -> None:
        """Count ``n`` characters of identifiers or constants shown: past _MAX_SHOWN, the name is not demangled."""
        self.shown += n
        if self.shown > _MAX_SHOWN:
            raise _Unsupported

    def _nested(self, parse):
        self.depth += 1
        self.nodes += 1
        if self.depth > _MAX_DEPTH or self.nodes > self.budget:
            raise _Unsupported
        try:
            return parse()
        finally:
            self.depth -= 1

    def backref(self, parse):
        """A ``B`` back-reference: ``parse`` run at the position it names, this parser's position kept."""
        target = self.base62()
        if target >= self.pos:
            raise _Unsupported
        here, self.pos = self.pos, target
        try:
            return self._nested(parse)
        finally:
            self.pos = here

    def path(self, value: bool = True) -> str:
        """A path; ``value``: in an expression's place, where generic arguments take ``::<`` (in a type's, ``<``)."""
        return self._nested(lambda: self._path(value))

    def _path(self, value: bool) -> str:
        tag = self.take()
        if tag == "C":
            return self.identifier()[1]
        if tag == "N":
            namespace = self.take()
            parent = self.path(value)
            which, word = self.identifier()
            if namespace.islower():
                return f"{parent}::{word}"
            kind = {"C": "closure", "S": "shim"}.get(namespace)
            if kind is None:
                raise _Unsupported
            return f"{parent}::{{{kind}{':' + word if word else ''}#{which}}}"
        if tag == "M":
            self.disambiguator()
            self.path()  # where the impl is: not part of the name
            return f"<{self.type()}>"
        if tag == "X":
            self.disambiguator()
            self.path()
            return f"<{self.type()} as {self.path(False)}>"
        if tag == "Y":
            return f"<{self.type()} as {self.path(False)}>"
        if tag == "I":
            base = self.path(value)
            return f"{base}{'::' if value else ''}<{', '.join(self.generic_args())}>"
        if tag == "B":
            return self.backref(lambda: self._path(value))
        raise _Unsupported

    def generic_args(self) -> list[str]:
        args = []
        while self.peek() != "E":
            if self.peek() == "L":
                self.pos += 1
                self.base62()
                args.append("'_")
            elif self.peek() == "K":
                self.pos += 1
                args.append(self.const())
            else:
                args.append(self.type())
        self.pos += 1
        return args

    def const(self) -> str:
        tag = self.peek()
        if tag == "p":
            self.pos += 1
            return "_"
        if tag == "B":
            self.pos += 1
            return self.backref(self.const)
        if tag not in _INTEGERS and tag != "b":
            raise _Unsupported
        self.pos += 1
        negative = self.peek() == "n"
        if negative:
            self.pos += 1
        end = self.text.index("_", self.pos)
        if end - self.pos > _MAX_CONST_DIGITS:
            raise _Unsupported
        value = int(self.text[self.pos:end] or "0", 16)
        self.pos = end + 1
        shown = ("true" if value else "false") if tag == "b" else f"{'-' if negative else ''}{value}"
        self._show(len(shown))
        return shown

    def type(self) -> str:
        return self._nested(self._type)

    def _type(self) -> str:
        tag = self.peek()
        if tag in _BASIC:
            self.pos += 1
            return _BASIC[tag]
        if tag in "CNMXYI":
            return self.path(False)
        self.pos += 1
        if tag == "B":
            return self.backref(self._type)
        if tag in "RQ":
            if self.peek() == "L":
                self.pos += 1
                self.base62()
            return ("&" if tag == "R" else "&mut ") + self.type()
        if tag in "PO":
            return ("*const " if tag == "P" else "*mut ") + self.type()
        if tag == "S":
            return f"[{self.type()}]"
        if tag == "A":
            element = self.type()
            return f"[{element}; {self.const()}]"
        if tag == "T":
            items = []
            while self.peek() != "E":
                items.append(self.type())
            self.pos += 1
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        raise _Unsupported
