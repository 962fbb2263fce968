"""JSON documents as Berm's readers take them, which is as the guest SDKs' parsers do: a key named twice in one object
is an error (Python's json module keeps the last), and so is what no JSON text can say (``unsayable``). Otherwise a
manifest or a tool's arguments read one way here and another there (found by reviews of the manifest reader and of
``berm call``)."""

from __future__ import annotations

import json
import re
from collections import Counter


#: The most digits an integer Berm reads from JSON may have: below Python's least limit on converting integers to and
#: from text (640, ``sys.set_int_max_str_digits``), so what is accepted does not hang on the interpreter's setting
#: (with none, a 1 MiB integer took 25 s to read: quadratic; with the default, 4,300 digits were a ValueError
#: quoting that function), and a number accepted can always be written back out.
MAX_INT_DIGITS = 600


class LongInteger(ValueError):
    def __init__(self) -> None:
        super().__init__(f"an integer of more than {MAX_INT_DIGITS} digits")


def bounded_int(digits: str) -> int:
    """``json.loads``'s ``parse_int``: the integer, or LongInteger past MAX_INT_DIGITS."""
    if len(digits) > MAX_INT_DIGITS + digits.startswith("-"):
        raise LongInteger
    return int(digits)


class RepeatedKey(ValueError):
    def __init__(self, key: str):
        super().__init__(f"the key {key!r} is given twice in an object")
        self.key = key


def unique_object(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s ``object_pairs_hook``: the object, or RepeatedKey. Counted, not searched, unless a key
    repeats: it runs for every object of every document read."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise RepeatedKey(next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1))
    return obj


def unsayable(doc) -> str | None:
    """What in ``doc`` (as ``json.loads`` read it) no JSON text in UTF-8 can say, or None: Python's parser also takes
    NaN, Infinity (and 1e999, read as infinity) and escaped lone surrogates, which are no Unicode text. Written back
    out as strict JSON in UTF-8, they fail; the guest SDKs' parsers refuse NaN, Infinity and lone surrogates (found
    by reviews of the manifest reader and of ``berm call``, which reads numbers as text, so 1e999 passes)."""
    try:
        json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # a ValueError too: first
        return f"a lone surrogate ({exc.object[exc.start]!r}), which is not text"
    except ValueError:  # allow_nan=False
        return "NaN, Infinity or a number too large for a double"
    return None


#: A JSON string, or what is left of the text from an unclosed one. Possessive: where a string never closes, a
#: backtracking match went back over it from every escaped quote, and 128 KB of manifest took 84 s to scan (found by
#: a review).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def text_nesting_depth(text: str) -> int:
    """How deeply a JSON text's arrays and objects nest, read off its brackets outside strings in linear time,
    before any parser sees it: json.loads recurses in C once a level, up to the recursion limit whatever the stack,
    and a 990-deep manifest read in a thread with a 64 KiB stack crashed the process (found by a review)."""
    deepest = depth = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest
