"""``berm serve``: run the daemon — declared harnesses, one queue and scheduler, a control socket — until SIGTERM
(a second SIGTERM or SIGINT: at once)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from berm_abi.text import escaped
from berm_cli import arguments
from berm_host.daemon import IDLE_TIMEOUT, Daemon, DaemonConfig, default_socket


def _at_least(least: int):
    """An argparse type: a whole number no smaller than ``least``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("declarations", type=arguments.path, help="TOML file with the [[harnesses]] to load")
    p.add_argument("--socket", type=arguments.path, default=None,
                   help="control socket path (default: $BERM_SOCKET, $XDG_RUNTIME_DIR/berm.sock or the user state dir)")
    p.add_argument("--state-dir", type=arguments.path, default=None,
                   help="where the due-set and kv store live (default: the user data dir); one daemon at a time")
    p.add_argument("--harnesses-dir", type=arguments.path, default=None, help="where {name}.elf images are found")
    p.add_argument("--engine", choices=("aot", "interp"), default="aot", help="default aot")
    p.add_argument("--workers", type=_at_least(1), default=4,
                   help="worker threads, the most guests running at once (default 4)")
    p.add_argument("--per-harness", type=_at_least(1), default=None, help="most invocations of one harness at once "
                   "(default: one fewer than --workers, so with two or more one harness never holds every worker)")
    p.add_argument("--timeout", type=arguments.seconds, default=60.0,
                   help="per-invocation deadline in seconds, at most a day (default 60)")
    p.add_argument("--max-depth", type=_at_least(0), default=8,
                   help="chain depth past which harness-caused work is refused (0: a harness causes none; default 8)")
    p.add_argument("--idle-timeout", type=arguments.seconds, default=IDLE_TIMEOUT,
                   help=f"seconds a control connection may stay silent before it is closed (default {IDLE_TIMEOUT:g})")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also log each invocation's end, each harness loaded and the guests' berm.log lines (traps "
                        "and errors are logged without it, at most 10 a minute per harness: the rest are counted)")


class OneRecordALine(logging.Formatter):
    """Every record's message on one line of its own, whatever guest text it holds (a trap or failure message, a
    wake id): control characters escaped, newlines included; a traceback follows it with each line marked ``  | ``,
    so no text inside it can pass for a record of the daemon's."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord({**record.__dict__, "message": escaped(record.message, lines=False)})
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        return _marked(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _marked(super().formatStack(stack_info))


def _marked(text: str) -> str:
    return "\n".join("  | " + escaped(line, lines=False) for line in text.splitlines())


def _running(daemon: Daemon) -> str:
    running = daemon.queue.executor.load()["busy"]
    return f"{running} running invocation{'' if running == 1 else 's'}"


def run(args: argparse.Namespace) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneRecordALine("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    config = DaemonConfig(
        declarations=args.declarations, socket=args.socket or default_socket(),
        state_dir=args.state_dir, harnesses_dir=args.harnesses_dir, engine=args.engine,
        workers=args.workers, per_harness=args.per_harness, max_depth=args.max_depth, timeout=args.timeout,
        idle_timeout=args.idle_timeout)
    daemon = Daemon(config)

    def on_signal(signum: int, frame: object) -> None:
        if not daemon.stop_requested():
            daemon.request_stop()  # a start in progress (loading, compiling) serves nothing
            return
        # Found by a review: a second signal was ignored, and shutdown waits for running guests' deadlines (with
        # --timeout 86400, a day). The due-set commits synchronously, and a wake cut short stays due and runs
        # again at the next start (at least once); the locks end with the process, the next start takes over the
        # socket left behind, and grep workers and exec's supervisors end as their host does.
        # os.write: print could be in the middle of a write of the main thread's to stderr (a reentrant call).
        os.write(2, f"berm serve: second signal: exiting now, without waiting for {_running(daemon)}\n".encode())
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if not daemon.start():
        print("berm serve: stopped before serving (a signal came while it started)", file=sys.stderr, flush=True)
        return 0
    print(f"berm serve: listening on {config.socket}", file=sys.stderr, flush=True)
    daemon.stop_requested(wait=True)
    # what it waits for, up to --timeout (a review: it was not said)
    print(f"berm serve: stopping, waiting for {_running(daemon)} (a second signal exits at once)", file=sys.stderr,
          flush=True)
    daemon.stop()
    print("berm serve: stopped", file=sys.stderr, flush=True)
    return 0
