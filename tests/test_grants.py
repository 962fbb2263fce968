"""Grants → linker: a capability exists only when granted with its bounding argument; crabtalk aliases; the
image key digests exactly what the linker is built from."""

from __future__ import annotations

import json
import time

import pytest

from berm_abi.frames import encode_frame
from berm_abi.names import UPSTREAM_ALIASES, fnv1a64
from berm_host.capabilities._request import Deadline
from berm_host.declaration import Declaration, DeclarationError
from berm_host.grants import GrantError, grant_report, grant_status, image_key, linker_for
from berm_host.linker import CapabilityError
from berm_host.running import interpreting, time_left

FS = ["berm.fs.glob", "berm.fs.grep", "berm.fs.read", "berm.fs.write", "crabtalk.fs.read", "crabtalk.fs.write"]
EXEC = ["berm.exec.run", "crabtalk.exec.run"]
HTTP = ["berm.http.fetch", "crabtalk.http.fetch"]
KV = ["berm.kv.delete", "berm.kv.get", "berm.kv.list", "berm.kv.set"]
ELF = "ab" * 32


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    r.mkdir()
    return r


def _names(decl, tmp_path):
    return linker_for(decl, data_dir=tmp_path / "data").names()


@pytest.mark.parametrize("grant, expected", [
    ("fs", FS), ("exec", EXEC), ("http", HTTP), ("clock", ["berm.clock.now"]), ("kv", KV)])
def test_each_grant_with_its_argument_links_exactly_its_capabilities(grant, expected, root, tmp_path):
    decl = Declaration(name="h", capabilities=(grant,), root=str(root), hosts=("example.com",))
    assert _names(decl, tmp_path) == sorted(expected)


@pytest.mark.parametrize("grant", ["fs", "exec", "http"])
def test_a_grant_without_its_bounding_argument_links_nothing(grant, tmp_path):
    decl = Declaration(name="h", capabilities=(grant,))
    assert _names(decl, tmp_path) == []
    assert grant_status(decl)[grant].startswith("absent: no ")


def test_arguments_without_grants_link_nothing(root, tmp_path):
    decl = Declaration(name="h", root=str(root), hosts=("example.com",))
    assert _names(decl, tmp_path) == []


def test_everything_granted(root, tmp_path):
    decl = Declaration(name="h", capabilities=("fs", "exec", "http", "clock", "kv"), root=str(root),
                       hosts=("example.com",))
    assert _names(decl, tmp_path) == sorted(FS + EXEC + HTTP + KV + ["berm.clock.now"])
    assert set(grant_status(decl).values()) == {"linked"}


def test_aliases_are_the_same_functions(root, tmp_path):
    decl = Declaration(name="h", capabilities=("fs", "exec", "http"), root=str(root), hosts=("example.com",))
    linker = linker_for(decl)
    for alias, name in UPSTREAM_ALIASES.items():
        assert linker.lookup(fnv1a64(alias)).fn is linker.lookup(fnv1a64(name)).fn
    (root / "f").write_bytes(b"via alias")
    assert [c for c in linker if c.name == "crabtalk.fs.read"][0].fn(encode_frame(["f"])) == b"via alias"


def test_unknown_grants_are_refused_and_extra_grants_are_linked(tmp_path):
    decl = Declaration(name="h", capabilities=("fss",))
    assert grant_status(decl) == {"fss": "absent: this host does not know it"}
    with pytest.raises(GrantError, match="granted 'fss', which this host does not know"):
        linker_for(decl)
    decl = Declaration(name="h", capabilities=("schedule",))
    linker = linker_for(decl, extra={"schedule": lambda d: {"berm.schedule.at": lambda req: d.name.encode()}})
    assert linker.names() == ["berm.schedule.at"]


def test_the_report_shows_requests_beside_grants_never_as_grants(root):
    decl = Declaration(name="h", capabilities=("fs", "clock", "http"), root=str(root))
    assert grant_report(decl, ["fs", "kv", "http"]) == {
        "fs": "linked", "kv": "not granted (requested)", "http": "absent: no hosts declared",
        "clock": "linked (not requested)"}


