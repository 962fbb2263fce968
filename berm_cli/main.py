"""``berm``: one subcommand per module of this package. Each module defines ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int`` (the exit status)."""

from __future__ import annotations

import argparse
import importlib
import sys

from berm_abi.errors import BermError

#: subcommand -> module under berm_cli
SUBCOMMANDS = {
    "build": "build",
    "inspect": "inspect_cmd",
    "run": "run_cmd",
    "call": "call",
    "schedule": "schedule",
    "serve": "serve",
}


def _parser(modules: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="berm", description="Run untrusted RV64IMAC harnesses, translated to C.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in modules.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def _modules() -> dict:
    return {name: importlib.import_module(f"berm_cli.{mod}") for name, mod in SUBCOMMANDS.items()}


def main(argv: list[str] | None = None) -> int:
    args = _parser(_modules()).parse_args(argv)
    try:
        return args._module.run(args)
    except BermError as exc:
        print(f"berm {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
