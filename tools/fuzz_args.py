"""Tool-argument fuzzing campaign: arbitrary bytes and arbitrary JSON (plausible keys with hostile values) as the
arguments of every tool of the fixture and OS harnesses, granted fs (and exec only with ``--with-bash``) over a
scratch root. Every call must end in a result, a ToolFailure (the harness refused the input) or — a finding — a
Trap; a HostError (the result is not UTF-8 text, e.g. raw bytes echoed back) is counted; anything else (a raw
exception, a crash, a hang of the child process) is a finding too. A sample of the
cases also runs on the interpreter, which must give exactly the same outcome. Files outside the root must not
change.

    python tools/fuzz_args.py --minutes 5
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

from fuzz_common import ROOT, Campaign, campaign_args

KEYS = ["path", "content", "command", "cwd", "env", "include", "limit", "offset", "mode", "new_string",
        "old_string", "pattern", "text", "x", ""]
_STRINGS = ["", ".", "..", "/", "../../etc/passwd", "/etc/passwd", "a" * 5000, "\u0000", "\udcff", "a\nb",
            "*", "**/*", "[", "(", "\\", "%s%n", "é" * 300, "f.txt", "dir/", "dir/../f.txt", "link", "x" * 70000]
_NUMBERS = [0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), 1e308, -0.0, 3.5, 10**40]


def _value(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if pick < 0.35:
        return rng.choice(_STRINGS) if rng.random() < 0.6 else rng.randbytes(rng.randint(0, 40)).decode("latin-1")
    if pick < 0.55:
        return rng.choice(_NUMBERS)
    if pick < 0.65:
        return rng.choice([None, True, False])
    if depth > 6 or pick < 0.8:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def arguments(rng: random.Random) -> bytes:
    """One argument blob: JSON objects with plausible keys mostly, else odd JSON, raw bytes or deep nesting."""
    pick = rng.random()
    if pick < 0.6:
        obj = {rng.choice(KEYS): _value(rng) for _ in range(rng.randint(0, 5))}
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if pick < 0.75:
        return json.dumps(_value(rng)).encode("utf-8", "surrogatepass")
    if pick < 0.85:
        n = rng.choice([1, 63, 64, 65, 1000, 100000])
        return (b"[" * n + b"]" * n) if rng.random() < 0.5 else (b'{"a":' * n + b"1" + b"}" * n)
    if pick < 0.95:
        return rng.randbytes(rng.choice([0, 1, 7, 100, 4096, 1 << 20]))
    good = json.dumps({"path": "f.txt", "content": "hi", "pattern": "h"}).encode()
    at = rng.randrange(len(good))
    return good[:at] + bytes([rng.getrandbits(8)]) + good[at + 1:]


#: A well-formed argument object per OS tool: half the cases start from one and make one field hostile, so the
#: fuzzing reaches past the argument checks into the tools themselves.
VALID = {"read": {"path": "f.txt", "offset": 1, "limit": 10}, "write": {"path": "new.txt", "content": "x"},
         "edit": {"path": "f.txt", "old_string": "hello", "new_string": "bye"},
         "glob": {"pattern": "**/*.txt", "path": "."}, "grep": {"pattern": "w.r", "path": ".", "mode": "content"},
         "bash": {"command": "echo hi", "cwd": "."}}


def case(seed_value: int, index: int) -> tuple[str, bytes, bool]:
    """(tool key "harness/tool", argument blob, also run on the interpreter)."""
    rng = random.Random(seed_value * 1_000_003 + index)
    key = rng.choice(TOOLS_ALL)
    tool = key.split("/")[1]
    if tool in VALID and rng.random() < 0.5:
        obj = dict(VALID[tool])
        obj[rng.choice(list(obj))] = rng.choice(_STRINGS) if rng.random() < 0.7 else _value(rng)
        blob = json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    else:
        blob = arguments(rng)
    return key, blob, rng.random() < 0.1


TOOLS_ALL = ["fixture/echo", "fixture/chatty", "fixture/probe", "fixture/boom", "os/read", "os/write", "os/edit",
             "os/glob", "os/grep", "os/bash"]


# ---------------------------------------------------------------- the child


def _harnesses(kind: str, root: Path, with_bash: bool):
    from berm_host.declaration import Declaration
    from berm_host.engine import Engine
    from berm_host.grants import linker_for
    from berm_sdk.build import build_harness
    engine = Engine(kind=kind, deadline=5.0, cache_dir=Path(tempfile.gettempdir()) / "berm-fuzz-args-cache")
    out = {}
    for name in ("fixture", "os"):
        elf = Path(tempfile.gettempdir()) / f"berm-fuzz-args-{name}.elf"
        if not elf.exists():
            build_harness(ROOT / "harnesses" / name, elf)
        grants = ("fs", "exec") if with_bash else ("fs",)
        linker = linker_for(Declaration(name=name, capabilities=grants, root=str(root)))
        out[name] = engine.load(elf.read_bytes()).harness(linker, name=name)
    return out


def _outcome(harness, tool: str, blob: bytes) -> str:
    from berm_host.traps import HostError, ToolFailure, Trap
    if tool not in harness.tools:
        return "absent"
    try:
        text = harness.call(tool, blob)
        return "result " + hashlib.sha256(text.encode()).hexdigest()[:16]
    except ToolFailure as exc:
        return "failure " + exc.message[:120]
    except Trap as exc:
        return f"TRAP {exc}"
    except HostError as exc:  # a clear refusal of what the tool returned (e.g. echoed bytes that are not UTF-8)
        return "hosterror " + str(exc)[:120]
    except Exception as exc:  # noqa: BLE001 - the finding
        return f"RAW {type(exc).__name__}: {str(exc)[:200]}"


def _fresh_root(root: Path) -> None:
    import shutil
    shutil.rmtree(root, ignore_errors=True)
    (root / "dir").mkdir(parents=True)
    (root / "f.txt").write_text("hello\nworld\n")
    (root / "dir" / "g.txt").write_text("x" * 1000)
    (root / "link").symlink_to("../outside/secret.txt")


def _outside_digest(outside: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(outside.rglob("*")):
        h.update(str(p).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def child() -> None:
    job = json.loads(sys.stdin.read())
    work = Path(job["work"])
    root, outside = work / "root", work / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret.txt").write_text("secret")
    before = _outside_digest(outside)
    _fresh_root(root)
    aot = _harnesses("aot", root, job["with_bash"])
    interp = _harnesses("interp", root, job["with_bash"]) if job["interp"] else None
    for index in range(job["count"]):
        key, blob, on_interp = case(job["seed"], index)
        harness_name, tool = key.split("/")
        if tool == "bash" and not job["with_bash"]:
            continue
        print(json.dumps({"start": index}), flush=True)
        if tool in ("write", "edit", "bash"):
            _fresh_root(root)
        got = _outcome(aot[harness_name], tool, blob)
        msg = {"done": index, "tool": key, "how": got}
        if interp is not None and on_interp and len(blob) < 5000 and tool not in ("write", "edit", "bash"):
            expected = _outcome(interp[harness_name], tool, blob)
            if expected != got:
                msg["differs"] = expected
        if _outside_digest(outside) != before:
            msg["outside_changed"] = True
        print(json.dumps(msg), flush=True)


CHILD = "import sys; sys.path.insert(0, 'tools'); import fuzz_args; fuzz_args.child()"


def main() -> int:
    p = campaign_args(__doc__.split("\n\n")[0])
    p.add_argument("--per-child", type=int, default=150, help="cases per child process (default %(default)s)")
    p.add_argument("--with-bash", action="store_true", help="grant exec and fuzz the os harness's bash tool")
    p.add_argument("--no-interp", action="store_true", help="skip the interpreter comparison")
    args = p.parse_args()
    campaign = Campaign("fuzz_args", args)
    outcomes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="berm-fuzz-args-") as work:
        for s in campaign.seeds():
            job = {"seed": s, "count": args.per_child, "work": work, "with_bash": args.with_bash,
                   "interp": not args.no_interp}
            for msg in campaign.child_round(s, CHILD, job, timeout=120 + args.per_child * 2):
                how = msg["how"]
                kind = how.split(" ")[0]
                outcomes[f"{msg['tool']} {kind}"] = outcomes.get(f"{msg['tool']} {kind}", 0) + 1
                if kind in ("TRAP", "RAW") or "differs" in msg or msg.get("outside_changed"):
                    campaign.finding(s, f"case {msg['done']} {msg['tool']}: {how}"
                                     + (f" | interp: {msg['differs']}" if "differs" in msg else "")
                                     + (" | FILES OUTSIDE THE ROOT CHANGED" if msg.get("outside_changed") else ""))
    return campaign.summary(outcomes)


if __name__ == "__main__":
    raise SystemExit(main())
