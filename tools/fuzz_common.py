"""Shared pieces of the long fuzzing campaigns (tools/fuzz_*.py): seeded example drawing, time budgets, a guarded
child process, and the report format. Campaigns are not tests: they run for minutes and print what they found,
each finding with the seed that reproduces it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def draw_examples(strategy, n: int, seed_value: int) -> list:
    """``n`` examples of ``strategy``, the same ones for the same seed (hypothesis used as a generator)."""
    out: list = []

    @seed(seed_value)
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize=False)
    @given(strategy)
    def draw(example):
        out.append(example)

    draw()
    return out


def campaign_args(description: str, *, default_minutes: float = 3.0) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--minutes", type=float, default=default_minutes, help="time budget (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock); rounds use "
                   "seed, seed+1, …")
    p.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (replay one: --rounds 1)")
    return p


class Campaign:
    """Rounds until the time budget or round count is spent; collects findings and prints a summary."""

    def __init__(self, name: str, args: argparse.Namespace):
        self.name = name
        self.first_seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
        self.budget = args.minutes * 60
        self.max_rounds = args.rounds
        self.start = time.monotonic()
        self.rounds = 0
        self.cases = 0
        self.findings: list[str] = []

    def seeds(self):
        while (self.max_rounds is None or self.rounds < self.max_rounds) and \
                time.monotonic() - self.start < self.budget:
            yield self.first_seed + self.rounds
            self.rounds += 1

    def finding(self, seed_value: int, what: str) -> None:
        text = f"[{self.name}] seed {seed_value}: {what}"
        self.findings.append(text)
        print(text, flush=True)

    def child_round(self, seed_value: int, code: str, job: dict, timeout: float, replay: str = ""):
        """Run one child process (``run_child``) and yield the message of each case it finished; a hang or crash
        is a finding naming the case it happened in (``replay`` may use {seed} and {case})."""
        status, lines = run_child(code, job, timeout)
        started = None
        for line in lines:
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
                continue
            self.cases += 1
            yield msg
        if status != "ok":
            self.finding(seed_value, f"case {started}: child {status}" + replay.format(seed=seed_value, case=started))

    def summary(self, outcomes: dict[str, int] | None = None) -> int:
        for key, n in sorted((outcomes or {}).items(), key=lambda kv: -kv[1]):
            print(f"  {n:6d}  {key}")
        took = time.monotonic() - self.start
        print(f"[{self.name}] {self.rounds} rounds, {self.cases} cases in {took:.0f} s, seeds {self.first_seed}.."
              f"{self.first_seed + max(self.rounds - 1, 0)}, {len(self.findings)} findings", flush=True)
        return 1 if self.findings else 0


def run_child(code: str, payload: dict, timeout: float) -> tuple[str, list[str]]:
    """Run ``code`` (Python reading one JSON ``payload`` on stdin) in a child process. Returns (status, the lines
    it printed, also when it hung or died): status "ok", "timeout", or "died <exit status>: <stderr tail>"."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        return "timeout", (out.decode(errors="replace") if isinstance(out, bytes) else out).splitlines()
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        return f"died {proc.returncode}: {proc.stderr[-1500:]}", lines
    return "ok", lines
