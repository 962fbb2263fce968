"""``berm call ELF TOOL [JSON|-]``: call one tool of a harness image, granting exactly what the command line says
(``-``: the JSON arguments come from stdin).

The command line is a one-entry declaration: ``--grant`` names capabilities, ``--root`` bounds fs and exec,
``--host`` bounds http. A grant without its bound would be absent, as in a declaration, so the command line
refuses it instead of running a guest whose calls then trap as "not granted". With ``--daemon``, the call goes
through a running daemon's queue instead (``berm serve``), to the harness its declarations name, with the grants
those declarations give. Exit status: 0 with the result on stdout; 1 when the tool failed (its message on
stderr); 2 on a trap or any host error.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import platformdirs

from berm_abi.errors import BermError
from berm_abi.json_objects import unique_object, unsayable
from berm_abi.names import KNOWN_NAMES
from berm_abi.text import escaped
from berm_cli import arguments
from berm_cli.interrupt import interruptible
from berm_cli.terminal import compile_notice, failure_text, print_result, shown
from berm_host.declaration import NAME, NAME_RULE, declaration_from_table, parse_memory
from berm_host.grants import BOUNDS, DAEMON_GRANTS, KNOWN_GRANTS, grant_for, linker_for
from berm_host.traps import ToolFailure, Trap, TrapKind


def add_arguments(p) -> None:
    p.add_argument("elf", type=arguments.image,
                   help="the name of a bundled harness (e.g. os), or the path of a harness image (./os for a file "
                        "named like a bundled harness)")
    p.add_argument("tool", help="the tool to call (berm_tool_<TOOL>)")
    p.add_argument("json", nargs="?", default="{}",
                   help="the tool's arguments as JSON (default {}); - reads them from stdin (for arguments longer "
                        "than a command line may be)")
    p.add_argument("--grant", action="append", default=[], metavar="CAP",
                   help="grant a capability: fs, exec, http, clock, kv (repeatable)")
    p.add_argument("--root", help="the directory bounding fs and exec")
    p.add_argument("--host", action="append", default=[], metavar="HOST",
                   help="a host http may reach; *.example.org for its subdomains (repeatable)")
    p.add_argument("--engine", choices=("aot", "interp"), help="execution engine (default aot; with --daemon, the "
                                                                   "daemon's)")
    p.add_argument("--memory", metavar="SIZE", help="guest memory, e.g. 64M (default 64M)")
    p.add_argument("--timeout", type=arguments.seconds, metavar="SECONDS", help="invocation deadline (default 60)")
    p.add_argument("--name", help="the harness name: its kv namespace (default: the image's file name stem)")
    p.add_argument("--data-dir", type=arguments.path,
                   help=f"where kv data lives (default: $BERM_DATA_DIR, else {platformdirs.user_data_dir('berm')})")
    p.add_argument("--daemon", nargs="?", const="", metavar="SOCKET",
                   help="call the harness of that name in a running daemon (berm serve) over its control socket "
                        "(default socket: $BERM_SOCKET, $XDG_RUNTIME_DIR/berm.sock or the user state dir, as for "
                        "berm serve); its declaration grants, so the options above do not apply")

#: Options that describe a one-entry declaration: meaningless when a daemon's own declarations decide.
_LOCAL_ONLY = ("grant", "root", "host", "memory", "timeout", "name", "data_dir", "engine")


#: The option that gives each bounded grant its bound (berm_host.grants.BOUNDS).
_BOUND_OPTIONS = {"root": "--root DIR", "hosts": "--host HOST"}


def _given(args, bound: str):
    """What the command line gives for a grant's bound (BOUNDS: "root" or "hosts")."""
    return args.root if bound == "root" else args.host


