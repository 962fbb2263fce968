"""``berm.exec.run``: ``bash -c COMMAND`` in a directory inside the root.

The working directory is resolved like any capability path and entered through its descriptor
(``/proc/self/fd/N`` as ``cwd``), so a swap after resolving cannot move the command outside. stdin is
``/dev/null``. The command runs under a supervisor, the program ``berm-supervise`` (supervise.c): when the
command exits, it kills everything the command started — its process group, and every descendant that left the
group (``setsid``, a double fork) — before exiting itself, so nothing a call started outlives the call, and a
background child cannot hold the pipes open and hang it. On the timeout the host asks the supervisor to do the
same at once; if the command keeps it from doing so (stops it again and again), the host kills the supervisor's
descendants itself, then the supervisor. The call ends within the invocation's deadline whatever the command does
(see ``run_command``). Each output stream keeps its first ``OUTPUT_CAP`` bytes; the rest is read and counted, and
a marker line says so. The environment is built, never inherited: PATH, HOME and LANG from the host, then the
declaration's pairs, then the call's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from berm_aot.cc import SIGCHLD_IGNORED, children_unseen
from berm_host.linker import CapabilityError, CapabilityFn

from ._request import Deadline, capability, fields, text
from .paths import Root

EXEC_TIMEOUT = 30.0
OUTPUT_CAP = 1024 * 1024
#: After the supervisor exits, how long to wait for pipes still held open: only a process that escaped it (by
#: killing it) or was handed a descriptor can hold them.
DRAIN_GRACE = 0.5
#: How long the supervisor may take to kill what a timed-out command started before the host does it itself.
STOP_GRACE = 5.0
#: Inside an invocation that leaves less than the timeout plus both graces, the share of the time left that is kept
#: back from the command for stopping it and draining its pipes (the graces shrink to fit it, in their ratio).
STOP_SHARE = 0.1
#: While it waits for a stopping supervisor, the host resumes it (SIGCONT) this often: its command may stop it again.
CONT_INTERVAL = 0.01
#: How long the host waits past the call's end for a supervisor it SIGKILLed to be reaped (the kernel takes
#: milliseconds), before it leaves it to subprocess to reap later.
REAP_GRACE = 0.05
_BASE_KEYS = ("PATH", "HOME", "LANG")
#: What execve takes on Linux: one ``NAME=value`` string of at most 128 KiB (MAX_ARG_STRLEN), and about 2 MiB of
#: arguments and environment together. Checked before anything reads the environment: a PATH of millions of entries
#: kept the lookup of bash busy for 100 s and 1.2 GB, past every time limit, before the command could start (found
#: by a hostile review).
MAX_ENV_STRING = 128 * 1024
MAX_ENV_TOTAL = 1024 * 1024
#: Built by setup.py from supervise.c.
SUPERVISOR = Path(__file__).with_name("berm-supervise")
#: What a missing SUPERVISOR means, for whoever finds it missing (exec here; the compiler runs under it too).
SUPERVISOR_MISSING = (f"{SUPERVISOR} is missing: Berm's install is incomplete (reinstall it; in a source tree, run "
                      "./setup.sh)")


def base_environment() -> dict[str, str]:
    """The minimal environment every command starts from; none of the host's other variables."""
    env = {"PATH": os.defpath, "HOME": "/", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _BASE_KEYS if os.environ.get(k)})
    return env


def _check_env(key: str, value: str) -> int:
    """The bytes ``key=value`` takes in a command's environment (its NUL included), or a CapabilityError."""
    if not key or "=" in key or "\0" in key or "\0" in value:
        raise CapabilityError(f"bad environment variable {key[:40]!r}")
    size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2  # the host's own (HOME) may hold bytes not UTF-8
    if size > MAX_ENV_STRING:
        raise CapabilityError(f"environment variable {key[:40]!r} is longer than {MAX_ENV_STRING} bytes")
    return size


def check_environment(env: Mapping[str, str]) -> None:
    """A CapabilityError unless ``env`` fits every command's environment: each variable, and all together."""
    if sum(_check_env(key, value) for key, value in env.items()) > MAX_ENV_TOTAL:
        raise CapabilityError(f"the environment is larger than {MAX_ENV_TOTAL} bytes")


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


