"""Ctrl-C while a guest runs. Translated code runs with the GIL released, and CPython acts on a signal only
between bytecodes of the main thread: a guest run on the main thread ignored Ctrl-C until its deadline (60 s by
default, or ``--timeout``). So the CLI runs the guest on a thread of its own and waits for it; Ctrl-C then ends
the process at once (exit status 130), without unwinding: the guest's thread may still be running in guest
memory the interpreter's shutdown would unmap."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


def default_sigchld() -> None:
    """SIGCHLD back to its default action when the command's parent left it ignored (kept across exec): every child
    would be reaped unseen, an exec command's exit status read as 0 and a compiler's failure as a success (found by
    a review). A command owns its process; an embedder's host is refused instead (berm_aot.cc.SIGCHLD_IGNORED)."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:  # not berm_aot.cc's test: that import costs every
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)         # command ~14 ms at its start


def interruptible(run: Callable[[], T]) -> T:
    """``run()`` on a guest thread: its result, or what it raised; on Ctrl-C, the end of the process."""
    outcome: list = []

    def guest() -> None:
        try:
            outcome.append((True, run()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the main thread
            outcome.append((False, exc))

    thread = threading.Thread(target=guest, name="berm-guest", daemon=True)
    thread.start()
    try:
        thread.join()  # a lock wait: a signal interrupts it
    except KeyboardInterrupt:
        try:
            print("berm: interrupted", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe, a second Ctrl-C: the process ends all the same
            pass
        os._exit(INTERRUPTED)
    ok, value = outcome[0]
    if ok:
        return value
    raise value