def _declaration(args):
    for cap in dict.fromkeys(args.grant):
        if cap in DAEMON_GRANTS:  # it said the host did not know them (found by a review)
            raise BermError(f"--grant {cap}: {_daemon_only(cap)}")
        if cap not in KNOWN_GRANTS:  # named first: with --root or --host given, the bound's check spoke of a missing
            # --grant, leaving a misspelt one (--grant FS, --grant fs,exec) unnamed (found by a review)
            one_each = "; give each its own --grant" if "," in cap else ""
            raise BermError(f"--grant {cap!r}: this host knows no such grant (known: {', '.join(KNOWN_GRANTS)})"
                            f"{one_each}")
        bound = BOUNDS.get(cap)
        if bound and not _given(args, bound):
            raise BermError(f"--grant {cap} needs {_BOUND_OPTIONS[bound]}: without it the grant gives nothing")
    for bound, option in _BOUND_OPTIONS.items():
        bounded = sorted(cap for cap, b in BOUNDS.items() if b == bound)
        if _given(args, bound) and not set(bounded) & set(args.grant):  # taken without a word (found by a review)
            raise BermError(f"{option.split()[0]} bounds only {' or '.join(f'--grant {cap}' for cap in bounded)}: "
                            "without one it gives nothing")
    table = {"name": _name(args), "capabilities": list(dict.fromkeys(args.grant)),
             "hosts": list(dict.fromkeys(args.host))}
    if args.root is not None:
        table["root"] = os.path.abspath(args.root)
    if args.memory is not None:
        table["memory"] = parse_memory(args.memory, "--memory")  # not "command line 'name': memory: …"
    if args.timeout is not None:
        table["timeout"] = args.timeout
    return declaration_from_table(table, "command line")


def _name(args) -> str:
    """--name, else the image file's stem when a declaration could give it; else, without kv (whose namespace the
    name is), the stem with what a name cannot hold made "_" (found by a review: "my tool.elf" was refused, without
    a word of --name, though the name only tags its log lines)."""
    stem = Path(args.elf).stem
    if args.name or NAME.fullmatch(stem):
        return args.name or stem
    if "kv" in args.grant:
        raise BermError(f"the image's file name ({stem[:80]!r}) cannot name its kv store's namespace: give --name "
                        f"NAME ({NAME_RULE})")
    return re.sub(r"^[.-]|[^A-Za-z0-9_.-]", "_", stem)[:64] or "harness"


#: How deeply the guest SDKs' parsers let arrays and objects nest (``BERM_JSON_MAX_DEPTH`` in berm.h, ``MAX_DEPTH``
#: in the Rust SDK's json.rs).
SDK_JSON_DEPTH = 64


def _nesting(doc) -> int:
    """How deeply arrays and objects nest in ``doc`` (0: a scalar)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def json_problem(text: str) -> str | None:
    """Why ``text`` is not the JSON a guest's SDK reads (None when it is), before any image is loaded: not UTF-8 (a
    command-line argument's bad bytes), not JSON, nested past what the SDKs read (``SDK_JSON_DEPTH``: deeper went to
    the guest, a failure of status 1, found by a review) or Python reads, a key given twice in an object,
    NaN or Infinity, a lone surrogate: what the manifest reader refuses too (``unsayable``). Numbers of any length
    are JSON: Python's 4,300-digit limit is int()'s, and 1e999 a double's, which the SDKs keep as the number's text
    (found by a review: it was refused as infinity). Found by a review: json.loads let the four above through to
    the guest (a failure, status 1, where bad arguments are 2), turned away long integers, and raised RecursionError
    as a traceback."""
    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "UTF-8"
    try:
        doc = json.loads(text, object_pairs_hook=unique_object, parse_constant=no_constant, parse_int=str,
                         parse_float=str)
        problem = unsayable(doc)
    except RecursionError:
        return "valid JSON here: they nest too deeply"
    except ValueError as exc:
        return f"valid JSON: {exc}"
    if problem:
        return f"valid JSON: it holds {problem}"
    if (depth := _nesting(doc)) > SDK_JSON_DEPTH:
        return f"valid JSON here: they nest {depth} deep, past the {SDK_JSON_DEPTH} a guest's SDK reads"
    return None


def _image(elf: str) -> Path:
    """The bundled harness (``harnesses/<name>``, built on first use and cached) when ``elf`` is a bare name one
    has, whatever the current directory holds: a checkout shipping a file named ``os`` ran in its place, with the
    grants meant for the bundled one. Otherwise the image at the path ``elf``."""
    if os.sep not in elf:
        from berm_sdk.bundled import bundled_image, bundled_names

        if elf in bundled_names():
            return bundled_image(elf)
        if not os.path.lexists(elf):  # only "No such file" said nothing of the names that are bundled (a review)
            raise BermError(f"no file {elf!r} here, and no bundled harness of that name (bundled: "
                            f"{', '.join(bundled_names())}; an image is named by its path)")
    return Path(elf)


def _log(name: str, line: bytes) -> None:
    """A guest's log line, each of its lines under the harness's tag: untagged, the second line of one could pass
    for a line of berm call's own."""
    text = shown(line.decode("utf-8", "replace"))
    try:
        print("\n".join(f"[{name}] {part}" for part in text.split("\n")), file=sys.stderr)
    except OSError:  # stderr takes no more (closed, full): the call goes on without its log (the failed write was
        pass         # a trap of the call, and its result was lost: found by a review)


