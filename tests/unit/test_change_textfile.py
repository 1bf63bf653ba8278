"""The night's node_exporter textfile (docs/change-night.md "Watching a night"): the gauges follow the
journal lines as the play reports them, the file is valid Prometheus text (read back with
prometheus-client's own parser) and replaced whole, and a bad --textfile is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from k3fleet.change.textfile import NightTextfile, check_textfile
from k3fleet.errors import UsageError


def line(host: str, stage: str, **kw: object) -> dict[str, object]:
    return {"ts": "2026-12-05T01:00:00.000Z", "run": "R1", "change_id": "CHG-1", "host": host, "stage": stage,
            "detail": {}, **kw}


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "change_id")))] = s.value
    return out


def test_the_gauges_follow_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "k3fleet.prom"
    tf = NightTextfile(path, change_id="CHG-1", run="R1", batches=[["c"], ["w1", "w2"]], failure_budget=1)
    tf.add([])
    got = samples(path)
    assert got[("k3fleet_change_hosts", (("stage", "not_started"),))] == 3
    assert got[("k3fleet_change_wave", ())] == 0 and got[("k3fleet_change_waves", ())] == 2
    assert got[("k3fleet_change_failure_budget_left", ())] == 1
    tf.add([line("c", s) for s in ("snapshot", "draining", "drained", "upgrading", "rebooting", "verifying",
                                     "returned")])
    tf.add([line("w1", "snapshot"), line("w1", "draining"), line("w2", "snapshot"), line("w2", "failed"),
            # Another change's line, and an interruption mark, change nothing.
            line("w1", "returned", change_id="CHG-OTHER"),
            line("w1", "draining", interrupted={"signal": "SIGTERM"})])
    got = samples(path)
    assert got[("k3fleet_change_hosts", (("stage", "returned"),))] == 1
    assert got[("k3fleet_change_hosts", (("stage", "draining"),))] == 1
    assert got[("k3fleet_change_hosts", (("stage", "failed"),))] == 1
    assert got[("k3fleet_change_hosts", (("stage", "not_started"),))] == 0
    assert got[("k3fleet_change_host_stage", (("host", "w1"), ("stage", "draining")))] == 1
    assert got[("k3fleet_change_failures", ())] == 1
    assert got[("k3fleet_change_failure_budget_left", ())] == 0
    assert got[("k3fleet_change_wave", ())] == 1
    assert got[("k3fleet_change_info", (("run", "R1"),))] == 1
    # Replaced whole, readable by node_exporter, no temporary file left beside it.
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k3fleet.prom"]


def test_a_write_that_fails_is_kept_as_one_line_and_the_night_goes_on(tmp_path: Path) -> None:
    where = tmp_path / "gone"
    where.mkdir()
    tf = NightTextfile(where / "k3fleet.prom", change_id="CHG-1", run="R1", batches=[["c"]], failure_budget=0)
    where.rmdir()
    tf.add([line("c", "snapshot")])
    assert tf.problem is not None and "--textfile" in tf.problem


@pytest.mark.parametrize(("name", "why"), [
    ("night.txt", r"reads only \*\.prom files"),
    ("missing/night.prom", "does not exist"),
])
def test_a_textfile_the_collector_cannot_read_is_refused(tmp_path: Path, name: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        check_textfile(tmp_path / name)
