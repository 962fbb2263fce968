"""Read a harness directory's ``harness.toml`` and render the compact ``.berm.abi`` manifest (ABI.md §4).

    name = "fixture"
    usage = "What the tools are for."
    requests = { capabilities = ["fs"], hosts = [] }      # optional: documentation, never a grant
    [[tools]]
    name = "echo"
    description = "Returns its arguments."
    parameters = { type = "object", properties = {} }     # JSON Schema as a TOML table

Every error names the file, and the line when it can be found, so an author can go straight to it.
"""

from __future__ import annotations

import bisect
import json
import re
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from berm_abi.names import ABI_VERSION, CAPABILITY_CALLS
from berm_aot.elf import MAX_MANIFEST_BYTES
from berm_aot.manifest import MAX_NESTING, TOOL_NAME, nesting_depth
from berm_aot.regular_file import FileRefused, read_regular
from berm_host.capabilities.http import HostList, HostListError

from .errors import BuildError
from .schemas import schema_problem

TOML_NAME = "harness.toml"
#: The largest harness.toml read (its manifest may hold at most MAX_MANIFEST_BYTES, 1 MiB: checked when it is loaded).
MAX_TOML_BYTES = 4 << 20
#: How deeply a tool's parameters may nest: in the manifest they sit in its object, its tools array and the tool's
#: object, and the host reads a manifest at most MAX_NESTING deep.
MAX_PARAMETERS_NESTING = MAX_NESTING - 3
#: A harness name becomes a file name ({name}.elf) and a declaration key.
HARNESS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Capability groups a manifest may request, as a declaration grants them ("fs" for berm.fs.*).
CAPABILITY_GROUPS = frozenset(c.name.split(".")[1] for c in CAPABILITY_CALLS)
DEFAULT_PARAMETERS = {"type": "object", "properties": {}}

_TOP_KEYS = {"name", "usage", "tools", "requests"}
_TOOL_KEYS = {"name", "description", "parameters"}
_REQUEST_KEYS = {"capabilities", "hosts"}
#: Where an error is placed: patterns matched at a line's first character that is not a space or a tab.
_TOOLS_HEADER = r"\[\[[ \t]*tools[ \t]*\]\]"
_TOOLS_KEY = r"tools[ \t]*="
_REQUESTS_KEY = r"\[?[ \t]*requests\b"
_USAGE_KEY = r"usage[ \t]*="
_NAME_VALUE = re.compile(r"""name[ \t]*=[ \t]*["']([^"']*)["']""")


@dataclass(frozen=True)
class ToolDecl:
    name: str
    description: str
    parameters: dict = field(hash=False)
    line: int | None  # the line of the tool's name in harness.toml


