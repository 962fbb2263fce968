"""``berm-compile ELF... [--memory SIZE] [--jobs N] [--cache-dir D]``: translate and compile images into the code
cache ahead of time (what a package manager runs at install), so a daemon only loads them. Prints, per image, its
digest, the ELF size, the object size and the time taken ("cached" when it was already there).

Translated code is specialised to the guest memory size it runs with (its bounds checks compare against constants):
compile with the ``memory`` a harness's declaration gives it, 64M when it gives none."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from berm_abi.errors import BermError
from berm_aot.cache import CodeCache
from berm_aot.elf import read_elf
from berm_aot.program import Program
from berm_host.aot.objects import cached_object
from berm_host.declaration import DeclarationError, parse_memory
from berm_host.layout import DEFAULT_MEMORY, layout_for


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berm-compile", description=__doc__.split("\n\n")[0])
    p.add_argument("elf", nargs="+", type=Path, help="harness images to compile")
    p.add_argument("--memory", metavar="SIZE", default=str(DEFAULT_MEMORY),
                   help="the guest memory the images will run with: 65536, 64K, 64M, 1G (default 64M)")
    p.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1),
                   help="C compilers to run at once (default: up to 2)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="code cache directory (default: $BERM_CACHE_DIR or the user cache directory)")
    return p


def compile_one(path: Path, cache: CodeCache, jobs: int, memory: int) -> str:
    """Compile ``path`` for ``memory`` bytes of guest memory into ``cache``; the report line."""
    start = time.perf_counter()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BermError(f"cannot read {path}: {exc.strerror or exc}") from None
    image = read_elf(data)
    windows = layout_for(image, memory).windows()
    so, built = cached_object(image, windows, cache, lambda: Program.from_image(image), jobs=jobs)
    took = time.perf_counter() - start
    status = f"compiled in {took:.2f} s" if built else "cached"
    return (f"{image.sha256[:16]}  {path.name}: elf {len(data):,} B, object {so.stat().st_size:,} B, "
            f"{status}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        print("berm-compile: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        memory = parse_memory(args.memory, "--memory")
    except DeclarationError as exc:
        print(f"berm-compile: {exc}", file=sys.stderr)
        return 2
    cache = CodeCache(args.cache_dir)
    tty = sys.stdout.isatty()
    status = 0
    for i, path in enumerate(args.elf, 1):
        if tty:
            print(f"[{i}/{len(args.elf)}] compiling {path.name}…", end="\r", flush=True)
        try:
            line = compile_one(path, cache, args.jobs, memory)
        except BermError as exc:
            line, status = f"{path.name}: {exc}", 2
            print(("\x1b[2K" if tty else "") + line, file=sys.stderr)
            continue
        print(("\x1b[2K" if tty else "") + line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
