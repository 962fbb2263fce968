"""``berm.exec.run``: ``bash -c COMMAND`` in a directory inside the root.

The working directory is resolved like any capability path and entered through its descriptor
(``/proc/self/fd/N`` as ``cwd``), so a swap after resolving cannot move the command outside. stdin is
``/dev/null``; the command leads a new process group (session), and the whole group is killed when the command
exits — a background child cannot hold the pipes open and hang the call — or when the timeout passes. Each
output stream keeps its first ``OUTPUT_CAP`` bytes; the rest is read and counted, and a marker line says so.
The environment is built, never inherited: PATH, HOME and LANG from the host, then the declaration's pairs,
then the call's.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
from collections.abc import Mapping

from berm_host.linker import CapabilityError, CapabilityFn

from ._request import Deadline, capability, fields, text
from .paths import Root

EXEC_TIMEOUT = 30.0
OUTPUT_CAP = 1024 * 1024
#: After the command exits (its group killed), how long to wait for pipes held by a child that left the group.
DRAIN_GRACE = 0.5
_BASE_KEYS = ("PATH", "HOME", "LANG")


def base_environment() -> dict[str, str]:
    """The minimal environment every command starts from; none of the host's other variables."""
    env = {"PATH": os.defpath, "HOME": "/", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _BASE_KEYS if os.environ.get(k)})
    return env


def _check_env(key: str, value: str) -> None:
    if not key or "=" in key or "\0" in key or "\0" in value:
        raise CapabilityError(f"bad environment variable {key[:40]!r}")


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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(root: Root, command: str, cwd: str, env: Mapping[str, str], *, timeout: float = EXEC_TIMEOUT,
                cap: int = OUTPUT_CAP) -> dict:
    """Run ``command``; returns ``{"exit_code", "stdout", "stderr"}`` (exit_code -1 when killed by a signal,
    including the timeout, which also adds a line to stderr)."""
    if "\0" in command:
        raise CapabilityError("command contains a NUL byte")
    for key, value in env.items():
        _check_env(key, value)
    deadline = Deadline.within_invocation(timeout)
    with root.open_dir(cwd or ".") as r:
        proc = subprocess.Popen(["bash", "-c", command], cwd=f"/proc/self/fd/{r.dir_fd}", env=dict(env),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    streams = {proc.stdout: _Stream(cap), proc.stderr: _Stream(cap)}
    timed_out = False
    ended_at: float | None = None  # deadline.remaining() when the command ended or was killed
    pidfd = os.pidfd_open(proc.pid)  # readable once the command exits; it stays unreaped until proc.wait()
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
                    _kill_group(proc)
                    sel.unregister(pidfd)
                    ended_at = left
                wait = left if ended_at is None else DRAIN_GRACE - (ended_at - left)
                if wait <= 0:
                    break
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        # Kill what it left behind before reaping it, so the group id cannot be reused.
                        _kill_group(proc)
                        sel.unregister(pidfd)
                        ended_at = deadline.remaining()
                    elif chunk := os.read(key.fd, 65536):
                        streams[key.fileobj].feed(chunk)
                    else:
                        sel.unregister(key.fileobj)
    finally:
        _kill_group(proc)
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
