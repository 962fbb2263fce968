"""Host-call names and the numbers derived from them (ABI.md §1).

Names are permanent, numbers derived: every number is FNV-1a 64 over the UTF-8 name. This module is the single
definition; the guest SDK header is generated from it and the host's linker is keyed by it.
"""

from __future__ import annotations

from dataclasses import dataclass

ABI_VERSION = 0

#: Bit 63 of a capability's return value: the staged bytes are an error message, not a reply.
ERROR_BIT = 1 << 63
#: The most keys one ``berm.kv.list`` reply holds (berm_calls.h: BERM_KV_LIST_PAGE).
KV_LIST_PAGE = 10_000

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(name: str | bytes) -> int:
    """FNV-1a 64 of ``name`` (UTF-8 when a str). ``fnv1a64("foobar") == 0x85944171f73967e8``."""
    data = name.encode("utf-8") if isinstance(name, str) else name
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK64
    return h


@dataclass(frozen=True)
class HostCall:
    """One numbered host call: its permanent name, the C identifier the SDK uses, and what it does."""

    name: str
    c_name: str
    doc: str

    @property
    def number(self) -> int:
        return fnv1a64(self.name)


#: Always present in every image's linker; never granted, never in a declaration. Served by the engine itself.
CORE_CALLS: tuple[HostCall, ...] = (
    HostCall("berm.log", "LOG", "a0=ptr, a1=len -> 0: a host-side log line tagged with the harness"),
    HostCall("berm.args.len", "ARGS_LEN", "-> byte length of the invocation's argument blob"),
    HostCall("berm.args.read", "ARGS_READ", "a0=ptr, a1=cap -> copies min(len, cap) bytes, returns the full length"),
    HostCall("berm.fail", "FAIL", "a0=ptr, a1=len -> 0: records the failure text; the last call wins"),
    HostCall("berm.result.read", "RESULT_READ",
             "a0=ptr, a1=cap -> copies min(len, cap) bytes of the staged capability result, returns the full length"),
    HostCall("berm.heap.start", "HEAP_START", "-> guest address where the heap begins"),
    HostCall("berm.heap.size", "HEAP_SIZE", "-> heap size in bytes"),
)

#: Capabilities: present only when a declaration grants them (with their bounding argument).
#: Each takes a request frame (a0=ptr, a1=len) and returns the staged reply length, ERROR_BIT on failure.
CAPABILITY_CALLS: tuple[HostCall, ...] = (
    HostCall("berm.fs.read", "FS_READ", "[path] -> raw file bytes"),
    HostCall("berm.fs.write", "FS_WRITE",
             "[path, content, optional pair (parents, 1)] -> empty; atomic; missing parent directories are an "
             "error unless parents=1"),
    HostCall("berm.fs.glob", "FS_GLOB",
             "[pattern, path] -> newline-separated root-relative paths of files under path matching pattern, "
             "newest first; at most 1000, then a last line starting '[truncated' (also when the time budget ran out)"),
    HostCall("berm.fs.grep", "FS_GREP",
             "[pattern, path, include, mode] -> one result per line: mode files (or empty) = matching root-relative "
             "paths, newest first; content = 'path:line:text'; count = 'path:N'. At most 1000 lines, then a "
             "last line starting '[truncated' (also when the time budget ran out). Binary and .gitignored files skipped"),
    HostCall("berm.exec.run", "EXEC_RUN",
             "[command, cwd, k1, v1, ...] -> JSON {exit_code, stderr, stdout} (keys sorted; exit_code -1 when "
             "killed by a signal or the timeout; each stream capped at 1 MiB, then a last line starting '[truncated')"),
    HostCall("berm.http.fetch", "HTTP_FETCH", "[method, url, body, h1, v1, ...] -> framed [status, headers, body]"),
    HostCall("berm.clock.now", "CLOCK_NOW", "[] -> framed [utc_millis, local_offset_seconds]"),
    HostCall("berm.kv.get", "KV_GET", "[key] -> value; a missing key is an error reply ('no value for key ...')"),
    HostCall("berm.kv.set", "KV_SET", "[key, value] -> empty"),
    HostCall("berm.kv.delete", "KV_DELETE", "[key] -> empty"),
    HostCall("berm.kv.list", "KV_LIST",
             f"[prefix] -> framed keys with that byte prefix, sorted; more than {KV_LIST_PAGE} is an error reply. "
             f"[prefix, after] -> a page: the first {KV_LIST_PAGE} of them greater than after (a full page may "
             "have more)"),
    HostCall("berm.schedule.at", "SCHEDULE_AT", "[when_utc_millis, id, payload] -> empty"),
    HostCall("berm.schedule.cancel", "SCHEDULE_CANCEL", "[id] -> empty"),
    HostCall("berm.call", "CALL", "[harness, tool, args] -> the other harness's result"),
)

#: Upstream crabtalk names for the same operations (ABI.md §1); a host registers them as aliases of the same grant.
UPSTREAM_ALIASES: dict[str, str] = {
    "crabtalk.fs.read": "berm.fs.read",
    "crabtalk.fs.write": "berm.fs.write",
    "crabtalk.exec.run": "berm.exec.run",
    "crabtalk.http.fetch": "berm.http.fetch",
}

#: Every name this host knows, by number: used to name a known-but-ungranted capability in a trap message.
KNOWN_NAMES: dict[int, str] = {
    fnv1a64(n): n
    for n in [c.name for c in CORE_CALLS + CAPABILITY_CALLS] + list(UPSTREAM_ALIASES)
}

CORE_BY_NAME: dict[str, HostCall] = {c.name: c for c in CORE_CALLS}
CORE_NUMBERS: frozenset[int] = frozenset(c.number for c in CORE_CALLS)


def core_number(name: str) -> int:
    """The number of a core host call, by name; a KeyError names an unknown one."""
    return CORE_BY_NAME[name].number
