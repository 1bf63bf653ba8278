"""report.md of a fleet larger than markdown.HOST_ROWS: one row per group of hosts that share what the row
says, with the group's size and first hosts (verdict.json keeps every host); a smaller fleet keeps a row per
host. Built through `k3fleet merge` of one audit slice, as the 100,000-host benchmark does
(docs/scale.md "Merging 100,000 hosts")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import k3fleet.report.markdown as markdown
from k3fleet.audit.merge import run_merge
from k3fleet.evidence import RunDir, layout
from k3fleet.targets import load_target

# A real-shaped R575 HGX H200 node (tests/fixtures/verdict/SOURCES.md).
FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "verdict" / "host_r575_h200_hgx.json"
HOSTS = 10
UNREACHABLE = 2


def _slice(base: Path) -> Path:
    rd = RunDir.create(base, "audit", ["k3fleet", "audit"], out=base / "slice")
    data = json.loads(FACTS.read_text())
    for i in range(HOSTS):
        rd.write_json(layout.facts_file(f"gpu{i:03d}"), {**data, "host": f"gpu{i:03d}", "hostname": f"gpu{i:03d}"})
    gone = {f"gpu{i:03d}": "ssh: connect to host: Connection timed out" for i in range(HOSTS, HOSTS + UNREACHABLE)}
    rd.write_json(layout.TARGET, load_target(None).model_dump(mode="json"))
    rd.write_json(layout.RUN, {"status": "successful", "hosts_total": HOSTS + UNREACHABLE, "hosts_with_facts": HOSTS,
                               "unreachable": gone, "invalid_evidence": {}, "wall_s": 1.0, "exit_code": 0})
    rd.write_manifest()
    return rd.path


def _report(tmp_path: Path) -> tuple[str, dict[str, object]]:
    result = run_merge([_slice(tmp_path)], ["k3fleet", "merge"], out=tmp_path / "merged")
    verdict = json.loads((result.run_dir.path / layout.VERDICT).read_text())
    return (result.run_dir.path / layout.REPORT).read_text(), verdict


def _section(report: str, title: str) -> str:
    return report.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_a_large_fleet_gets_a_row_per_group_and_every_host_counted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(markdown, "HOST_ROWS", 3)
    report, verdict = _report(tmp_path)
    hosts = _section(report, "Hosts")
    assert "verdict.json lists every host" in hosts
    rows = [r for r in hosts.splitlines() if re.match(r"\| \d+ \|", r)]
    # The ten identical nodes are one group; the two unreachable ones another.
    assert sorted(int(r.split("|")[1]) for r in rows) == [UNREACHABLE, HOSTS]
    big = next(r for r in rows if r.startswith(f"| {HOSTS} |"))
    assert "gpu000, gpu001, gpu002 and 7 more" in big and "gpu003" not in big
    assert len(verdict["hosts"]) == HOSTS + UNREACHABLE
    findings = _section(report, "Findings")
    # Each host finding is one row for all the hosts that have it, not one per host.
    assert f"| {HOSTS}: gpu000, gpu001, gpu002 and 7 more |" in findings
    assert "| gpu005 |" not in findings
    plan = _section(report, "Change plan: R580 580.95.05")
    assert f"| {HOSTS}: gpu000, gpu001, gpu002 and 7 more | driver: nvidia-driver-575-server -> " in plan
    # The plan's sentences name a few hosts each: the blocked hosts' line is cut after three.
    assert "Blocked gpu003" not in plan and "more host(s)" in plan
    without = _section(report, "Hosts without evidence")
    assert f"- {UNREACHABLE} hosts (gpu010, gpu011): ssh: connect to host: Connection timed out" in without


def test_a_fleet_up_to_the_limit_keeps_a_row_per_host(tmp_path: Path) -> None:
    report, _ = _report(tmp_path)
    hosts = _section(report, "Hosts")
    assert "| host | status | driver | GPUs | top finding |" in hosts
    assert sum(1 for r in hosts.splitlines() if re.match(r"\| gpu\d{3} \|", r)) == HOSTS + UNREACHABLE
    without = _section(report, "Hosts without evidence")
    assert "- gpu010: ssh: connect to host: Connection timed out" in without
