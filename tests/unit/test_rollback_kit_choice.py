"""The rollback kit as the controller chooses it (k3fleet/change/kit.py, docs/change-night.md "Rollback
kit"): on by default, --no-rollback-kit recorded in change.json and run.json with a warning, a resume as
the night was started, the play's one extra var, and where the rollback's result says the packages came
from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from empty_night import empty_audit, empty_night

from k3fleet.change import UpgradeOptions
from k3fleet.change.journal import JournalEntry, replay
from k3fleet.change.kit import SKIPPED, describe, kit_choice, kit_extravar, kit_warnings
from k3fleet.change.night import change_timeouts, extravars, resumed_timeouts
from k3fleet.change.record import ChangeRecord, HostPlan
from k3fleet.change.rollback import _source
from k3fleet.evidence import RunDir
from k3fleet.targets import load_target


def _opts(tmp_path: Path, **kw: Any) -> UpgradeOptions:
    return UpgradeOptions(inventory=tmp_path / "hosts.yml", change_id="CHG-1", operator="alice", **kw)


@pytest.mark.parametrize(("flag", "recorded", "chosen"), [
    (None, None, True),      # a fresh night, or a resume of a night recorded before the kit: on
    (False, None, False),    # --no-rollback-kit
    (None, False, False),    # a resume keeps the night's choice
    (True, False, True),     # ... unless --rollback-kit says otherwise
    (False, True, False),
])
def test_the_choice(tmp_path: Path, flag: bool | None, recorded: bool | None, chosen: bool) -> None:
    assert kit_choice(_opts(tmp_path, rollback_kit=flag), recorded) is chosen


def test_the_warning_and_the_result_line() -> None:
    assert kit_warnings(False, check=False) == [SKIPPED]
    assert kit_warnings(False, check=True) == [] and kit_warnings(True, check=False) == []
    assert describe({"rollback_kit": True}) == "rollback kit: on, staged on each host before its first change"
    assert describe({"rollback_kit": False}) == "rollback kit: off (--no-rollback-kit)"
    assert describe({"change_id": "CHG-1"}) is None


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    return empty_audit(tmp_path)


@pytest.mark.parametrize(("kit", "expected"), [(True, {"timeout": 1200}), (None, {"timeout": 1200}), (False, None)])
def test_the_play_gets_the_kit_as_one_extra_var(tmp_path: Path, audit_dir: Path, kit: bool | None,
                                                expected: dict[str, int] | None) -> None:
    target = load_target(None)
    assert target.change.rollback_kit_timeout_s == 1200
    timeouts = change_timeouts(target, _opts(tmp_path))
    plan = HostPlan(target_version="580.95.05", target_branch=580, packages=[])
    record = ChangeRecord(change_id="CHG-1", operator="alice", target_version="580.95.05", target_branch=580,
                          canary="gpu-a01", hosts={"gpu-a01": plan}, timeouts=timeouts, image="img", rollback_kit=kit)
    rd = RunDir.create(tmp_path, "change", ["k3fleet", "upgrade"], out=tmp_path / "night")
    ev = extravars(record, rd, ["gpu-a01"], [1], audit_dir=audit_dir)
    assert ev["k3fleet_rollback_kit"] == expected
    assert kit_extravar(record) == expected


def test_a_resume_of_a_night_recorded_before_the_kit_gets_the_targets_bound() -> None:
    old = {"drain": 3600, "reboot": 1200, "fabricmanager_settle": 60, "command": 20, "smoke_ready": 1800,
           "smoke_request": 120}
    assert resumed_timeouts(old, load_target(None), smoke=True)["rollback_kit"] == 1200


def test_no_rollback_kit_is_recorded_and_warned_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from k3fleet.cli.base import main

    def derive(opts: UpgradeOptions) -> tuple[dict[str, Any], list[str]]:
        kit = kit_choice(opts)
        return {"rollback_kit": kit}, kit_warnings(kit, opts.check)

    seen = empty_night(monkeypatch, tmp_path, derive)
    base = ["upgrade", "-i", "hosts.yml", "--change-id", "CHG-1", "--operator", "alice"]
    assert main(base) == 0
    out = capsys.readouterr()
    assert "rollback kit: on, staged on each host before its first change" in out.out and "warning:" not in out.err
    assert main([*base, "--no-rollback-kit"]) == 0
    out = capsys.readouterr()
    assert f"warning: {SKIPPED}\n" in out.err and "rollback kit: off (--no-rollback-kit)" in out.out
    assert [o.rollback_kit for o in seen] == [None, False]
    runs = sorted(Path("runs").glob("*/run.json"))
    recorded = [json.loads(p.read_text()) for p in runs]
    assert sorted((r["rollback_kit"], tuple(r["warnings"])) for r in recorded) == [(False, (SKIPPED,)), (True, ())]


def _line(stage: str, detail: dict[str, Any]) -> JournalEntry:
    return JournalEntry(ts="2026-12-05T08:00:00.000Z", run="r", change_id="CHG-1", host="gpu-a01", stage=stage,
                        detail=detail)


def test_the_rollback_result_says_where_the_packages_came_from() -> None:
    why = ("the repository does not offer nvidia-driver-575-server:amd64=575.57.08-0ubuntu1; every kit file has "
           "its recorded sha256")
    h = replay([_line("upgrading", {"direction": "rollback"}),
                _line("rolled_back", {"packages_restored": True, "source": "kit", "source_why": why})])["gpu-a01"]
    assert _source(h) == {"source": "kit", "source_why": why}
    nothing = replay([_line("rolled_back", {"packages_restored": False, "source": None})])["gpu-a01"]
    assert _source(nothing) == {"source": None, "source_why": None}


def test_a_host_blocked_before_its_snapshot_has_nothing_to_roll_back() -> None:
    # A host whose rollback kit could not be made failed before its slot: its only line is "failed".
    from k3fleet.change.journal import rollback_targets

    blocked = _line("failed", {"at": "snapshot", "task": "Stage the rollback kit",
                               "msg": "rollback kit /var/lib/k3fleet/rollback-kit/CHG-1 cannot be made: ..."})
    histories = replay([blocked])
    assert histories["gpu-a01"].snapshot_problem is None
    targets, skipped, refused = rollback_targets(histories)
    assert (targets, refused) == ([], {})
    assert skipped == {"gpu-a01": "no snapshot line (last stage failed): nothing was changed on it"}
    # A change recorded past the snapshot without one is still refused.
    drained = replay([_line("draining", {}), _line("failed", {"at": "draining"})])
    assert drained["gpu-a01"].snapshot_problem == "no snapshot line, yet its last stage was failed"