def test_a_root_that_is_not_a_directory_is_a_grant_error(tmp_path):
    with pytest.raises(GrantError, match="not an existing directory"):
        linker_for(Declaration(name="h", capabilities=("fs",), root=str(tmp_path / "missing")))


def test_kv_is_namespaced_by_harness_name(tmp_path):
    a = linker_for(Declaration(name="a", capabilities=("kv",)), data_dir=tmp_path)
    b = linker_for(Declaration(name="b", capabilities=("kv",)), data_dir=tmp_path)
    renamed = linker_for(Declaration(name="b", capabilities=("kv",)), harness_name="a", data_dir=tmp_path)
    fn = {name: {c.name: c.fn for c in linker} for name, linker in [("a", a), ("b", b), ("renamed", renamed)]}
    fn["a"]["berm.kv.set"](encode_frame(["k", "from a"]))
    assert fn["renamed"]["berm.kv.get"](encode_frame(["k"])) == b"from a"
    with pytest.raises(CapabilityError, match="no value"):
        fn["b"]["berm.kv.get"](encode_frame(["k"]))


def test_capability_time_stays_below_what_the_invocation_has_left():
    assert Deadline.within_invocation(30.0).seconds == 30.0  # no invocation runs on this thread
    with interpreting(time.monotonic() + 100):
        assert Deadline.within_invocation(30.0).seconds == 30.0
        with interpreting(time.monotonic() + 10):  # a nested run ends by the earliest deadline
            assert 7.9 < Deadline.within_invocation(30.0).seconds <= 8.0  # a fifth (at most 5 s) left for the reply
            with interpreting(None):
                assert Deadline.within_invocation(30.0).seconds <= 8.0
        assert Deadline.within_invocation(30.0).seconds == 30.0
    with interpreting(time.monotonic() - 1):
        assert Deadline.within_invocation(30.0).seconds == 0.0
    assert time_left() is None


# -- the image key ------------------------------------------------------------------------------------------


def _key(root=None, **kw):
    kw.setdefault("capabilities", ("fs", "exec", "http"))
    kw.setdefault("hosts", ("a.example.com", "b.example.com"))
    return image_key(ELF, Declaration(name=kw.pop("name", "os"), root=str(root) if root else None, **kw))


def test_same_declaration_same_key(root):
    assert _key(root) == _key(root)
    assert len(_key(root)) == 64


def test_a_rename_keeps_the_key(root):
    assert _key(root, name="os") == _key(root, name="renamed")
    assert _key(root, name="os", source="github:x/y@1") == _key(root, name="os", source="builtin")


