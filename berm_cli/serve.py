"""``berm serve``: run the daemon — declared harnesses, one queue and scheduler, a control socket — until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from berm_host.daemon import Daemon, DaemonConfig, default_socket


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("declarations", type=Path, help="TOML file with the [[harnesses]] to load")
    p.add_argument("--socket", type=Path, default=None, help="control socket path (default: $BERM_SOCKET, "
                   "$XDG_RUNTIME_DIR/berm.sock or the user state dir)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where the due-set and kv store live (default: the user data dir)")
    p.add_argument("--harnesses-dir", type=Path, default=None, help="where {name}.elf images are found")
    p.add_argument("--engine", choices=("aot", "interp"), default="aot")
    p.add_argument("--workers", type=int, default=4, help="worker threads (the most guests running at once)")
    p.add_argument("--per-harness", type=int, default=None, help="most invocations of one harness at once")
    p.add_argument("--timeout", type=float, default=60.0, help="per-invocation deadline in seconds")
    p.add_argument("--max-depth", type=int, default=8, help="chain depth past which harness-caused work is refused")
    p.add_argument("-v", "--verbose", action="store_true", help="log every invocation-level event")


def run(args: argparse.Namespace) -> int:
    from berm_host.capabilities.kv import data_dir

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = DaemonConfig(
        declarations=args.declarations, socket=args.socket or default_socket(),
        state_dir=args.state_dir or data_dir(), harnesses_dir=args.harnesses_dir, engine=args.engine,
        workers=args.workers, per_harness=args.per_harness, max_depth=args.max_depth, timeout=args.timeout)
    daemon = Daemon(config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    daemon.start()
    print(f"berm serve: listening on {config.socket}", file=sys.stderr, flush=True)
    stop.wait()
    daemon.stop()
    print("berm serve: stopped", file=sys.stderr, flush=True)
    return 0
