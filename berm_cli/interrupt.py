"""Signals that end a command. Translated code runs with the GIL released, and CPython acts on a signal only
between bytecodes of the main thread: a guest run on the main thread ignored Ctrl-C until its deadline (60 s by
default, or ``--timeout``). So the CLI runs the guest on a thread of its own and waits for it; Ctrl-C (or SIGTERM,
SIGHUP) then ends the process at once (exit status 128 + the signal), without unwinding: the guest's thread may
still be running in guest memory the interpreter's shutdown would unmap. Elsewhere SIGTERM and SIGHUP raise
``Signalled`` (``signals_raise``), as SIGINT raises KeyboardInterrupt, so that what a command was doing is undone
on the way out: a build's or a compile's temporary directory removed, its compilers killed."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


def default_sigchld() -> None:
    """SIGCHLD back to its default action when the command's parent left it ignored (kept across exec): every child
    would be reaped unseen, an exec command's exit status read as 0 and a compiler's failure as a success (found by
    a review). A command owns its process; an embedder's host is refused instead (berm_aot.cc.SIGCHLD_IGNORED)."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:  # not berm_aot.cc's test: that import costs every
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)         # command ~14 ms at its start


class Signalled(BaseException):
    """A signal that ends the command, raised where it stands (as Python raises KeyboardInterrupt for SIGINT) so
    that the ``finally`` blocks on the way out remove temporary directories and kill compilers."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


#: The signals whose handler raised Signalled since signals_raise was taken. CPython can drop an exception a signal
#: handler raises: inside compile() of a module imported without its .pyc, SIGTERM was lost, and with the handler
#: reset the guest ran on to its deadline (found by a review). raise_pending raises it again where it is safe to.
_received: list[int] = []


def _raise(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    _received.append(signum)
    raise Signalled(signum)


def raise_pending() -> None:
    """Raise Signalled for a signal whose exception was lost (``_received``)."""
    if _received:
        raise Signalled(_received[0])


@contextmanager
def signals_raise(*signums: signal.Signals) -> Iterator[None]:
    """``signums`` raise Signalled while this is held; those set otherwise (ignored under nohup) are left alone, as
    all are off the main thread (where Python runs no handler, and sets none)."""
    main = threading.current_thread() is threading.main_thread()
    taken = [signum for signum in signums if main and signal.getsignal(signum) == signal.SIG_DFL]
    if taken:
        _received.clear()
    for signum in taken:
        signal.signal(signum, _raise)
    try:
        yield
    finally:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)


def interruptible(run: Callable[[], T]) -> T:
    """``run()`` on a guest thread: its result, or what it raised; on Ctrl-C, SIGTERM or SIGHUP, the end of the
    process."""
    outcome: list = []

    def guest() -> None:
        try:
            outcome.append((True, run()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the main thread
            outcome.append((False, exc))

    thread = threading.Thread(target=guest, name="berm-guest", daemon=True)
    try:
        raise_pending()
        thread.start()  # inside: a signal in its lock wait left the guest running as the command unwound (a review)
        thread.join()  # a lock wait: a signal interrupts it
    except (KeyboardInterrupt, Signalled) as exc:
        signum = exc.signum if isinstance(exc, Signalled) else signal.SIGINT
        try:
            print(f"berm: {said(signum)}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe, a second Ctrl-C: the process ends all the same
            pass
        os._exit(128 + signum)
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def said(signum: int) -> str:
    """How a command says the signal ``signum`` ended it."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
