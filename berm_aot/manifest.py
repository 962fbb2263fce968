"""The ``.berm.abi`` manifest (ABI.md §4): what a harness claims about itself, read without running it.

``parse_manifest`` checks the bytes and the schema; ``load_manifest`` also checks the claims against the image's
exports. Each way a manifest can be wrong has its own error class (berm_aot/errors.py), so a caller can tell "no
manifest" from "bad JSON" from "wrong ABI version" from "declares a tool it does not export".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from berm_abi.json_objects import (LongInteger, RepeatedKey, bounded_int, text_nesting_depth, unique_object,
                                   unsayable)
from berm_abi.names import ABI_VERSION
from berm_aot.errors import (AbiVersionError, ManifestEncodingError, ManifestJsonError, MissingExportError,
                             NoManifestError)
from berm_aot.image import ElfImage

#: Exported tool functions are named ``berm_tool_<name>`` (ABI.md §3).
TOOL_PREFIX = "berm_tool_"
#: Exports that register a harness for scheduling and events (RFC 0205: the export table is the registration).
LIFECYCLE_EXPORTS = ("on_wake", "on_notify")
#: What a tool name may contain: it becomes part of a C symbol and of agent-facing tool lists.
TOOL_NAME = re.compile(r"[A-Za-z0-9_]+")
#: Keys of the manifest that state what the harness *requests* (documentation for whoever grants, never a grant).
REQUEST_KEYS = ("capabilities", "hosts")
#: How deeply a manifest's arrays and objects may nest. Python's parser and writer recurse, and a depth just under
#: their limit passed json.loads and then broke the check that writes the document back (a RecursionError out of
#: Engine.load and berm inspect, found by a hostile review). A fixed bound, far under that limit, makes the answer
#: independent of how deep the caller's own stack is. Tool schemas nest a few levels.
MAX_NESTING = 100
#: A manifest's text shown in an error (a key, a name, a version) is cut to this many characters.
SHOWN = 80


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict = field(hash=False)


@dataclass(frozen=True)
class Manifest:
    abi_version: int
    tools: tuple[ToolSpec, ...]
    usage: str
    requests: dict = field(hash=False)  # "capabilities" / "hosts" when the manifest names them
    raw: dict = field(hash=False, repr=False)  # the whole JSON object, unknown keys included

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)


def parse_manifest(data: bytes | None) -> Manifest:
    """The manifest in ``data`` (the ``.berm.abi`` contents; None when the section is absent).

    Trailing NUL bytes are ignored: a C harness that stores its JSON in a ``char[]`` carries the terminator.
    """
    if data is None:
        raise NoManifestError("the image has no .berm.abi section (no manifest)")
    try:
        text = bytes(data).rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestEncodingError(f"the manifest is not UTF-8 (byte {exc.start})") from None
    # Only a text of more brackets than that can nest deeper (a count costs ~1 µs, on every load of an image).
    if text.count("[") + text.count("{") > MAX_NESTING and (depth := text_nesting_depth(text)) > MAX_NESTING:
        raise ManifestJsonError(f"the manifest nests arrays and objects {depth} deep; at most {MAX_NESTING} are read")
    try:
        doc = json.loads(text, object_pairs_hook=unique_object, parse_int=bounded_int)
    except RepeatedKey as exc:  # the last one was kept: a manifest with two "tools" read as the second
        raise ManifestJsonError(f"the manifest names the key {exc.key[:SHOWN]!r} twice in one object") from None
    except LongInteger as exc:
        raise ManifestJsonError(f"the manifest holds {exc}") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ManifestJsonError(f"the manifest is not valid JSON: {exc}") from None
    except RecursionError:
        raise ManifestJsonError(f"the manifest nests arrays and objects too deep to read; at most {MAX_NESTING} "
                                "are read") from None
    if problem := unsayable(doc):  # berm inspect --json printed NaN, and a surrogate made it a traceback
        raise ManifestJsonError(f"the manifest is not valid JSON: it holds {problem}")
    if not isinstance(doc, dict):
        raise ManifestJsonError(f"the manifest must be a JSON object, not {_json_type(doc)}")
    version = doc.get("abi_version")
    if type(version) is not int:
        raise ManifestJsonError(f"the manifest's abi_version must be an integer, not {_json_type(version)}")
    if version != ABI_VERSION:
        raise AbiVersionError(f"harness was built against ABI version {str(version)[:SHOWN]}, this host speaks "
                              f"{ABI_VERSION}")
    usage = doc.get("usage", "")
    if not isinstance(usage, str):
        raise ManifestJsonError(f"the manifest's usage must be a string, not {_json_type(usage)}")
    return Manifest(abi_version=version, tools=_tools(doc.get("tools")), usage=usage, requests=_requests(doc),
                    raw=doc)


def nesting_depth(doc) -> int:
    """How deeply the parsed document's arrays and objects nest, found without recursion (berm build bounds a
    harness.toml's with it before anything recursive reads it)."""
    if not isinstance(doc, (dict, list)):
        return 0
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number with a fraction or an exponent"}
    return "null (or missing)" if value is None else names.get(type(value), type(value).__name__)


