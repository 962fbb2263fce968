"""JSON objects as Berm's readers take them: a key named twice in one object is an error. Python's json module keeps
the last, where the guest SDKs' parsers refuse the document, so a manifest or a tool's arguments read one way here
and another there (found by reviews of the manifest reader and of ``berm call``)."""

from __future__ import annotations

from collections import Counter


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
