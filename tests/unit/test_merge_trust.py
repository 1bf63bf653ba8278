"""Which slice's observation of a host wins a merge, and which timestamps may take part at all.

The rule (docs/scale.md "Slices merged into one verdict"): verified outranks unverified whatever
the times; among equals the newest wins; ties go to the later input. A time that is not finite
and sane refuses its slice, so a made-up date can never win.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
from pathlib import Path

import pytest

import k3fleet.audit.merge as merge_module
from k3fleet.audit.merge import CLOCK_SKEW_S, Observation, Slice, _iso, merge_slices, write_facts
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import REDACTED, RunDir, layout, verify_run
from k3fleet.evidence.reader import RunReader

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


# -- writing the chosen facts (several writer processes for a large merge) ---------------------

# The synthetic fleet's R575 host (tests/fixtures/verdict), one of which carries a token in its facts.
_FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "verdict" / "host_r575_h200_hgx.json"


def _slice_run(base: Path, hosts: int) -> Path:
    rd = RunDir.create(base, "audit", ["k3fleet", "audit"], out=base / "slice")
    data = json.loads(_FACTS.read_text())
    for i in range(hosts):
        facts = {**data, "host": f"gpu{i:03d}", "hostname": f"gpu{i:03d}"}
        if i == 3:
            facts["env"] = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}
        # Written as a node's facts arrive, but kept unredacted here to see that the merge redacts them.
        (rd.path / layout.FACTS).mkdir(exist_ok=True)
        (rd.path / layout.facts_file(f"gpu{i:03d}")).write_text(json.dumps(facts, indent=2) + "\n")
    return rd.path


@pytest.mark.parametrize("writers", [1, 2])
def test_every_chosen_host_s_facts_are_written_through_the_redactor(tmp_path: Path, writers: int) -> None:
    src = _slice_run(tmp_path, 12)
    run = RunReader(src)
    chosen = {h: Observation(h, "facts", OLD, str(src), run=run, settled=False) for h in run.fact_hosts()}
    chosen["awx-host"] = Observation("awx-host", "facts", OLD, "awx", facts={"host": "awx-host", "api_key": "x"})
    rd = RunDir.create(tmp_path, "merge", ["k3fleet", "merge"], out=tmp_path / f"merged{writers}")
    write_facts(rd, chosen, writers=writers)
    rd.write_manifest()
    assert verify_run(rd.path).ok
    written = sorted(p.name for p in (rd.path / layout.FACTS).iterdir())
    assert written == sorted(f"{h}.json" for h in chosen)
    for i in range(12):
        name = layout.facts_file(f"gpu{i:03d}")
        got = (rd.path / name).read_bytes()
        if i == 3:
            assert b"hf_abcdefghij" not in got and json.loads(got)["env"] == {"HF_TOKEN": REDACTED}
        else:
            assert got == (src / name).read_bytes()  # written as read: the redactor left it as it was
    assert json.loads((rd.path / layout.facts_file("awx-host")).read_text())["api_key"] == REDACTED


def test_a_writer_s_error_is_the_merge_s_one_line_error(tmp_path: Path) -> None:
    src = _slice_run(tmp_path, 4)
    run = RunReader(src)
    chosen = {h: Observation(h, "facts", OLD, str(src), run=run, settled=False) for h in run.fact_hosts()}
    (src / layout.facts_file("gpu002")).unlink()  # gone between the merge's two passes
    rd = RunDir.create(tmp_path, "merge", ["k3fleet", "merge"], out=tmp_path / "merged")
    with pytest.raises(IncompleteError, match=r"facts/gpu002.json is missing: the run directory is incomplete"):
        write_facts(rd, chosen, writers=2)
    assert not (rd.path / layout.MANIFEST).exists()


_PARENT = os.getpid()


def _killed_writer(items: object) -> int:
    # A writer the kernel kills (out of memory) mid-merge.
    if os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


def test_a_killed_writer_is_an_incomplete_merge_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _slice_run(tmp_path, 4)
    run = RunReader(src)
    chosen = {h: Observation(h, "facts", OLD, str(src), run=run, settled=False) for h in run.fact_hosts()}
    monkeypatch.setattr(merge_module, "_write_run_facts", _killed_writer)
    rd = RunDir.create(tmp_path, "merge", ["k3fleet", "merge"], out=tmp_path / "merged")
    with pytest.raises(IncompleteError, match=r"ended before it was done \(killed\?\): the merged run is incomplete"):
        write_facts(rd, chosen, writers=2)
    assert not (rd.path / layout.MANIFEST).exists()
