"""``berm-compile [ELF...] [--declarations FILE] [--memory SIZE] [--jobs N] [--cache-dir D]``: DESCRIPTION.

Translated code is specialised to the guest memory size it runs with (its bounds checks compare against constants):
compile with the ``memory`` a harness's declaration gives it, 64M when it gives none. ``--declarations`` does that
by itself: it compiles every harness an agent's TOML declares, from the harnesses directory, each for the memory
the daemon gives it (its declared ``memory``, else 64M; ``--memory`` is for the ELFs named), and refuses an image
whose digest is not the pinned one."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from berm_abi.errors import BermError
from berm_aot.cache import CodeCache
from berm_aot.elf import file_limit, read_elf, read_file
from berm_aot.errors import about_file
from berm_aot.program import Program
from berm_cli import arguments
from berm_cli.interrupt import Signalled, default_sigchld, raise_pending, said, signals_raise
from berm_cli.terminal import reader_may_leave, shown, silence_stdout
from berm_host.aot.objects import cached_object
from berm_host.declaration import DeclarationError, load_declarations, parse_memory
from berm_host.layout import DEFAULT_MEMORY, layout_for

#: What ``berm-compile --help`` says it does (plain text: argparse shows it as it is).
DESCRIPTION = ("Translate and compile images into the code cache ahead of time (what a package manager runs at "
               "install), so a daemon only loads them. Prints, per image, its digest, the ELF size, the object size "
               "and the time taken (\"cached\" when it was already there).")
#: What its status means (README, "Commands").
EXIT_STATUS = ("exit status: 0 every image is in the cache; 1 the output could not be written; 2 a usage error, or "
               "an image that could not be compiled (the others still are); 128 + the signal's number when stopped by "
               "one (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); 141 the output's reader went away")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="berm-compile", description=DESCRIPTION, epilog=EXIT_STATUS)
    p.add_argument("elf", nargs="*", type=arguments.path, help="harness images to compile")
    p.add_argument("--declarations", metavar="FILE", type=arguments.path, default=None,
                   help="also compile every harness this TOML declares ([[harnesses]]), each for its memory")
    p.add_argument("--harnesses-dir", metavar="DIR", type=arguments.path, default=None,
                   help="where declared images live (default: $BERM_HARNESSES_DIR or the user config directory)")
    p.add_argument("--memory", metavar="SIZE", default=str(DEFAULT_MEMORY),
                   help="the guest memory the images will run with: 65536, 64K, 64M, 1G (default 64M)")
    p.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1),
                   help="C compilers to run at once (default: up to 2)")
    p.add_argument("--cache-dir", type=arguments.path, default=None,
                   help="code cache directory (default: $BERM_CACHE_DIR or the user cache directory)")
    return p


@dataclass(frozen=True)
class Job:
    """One image to compile: what the report calls it, how to read its bytes, and the memory it will run with."""

    label: str
    read: Callable[[], bytes]
    memory: int


def jobs_for(elves: list[Path], declarations: Path | None, harnesses: str | None, memory: int) -> list[Job]:
    """The images named on the command line (for ``memory``), then every declared harness for the memory the
    daemon runs it with: its declared ``memory``, else the default (berm_host/queue/harness.py), whatever
    ``--memory`` says; its pinned digest is checked when it is read."""
    # each named as given: two files of one name in two directories were told apart by nothing (found by a review)
    jobs = [Job(str(path), partial(read_file, path, file_limit(memory)), memory) for path in elves]
    if declarations is not None:
        jobs += [Job(decl.name, partial(decl.load_image, harnesses), decl.memory_size)
                 for decl in load_declarations(declarations)]
    return jobs


def compile_one(job: Job, cache: CodeCache, jobs: int) -> str:
    """Compile ``job``'s image for its memory into ``cache``; the report line. Every error names the image."""
    start = time.perf_counter()
    data = job.read()  # its errors name the file
    with about_file(job.label):
        image = read_elf(data)
        windows = layout_for(image, job.memory).windows()
        so, built = cached_object(image, windows, cache, lambda: Program.from_image(image), jobs=jobs)
    took = time.perf_counter() - start
    status = f"compiled in {took:.2f} s" if built else "cached"
    return (f"{image.sha256[:16]}  {job.label}: elf {len(data):,} B, memory {job.memory >> 10:,} KiB, "
            f"object {so.stat().st_size:,} B, {status}")


def main(argv: list[str] | None = None) -> int:
    """Ended by Ctrl-C, SIGTERM or SIGHUP, berm-compile says so in a line and exits with 128 + the signal, having
    undone what it was doing: SIGTERM and SIGHUP ended the process where it stood, leaving the compile's temporary
    directory in the cache, and Ctrl-C printed a traceback (found by a review)."""
    default_sigchld()
    try:
        with signals_raise(signal.SIGTERM, signal.SIGHUP):
            status = reader_may_leave("berm-compile", lambda: _main(argv))
            raise_pending()
            return status
    except (KeyboardInterrupt, Signalled) as exc:
        signum = exc.signum if isinstance(exc, Signalled) else signal.SIGINT
        try:
            _erase_progress(sys.stdout.isatty())
            print(f"berm-compile: {said(signum)}", file=sys.stderr)
        except OSError:  # a terminal closed (the SIGHUP's cause) takes no more: the status says it (found by a review)
            pass
        return 128 + signum


#: Erases the progress line (on stdout, when a terminal) before a line of its own: the erasing escape went to stderr,
#: where a redirected file got it and the terminal's progress line stayed (found by a review).
_ERASE_LINE = "\x1b[2K"


def _erase_progress(tty: bool) -> None:
    if tty:
        print(_ERASE_LINE, end="\r", flush=True)


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.elf and args.declarations is None:
        parser.error("name at least one ELF or --declarations")
    if args.harnesses_dir is not None and args.declarations is None:
        parser.error("--harnesses-dir only says where declared images live: it needs --declarations")
    if args.jobs < 1:
        print("berm-compile: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        todo = jobs_for(args.elf, args.declarations, args.harnesses_dir, parse_memory(args.memory, "--memory"))
    except DeclarationError as exc:
        print(f"berm-compile: {shown(str(exc))}", file=sys.stderr)
        return 2
    cache = CodeCache(args.cache_dir)
    tty = sys.stdout.isatty()
    status = 0
    lost: list[OSError] = []  # a failed write to stdout: every image is compiled all the same (found by a review:
    # the first report line that could not be written ended the run, the other images not compiled, and status 2 lost)

    def say(text: str, end: str = "\n") -> None:
        try:
            print(text, end=end, flush=True)
        except OSError as exc:
            lost.append(exc)
            silence_stdout()

    for i, job in enumerate(todo, 1):
        if tty:
            say(f"[{i}/{len(todo)}] compiling {shown(job.label)}…", end="\r")
        try:
            line = compile_one(job, cache, args.jobs)
        except BermError as exc:
            line, status = f"berm-compile: {exc}", 2
            if tty:
                say(_ERASE_LINE, end="\r")
            print(shown(line), file=sys.stderr)
            continue
        if tty:
            say(_ERASE_LINE, end="\r")
        say(shown(line))
    if lost and not status:
        raise lost[0]  # said as any command's output error (reader_may_leave): 141 for a reader gone, else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
