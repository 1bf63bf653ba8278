"""The exit-code contract (docs/architecture.md "Contracts"): one combine() for every command that
holds several results; a definite failure (1) wins over missing evidence (3), a usage error (2) over
both. Each row names the command whose combination it pins."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from k3fleet import errors
from k3fleet.accept.result import ProbeResult, combined_exit_code
from k3fleet.audit.run import AuditResult
from k3fleet.audit.runner import PlayResult
from k3fleet.change.gate import NothingToChange
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, combine


@pytest.mark.parametrize(("codes", "want"), [
    ((), EXIT_INCOMPLETE),
    ((0,), 0),
    ((0, 0), 0),
    ((1, 3), 1),
    ((3, 1), 1),
    ((3, 0), 3),
    ((2, 1, 3), 2),
    (([0, 3], 1), 1),
    (([],), EXIT_INCOMPLETE),
])
def test_combine_table(codes: tuple[Any, ...], want: int) -> None:
    assert combine(*codes) == want


def test_combine_refuses_a_code_outside_the_contract() -> None:
    with pytest.raises(ValueError, match="not a k3fleet exit code"):
        combine(0, 4)


def test_one_owner_for_the_codes() -> None:
    # One way in: the codes and combine() come from contracts; errors maps exceptions onto them only.
    assert not {"EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INCOMPLETE", "combine"} & set(errors.__all__)
    assert errors.UsageError.exit_code == EXIT_USAGE and errors.IncompleteError.exit_code == EXIT_INCOMPLETE


def _audit(verdict_code: int, *, invalid: bool = False, interrupted: bool = False) -> AuditResult:
    play = PlayResult(playbook="audit.yml", status="successful", rc=0, interrupted=interrupted)
    return AuditResult(run_dir=SimpleNamespace(path=Path("runs/x")),  # type: ignore[arg-type]
                       verdict=SimpleNamespace(exit_code=verdict_code), hosts_with_facts=0, unreachable={},
                       invalid={"gpu-02": "facts did not validate"} if invalid else {}, play=play)


@pytest.mark.parametrize(("verdict_code", "invalid", "interrupted", "want"), [
    (EXIT_OK, False, False, EXIT_OK),
    (EXIT_OK, True, False, EXIT_INCOMPLETE),
    (EXIT_OK, False, True, EXIT_INCOMPLETE),
    # A failed check beside an invalid host is a known no-go (it used to exit 3).
    (EXIT_FAILED, True, False, EXIT_FAILED),
    # An interrupted play (Ctrl-C, SIGTERM, SIGHUP) is an interrupted run: its verdict rests on the
    # hosts that answered before the stop.
    (EXIT_FAILED, False, True, EXIT_INCOMPLETE),
    (EXIT_INCOMPLETE, True, True, EXIT_INCOMPLETE),
])
def test_audit_combines_verdict_and_evidence(verdict_code: int, invalid: bool, interrupted: bool, want: int) -> None:
    assert _audit(verdict_code, invalid=invalid, interrupted=interrupted).exit_code == want


def _probe(status: str) -> ProbeResult:
    return ProbeResult(probe="p", status=status, reason="r")  # type: ignore[arg-type]


@pytest.mark.parametrize(("statuses", "want"), [
    (["pass", "pass"], EXIT_OK),
    (["pass", "inconclusive"], EXIT_INCOMPLETE),
    (["error", "fail"], EXIT_FAILED),
    (["fail", "skipped", "pass"], EXIT_FAILED),
    ([], EXIT_INCOMPLETE),
])
def test_accept_all_combines_probes(statuses: list[str], want: int) -> None:
    assert combined_exit_code(_probe(s) for s in statuses) == want


@pytest.mark.parametrize(("blocked", "held", "want"), [
    (False, False, EXIT_OK), (True, False, EXIT_FAILED), (False, True, EXIT_INCOMPLETE), (True, True, EXIT_FAILED),
])
def test_change_gate_nothing_to_change(blocked: bool, held: bool, want: int) -> None:
    assert NothingToChange("m", blocked=blocked, held=held).exit_code == want


@pytest.mark.parametrize(("check", "want"), [
    ({"a": {"plan": []}, "b": {"plan": []}}, EXIT_OK),
    ({"a": {"plan": []}, "b": {"error": "unreachable: ssh timed out"}}, EXIT_INCOMPLETE),
    ({"a": {"error": "cannot plan: held package"}, "b": {"plan": []}}, EXIT_FAILED),
    # A known failure beside an unreachable host: 1, not 3.
    ({"a": {"error": "cannot plan: held package"}, "b": {"error": "unreachable: ssh timed out"}}, EXIT_FAILED),
])
def test_change_check_combines_hosts(tmp_path: Path, check: dict[str, dict[str, Any]], want: int) -> None:
    import json

    from k3fleet.change.night import ChangeResult, finish
    from k3fleet.evidence import RunDir

    rd = RunDir.create(tmp_path, "upgrade", ["k3fleet", "upgrade", "--check"])
    result = ChangeResult(run_dir=rd, change={"check": True}, play=None, check=check)
    finish(result, None)
    assert result.exit_code == want
    assert json.loads((rd.path / "run.json").read_text())["exit_code"] == want


# -- a usage error writes nothing ----------------------------------------------------------------


def test_discard_unstarted_removes_only_claims_without_evidence(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from k3fleet.evidence import RunDir, rundir
    from k3fleet.evidence.rundir import discard_unstarted

    # The claims are the process's: earlier tests in this worker (make test runs several files per worker)
    # leave theirs, so this test counts only its own.
    monkeypatch.setattr(rundir, "_CLAIMED", [])
    bare = RunDir.create(tmp_path / "runs", "audit", ["k3fleet", "audit"])
    started = RunDir.create(tmp_path / "runs", "audit", ["k3fleet", "audit"])
    started.write_json("run.json", {"status": "successful"})
    given = tmp_path / "given"
    given.mkdir()
    out = RunDir.create(tmp_path / "runs", "audit", ["k3fleet", "audit"], out=given)
    removed = discard_unstarted()
    assert sorted(removed) == sorted([bare.path, out.path])
    assert not bare.path.exists() and started.path.is_dir()
    # An --out the operator made is left in place, empty again.
    assert given.is_dir() and list(given.iterdir()) == []
    assert discard_unstarted() == []


@pytest.mark.parametrize("argv", [
    ["audit", "--lab", "--limit", "no-such-host"],
    ["audit", "-i", "{tmp}/missing.yml"],
    ["upgrade", "-i", "{tmp}/missing.yml", "--change-id", "CHG-1", "--operator", "alice"],
    ["rollback", "-i", "{tmp}/missing.yml", "--limit", "gpu-01"],
])
def test_a_usage_error_leaves_no_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    from k3fleet.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # No run directory; the change lock's state directory (runs/.k3fleet, taken before any journal
    # is read, docs/change-night.md "Lock") is not a run.
    left = [p.name for p in (tmp_path / "runs").iterdir()] if (tmp_path / "runs").exists() else []
    assert [n for n in left if n != ".k3fleet"] == []


def test_a_night_with_nothing_to_change_writes_its_records_through_their_models(tmp_path: Path) -> None:
    """change.json and run.json of a night over a done fleet: the models' dumps, read back by the change
    record and the run reader (exit 0; 1 with blocked hosts)."""
    from k3fleet.change.gate import UpgradeOptions
    from k3fleet.change.night import _nothing
    from k3fleet.change.record import ChangeRecord
    from k3fleet.evidence import RunDir, layout
    from k3fleet.evidence.reader import RunReader
    from k3fleet.models.evidence import RunRecord

    rd = RunDir.create(tmp_path, "change", ["k3fleet", "upgrade"], out=tmp_path / "run")
    opts = UpgradeOptions(inventory=tmp_path / "inv.yml", change_id="CHG-9", operator="alice")
    plan = {"target_branch": 580, "done": ["gpu-a01"], "blocked": [{"host": "gpu-a02", "reasons": ["busy"]}]}
    result = _nothing(rd, opts, "alice", plan, "580.95.05", {}, NothingToChange("m", blocked=True, held=False),
                      {"enabled": False})
    reader = RunReader(rd.path)
    change = reader.model(layout.CHANGE, ChangeRecord)
    assert (change.done, change.smoke is not None and change.smoke.enabled) == (["gpu-a01"], False)
    assert set(reader.object(layout.CHANGE)) == {"change_id", "operator", "target_version", "target_branch", "canary",
                                                 "waves", "check", "done", "blocked", "held", "smoke"}
    record = reader.model(layout.RUN, RunRecord)
    assert (record.status, record.exit_code, result.exit_code) == ("nothing_to_do", EXIT_FAILED, EXIT_FAILED)