def _through_daemon(args) -> int:
    from berm_host.daemon import DaemonClient, DaemonError, RemoteError, default_socket

    given = [f"--{o.replace('_', '-')}" for o in _LOCAL_ONLY if getattr(args, o) not in (None, [])]
    if given:
        print(f"berm call: {', '.join(given)} cannot be combined with --daemon: the daemon's declarations grant, "
              "and it runs them with its own engine", file=sys.stderr)
        return 2
    client = DaemonClient(Path(args.daemon) if args.daemon else default_socket())
    try:
        result = client.call(str(args.elf), args.tool, args.json)
    except DaemonError as exc:
        if args.daemon and os.sep not in args.daemon and not os.path.lexists(args.daemon):  # found by a review
            raise DaemonError(f"{exc}; if {args.daemon!r} was meant for the image, put --daemon after the image, "
                              "tool and arguments, or write --daemon=SOCKET: --daemon takes the word after it "
                              "for its socket") from None
        raise
    except RemoteError as exc:  # as a direct call prints them: a tool's failure as it is, the rest as berm call's
        if exc.kind == "failure":
            print(failure_text(str(exc)), file=sys.stderr)
            return 1
        print(_trap_text(str(exc), exc.chain), file=sys.stderr)
        return 2
    print_result(result)
    return 0


def _trap_text(message: str, chain) -> str:
    """A trap as berm call prints it, direct or through the daemon: the message on one line (a newline in the guest's
    berm.fail text it carries forged "called from" lines: found by a review), its call chain indented under it."""
    return "\n".join([f"berm call: {escaped(message, lines=False)}", *(f"  {shown(line)}" for line in chain)])


def run(args) -> int:
    if args.json == "-":
        if sys.stdin is None:
            print("berm call: the arguments are to come from stdin, which is closed", file=sys.stderr)
            return 2
        try:  # bytes: the text layer decodes with the locale's codec, and C.UTF-8's escapes bad bytes
            args.json = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            print(f"berm call: the arguments on stdin are not UTF-8 (byte {exc.start})", file=sys.stderr)
            return 2
    if problem := json_problem(args.json):
        print(f"berm call: the arguments are not {problem}", file=sys.stderr)
        return 2
    if args.daemon is not None:
        return _through_daemon(args)
    from berm_host.engine import Engine  # the engine pulls in the compiler and runtime; only `call` needs them

    decl = _declaration(args)
    linker = linker_for(decl, data_dir=args.data_dir)
    options = {"kind": args.engine or "aot", "log": _log, "on_compile": compile_notice("berm call")}
    if decl.memory is not None:
        options["memory_size"] = decl.memory
    if decl.timeout is not None:
        options["deadline"] = decl.timeout
    harness = Engine(**options).load(_image(args.elf)).harness(linker, name=decl.name)
    try:
        result = interruptible(lambda: harness.call(args.tool, args.json))
    except ToolFailure as failure:
        print(failure_text(failure.message), file=sys.stderr)
        return 1
    except Trap as trap:  # with the call chain under the message, and how to grant what it lacked
        print(_trap_text(str(trap), trap.info.chain_lines()), file=sys.stderr)
        if hint := _grant_hint(trap):
            print(f"berm call: {hint}", file=sys.stderr)
        return 2
    print_result(result)
    return 0


def _daemon_only(grant: str) -> str:
    return f"only a declaration under berm serve grants {grant}: call the harness through the daemon (--daemon)"


def _grant_hint(trap: Trap) -> str | None:
    """How to grant the capability a trap says the harness was not granted (a newcomer's walkthrough: the trap named
    it, not the option that grants it)."""
    name = KNOWN_NAMES.get(trap.info.addr) if trap.kind is TrapKind.UNKNOWN_HOST_CALL else None
    grant = grant_for(name) if name else None
    if grant in DAEMON_GRANTS:
        return _daemon_only(grant)
    if grant:
        bound = f" {_BOUND_OPTIONS[BOUNDS[grant]]}" if grant in BOUNDS else ""
        return f"to grant {name}, add --grant {grant}{bound}"
    return None