@dataclass(frozen=True)
class HarnessSpec:
    path: Path  # the harness.toml file
    name: str
    usage: str
    tools: tuple[ToolDecl, ...]
    requests: dict | None = field(default=None, hash=False)

    def where(self, line: int | None) -> str:
        return f"{self.path}:{line}" if line else str(self.path)

    def manifest(self) -> dict:
        doc: dict = {
            "abi_version": ABI_VERSION,
            "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters}
                      for t in self.tools],
            "usage": self.usage,
        }
        if self.requests is not None:
            doc["requests"] = self.requests
        return doc

    def manifest_bytes(self) -> bytes:
        """The compact UTF-8 JSON stored in ``.berm.abi`` (what JSON cannot write was refused as it was read)."""
        return json.dumps(self.manifest(), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _stripped_lines(text: str) -> list[str]:
    """``text``'s lines, each without its leading spaces and tabs. Patterns are matched a line at a time: ``^\\s*``
    searched in the whole text let ``\\s*`` run across newlines, which took cubic time in a file of blank lines
    (8,000 of them: over a minute) and placed a key at the first of the blank lines before it."""
    return [line.lstrip(" \t") for line in text.split("\n")]


def _line_of(lines: list[str], pattern: str, nth: int = 0) -> int | None:
    """The number (from 1) of the ``nth`` (from 0) of ``lines`` (stripped) that ``pattern`` matches at its start."""
    regex = re.compile(pattern)
    return next(islice((i + 1 for i, line in enumerate(lines) if regex.match(line)), nth, None), None)


def _tool_lines(text: str, names: list[str]) -> list[int | None]:
    """The line of each tool's ``name = "…"``, searched in order from the first ``[[tools]]`` header (before it, a
    harness named like a tool gave its own line), or in a file without one from its ``tools = [`` line, whose
    inline tables' names may share lines (the search started at line 1, and found the harness's name: a review):
    each the first after the one found for the tool before. One pass over the lines, then a look-up a tool: a
    search of the rest of the file a tool was quadratic in a file of tools whose name lines it could not find."""
    lines = _stripped_lines(text)
    header = _line_of(lines, _TOOLS_HEADER)
    if header is not None:
        seen = [(number, m.group(1)) for number, line in enumerate(lines[header:], header + 1)
                if (m := _NAME_VALUE.match(line))]
    else:
        key = _line_of(lines, _TOOLS_KEY)
        seen = [] if key is None else [(number, m.group(1)) for number, line in enumerate(lines[key - 1:], key)
                                       for m in _NAME_VALUE.finditer(line)]
    where: dict[str, list[int]] = {}  # each name's places in `seen`
    for place, (_, name) in enumerate(seen):
        where.setdefault(name, []).append(place)
    found, after = [], -1
    for name in names:
        places = where.get(name, [])
        i = bisect.bisect_right(places, after)
        if i < len(places):
            after = places[i]
            found.append(seen[after][0])
        else:
            found.append(None)
    return found


def _key_line(text: str, name_line: int | None, key: str) -> int | None:
    """The line of ``key = …`` (or ``key.sub = …``) in the tool table whose name is on ``name_line``: searched from
    the table's ``[[tools]]`` header to the next header; ``name_line`` when it is not found there (a newcomer's
    walkthrough: a typo in a tool's key was placed at its name's line)."""
    if name_line is None:
        return None
    lines = _stripped_lines(text)
    start = next((i for i in range(name_line - 1, -1, -1) if lines[i].startswith("[[")), name_line - 1)
    regex = re.compile(rf"{re.escape(key)}[ \t]*[=.]")
    for number in range(start + 1, len(lines)):
        if lines[number].startswith("["):
            break
        if regex.match(lines[number]):
            return number + 1
    return name_line


def _read_text(path: Path) -> str:
    """The text of ``path``, a regular file of at most ``MAX_TOML_BYTES``: a FIFO (or a link to /dev/zero) kept
    ``berm build`` waiting for ever (found by a review)."""
    try:
        data = read_regular(path, MAX_TOML_BYTES)
    except FileNotFoundError:
        raise BuildError(f"{path}: no such file (a harness directory needs a {TOML_NAME})") from None
    except OSError as exc:
        raise BuildError(f"{path}: cannot read: {exc}") from None
    except FileRefused as exc:
        raise BuildError(f"{path} {exc}{f', over {MAX_TOML_BYTES >> 20} MiB' if exc.oversized else ''}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:  # at its line (it said "position 20": found by a review)
        line, column = data.count(b"\n", 0, exc.start) + 1, exc.start - data.rfind(b"\n", 0, exc.start)
        raise BuildError(f"{path}:{line}: not UTF-8 (byte {column} of the line)") from None


def load_harness_toml(path: Path) -> HarnessSpec:
    """Parse and check ``path``; a BuildError names the file and line of the first problem."""
    path = Path(path)
    text = _read_text(path)
    try:
        doc = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer past int()'s 4,300 digits (found by a review)
        raise BuildError(f"{path}: {exc}") from None  # tomllib says "(at line L, column C)"
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise BuildError(f"{path}: its arrays or tables are nested too deeply") from None

    def fail(message: str, line: int | None = None, *, at: str | None = None, nth: int = 0) -> BuildError:
        """The error, at ``line`` or at the ``nth`` line the pattern ``at`` matches: looked for only now, when there
        is an error to place."""
        if at is not None:
            line = _line_of(_stripped_lines(text), at, nth)
        return BuildError(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    for key in doc:
        if key not in _TOP_KEYS:
            raise fail(f"unknown key {key!r} (expected {', '.join(sorted(_TOP_KEYS))})",
                       at=rf"\[*[ \t]*{re.escape(key)}\b")
    name = doc.get("name")
    if name is None:
        raise fail("name is missing: the harness's name, e.g. name = \"greeter\"")
    if not isinstance(name, str) or not HARNESS_NAME.fullmatch(name):
        raise fail(f"name must be a string of letters, digits, '_', '-' or '.', not {name!r}",
                   at=r"name[ \t]*=")
    usage = doc.get("usage", "")
    if not isinstance(usage, str):
        raise fail("usage must be a string", at=_USAGE_KEY)
    raw_tools = doc.get("tools")
    if not isinstance(raw_tools, list) or not raw_tools:
        raise fail("declare at least one tool with a [[tools]] table")
    names = [t.get("name") if isinstance(t, dict) else None for t in raw_tools]
    lines = _tool_lines(text, [n for n in names if isinstance(n, str)])
    tools: list[ToolDecl] = []
    for i, entry in enumerate(raw_tools):
        # a tool without a usable name is placed at its [[tools]] header (only the first's was: found by a review)
        if not isinstance(entry, dict):
            raise fail(f"tools[{i}] must be a table", at=_TOOLS_HEADER, nth=i)
        tname = entry.get("name")
        if tname is None:
            raise fail(f"tools[{i}] has no name (name = \"...\": the C function is berm_tool_<name>)",
                       at=_TOOLS_HEADER, nth=i)
        if not isinstance(tname, str) or not TOOL_NAME.fullmatch(tname):
            raise fail(f"tools[{i}].name must be a string of letters, digits and '_', not {tname!r}",
                       at=_TOOLS_HEADER, nth=i)
        line = lines[len(tools)]
        for key in entry:
            if key not in _TOOL_KEYS:
                raise fail(f"tool {tname!r}: unknown key {key!r} (expected {', '.join(sorted(_TOOL_KEYS))})",
                           _key_line(text, line, key))
        if any(t.name == tname for t in tools):
            raise fail(f"tool {tname!r} is declared twice", line)
        description = entry.get("description")
        if not isinstance(description, str):
            raise fail(f"tool {tname!r}: description must be a string", _key_line(text, line, "description"))
        parameters = entry.get("parameters", DEFAULT_PARAMETERS)
        if not isinstance(parameters, dict):
            raise fail(f"tool {tname!r}: parameters must be a table (a JSON Schema)",
                       _key_line(text, line, "parameters"))
        # Found by a review: parameters nested 203 deep were a RecursionError traceback out of jsonschema, and 101
        # deep were refused by the image's own check, after compiling, without a line. Bounded before anything reads
        # them recursively.
        if (depth := nesting_depth(parameters)) > MAX_PARAMETERS_NESTING:
            raise fail(f"tool {tname!r}: parameters nest {depth} deep; at most {MAX_PARAMETERS_NESTING} (the host "
                       f"reads a manifest {MAX_NESTING} deep, and a tool's parameters sit 3 down in it)",
                       _key_line(text, line, "parameters"))
        try:  # the manifest's writing (manifest_bytes) said only that "a tool's parameters" could not be (a review)
            json.dumps(parameters, allow_nan=False)
        except (TypeError, ValueError):
            raise fail(f"tool {tname!r}: parameters hold a value JSON has no form for (a TOML date or time, inf or "
                       "nan)", _key_line(text, line, "parameters")) from None
        tools.append(ToolDecl(tname, description, parameters, line))
    spec = HarnessSpec(path=path, name=name, usage=usage, tools=tuple(tools), requests=_requests(doc, fail))
    # Found by a review: a manifest over the host's limit was refused only by the image's own check, after compiling.
    if (size := len(spec.manifest_bytes())) > MAX_MANIFEST_BYTES:
        what, line = _largest_part(spec, text)
        raise fail(f"the manifest would be {size} bytes, over the {MAX_MANIFEST_BYTES} a host reads ({what} is the "
                   "largest part)", line)
    # What the parameters say, checked once the manifest is one JSON can write and a host reads: jsonschema is given
    # nothing larger.
    for tool in spec.tools:
        if problem := schema_problem(tool.parameters):
            raise fail(f"tool {tool.name!r}: parameters are not a JSON Schema: {problem}",
                       _key_line(text, tool.line, "parameters"))
        if tool.parameters.get("type") != "object":  # found by a review: {type = "string"} and {} were taken
            raise fail(f"tool {tool.name!r}: parameters must be a schema of type = \"object\": a tool's arguments "
                       "are a JSON object (berm_args_object reads one)",
                       _key_line(text, tool.line, "parameters"))
    return spec


def _largest_part(spec: HarnessSpec, text: str) -> tuple[str, int | None]:
    """What takes the most of ``spec``'s manifest (usage, requests, or a tool's description or parameters) and its
    line: where an oversized manifest is best cut. The line is looked for once, for that part only."""
    def size(value) -> int:
        return len(json.dumps(value, ensure_ascii=False))

    parts = [(size(spec.usage), "usage", None), (size(spec.requests), "requests", None)]
    parts += [(size(getattr(t, key)), key, t) for t in spec.tools for key in ("description", "parameters")]
    _, key, tool = max(parts, key=lambda part: part[0])
    if tool is not None:
        return f"the {key} of tool {tool.name!r}", _key_line(text, tool.line, key)
    return key, _line_of(_stripped_lines(text), _USAGE_KEY if key == "usage" else _REQUESTS_KEY)


def _requests(doc: dict, fail) -> dict | None:
    if "requests" not in doc:
        return None
    requests = doc["requests"]
    if not isinstance(requests, dict):
        raise fail("requests must be a table: requests = { capabilities = [...], hosts = [...] }", at=_REQUESTS_KEY)
    for key, value in requests.items():
        if key not in _REQUEST_KEYS:
            raise fail(f"requests: unknown key {key!r} (expected capabilities, hosts)", at=_REQUESTS_KEY)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail(f"requests.{key} must be a list of strings", at=_REQUESTS_KEY)
        repeated = next((v for v, n in Counter(value).items() if n > 1), None)
        if repeated is not None:  # found by a review: capabilities = ["fs", "fs"] was taken
            raise fail(f"requests.{key} names {repeated!r} twice", at=_REQUESTS_KEY)
    if problem := requests_problem(requests):
        raise fail(problem, at=_REQUESTS_KEY)
    return requests


def requests_problem(requests: dict) -> str | None:
    """What in a manifest's requests (lists of strings under "capabilities" and "hosts") no declaration could
    grant: a capability that is none, or a host a declaration's host list refuses ("", "http://a b/", "*": found
    by a review); None when there is nothing. berm build checks a harness.toml's, and a built image's (a Rust crate
    writes its own manifest)."""
    unknown = sorted(set(requests.get("capabilities", [])) - CAPABILITY_GROUPS)
    if unknown:
        return (f"requests.capabilities: unknown capability {unknown[0]!r} "
                f"(known: {', '.join(sorted(CAPABILITY_GROUPS))})")
    try:
        HostList(requests.get("hosts", []))
    except HostListError as exc:
        return f"requests.hosts: {exc}"
    return None
