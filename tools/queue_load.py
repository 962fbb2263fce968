"""Load figure for the queue (issue 7): N due wakes across H harnesses drain without loss or duplication.

    python tools/queue_load.py                         # 10,000 wakes, 100 harnesses, real guests (AOT engine)
    python tools/queue_load.py --engine interp         # the same on the reference interpreter
    python tools/queue_load.py --engine none           # the queue machinery alone (a Python target per harness)

Every wake is already due when the queue starts (as after downtime), so the first drain sees all of them and the
worker budget spills the rest from drain to drain. Each harness logs the id it was woken with; the script checks
that every (harness, id) arrived exactly once and that the due-set is empty, then prints the throughput and the
scheduler's counters.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from berm_host.queue import Invocation, Queue  # noqa: E402

WAKER_C = r"""
#include "berm.h"
#include "berm_recurring.h"

BERM_TOOL(ping) { return berm_ok_str("pong"); }

BERM_ON_WAKE {
    berm_wake wake = berm_wake_args();
    if (wake.error) return berm_fail(wake.error);
    berm_log(wake.id.ptr, wake.id.len);
    return berm_ok_str("ok");
}
"""

WAKER_TOML = """
name = "waker"
usage = "Logs the id of every wake (tools/queue_load.py)."
[[tools]]
name = "ping"
description = "pong"
"""


class PythonTarget:
    """The queue machinery alone: records the wake id the way the guest's berm.log would."""

    tools = frozenset({"ping"})
    exports = frozenset({"on_wake"})

    def __init__(self, name: str, seen: collections.Counter, lock: threading.Lock):
        self.name, self.seen, self.lock = name, seen, lock

    def invoke(self, inv: Invocation, deadline: float) -> str:
        with self.lock:
            self.seen[(self.name, json.loads(inv.args)["id"])] += 1
        return "ok"


def guest_targets(engine: str, names: list[str], seen: collections.Counter, lock: threading.Lock, work: Path):
    from berm_host.declaration import Declaration
    from berm_host.linker import Linker
    from berm_host.queue.harness import Loader
    from berm_sdk.build import build_harness

    src = work / "waker"
    src.mkdir()
    (src / "waker.c").write_text(WAKER_C)
    (src / "harness.toml").write_text(WAKER_TOML)
    image = build_harness(src, work / "waker.elf")

    def sink(harness: str, line: bytes) -> None:
        with lock:
            seen[(harness, line.decode())] += 1

    loader = Loader(engine, log=sink)  # one engine: the hundred harnesses share one loaded image
    return {name: loader.load(Declaration(name=name), image, Linker()) for name in names}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wakes", type=int, default=10_000)
    ap.add_argument("--harnesses", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--engine", choices=("aot", "interp", "none"), default="aot")
    args = ap.parse_args()

    seen: collections.Counter = collections.Counter()
    lock = threading.Lock()
    names = [f"h{i:03d}" for i in range(args.harnesses)]
    with tempfile.TemporaryDirectory(prefix="berm-load-") as tmp:
        work = Path(tmp)
        q = Queue(work / "due.sqlite3", workers=args.workers)
        if args.engine == "none":
            targets = {n: PythonTarget(n, seen, lock) for n in names}
        else:
            targets = guest_targets(args.engine, names, seen, lock, work)
        for name, target in targets.items():
            q.add(name, target)
        past = time.time_ns() // 1_000_000 - 60_000
        expected = {(names[i % len(names)], f"w{i}") for i in range(args.wakes)}
        q.dueset.put_many([(h, i, past + n % 1000, "", 0) for n, (h, i) in enumerate(sorted(expected))])

        start = time.perf_counter()
        q.start()
        while q.dueset.count() or sum(s.invocations for s in q.executor.stats().values()) < args.wakes:
            time.sleep(0.01)
        elapsed = time.perf_counter() - start
        stats = q.stats()
        q.stop()

    lost = expected - set(seen)
    duplicated = {k: n for k, n in seen.items() if n > 1}
    failures = sum(h["traps"] + h["failures"] + h["errors"] for h in stats["harnesses"].values())
    waits = [h["max_wait"] for h in stats["harnesses"].values()]
    sched = stats["scheduler"]
    print("| engine | wakes | harnesses | workers | seconds | wakes/s | lost | duplicated | failed "
          "| drains | spill events | scheduler wakeups | max queue wait |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.engine} | {args.wakes} | {args.harnesses} | {args.workers} | {elapsed:.2f} "
          f"| {args.wakes / elapsed:,.0f} | {len(lost)} | {len(duplicated)} | {failures} | {sched['drains']} "
          f"| {sched['spill_events']} | {sched['wakeups']} | {max(waits) * 1000:.1f} ms |")
    return 1 if lost or duplicated or failures else 0


if __name__ == "__main__":
    sys.exit(main())
