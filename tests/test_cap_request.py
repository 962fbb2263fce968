"""What every capability shares: the time budget a call takes from the invocation it serves, and how a timeout
reads to the guest."""

from __future__ import annotations

import time

import pytest

from berm_abi.frames import encode_frame
from berm_host.capabilities._request import Deadline, capability
from berm_host.linker import CapabilityError
from berm_host.running import interpreting


def test_a_call_keeps_a_fifth_of_what_its_invocation_has_left_at_most_five_seconds_for_the_guest():
    assert Deadline.within_invocation(30).seconds == 30  # no invocation: the capability's own timeout
    with interpreting(time.monotonic() + 1000):
        # 5 s kept, not 200 (the margins leave seconds for a loaded machine between these lines, not a measurement)
        assert 990 < Deadline.within_invocation(2000).seconds <= 995
        assert Deadline.within_invocation(30).seconds == 30
    with interpreting(time.monotonic() + 20):
        assert 15.5 < Deadline.within_invocation(30).seconds <= 16  # a fifth kept (4 s), not 5 s


def test_a_call_made_after_its_invocation_ran_out_has_no_time():
    with interpreting(time.monotonic() - 1):
        deadline = Deadline.within_invocation(30)
        assert deadline.seconds == 0
        with pytest.raises(TimeoutError):
            deadline.check()


def test_a_timeout_reads_as_such_with_its_reason():
    @capability("berm.test.slow")
    def slow(request: bytes) -> bytes:
        raise TimeoutError("took longer than 0.5 s")

    with pytest.raises(CapabilityError, match=r"^berm.test.slow: timed out \(took longer than 0.5 s\)$"):
        slow(b"")


def test_naming_a_path_leaves_a_timeout_one(monkeypatch):
    """A TimeoutError is an OSError: naming() made a glob's timeout "f/x/*: took longer than 10 s", where the
    capability says it timed out (found by a review)."""
    from berm_host.capabilities import fs_search
    from berm_host.capabilities.paths import Root

    def slow(*args):
        raise TimeoutError("took longer than 10 s")

    monkeypatch.setattr(fs_search, "_leads_nowhere", slow)
    glob = fs_search.capabilities(Root("/tmp"), timeout=10)["berm.fs.glob"]
    with pytest.raises(CapabilityError, match=r"^berm.fs.glob: timed out \(took longer than 10 s\)$"):
        glob(encode_frame(["no-such-dir-here/x/*", ""]))
