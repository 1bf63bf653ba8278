"""``k3fleet decide`` over real run directories: the lab fleet's audits and a real ``upgrade --check``.

The acceptance half (the simulator made healthy, small, crashing, cache-less, defective) is in
test_decide_accept.py; here the outcomes the fleet side decides on its own, and bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from decide_helpers import k3fleet

pytestmark = pytest.mark.integration


def _decide(tmp: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp / "decision"
    proc = k3fleet("decide", *args, "--out", str(out), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, data, proc.stderr


def test_story_fleet_must_rebuild_with_every_reason_on_its_file(story_audit: Path, tmp_path: Path) -> None:
    code, d, _ = _decide(tmp_path, str(story_audit), "--reviewer", "carol")
    assert code == 1
    assert d["outcome"] == "rebuild_environment" and not d["approved"]
    chain = [r for r in d["reasons"] if r["rule"] == "chain.mismatch"]
    assert chain and all(r["evidence"] == [{"run": story_audit.name, "file": "verdict.json",
                                            "operator_supplied": False}] for r in chain)
    verdict = json.loads((story_audit / "verdict.json").read_text())
    low = sorted(h for h, v in verdict["hosts"].items() if any(f["check_id"] == "driver.branch" for f in v["findings"]))
    assert len(low) >= 2
    assert any(r["text"].startswith(f"driver.branch on {len(low)} host(s): {', '.join(low)}") for r in chain), \
        [r["text"] for r in chain]
    items = {i["id"]: i for i in d["checklist"]}
    assert items["hosts.driver_branch"]["status"] == "fail"
    assert f"{len(low)} host(s) below R580" in items["hosts.driver_branch"]["detail"]
    assert items["chain.agree"]["status"] == "fail"
    # The acceptance evidence is not there and says so, item by item.
    assert {"startup.model_load_memory", "prefix_cache.warm", "agent.tool_schema", "load.long_input"} <= set(
        d["missing"])


def test_healthy_fleet_and_a_checked_change_still_miss_the_serving_evidence(
        healthy_audit: Path, change_check: Path, tmp_path: Path) -> None:
    code, d, err = _decide(tmp_path, str(healthy_audit), str(change_check), "--reviewer", "carol",
                           "--owner", "serving-team")
    assert code == 3, err
    assert d["outcome"] == "observe_with_limits" and not d["approved"]
    assert d["baseline"] is None
    items = {i["id"]: i["status"] for i in d["checklist"]}
    assert items["hosts.driver_branch"] == "pass"
    assert items["container.cuda13"] == "pass"  # the image's CUDA 13.0.2 from the audited hosts
    assert items["signoff.reviewer"] == "pass"
    # No acceptance run and no profile: the evidence is missing, what is unproven is named, and the tested
    # envelope (nothing) has no owner.
    assert {r["rule"] for r in d["reasons"]} == {"evidence.missing", "profile.missing", "limits.unowned"}
    assert any(u.startswith("production concurrency (tested: none)") for u in d["unproven"])
    summary = json.loads((tmp_path / "decision" / "summary.json").read_text())
    assert summary["change"]["change_id"] == "CHG-1042" and summary["change"]["check"] is True
    stages = [(e["host"], e["stage"]) for e in summary["change"]["timeline"]]
    assert ("gpu-a01", "draining") in stages and ("gpu-a01", "rebooting") in stages
    assert "evidence package:" in err


def test_a_real_change_night_after_the_audit_makes_the_audit_stale(healthy_audit: Path, change_check: Path,
                                                                  tmp_path: Path) -> None:
    from k3fleet.decide.flow import DecideOptions, build_summary, read_sources
    from k3fleet.decide.rules import decide

    src = read_sources([healthy_audit, change_check])
    summary = build_summary(src, DecideOptions(runs=[], reviewer="carol"), "2026-12-01T00:00:00+00:00")
    assert summary.change is not None and summary.audit is not None
    # The same run read as a real night (not --check) that started after the audit.
    summary.change.check = False
    summary.change.started_at = "9999-01-01T00:00:00+00:00"
    d = decide(summary)
    item = next(i for i in d.checklist if i.id == "hosts.driver_branch")
    assert item.status == "missing" and "predates change night" in item.detail


OWNERS_BAD = {
    "bad_date": ("items:\n  agent.retry:\n    owner: dana\n    deadline: next week\n    rollback: pin\n",
                 "items.agent.retry.deadline"),
    "unknown_item": ("items:\n  agent.retries:\n    owner: dana\n    deadline: 2026-12-01\n    rollback: pin\n",
                     "items.agent.retries: not a checklist item"),
    "no_rollback": ("items:\n  agent.retry:\n    owner: dana\n    deadline: 2026-12-01\n",
                    "items.agent.retry.rollback: Field required"),
    "misspelt_key": ("items:\n  agent.retry:\n    owner: dana\n    deadline: 2026-12-01\n    rollbak: pin\n"
                     "    rollback: pin\n", "rollbak: unknown key"),
    "not_yaml": ("items: [unclosed\n", "is not valid YAML"),
    "a_list": ("- owner: dana\n", "expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(OWNERS_BAD))
def test_bad_owners_file_is_one_line_and_exit_2(case: str, healthy_audit: Path, tmp_path: Path) -> None:
    text, message = OWNERS_BAD[case]
    owners = tmp_path / "owners.yaml"
    owners.write_text(text)
    proc = k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--owners", str(owners),
                   "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--reviewer", " "], "--reviewer NAME is required"),
    (["--reviewer", "a\nb"], "--reviewer 'a\\nb' is not valid"),
    ([], "Missing option '--reviewer'"),
])
def test_reviewer_is_required(args: list[str], message: str, healthy_audit: Path, tmp_path: Path) -> None:
    proc = k3fleet("decide", str(healthy_audit), *args, "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_not_a_run_a_wrong_kind_and_a_run_given_twice(healthy_audit: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = k3fleet("decide", str(plain), "--reviewer", "carol")
    assert proc.returncode == 2 and "not a k3fleet run directory" in proc.stderr
    twice = k3fleet("decide", str(healthy_audit), str(healthy_audit), "--reviewer", "carol")
    assert twice.returncode == 2 and "given twice" in twice.stderr
    first = tmp_path / "d1"
    assert k3fleet("decide", str(healthy_audit), "--reviewer", "carol", "--out", str(first)).returncode == 3
    proc = k3fleet("decide", str(first), "--reviewer", "carol", "--runs-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "of kind 'decision'" in proc.stderr


def test_pasted_captures_enter_the_decision_marked_operator_supplied(healthy_audit: Path, tmp_path: Path) -> None:
    fix = Path(__file__).resolve().parents[2] / "fixtures"
    tri = tmp_path / "triage"
    proc = k3fleet("triage", str(fix / "vllm_startup" / "oom_load_model.log"),
                   str(fix / "triage" / "nvidia_smi_h100x8_565.txt"), "--host", "gpu-x01", "--out", str(tri))
    assert proc.returncode == 1, proc.stderr
    code, d, _ = _decide(tmp_path, str(healthy_audit), str(tri), "--reviewer", "carol")
    assert code == 1 and d["outcome"] == "rebuild_environment"
    rules = {r["rule"]: r for r in d["reasons"]}
    oom = rules["startup.model_load_oom"]
    assert oom["evidence"] == [{"run": "triage", "file": "triage.json", "operator_supplied": True}]
    chain = [r for r in d["reasons"] if r["rule"] == "chain.mismatch"]
    assert any(e["operator_supplied"] and e["file"] == "inputs/02-nvidia_smi_h100x8_565.txt"
               for r in chain for e in r["evidence"]), chain
    items = {i["id"]: i for i in d["checklist"]}
    assert items["startup.model_load_memory"]["status"] == "fail"
    assert "(operator-supplied)" in (tmp_path / "decision" / "report.md").read_text()