def test_different_root_grants_or_hosts_change_the_key(root, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    base = _key(root)
    assert _key(other) != base
    assert _key(root, capabilities=("fs", "exec")) != base
    assert _key(root, capabilities=("fs", "exec", "http", "clock")) != base
    assert _key(root, hosts=("a.example.com",)) != base
    assert image_key("cd" * 32, Declaration(name="os", root=str(root), capabilities=("fs", "exec", "http"),
                                            hosts=("a.example.com", "b.example.com"))) != base
    assert _key(root, env=(("A", "1"),)) != base
    assert _key(root, timeout=5.0) != base
    assert _key(root, memory=1 << 20) != base


def test_scope_changes_the_key(root):
    decl = Declaration(name="os", capabilities=("fs",), root=str(root))
    assert image_key(ELF, decl, scope="session-1") != image_key(ELF, decl, scope="session-2")


def test_the_key_sees_what_is_linked_not_how_it_was_spelled(root, tmp_path):
    (tmp_path / "alias").symlink_to(root)
    assert _key(root) == _key(tmp_path / "alias")  # the resolved root
    assert _key(root, hosts=("B.example.com.", "a.example.com")) == _key(root)  # hosts as a set, normalised
    assert _key(root, capabilities=("http", "exec", "fs")) == _key(root)
    # An argument whose grant is absent links nothing, so it does not change the key.
    assert _key(root, capabilities=("clock",)) == _key(None, capabilities=("clock",), hosts=())
    # A grant whose argument is absent links nothing either.
    assert _key(None, capabilities=("fs", "clock"), hosts=()) == _key(None, capabilities=("clock",), hosts=())


def test_with_kv_the_namespace_is_part_of_the_key(root):
    """kv storage is part of what the guest reaches, so a renamed harness (a different namespace) cannot share
    a linker with the old name; without kv a rename shares (test_a_rename_keeps_the_key)."""
    assert _key(root, name="a", capabilities=("kv",)) != _key(root, name="b", capabilities=("kv",))
    decl = Declaration(name="b", capabilities=("kv",))
    assert image_key(ELF, decl, harness_name="a") == _key(root, name="a", capabilities=("kv",))


def test_with_kv_the_stores_directory_is_part_of_the_key(tmp_path):
    """Found by a review: two linkers of one declaration with different data directories reach different stores,
    yet had the same key."""
    decl = Declaration(name="a", capabilities=("kv",))
    assert image_key(ELF, decl, data_dir=tmp_path / "x") != image_key(ELF, decl, data_dir=tmp_path / "y")
    assert image_key(ELF, decl, data_dir=tmp_path / "x") == image_key(ELF, decl, data_dir=tmp_path / "x" / ".")
    clock_only = Declaration(name="a", capabilities=("clock",))  # no store reached: no directory in the key
    assert image_key(ELF, clock_only, data_dir=tmp_path / "x") == image_key(ELF, clock_only, data_dir=tmp_path / "y")


def test_with_a_grant_served_beside_the_hosts_the_name_is_part_of_the_key():
    """Found by a review: an extra grant's builder takes the whole declaration (the daemon's ``schedule`` writes the
    wakes of the harness it names), yet two declarations differing only in name had one key."""
    extra = {"schedule": lambda decl: {}}
    alpha, beta = (Declaration(name=n, capabilities=("schedule",)) for n in ("alpha", "beta"))
    assert image_key(ELF, alpha, extra=extra) != image_key(ELF, beta, extra=extra)
    plain_alpha, plain_beta = (Declaration(name=n, capabilities=("clock",)) for n in ("alpha", "beta"))
    assert image_key(ELF, plain_alpha, extra=extra) == image_key(ELF, plain_beta, extra=extra)  # a rename shares


def test_exec_alone_runs_in_the_declared_root_with_the_declared_environment(root, tmp_path):
    """exec without fs still gets its root (a linker that resolved the root only for fs handed exec none), and
    the declaration's env reaches the command (a linker that dropped it ran the command without it)."""
    (root / "sub").mkdir()
    decl = Declaration(name="h", capabilities=("exec",), root=str(root), env=(("DECLARED", "d"),))
    linker = linker_for(decl, data_dir=tmp_path / "data")
    assert linker.names() == sorted(EXEC)
    reply = json.loads(linker.lookup(fnv1a64("crabtalk.exec.run")).fn(encode_frame(['pwd; echo "$DECLARED"', "sub"])))
    assert reply == {"exit_code": 0, "stderr": "", "stdout": f"{root.resolve()}/sub\nd\n"}


def test_exec_alone_keys_by_its_root_and_env_only_with_exec(root, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    assert _key(root, capabilities=("exec",)) != _key(other, capabilities=("exec",))
    # env reaches nothing but exec: without exec it does not change the key.
    assert _key(root, capabilities=("fs",), env=(("A", "1"),)) == _key(root, capabilities=("fs",))
    assert _key(root, capabilities=("exec",), env=(("A", "1"),)) != _key(root, capabilities=("exec",))


def test_grant_for_names_the_grant_that_links_each_capability():
    from berm_abi.names import CAPABILITY_CALLS
    from berm_host.grants import grant_for

    granted = {call.name: grant_for(call.name) for call in CAPABILITY_CALLS}
    assert None not in granted.values(), granted  # every capability of the ABI is some grant's
    assert (granted["berm.fs.glob"], granted["berm.kv.list"], granted["berm.call"]) == ("fs", "kv", "call")
    assert grant_for("berm.args.read") is None and grant_for("other.fs.read") is None


def test_a_relative_root_is_refused_as_a_declarations_file_refuses_it():
    """Found by a review: a declarations file's root must be absolute, but one made in code was taken from the
    current directory (a process started in / granted the whole file system). The Declaration refuses it now,
    before any linker is built from it."""
    with pytest.raises(DeclarationError, match="root must be an absolute path, not '.'"):
        Declaration(name="h", capabilities=("fs",), root=".")
