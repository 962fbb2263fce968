"""``berm.exec.run``: ``bash -c COMMAND`` in a directory inside the root.

The working directory is resolved like any capability path and entered through its descriptor
(``/proc/self/fd/N`` as ``cwd``), so a swap after resolving cannot move the command outside. stdin is
``/dev/null``. The command runs under a supervisor, the program ``berm-supervise`` (supervise.c): when the
command exits, it kills everything the command started — its process group, and every descendant that left the
group (``setsid``, a double fork) — before exiting itself, so nothing a call started outlives the call, and a
background child cannot hold the pipes open and hang it. On the timeout the host asks the supervisor to do the
same at once. Each output stream keeps its first ``OUTPUT_CAP`` bytes; the rest is read and counted, and a marker
line says so. The environment is built, never inherited: PATH, HOME and LANG from the host, then the
declaration's pairs, then the call's.
"""

from __future__ import annotations

import errno
import json
import os
import select
import selectors
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from berm_host.linker import CapabilityError, CapabilityFn

from ._request import Deadline, capability, fields, text
from .paths import Root

EXEC_TIMEOUT = 30.0
OUTPUT_CAP = 1024 * 1024
#: After the supervisor exits, how long to wait for pipes still held open: only a process that escaped it (by
#: killing it) or was handed a descriptor can hold them.
DRAIN_GRACE = 0.5
#: How long the supervisor may take to kill what a timed-out command started before it is itself SIGKILLed.
STOP_GRACE = 5.0
_BASE_KEYS = ("PATH", "HOME", "LANG")
#: What execve takes on Linux: one ``NAME=value`` string of at most 128 KiB (MAX_ARG_STRLEN), and about 2 MiB of
#: arguments and environment together. Checked before anything reads the environment: a PATH of millions of entries
#: kept the lookup of bash busy for 100 s and 1.2 GB, past every time limit, before the command could start (found
#: by a hostile review).
MAX_ENV_STRING = 128 * 1024
MAX_ENV_TOTAL = 1024 * 1024
#: Built by setup.py from supervise.c.
SUPERVISOR = Path(__file__).with_name("berm-supervise")


def base_environment() -> dict[str, str]:
    """The minimal environment every command starts from; none of the host's other variables."""
    env = {"PATH": os.defpath, "HOME": "/", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _BASE_KEYS if os.environ.get(k)})
    return env


def _check_env(key: str, value: str) -> int:
    """The bytes ``key=value`` takes in a command's environment (its NUL included), or a CapabilityError."""
    if not key or "=" in key or "\0" in key or "\0" in value:
        raise CapabilityError(f"bad environment variable {key[:40]!r}")
    size = len(key.encode()) + len(value.encode()) + 2
    if size > MAX_ENV_STRING:
        raise CapabilityError(f"environment variable {key[:40]!r} is longer than {MAX_ENV_STRING} bytes")
    return size


class _Stream:
    def __init__(self, cap: int):
        self.cap = cap
        self.kept = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]

    def render(self) -> str:
        out = self.kept.decode("utf-8", "replace")
        if self.total > len(self.kept):
            out += f"\n[truncated: {self.total} bytes in all, kept the first {len(self.kept)}]"
        return out


