"""Text a guest chose (symbol and section names, manifest text, log lines, failure and trap messages) made safe to
print (berm_abi.text: control characters other than newline and tab become escapes). A tool's result is printed
as it is into a file or a pipe (it is the tool's output, as ``cat`` prints a file), and escaped like the rest to a
terminal, which obeys what a harness could put in it (OSC 52 sets the clipboard, others the window title)."""

from __future__ import annotations

import errno
import io
import os
import sys
from collections.abc import Callable

from berm_abi.text import escaped

#: The exit status of a command whose reader went away (a shell's 128 + SIGPIPE).
BROKEN_PIPE = 141


def shown(text: str) -> str:
    return escaped(text)


def failure_text(text: str) -> str:
    """A tool's ``berm.fail`` text for stderr: its first line as it is, the next ones indented (a newline in it
    printed a line passing for the command's own, "berm call: to grant …": found by a review); an empty one says
    so (a bare empty line was printed)."""
    if not text:
        return "(the tool failed with no message)"
    first, *rest = shown(text).split("\n")
    return "\n".join([first, *(f"  {line}" for line in rest)])


def print_result(result: str) -> None:
    """A tool's result on stdout: as it is, or escaped when stdout is a terminal."""
    print(shown(result) if sys.stdout.isatty() else result)


def reader_may_leave(command: str, main: Callable[[], int]) -> int:
    """``main()``, ending quietly with BROKEN_PIPE when its output's reader has gone (``berm inspect … | head``
    printed a BrokenPipeError traceback), and with a line and status 1 when its output cannot be written (a full
    disk, /dev/full: a traceback too). stdout is then pointed at /dev/null so the interpreter's own flush at exit
    does not raise again (Python's documentation, "Note on SIGPIPE")."""
    _stand_in_for_closed_streams()
    try:
        status = main()
        sys.stdout.flush()  # what is still buffered fails here, not at exit
        return status
    except BrokenPipeError:
        silence_stdout()
        return BROKEN_PIPE
    except OSError as exc:
        if exc.filename is not None or exc.errno not in _OUTPUT_ERRORS:
            raise
        silence_stdout()
        print(f"{command}: cannot write its output: {exc.strerror or exc}", file=sys.stderr)
        return 1


#: What a write to a stream (no file name) fails with when its file or device takes no more, or is closed.
_OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF)


class _ClosedOutput(io.TextIOBase):
    """Standard output for a command started with it closed (Python leaves sys.stdout None, and the first print or
    isatty raised AttributeError: found by a review): writing to it is an OSError, which ``reader_may_leave``
    reports as output it cannot write; a command that writes nothing there (berm serve) runs as it would."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _stand_in_for_closed_streams() -> None:
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    if sys.stderr is None:  # nothing could say anything there: what is said goes nowhere
        sys.stderr = open(os.devnull, "w")


def silence_stdout() -> None:
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # no descriptor (_ClosedOutput): nothing is buffered for the exit to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def compile_notice(command: str) -> Callable[[str], None] | None:
    """What ``command`` says on stderr before a load compiles an image (the first load of a large one takes
    minutes, which looked like a hang), when stderr is a terminal; None (silence) otherwise."""
    if not sys.stderr.isatty():
        return None
    return lambda what: print(f"{command}: {what}…", file=sys.stderr, flush=True)
