"""Which slice's observation of a host wins a merge, and which timestamps may take part at all.

The rule (docs/scale.md "Slices merged into one verdict"): verified outranks unverified whatever
the times; among equals the newest wins; ties go to the later input. A time that is not finite
and sane refuses its slice, so a made-up date can never win.
"""

from __future__ import annotations

import datetime as _dt

import pytest

from k3fleet.audit.merge import CLOCK_SKEW_S, Observation, Slice, _iso, merge_slices
from k3fleet.errors import UsageError

NOW = _dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=_dt.UTC)


def _slice(source: str, when: str, *, verified: bool) -> Slice:
    sl = Slice(source=source, kind="run" if verified else "artifacts",
               verified="manifest.json ok" if verified else "no manifest: job artifacts (not verifiable)",
               status="successful", started_at=when)
    sl.observations.append(Observation("gpu-a01", "facts", when, source, facts={"host": "gpu-a01"},
                                       verified=verified))
    return sl


OLD, NEW = "2025-06-01T10:00:00+00:00", "2025-06-01T11:00:00+00:00"


@pytest.mark.parametrize("first, second, winner, why", [
    # A verified slice beats a newer unverifiable one, in either order.
    (("run", OLD, True), ("awx", NEW, False), "run", "not verifiable (no manifest: job artifacts"),
    (("awx", NEW, False), ("run", OLD, True), "run", "not verifiable"),
    # Equals: the newer wins.
    (("run-a", OLD, True), ("run-b", NEW, True), "run-b", "older (2025-06-01T10:00:00+00:00) than run-b"),
    (("awx-a", NEW, False), ("awx-b", OLD, False), "awx-a", "older"),
    # Equals at the same time: the later input.
    (("run-a", OLD, True), ("run-b", OLD, True), "run-b", "same time as run-b, which was listed later"),
])
def test_who_wins(first: tuple[str, str, bool], second: tuple[str, str, bool], winner: str, why: str) -> None:
    slices = [_slice(src, when, verified=v) for src, when, v in (first, second)]
    merged = merge_slices(slices)
    assert merged.chosen["gpu-a01"].source == winner
    (dup,) = merged.duplicates
    assert dup["kept"]["source"] == winner and dup["rule"].startswith("an observation from a slice verified")
    (dropped,) = dup["dropped"]
    assert why in dropped["why"], dropped
    # Only a trust decision is reported as an ignored slice.
    trust_drop = dup["kept"]["verified"] and not dropped["verified"]
    assert [(h, s) for h, s, _ in merged.overruled] == ([("gpu-a01", dropped["source"])] if trust_drop else [])


@pytest.mark.parametrize("value, expected", [
    ("2025-06-01T11:59:00Z", "2025-06-01T11:59:00+00:00"),
    ("2025-06-01T13:59:00+02:00", "2025-06-01T11:59:00+00:00"),
    ("2025-06-01T11:59:00", "2025-06-01T11:59:00+00:00"),  # no zone: UTC, as ansible-runner writes it
    (NOW.timestamp() - 60, "2025-06-01T11:59:00+00:00"),
    (NOW.timestamp() + CLOCK_SKEW_S - 1, "2025-06-01T12:04:59+00:00"),  # within the skew allowance
    (None, "fallback"),
    ("", "fallback"),
])
def test_sane_times(value: object, expected: str) -> None:
    assert _iso(value, "fallback", "collected_at", now=NOW) == expected


@pytest.mark.parametrize("value, words", [
    (1e300, "out of the range of a date"),
    (float("nan"), "not a finite number"),
    (float("inf"), "not a finite number"),
    (-1e300, "out of the range of a date"),
    ("2999-01-01T00:00:00Z", "ahead of this controller's clock"),
    (NOW.timestamp() + CLOCK_SKEW_S + 60, "ahead of this controller's clock"),
    ("9999-12-31T23:59:59-05:00", "days ahead of this controller's clock"),
    ("NaN", "not an ISO 8601 time"),
    ("yesterday", "not an ISO 8601 time"),
    (0, "before 2000"),
    (True, "a bool, not a time"),
    ([2025, 6, 1], "a list, not a time"),
])
def test_times_that_would_decide_the_merge_are_refused(value: object, words: str) -> None:
    with pytest.raises(UsageError) as exc:
        _iso(value, "fallback", "slice s: host h: collected_at", now=NOW)
    msg = str(exc.value)
    assert msg.startswith("slice s: host h: collected_at ") and words in msg and "the slice is refused" in msg
    assert "\n" not in msg
