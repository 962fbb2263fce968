"""Benchmark the OS harness: image size, cold compile, cached load, and p50 of `read` (a 1000-line file), `edit`
and `bash` (the command `true`) through the translated code, next to the same operations done directly in Python.

    python tools/bench_os.py [--runs 200]

Prints a table. The cold compile uses a fresh code cache in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from berm_host.declaration import Declaration  # noqa: E402
from berm_host.engine import Engine  # noqa: E402
from berm_host.grants import linker_for  # noqa: E402
from berm_sdk.bundled import bundled_image  # noqa: E402


def p50(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def python_read(path: Path, offset: int = 1, limit: int = 2000) -> str:
    lines = path.read_text().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    shown = lines[offset - 1:offset - 1 + limit]
    body = "".join(f"{offset + i}\t{line.removesuffix(chr(13))}\n" for i, line in enumerate(shown))
    return body + f"\n--- {len(lines)} total lines ---"


def python_edit(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    if text.count(old) != 1:
        raise ValueError("not unique")
    path.write_text(text.replace(old, new))
    return "ok"


def python_bash(root: Path) -> None:
    subprocess.run(["bash", "-c", "true"], cwd=root, capture_output=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs

    elf = bundled_image("os")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "code"
        t = time.perf_counter()
        Engine(cache_dir=cache).load(elf)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        image = Engine(cache_dir=cache).load(elf)
        load = time.perf_counter() - t

        root = Path(tmp) / "root"
        root.mkdir()
        data = root / "data.txt"
        data.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1000)))
        grant = Declaration(name="os", capabilities=("fs", "exec"), root=str(root))
        harness = image.harness(linker_for(grant), name="os")

        def call(tool: str, args: dict) -> str:
            return harness.call(tool, json.dumps(args))

        assert call("read", {"path": "data.txt"}) == python_read(data)
        data.write_text(data.read_text().replace("line 500: the", "line 500: A"))
        marker = ["A"]  # each edit swaps the marker, so old_string is always present exactly once

        def swap() -> tuple[str, str]:
            old, new = marker[0], "B" if marker[0] == "A" else "A"
            marker[0] = new
            return f"line 500: {old}", f"line 500: {new}"

        def guest_edit():
            old, new = swap()
            assert call("edit", {"path": "data.txt", "old_string": old, "new_string": new}) == "ok"

        def python_edit_once():
            python_edit(data, *swap())

        rows = [
            ("image size", f"{elf.stat().st_size / 1024:.1f} KiB", ""),
            ("cold compile (translate + cc)", f"{cold:.2f} s", ""),
            ("cached load (read ELF, program, dlopen)", f"{load * 1000:.1f} ms", ""),
            ("read, 1000-line file, p50", f"{p50(lambda: call('read', {'path': 'data.txt'}), runs) * 1e6:.0f} µs",
             f"{p50(lambda: python_read(data), runs) * 1e6:.0f} µs"),
            ("edit, 1000-line file, p50", f"{p50(guest_edit, runs) * 1e6:.0f} µs",
             f"{p50(python_edit_once, runs) * 1e6:.0f} µs"),
            # the harness's command runs under berm-supervise (berm_host/capabilities/exec.py); Python's does not
            ("bash `true`, p50", f"{p50(lambda: call('bash', {'command': 'true'}), runs) * 1e6:.0f} µs",
             f"{p50(lambda: python_bash(root), runs) * 1e6:.0f} µs"),
        ]
    print(f"{'figure':<42} {'berm (aot)':>14} {'python':>10}")
    for name, ours, theirs in rows:
        print(f"{name:<42} {ours:>14} {theirs:>10}")


if __name__ == "__main__":
    main()