def _start(command: str, dir_fd: int, env: Mapping[str, str]) -> subprocess.Popen:
    """``bash -c command`` started under the supervisor in the directory ``dir_fd`` names, stdin ``/dev/null``,
    stdout and stderr piped. An OSError if it could not start (bash not found, ``E2BIG``, ...). bash is found on
    the command's PATH from the command's directory (a relative entry found it from the host's, and the supervisor
    then looked for it from the command's: found by a review); ``--`` ends its options, so a command starting with
    ``-`` or ``+`` is one.

    The child enters the directory as ``/proc/self/fd/N`` with N a copy of ``dir_fd`` of at least 3: Popen's child
    puts /dev/null and the pipes on 0-2 before it changes directory, so in a host started with stdin (or stdout,
    stderr) closed, where ``dir_fd`` could be one of them, the command ran in a pipe's place and failed with "Not a
    directory" (found by a review)."""
    fd = fcntl.fcntl(dir_fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        cwd = f"/proc/self/fd/{fd}"
        bash = _bash(env.get("PATH", os.defpath), cwd)
        if bash is None:
            raise FileNotFoundError(errno.ENOENT, "bash is not on the command's PATH")
        if not os.access(SUPERVISOR, os.X_OK):
            raise CapabilityError(SUPERVISOR_MISSING)
        if children_unseen():
            raise CapabilityError(SIGCHLD_IGNORED)
        return subprocess.Popen([SUPERVISOR, bash, "bash", "-c", "--", command], cwd=cwd, env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    finally:
        os.close(fd)


def _bash(path: str, cwd: str) -> str | None:
    """bash as the command's ``path`` finds it from ``cwd``: relative to ``cwd`` (where the supervisor runs it) for
    a relative entry, absolute for an absolute one."""
    for entry in path.split(os.pathsep):
        if shutil.which("bash", path=os.path.join(cwd, entry)):
            return os.path.join(entry or ".", "bash")
    return None


def _parent_and_state(pid: int) -> tuple[int, str]:
    """The parent and state letter of process ``pid`` from its stat line; (0, "") if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return 0, ""
    fields = line[line.rfind(b")") + 2:].split(b" ", 2)  # the name may hold ')' and spaces; state and ppid follow
    return (int(fields[1]), fields[0].decode()) if len(fields) > 2 else (0, "")


def _kill_children(parent: int) -> int:
    """SIGKILL every live (not yet a zombie) child of ``parent``; how many there were. Each is signalled through a
    pidfd opened before its parent is checked again, so a pid reused meanwhile is never signalled."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or _parent_and_state(int(name))[0] != parent:
            continue
        try:
            fd = os.pidfd_open(int(name))
        except OSError:
            continue
        try:
            ppid, state = _parent_and_state(int(name))
            if ppid == parent and state not in ("Z", "X"):
                count += 1
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)
    return count


#: exited(seconds) -> whether the supervisor has exited, waiting at most that long (0: a look).
Exited = Callable[[float], bool]


def _pidfd_exited(pidfd: int) -> Exited:
    """Exited, watched through the supervisor's pidfd (it stays unreaped). poll, not select: select refuses a
    descriptor numbered past 1023, which a busy host hands out, and a timed-out command's stop then failed
    half way, leaking its pipes and pidfd (found by a review)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return lambda seconds: bool(poller.poll(math.ceil(max(0.0, seconds) * 1000)))


def _reaped(proc: subprocess.Popen) -> Exited:
    """Exited, watched by waiting for (and so reaping) the supervisor: for when its pidfd could not be opened."""
    def exited(seconds: float) -> bool:
        try:
            proc.wait(max(0.0, seconds))
            return True
        except subprocess.TimeoutExpired:
            return False
    return exited


def _resume_until(pid: int, exited: Exited, until: float) -> bool:
    """Wait until the supervisor has exited or ``until`` (a ``time.monotonic()`` instant), resuming it every
    ``CONT_INTERVAL``; whether it exited."""
    while True:
        os.kill(pid, signal.SIGCONT)  # it is not reaped yet, so the pid is still its own
        wait = min(CONT_INTERVAL, until - time.monotonic())
        if exited(wait):
            return True
        if wait <= 0:
            return False


def _stop(proc: subprocess.Popen, exited: Exited, until: float) -> None:
    """Ask the supervisor to kill everything and exit, resuming it all along (a command can stop it: ``kill -STOP
    $PPID``, in a loop). If it has not exited half way to ``until`` (a ``time.monotonic()`` instant), the host
    kills its descendants itself, as the supervisor does: every child it has, until none is left (it is a child
    subreaper, so every orphan of the command's is its child: detached ones included), and then, once nothing can
    stop it any more, it exits; the supervisor is SIGKILLed at ``until`` if not."""
    now = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    if _resume_until(proc.pid, exited, now + (until - now) / 2):
        return
    while _kill_children(proc.pid):
        if exited(0.001):  # reaped, when its pidfd could not be opened (_reaped): its pid is no longer its own
            return
        if time.monotonic() >= until:
            break
    if not _resume_until(proc.pid, exited, until):
        os.kill(proc.pid, signal.SIGKILL)


def run_command(root: Root, command: str, cwd: str, env: Mapping[str, str], *, timeout: float = EXEC_TIMEOUT,
                cap: int = OUTPUT_CAP) -> dict:
    """Run ``command``; returns ``{"exit_code", "stdout", "stderr"}`` (exit_code -1 when killed by a signal,
    including the timeout, which also adds a line to stderr).

    The call returns by ``call``: ``timeout`` plus ``STOP_GRACE`` and ``DRAIN_GRACE``, or the invocation's time left
    less the guest's share (``Deadline.within_invocation``), whichever is sooner. The command's own timeout keeps
    back from ``call`` the time to stop it and drain its pipes: both graces, or ``STOP_SHARE`` of ``call`` when that
    is less, the graces shrunk in their ratio to fit. Past ``call`` there may run only one scan of ``/proc`` by the
    host's own kill and the reaping of a supervisor it SIGKILLed (the kernel's, milliseconds; ``REAP_GRACE`` at
    most)."""
    if "\0" in command:
        raise CapabilityError("command contains a NUL byte")
    check_environment(env)
    graces = STOP_GRACE + DRAIN_GRACE
    call = Deadline.within_invocation(timeout + graces)
    deadline = Deadline(min(timeout, call.seconds - min(graces, call.seconds * STOP_SHARE)))
    with root.open_dir(cwd or ".") as r:
        proc = _start(command, r.dir_fd, env)
    streams = {proc.stdout: _Stream(cap), proc.stderr: _Stream(cap)}
    timed_out = False
    drain_end: float | None = None  # the time.monotonic() instant the drain ends, once the supervisor has exited
    pidfd: int | None = None
    exited = _reaped(proc)

    def stop() -> float:
        """Stop the supervisor within the stop grace's share of what the call has left; the drain's end."""
        left = max(0.0, call.remaining())
        _stop(proc, exited, time.monotonic() + min(STOP_GRACE, left * STOP_GRACE / graces))
        return time.monotonic() + min(DRAIN_GRACE, call.remaining())

    try:
        # readable once the supervisor exits; it stays unreaped until proc.wait(). Opened inside the try: when it
        # failed (EMFILE), the command ran on unwatched while the guest was told the call failed (found by a review)
        pidfd = os.pidfd_open(proc.pid)
        exited = _pidfd_exited(pidfd)
        with selectors.DefaultSelector() as sel:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
            for pipe in streams:
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_READ, "pipe")
            # until the command ends, whatever its pipes do (``exec >log 2>&1`` closes both at once), then until
            # they are drained or the grace is over
            while drain_end is None or sel.get_map():
                wait = deadline.remaining() if drain_end is None else drain_end - time.monotonic()
                if drain_end is None and wait <= 0:
                    timed_out = True
                    sel.unregister(pidfd)
                    drain_end = stop()
                    continue  # pipes the command had already closed: no drain to wait for (found by a review)
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        sel.unregister(pidfd)
                        drain_end = time.monotonic() + min(DRAIN_GRACE, call.remaining())
                    elif chunk := os.read(key.fd, 65536):
                        streams[key.fileobj].feed(chunk)
                    else:
                        sel.unregister(key.fileobj)
    finally:
        try:
            if drain_end is None:
                stop()
        finally:  # whatever the stop met, nothing of the call's is left open
            if pidfd is not None:
                os.close(pidfd)
            for pipe in streams:
                pipe.close()
            try:
                proc.wait(max(REAP_GRACE, call.remaining()))
            except subprocess.TimeoutExpired:  # SIGKILLed and not dead yet: reaped by subprocess later
                pass
    stderr = streams[proc.stderr].render()
    if timed_out:
        stderr += ("\n" if stderr else "") + f"[killed: the command ran past its {deadline.seconds:.3g} s timeout]"
    code = proc.returncode
    return {"exit_code": -1 if timed_out or code is None or code < 0 else code, "stderr": stderr,
            "stdout": streams[proc.stdout].render()}


def capabilities(root: Root, *, env: Mapping[str, str] | None = None,
                 timeout: float = EXEC_TIMEOUT) -> dict[str, CapabilityFn]:
    """``berm.exec.run`` over ``root``; ``env`` is the declaration's environment, on top of the base."""
    declared = dict(env or {})
    check_environment(declared)

    @capability("berm.exec.run")
    def exec_run(request: bytes) -> bytes:
        (command, cwd), pairs = fields(request, ("command", "cwd"), pairs=True)
        call_env = base_environment() | declared
        call_env.update((text(k, "environment name"), text(v, "environment value")) for k, v in pairs)
        result = run_command(root, text(command, "command"), text(cwd, "cwd"), call_env, timeout=timeout)
        return json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    return {"berm.exec.run": exec_run}
