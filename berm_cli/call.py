"""``berm call ELF TOOL [JSON]``: call one tool of a harness image, granting exactly what the command line says.

The command line is a one-entry declaration: ``--grant`` names capabilities, ``--root`` bounds fs and exec,
``--host`` bounds http; a grant without its bound is absent, as everywhere. Exit status: 0 with the result on
stdout; 1 when the tool failed (its message on stderr); 2 on a trap or any host error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from berm_host.declaration import declaration_from_table
from berm_host.grants import linker_for
from berm_host.traps import ToolFailure

HELP = "call one tool of a harness image with the capabilities granted on the command line"


def add_arguments(p) -> None:
    p.add_argument("elf", type=Path, help="the harness image, or the name of a bundled harness (e.g. os)")
    p.add_argument("tool", help="the tool to call (berm_tool_<TOOL>)")
    p.add_argument("json", nargs="?", default="{}", help="the tool's arguments as JSON (default {})")
    p.add_argument("--grant", action="append", default=[], metavar="CAP",
                   help="grant a capability: fs, exec, http, clock, kv (repeatable)")
    p.add_argument("--root", help="the directory bounding fs and exec")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="a host http may reach; *.example.org for its subdomains (repeatable)")
    p.add_argument("--engine", choices=("aot", "interp"), default="aot", help="execution engine (default aot)")
    p.add_argument("--memory", metavar="SIZE", help="guest memory, e.g. 64M (default 64M)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="invocation deadline (default 60)")
    p.add_argument("--name", help="the harness name: its kv namespace (default: the image's file name stem)")
    p.add_argument("--data-dir", type=Path, help="where kv data lives (default: $BERM_DATA_DIR or the user data dir)")


def _declaration(args):
    table = {"name": args.name or args.elf.stem, "capabilities": list(dict.fromkeys(args.grant)),
             "hosts": list(dict.fromkeys(args.host))}
    if args.root is not None:
        table["root"] = os.path.abspath(args.root)
    if args.memory is not None:
        table["memory"] = args.memory
    if args.timeout is not None:
        table["timeout"] = args.timeout
    return declaration_from_table(table, "command line")


def _image(elf: Path) -> Path:
    """``elf``, or, when no such file exists and it names a bundled harness (``harnesses/<name>``), that
    harness's image, built on first use and cached."""
    if elf.exists():
        return elf
    from berm_sdk.bundled import bundled_image, bundled_names

    return bundled_image(str(elf)) if str(elf) in bundled_names() else elf


def _log(name: str, line: bytes) -> None:
    print(f"[{name}] {line.decode('utf-8', 'replace')}", file=sys.stderr)


def run(args) -> int:
    from berm_host.engine import Engine  # the engine pulls in the compiler and runtime; only `call` needs them

    try:
        json.loads(args.json)
    except ValueError as exc:
        print(f"berm call: the arguments are not valid JSON: {exc}", file=sys.stderr)
        return 2
    decl = _declaration(args)
    linker = linker_for(decl, data_dir=args.data_dir)
    options = {"kind": args.engine, "log": _log}
    if decl.memory is not None:
        options["memory_size"] = decl.memory
    if decl.timeout is not None:
        options["deadline"] = decl.timeout
    harness = Engine(**options).load(_image(args.elf)).harness(linker, name=decl.name)
    try:
        result = harness.call(args.tool, args.json)
    except ToolFailure as failure:
        print(failure.message, file=sys.stderr)
        return 1
    print(result)
    return 0
