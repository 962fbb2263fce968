"""``berm``: one subcommand per module of this package. Each module defines ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Only the chosen subcommand's module is imported, so ``berm call`` does not
pay for the daemon or the guest toolchain at start-up."""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from berm_abi.errors import BermError
from berm_cli.interrupt import Signalled, default_sigchld, raise_pending, said, signals_raise
from berm_cli.terminal import reader_may_leave, shown

#: subcommand -> (module under berm_cli, one-line help)
SUBCOMMANDS = {
    "build": ("build", "build a harness directory (harness.toml + C sources, or a Rust crate) into a checked harness ELF"),
    "inspect": ("inspect_cmd", "show a harness's manifest, exported tools, requests and image layout "
                               "(nothing is executed)"),
    "run": ("run_cmd", "call a global function of an image with integer arguments (no manifest, no capabilities)"),
    "call": ("call", "call one tool of a harness image with the capabilities granted on the command line"),
    "schedule": ("schedule", "add, list or cancel timed wakes of a running daemon (berm serve)"),
    "serve": ("serve", "run the long-running host: load declared harnesses, run the queue and scheduler, listen "
                       "on a control socket"),
}


#: What every command's status means (README, "Commands"). Found by a review: it was said nowhere a user looks.
EXIT_STATUS = ("exit status: 0 done (berm serve: stopped by a signal); 1 the tool failed (berm.fail), nothing to "
               "cancel, or the output could not be written; 2 a usage error, an error of Berm's or the host's, or a "
               "guest's trap; 130 interrupted (Ctrl-C), 143 and 129 stopped by SIGTERM and SIGHUP; 141 the output's "
               "reader went away; berm serve exits with 128 + the signal's number at a second one")


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    """The parser; only ``chosen``'s module is imported and given its arguments (the others show their help)."""
    parser = argparse.ArgumentParser(prog="berm", description="Run untrusted RV64IMAC harnesses, translated to C.",
                                     epilog=EXIT_STATUS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_STATUS)
        if name == chosen:
            module = importlib.import_module(f"berm_cli.{module_name}")
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def _chosen(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    default_sigchld()
    args = _parser(_chosen(argv)).parse_args(argv)
    return reader_may_leave("berm", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """SIGTERM and SIGHUP end a command as Ctrl-C does, undoing what it was doing on the way out (a build's
    temporary directory was left behind: found by a review); berm serve handles its signals itself."""
    try:
        with signals_raise(*() if args.command == "serve" else (signal.SIGTERM, signal.SIGHUP)):
            status = args._module.run(args)
            raise_pending()
            return status
    except BermError as exc:
        print(f"berm {args.command}: {shown(str(exc))}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Signalled) as exc:  # a guest run here ends at interruptible's
        signum = exc.signum if isinstance(exc, Signalled) else signal.SIGINT
        try:
            print(f"berm {args.command}: {said(signum)}{_left_with_the_daemon(args)}", file=sys.stderr)
        except OSError:  # a terminal closed (the SIGHUP's cause) takes no more: the status says it
            pass
        return 128 + signum


def _left_with_the_daemon(args: argparse.Namespace) -> str:
    """What an interrupted client leaves the daemon doing. Found by a review: a call's Ctrl-C said only
    "interrupted", and its guest ran on in the daemon to its deadline, holding its harness's slot."""
    if args.command == "schedule":
        return " (the daemon may have made the change: berm schedule list shows)"
    if args.command == "call" and getattr(args, "daemon", None) is not None:
        return " (a call the daemon had started runs on there until it ends or reaches its deadline)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
