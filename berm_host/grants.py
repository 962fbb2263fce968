"""From a declaration to a linker: the grant *is* the linker (shared/DESIGN.md, "Enforcement is absence").

A capability is linked only when the declaration grants it *and* its bounding argument is present: ``fs`` and
``exec`` need a ``root``, ``http`` needs ``hosts``; ``clock`` and ``kv`` need nothing (``kv`` is bound to the
harness's namespace). Anything else is simply absent, so calling it traps as an unknown host call. The upstream
``crabtalk.*`` names of the same operations are linked as aliases of the same functions.

``image_key`` digests everything a linker is built from (RFC 0205's image key): two declarations that would build
the same linker get the same key, and any difference in what the guest can reach gives a different key. Nothing
in the daemon keys by it yet: ``queue.harness.Loader`` shares loaded images by ELF digest and engine settings and
builds one linker per declaration.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from berm_abi.errors import BermError
from berm_abi.names import UPSTREAM_ALIASES

from .capabilities import clock, exec as exec_cap, fs, fs_search, http, kv
from .capabilities.paths import Root, RootError
from .declaration import NAME, NAME_RULE, Declaration
from .linker import CapabilityFn, Linker

KNOWN_GRANTS = ("clock", "exec", "fs", "http", "kv")
#: The grants ``berm serve`` serves beside these (``berm_host.daemon``): ``berm.call`` and ``berm.schedule.*``.
DAEMON_GRANTS = ("call", "schedule")
#: Grants that need an argument, and which.
BOUNDS = {"fs": "root", "exec": "root", "http": "hosts"}


def grant_for(capability: str) -> str | None:
    """The grant that links the capability named ``capability`` (``berm.kv.get``: ``kv``), when one does: its name's
    second part, as the ABI names them."""
    parts = capability.split(".")
    grant = parts[1] if len(parts) > 1 and parts[0] == "berm" else None
    return grant if grant in KNOWN_GRANTS or grant in DAEMON_GRANTS else None


LINKED = "linked"
UNKNOWN = "absent: this host does not know it"

#: An embedder's own grant: builds capabilities (name -> fn) for a declaration.
GrantBuilder = Callable[[Declaration], dict[str, CapabilityFn]]


class GrantError(BermError):
    """A declaration cannot be linked: an unknown grant name, or a root that is not a directory."""


def grant_status(declaration: Declaration, extra: Collection[str] = ()) -> dict[str, str]:
    """For each capability the declaration names: ``LINKED``, or why it is absent (``UNKNOWN``, or the missing
    bounding argument); ``extra`` names the grants served beside the host's own. What ``berm inspect`` can show
    beside a manifest's requests."""
    status = {}
    for name in declaration.capabilities:
        bound = BOUNDS.get(name)
        if name not in KNOWN_GRANTS and name not in extra:
            status[name] = UNKNOWN
        elif bound and not getattr(declaration, bound):
            status[name] = f"absent: no {bound} declared"
        else:
            status[name] = LINKED
    return status


def grant_report(declaration: Declaration, requested: Iterable[str], extra: Collection[str] = ()) -> dict[str, str]:
    """Each capability a manifest requests or a declaration grants, with what the declaration makes of it: the
    manifest's requests shown beside the grants, never turned into them."""
    requested = list(requested)
    status = grant_status(declaration, extra)
    report = {}
    for name in dict.fromkeys([*requested, *status]):
        if name not in status:
            report[name] = "not granted (requested)"
        else:
            report[name] = status[name] + ("" if name in requested else " (not requested)")
    return report


def _linked(declaration: Declaration, extra: Mapping[str, GrantBuilder] | None) -> list[str]:
    status = grant_status(declaration, extra or ())
    unknown = [n for n, s in status.items() if s == UNKNOWN]
    if unknown:
        raise GrantError(f"harness {declaration.name!r} is granted {unknown[0]!r}, which this host does not know "
                         f"(known: {', '.join(sorted([*KNOWN_GRANTS, *(extra or {})]))})")
    return sorted(n for n, s in status.items() if s == LINKED)


def _root(declaration: Declaration) -> Root:
    """The declaration's root (an absolute path: a Declaration holds no other) as a directory fs and exec work in."""
    try:
        return Root(declaration.root)
    except RootError as exc:
        raise GrantError(f"harness {declaration.name!r}: {exc}") from None