def _start(command: str, cwd: str, env: Mapping[str, str]) -> subprocess.Popen:
    """``bash -c command`` started under the supervisor in ``cwd``, stdin ``/dev/null``, stdout and stderr piped.
    An OSError if it could not start (bash not found, ``E2BIG``, ...)."""
    bash = shutil.which("bash", path=env.get("PATH", os.defpath))
    if bash is None:
        raise FileNotFoundError(errno.ENOENT, "bash is not on the command's PATH")
    if not os.access(SUPERVISOR, os.X_OK):
        raise CapabilityError(f"{SUPERVISOR} is missing: Berm's install is incomplete (run ./setup.sh)")
    return subprocess.Popen([SUPERVISOR, bash, "bash", "-c", command], cwd=cwd, env=dict(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _stop(proc: subprocess.Popen, pidfd: int) -> None:
    """Ask the supervisor to kill everything and exit; SIGKILL it if it has not within ``STOP_GRACE``. SIGCONT
    resumes a supervisor its command stopped (``kill -STOP $PPID``): else the SIGTERM waited for the grace, and the
    SIGKILL then left the command running after the call."""
    os.kill(proc.pid, signal.SIGTERM)  # it is not reaped yet, so the pid is still its own
    os.kill(proc.pid, signal.SIGCONT)
    if not select.select([pidfd], [], [], STOP_GRACE)[0]:
        os.kill(proc.pid, signal.SIGKILL)


def run_command(root: Root, command: str, cwd: str, env: Mapping[str, str], *, timeout: float = EXEC_TIMEOUT,
                cap: int = OUTPUT_CAP) -> dict:
    """Run ``command``; returns ``{"exit_code", "stdout", "stderr"}`` (exit_code -1 when killed by a signal,
    including the timeout, which also adds a line to stderr)."""
    if "\0" in command:
        raise CapabilityError("command contains a NUL byte")
    if sum(_check_env(key, value) for key, value in env.items()) > MAX_ENV_TOTAL:
        raise CapabilityError(f"the environment is larger than {MAX_ENV_TOTAL} bytes")
    deadline = Deadline.within_invocation(timeout)
    with root.open_dir(cwd or ".") as r:
        proc = _start(command, f"/proc/self/fd/{r.dir_fd}", env)
    streams = {proc.stdout: _Stream(cap), proc.stderr: _Stream(cap)}
    timed_out = False
    ended_at: float | None = None  # deadline.remaining() when the supervisor exited or was stopped
    pidfd = os.pidfd_open(proc.pid)  # readable once the supervisor exits; it stays unreaped until proc.wait()
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
            for pipe in streams:
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_READ, "pipe")
            # until the command ends, whatever its pipes do (``exec >log 2>&1`` closes both at once), then until
            # they are drained or the grace is over
            while ended_at is None or sel.get_map():
                left = deadline.remaining()
                if ended_at is None and left <= 0:
                    timed_out = True
                    _stop(proc, pidfd)
                    sel.unregister(pidfd)
                    ended_at = left
                wait = left if ended_at is None else DRAIN_GRACE - (ended_at - left)
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        sel.unregister(pidfd)
                        ended_at = deadline.remaining()
                    elif chunk := os.read(key.fd, 65536):
                        streams[key.fileobj].feed(chunk)
                    else:
                        sel.unregister(key.fileobj)
    finally:
        if ended_at is None:
            _stop(proc, pidfd)
        os.close(pidfd)
        for pipe in streams:
            pipe.close()
        proc.wait()
    stderr = streams[proc.stderr].render()
    if timed_out:
        stderr += ("\n" if stderr else "") + f"[killed: the command ran past its {deadline.seconds:.3g} s timeout]"
    code = proc.returncode
    return {"exit_code": -1 if timed_out or code < 0 else code, "stderr": stderr,
            "stdout": streams[proc.stdout].render()}


def capabilities(root: Root, *, env: Mapping[str, str] | None = None,
                 timeout: float = EXEC_TIMEOUT) -> dict[str, CapabilityFn]:
    """``berm.exec.run`` over ``root``; ``env`` is the declaration's environment, on top of the base."""
    declared = dict(env or {})
    for key, value in declared.items():
        _check_env(key, value)

    @capability("berm.exec.run")
    def exec_run(request: bytes) -> bytes:
        (command, cwd), pairs = fields(request, ("command", "cwd"), pairs=True)
        call_env = base_environment() | declared
        call_env.update((text(k, "environment name"), text(v, "environment value")) for k, v in pairs)
        result = run_command(root, text(command, "command"), text(cwd, "cwd"), call_env, timeout=timeout)
        return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    return {"berm.exec.run": exec_run}