def _tools(value) -> tuple[ToolSpec, ...]:
    if not isinstance(value, list):
        raise ManifestJsonError(f"the manifest's tools must be an array, not {_json_type(value)}")
    tools, seen = [], set()
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ManifestJsonError(f"tools[{i}] must be an object, not {_json_type(entry)}")
        name = entry.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            shown = repr(name[:SHOWN]) if isinstance(name, str) else _json_type(name)
            raise ManifestJsonError(f"tools[{i}].name must be a string of letters, digits and '_', not {shown}")
        if name in seen:
            raise ManifestJsonError(f"tool {name[:SHOWN]!r} is declared twice")
        seen.add(name)
        description = entry.get("description", "")
        if not isinstance(description, str):
            raise ManifestJsonError(f"tool {name[:SHOWN]!r}: description must be a string, "
                                    f"not {_json_type(description)}")
        parameters = entry.get("parameters", {})
        if not isinstance(parameters, dict):
            raise ManifestJsonError(f"tool {name[:SHOWN]!r}: parameters must be a JSON Schema object, "
                                    f"not {_json_type(parameters)}")
        tools.append(ToolSpec(name=name, description=description, parameters=parameters))
    return tuple(tools)


def _requests(doc: dict) -> dict:
    """The request keys, at the top level or inside a ``"requests"`` object (as ``berm build`` writes them); a key
    in both places lists both, once each."""
    nested = doc.get("requests", {})
    if not isinstance(nested, dict):
        raise ManifestJsonError(f"the manifest's requests must be an object, not {_json_type(nested)}")
    out = {}
    for source in (doc, nested):
        for key in REQUEST_KEYS:
            if key not in source:
                continue
            value = source[key]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ManifestJsonError(f"the manifest's {key} must be an array of strings")
            out[key] = list(dict.fromkeys([*out.get(key, []), *value]))
    return out


def tool_exports(image: ElfImage) -> dict[str, int]:
    """Every exported tool: the name after ``berm_tool_`` of each global FUNC symbol, mapped to its address."""
    return {s.name[len(TOOL_PREFIX):]: s.value for s in image.symbols
            if s.kind == "func" and s.binding == "global" and s.section is not None
            and s.name.startswith(TOOL_PREFIX) and TOOL_NAME.fullmatch(s.name[len(TOOL_PREFIX):])}


def lifecycle_exports(image: ElfImage) -> dict[str, int]:
    """Which of ``on_wake``/``on_notify`` the image exports (global FUNC symbols), mapped to their addresses."""
    return {s.name: s.value for s in image.symbols
            if s.kind == "func" and s.binding == "global" and s.section is not None and s.name in LIFECYCLE_EXPORTS}


def load_manifest(image: ElfImage) -> Manifest:
    """The image's manifest, checked against its exports: every declared tool exported, at least one tool."""
    manifest = parse_manifest(image.manifest_bytes)
    exports = tool_exports(image)
    if not exports:
        raise MissingExportError("the image exports no tools (no global function named berm_tool_<name>)")
    for tool in manifest.tools:
        if tool.name not in exports:
            raise MissingExportError(f"the manifest declares tool {tool.name[:SHOWN]!r}, but the image does not "
                                     f"export {TOOL_PREFIX}{tool.name[:SHOWN]}")
    return manifest
