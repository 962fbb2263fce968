"""Fuzz ``berm.fs.grep``'s patterns: random patterns built from the regex module's syntax (recursion, fuzzy
matching, flags, classes, escapes…) go through the real capability over a few small files, in child processes, and
anything but a reply or an error reply (``CapabilityError``) is a finding: another exception, a crash of the child
(a signal: the host process would die) or of its grep worker (the regex module's crash, which the host survives), or
a child past its time or memory bound. A crashing batch is bisected to the pattern that crashes it.

    python tools/fuzz_grep.py --minutes 10 [--seed S]

A hostile review found a SIGSEGV inside the regex module ((?R){e<=1}) and a RuntimeError while matching; grep now
refuses recursion and fuzzy matching (berm_host/capabilities/fs_search.py), and this keeps looking.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Pieces of patterns: the regex module's constructs, and the characters that make and break them.
ATOMS = ["a", "b", ".", "*", "+", "?", "*?", "++", "(", ")", "[", "]", "{", "}", "|", "^", "$", "\\", "-", ",",
         "0", "1", "2", "9", "<", ">", "=", "!", "#", ":", "&", "~", "e", "i", "d", "s", "P", "R", "(?", "(?<",
         "(?P<a>", "(?&a)", "(?1)", "(?R)", "(?+1)", "\\1", "\\g<1>", "{e<=1}", "{2,3}", "{,4}", "(?i)", "(?f)",
         "(?r)", "(?w)", "(?b)", "(?e)", "(?p)", "(?L)", "(?u)", "(?a)", "(?s)", "(?m)", "(?x)", "(?V1)", "\\L<x>",
         "\\N{", "\\p{L}", "\\P{", "\\X", "\\G", "\\K", "(?|", "(?>", "(?=", "(?!", "(?<=", "(?<!", "(?(1)",
         "(?(a)", "(?(DEFINE)", "\\Q", "\\E", "(*PRUNE)", "(*SKIP)", "(*FAIL)", "\\m", "\\M", "\\b", "\\B",
         "[[:alpha:]]", "[^", "[[a-z]--[aeiou]]", "||", "&&", "\\d", "\\w", "\\s", "\\h", "\\v", "é", "İ", "ß",
         "ﬃ", "０", "٣", "\n", " "]

#: The child: reads JSON patterns, one per line, greps each over a small root; prints one JSON line per pattern
#: whose outcome is neither a reply nor an error reply.
CHILD = r'''
import json, resource, sys, tempfile, os
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from berm_abi.frames import encode_frame
from berm_host.capabilities import fs_search
from berm_host.capabilities.paths import Root
from berm_host.linker import CapabilityError
root = tempfile.mkdtemp(prefix="berm-fuzz-grep-")
for name, text in [("a.txt", "abc\naab\n"), ("b.txt", "aaaa\u0130\u00df 1a2b\n"), ("c.txt", "2~~ {e} x(y)\n")]:
    with open(os.path.join(root, name), "w") as f:
        f.write(text)
grep = fs_search.capabilities(Root(root), timeout=0.5)["berm.fs.grep"]
for line in sys.stdin:
    pattern = json.loads(line)
    for mode in ("files", "content"):
        try:
            grep(encode_frame([pattern, "", "", mode]))
        except CapabilityError as exc:
            if "the process matching the regex ended" in str(exc):  # a crash of the grep worker
                print(json.dumps([pattern, f"worker crash: {str(exc)[:200]}"]), flush=True)
                break
        except BaseException as exc:
            print(json.dumps([pattern, f"{type(exc).__name__}: {str(exc)[:200]}"]), flush=True)
            break
print(json.dumps(None), flush=True)
'''


def run_batch(patterns: list[str], timeout: float) -> tuple[list[list[str]], str | None]:
    """The findings the child printed, and why it did not finish (None when it did)."""
    stdin = "".join(json.dumps(p) + "\n" for p in patterns)
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=stdin, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:g} s"
    said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith(("[", "null"))]
    findings = [s for s in said if s is not None]
    if said[-1:] == [None] and done.returncode == 0:
        return findings, None
    return findings, f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"


def culprit(patterns: list[str], timeout: float) -> tuple[str, str]:
    """The first pattern of a failing batch that fails alone, and how."""
    while len(patterns) > 1:
        half = patterns[:len(patterns) // 2]
        _, why = run_batch(half, timeout)
        patterns = half if why else patterns[len(patterns) // 2:]
    _, why = run_batch(patterns, timeout)
    return patterns[0], why or "failed only with the patterns before it"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=400, help="patterns per child process")
    args = parser.parse_args(argv)
    rnd = random.Random(args.seed)
    end = time.monotonic() + args.minutes * 60
    tried, found = 0, {}
    while time.monotonic() < end:
        patterns = ["".join(rnd.choice(ATOMS) for _ in range(rnd.randint(1, 12))) for _ in range(args.batch)]
        findings, why = run_batch(patterns, timeout=2.0 * args.batch)
        if why:
            findings.append(list(culprit(patterns, timeout=2.0 * args.batch)))
        for pattern, what in findings:
            key = what.split(":")[0]
            if key not in found:
                found[key] = pattern
                print(f"FINDING {what!r} from pattern {pattern!r}", flush=True)
        tried += len(patterns)
    print(f"{tried} patterns, {len(found)} kinds of finding", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
