"""Python code run in a child process, for what may crash or end the process that runs it (a segfault on a small
thread stack, os._exit, a signal), or needs a process state of its own (an ignored SIGCHLD)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

#: The repository's root: the child imports the working tree's packages from there.
REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, *, timeout: float = 60, **popen) -> subprocess.CompletedProcess:
    """``python -c code`` from the repository's root, its output captured as text."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          **popen)


def on_a_small_stack(setup: str, body: str) -> str:
    """Code that runs ``setup``, then ``body`` (statements) in a thread with a 64 KiB stack (threading.stack_size
    allows 32 KiB), and waits for it."""
    return (f"import threading\n{setup}\nthreading.stack_size(64 * 1024)\ndef run():\n{textwrap.indent(body, '    ')}\n"
            "t = threading.Thread(target=run)\nt.start()\nt.join()\n")
