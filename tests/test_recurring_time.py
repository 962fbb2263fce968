"""The SDK's recurring helpers (berm_recurring.h) at their edges, built natively: berm_next_local_time on an exact
local midnight before the epoch, and berm_wake_args refusing a wake without its `now` instead of reading it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest

from berm_sdk.native import NativeHarness, build_native_library

from .test_reminders import HELPERS, REMINDERS


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    d = tmp_path_factory.mktemp("recurring-native")
    (d / "helpers.c").write_text(HELPERS)
    return build_native_library([REMINDERS / "reminders.c", d / "helpers.c"], d / "reminders.so")


def ms(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000)


@pytest.mark.parametrize("after, offset, hm, expected", [
    # local time exactly on a midnight before the epoch: the day's start is the floor of a negative multiple of a
    # day, not one day less (a floor_div that always subtracted one for negatives answered `after` itself)
    ("1969-12-31T00:00:00+00:00", 0, (0, 0), "1970-01-01T00:00:00+00:00"),
    ("1969-12-30T23:00:00+00:00", 3600, (0, 0), "1969-12-31T23:00:00+00:00"),  # 00:00 at UTC+1
    ("1969-12-31T00:00:00+00:00", 0, (0, 1), "1969-12-31T00:01:00+00:00"),
])
def test_next_local_time_on_a_negative_midnight(library, after, offset, hm, expected):
    got = NativeHarness(library).call("next_local", f"{ms(after)} {offset} {hm[0]} {hm[1]}")
    assert int(got) == ms(expected)


@pytest.mark.parametrize("hm", [(-25, 0), (0, -1500), (24, 0), (0, 60), (48, 0)])
def test_next_local_time_of_no_time_of_day_is_minus_one(library, hm):
    """Found by a review: hour and minute were not checked, so -25:00 came out in the past (a re-arm there is a
    chain that ends in refusal) and 48:00 two days on. -1 stops a recurring wake."""
    got = NativeHarness(library).call("next_local", f"{ms('2026-12-01T08:00:00+00:00')} 0 {hm[0]} {hm[1]}")
    assert int(got) == -1


@pytest.mark.parametrize("wake", [
    {"id": "r1", "payload": "", "scheduled_at": 1},
    {"id": "r1", "payload": "", "scheduled_at": 1, "now": "2"},
    {"id": "r1", "payload": "", "now": 2},
    {"id": "r1", "scheduled_at": 1, "now": 2},
])
def test_a_wake_missing_a_field_is_refused_not_read(library, wake):
    """Run in a child: a wake_args that read a missing field would dereference NULL and kill the process."""
    script = ("import sys\n"
              "from berm_sdk.native import NativeHarness\n"
              "from berm_host.traps import ToolFailure\n"
              "try:\n"
              "    NativeHarness(sys.argv[1]).call('wake', sys.argv[2])\n"
              "except ToolFailure as exc:\n"
              "    print(exc)\n")
    r = subprocess.run([sys.executable, "-c", script, str(library), json.dumps(wake)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "not {id, payload, scheduled_at, now}" in r.stdout
