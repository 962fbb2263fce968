"""``berm schedule add|list|cancel``: the due-set of a running daemon, over its control socket."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time

from berm_abi.errors import BermError
from berm_abi.text import escaped
from berm_cli import arguments
from berm_host.daemon import DaemonClient, default_socket

#: ASCII digits only: \d and str.isdigit() also read "٣٣٣" and "１２３" as numbers (found by a review).
_RELATIVE = re.compile(r"\+([0-9]+)(ms|s|m|h|d)")
_MILLISECONDS = re.compile(r"[0-9]+")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class WhenError(BermError):
    """A schedule instant that cannot be read."""


def parse_when(text: str, now_ms: int | None = None) -> int:
    """UTC milliseconds from ``+30s``/``+5m``/``+2h``/``+1d``, an ISO-8601 instant (local time when it has no
    zone), or integer milliseconds since the epoch."""
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    try:
        return _instant(text, now_ms)
    except (ValueError, OverflowError):  # unreadable, or out of the range of a date (year 0) or of int()
        raise WhenError(f"cannot read {text!r} as an instant: use +30s, +5m, +2h, +1d, an ISO-8601 time "
                        "(2026-12-01T08:00, 2026-12-01T08:00:00Z) or epoch milliseconds") from None


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _instant(text: str, now_ms: int) -> int:
    if m := _RELATIVE.fullmatch(text):
        return now_ms + int(m[1]) * _UNIT_MS[m[2]]
    if _MILLISECONDS.fullmatch(text):
        return int(text)
    instant = dt.datetime.fromisoformat(text)
    if instant.tzinfo is None:
        instant = _local(instant)
    return (instant - _EPOCH) // dt.timedelta(milliseconds=1)  # exact: timestamp() * 1000 came out 1 ms early


def _local(wall: dt.datetime) -> dt.datetime:
    """The instant a local wall-clock time names; refused when the local zone skips that time or shows it twice (a
    daylight-saving change). Found by a review: a skipped 02:30 was taken as 01:30, before the time asked for,
    without a word; a repeated one silently as its first showing."""
    first, second = (wall.replace(fold=fold).astimezone() for fold in (0, 1))
    if first.replace(tzinfo=None) != wall:
        raise WhenError(f"{wall.isoformat()} does not exist in local time (the clocks skip it): give it a UTC "
                        f"offset, as {first.isoformat()} or {second.isoformat()}")
    if first.timestamp() != second.timestamp():
        raise WhenError(f"{wall.isoformat()} happens twice in local time (the clocks go back): give it a UTC "
                        f"offset, as {first.isoformat()} or {second.isoformat()}")
    return first


def _iso(ms: int) -> str:
    """``ms`` as local ISO-8601 time; as the milliseconds themselves when no date can show it (the daemon takes
    any instant within 2**62 ms of the epoch, years past 9999 or before 1)."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="seconds")
    except (ValueError, OverflowError, OSError):
        return str(ms)


def add_arguments(p: argparse.ArgumentParser) -> None:
    socket_help = "the daemon's control socket (default: as for berm serve)"
    p.add_argument("--socket", type=arguments.path, default=None, help=socket_help)
    # accepted after the action too (berm schedule list --socket S); unset there, it leaves the one before alone
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", type=arguments.path, default=argparse.SUPPRESS, help=socket_help)
    sub = p.add_subparsers(dest="action", required=True)
    # each action's --help says the exit statuses too, as every other command's does (found by a review)
    add = sub.add_parser("add", parents=[common], epilog=p.epilog,
                         help="wake HARNESS at WHEN with PAYLOAD (replaces a pending ID)")
    add.add_argument("harness")
    add.add_argument("id")
    add.add_argument("when", help="+30s, +5m, +2h, +1d, an ISO-8601 time, or epoch milliseconds")
    add.add_argument("--payload", default="")
    ls = sub.add_parser("list", parents=[common], epilog=p.epilog, help="pending wakes, soonest first")
    ls.add_argument("harness", nargs="?")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    cancel = sub.add_parser("cancel", parents=[common], epilog=p.epilog, help="remove a pending wake")
    cancel.add_argument("harness")
    cancel.add_argument("id")


def run(args: argparse.Namespace) -> int:
    client = DaemonClient(args.socket or default_socket())
    if args.action == "add":
        entry = client.schedule(args.harness, args.id, parse_when(args.when), args.payload)
        print(f"scheduled {_wake(entry['harness'], entry['id'])} at {_iso(entry['when_ms'])}")
        return 0
    if args.action == "list":
        for e in client.schedules(args.harness):
            if args.json:
                # ASCII only: a harness's id or payload may hold C1 controls (U+009B starts a terminal escape
                # sequence), which JSON would otherwise carry raw to whatever terminal shows the line
                print(json.dumps(e))
            else:
                # a harness chose its wakes' ids and payloads (berm.schedule.at): one line each, no terminal control
                shown = (escaped(e[k], lines=False) for k in ("harness", "id", "payload"))
                print("  ".join([_iso(e["when_ms"]), *shown]))
        return 0
    cancelled, started = client.cancel(args.harness, args.id)
    if cancelled:
        running = "; its wake had already started and runs to its end" if started else ""
        print(f"cancelled {_wake(args.harness, args.id)}{running}")
        return 0
    print(f"berm schedule: {_wake(args.harness, args.id)} was not scheduled", file=sys.stderr)
    return 1


def _wake(harness: str, id: str) -> str:
    """``harness[id]`` on one line, without terminal controls: a harness chose the id of a wake it scheduled, and
    cancelling that wake passes the id back (found by a review: OSC 52 and a screen clear reached the terminal)."""
    return f"{escaped(harness, lines=False)}[{escaped(id, lines=False)}]"