@dataclass(frozen=True)
class _Inputs:
    """Everything a linker is built from, resolved."""

    grants: list[str]
    root: Root | None
    hosts: http.HostList | None
    namespace: str | None
    kv_dir: Path | None  # where the kv store is (when kv is linked)


def _inputs(declaration: Declaration, harness_name: str | None, data_dir: str | os.PathLike[str] | None,
            extra: Mapping[str, GrantBuilder] | None) -> _Inputs:
    grants = _linked(declaration, extra)
    namespace = harness_name or declaration.name
    if "kv" in grants and not NAME.fullmatch(namespace):
        # Found by a review: a name holding a lone surrogate (a file name's stem, decoded with surrogateescape) was
        # linked, and every kv call then raised UnicodeEncodeError, a host bug, not the guest's CapabilityError.
        raise GrantError(f"harness name {namespace!r}, the kv namespace, must be {NAME_RULE}")
    return _Inputs(
        grants=grants,
        root=_root(declaration) if {"fs", "exec"} & set(grants) else None,
        hosts=http.HostList(declaration.hosts) if "http" in grants else None,
        namespace=namespace if "kv" in grants else None,
        kv_dir=kv.data_dir(data_dir) if "kv" in grants else None,
    )


def linker_for(declaration: Declaration, *, harness_name: str | None = None,
               data_dir: str | os.PathLike[str] | None = None, extra: Mapping[str, GrantBuilder] | None = None) -> Linker:
    """The linker of ``declaration``: exactly its bounded grants, plus their ``crabtalk.*`` aliases.

    ``harness_name`` names the kv namespace (default: the declaration's name; either must be a name a declarations
    file could give, else a GrantError); ``data_dir`` holds the kv database (default
    ``berm_host.capabilities.kv.data_dir()``); ``extra`` maps further grant names an embedder serves to builders of
    their capabilities.
    """
    inputs = _inputs(declaration, harness_name, data_dir, extra)
    fns: dict[str, CapabilityFn] = {}
    for grant in inputs.grants:
        if grant == "fs":
            fns |= fs.capabilities(inputs.root)
            fns |= fs_search.capabilities(inputs.root)
        elif grant == "exec":
            fns |= exec_cap.capabilities(inputs.root, env=dict(declaration.env))
        elif grant == "http":
            fns |= http.capabilities(inputs.hosts)
        elif grant == "clock":
            fns |= clock.capabilities()
        elif grant == "kv":
            fns |= kv.capabilities(kv.KvStore.shared(inputs.kv_dir), inputs.namespace)
        else:
            fns |= extra[grant](declaration)
    linker = Linker()
    for name, fn in fns.items():
        linker.define(name, fn)
    for alias, name in UPSTREAM_ALIASES.items():
        if name in fns:
            linker.define(alias, fns[name])
    return linker


def image_key(elf_sha256: str, declaration: Declaration, *, harness_name: str | None = None, scope: str = "",
              data_dir: str | os.PathLike[str] | None = None, extra: Mapping[str, GrantBuilder] | None = None) -> str:
    """SHA-256 (hex) over the ELF's digest and everything its linker and instance are built from: the linked
    grants, the resolved root (when fs or exec is linked), the hosts (when http is), exec's environment, the kv
    namespace and the store's directory (when kv is linked: storage is part of what the guest reaches; ``data_dir``
    as ``linker_for`` takes it), the declaration's name when a grant of ``extra`` is linked (its builder takes the
    whole declaration: the daemon's ``schedule`` writes the wakes of the harness it names, found by a review),
    timeout, memory and the caller's ``scope``. Never the agent's name, nor the harness's name unless kv or an
    ``extra`` grant uses it."""
    inputs = _inputs(declaration, harness_name, data_dir, extra)
    material = {
        "elf": elf_sha256.lower(),
        "grants": inputs.grants,
        "root": str(inputs.root.path) if inputs.root else None,
        "hosts": list(inputs.hosts.entries) if inputs.hosts else [],
        "env": [list(p) for p in declaration.env] if "exec" in inputs.grants else [],
        "kv": [inputs.namespace, str(inputs.kv_dir)] if inputs.kv_dir else None,
        "timeout": declaration.timeout,
        "memory": declaration.memory,
        "scope": scope,
        "extra": declaration.name if set(inputs.grants) - set(KNOWN_GRANTS) else None,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
