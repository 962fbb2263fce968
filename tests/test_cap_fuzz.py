"""Whatever bytes a guest sends, a capability answers with a reply or a CapabilityError: any other exception would
be a host bug (the host-call-failed trap). Random frames, fields and paths against every capability that cannot
act on the world beyond its root (exec is left out: its job is to run what it is given)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berm_abi.frames import encode_frame
from berm_host.declaration import Declaration
from berm_host.grants import linker_for
from berm_host.linker import CapabilityError

_PATHISH = st.lists(st.sampled_from(["..", ".", "", "a", "sub", "link", "out", "/", "\0", "é", "*", "**", "[", "f.txt"]),
                    max_size=8).map("/".join)
_FIELD = st.one_of(st.binary(max_size=64), _PATHISH.map(str.encode), st.sampled_from([b"files", b"content", b"count",
                                                                                      b"GET", b"http://x.invalid/"]))
#: How many fields each capability takes; those in _PAIRS take key/value pairs after them.
_ARITY = {"berm.fs.read": 1, "berm.fs.write": 2, "berm.fs.glob": 2, "berm.fs.grep": 4, "berm.http.fetch": 3,
          "berm.clock.now": 0, "berm.kv.get": 1, "berm.kv.set": 2, "berm.kv.delete": 1, "berm.kv.list": 1}
_PAIRS = {"berm.fs.write", "berm.http.fetch"}


def _requests(name: str) -> st.SearchStrategy[bytes]:
    """Mostly well-shaped frames (the right field count, sometimes pairs after), some of any shape, some not frames."""
    n = _ARITY[name]
    pairs = st.lists(st.tuples(_FIELD, _FIELD), max_size=2 if name in _PAIRS else 0)
    shaped = st.tuples(st.lists(_FIELD, min_size=n, max_size=n), pairs).map(
        lambda t: encode_frame(t[0] + [f for pair in t[1] for f in pair]))
    return st.one_of(shaped, shaped, shaped, st.lists(_FIELD, max_size=6).map(encode_frame), st.binary(max_size=96))


@pytest.fixture(scope="module")
def linker(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "f.txt").write_text("text\n")
    (base / "out").mkdir()
    (base / "out" / "secret").write_text("secret")
    os.symlink(base / "out", root / "link")
    decl = Declaration(name="fuzz", capabilities=("fs", "http", "clock", "kv"), root=str(root),
                       hosts=("nothing.invalid",), timeout=5)
    return linker_for(decl, data_dir=base / "data"), base


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(_ARITY)), data=st.data())
def test_every_request_gets_a_reply_or_a_capability_error(linker, name, data):
    links, base = linker
    request = data.draw(_requests(name))
    fn = next(c.fn for c in links if c.name == name)
    try:
        assert isinstance(fn(request), bytes)
    except CapabilityError:
        pass
    assert sorted(os.listdir(base / "out")) == ["secret"]
    assert (base / "out" / "secret").read_text() == "secret"
