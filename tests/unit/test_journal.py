"""The change journal: the k3fleet_journal module that writes it, and its replay on the controller.

Journal lines are k3fleet's own format, so the tests write them with the real module code
(append_line) rather than recorded output. The plan helpers are tested on the ChangePlan JSON
shape the audit writes.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson

from k3fleet.ansible.modules import k3fleet_journal
from k3fleet.change import ChangeRecorder, TaskTime, check_reports, host_timings, plan_batches
from k3fleet.errors import UsageError
from k3fleet.journal import (
    STAGES,
    read_journal,
    replay,
    resume_plan,
    rollback_targets,
    summarize,
)
from k3fleet.runner import HostOutcome, PlayResult

SNAP = {"manager": "dpkg", "packages": [
    {"name": "nvidia-driver-575-server", "version": "575.57.08-0ubuntu1", "held": True, "branch": "575"}],
    "driver": {"loaded_version": "575.57.08"}}


def journal_module(args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    with patch_module_args(dict(args, _ansible_check_mode=check)), pytest.raises(ExitJson) as exc:
        k3fleet_journal.main()
    return exc.value.args[0]


def line(host: str, stage: str, ts: str, **kw: Any) -> dict[str, Any]:
    return {"ts": ts, "run": "R1", "change_id": "CHG-1", "host": host, "stage": stage, "detail": {}, **kw}


def write(path: Path, lines: list[dict[str, Any]]) -> None:
    for entry in lines:
        k3fleet_journal.append_line(str(path), entry)


# -- the module ---------------------------------------------------------------------------------


def test_module_appends_one_line_and_sets_the_stage(patched_exits: None, tmp_path: Path) -> None:
    path = tmp_path / "run" / "journal.jsonl"
    args = {"path": str(path), "run": "R1", "change_id": "CHG-1", "host": "n1", "stage": "snapshot",
            "snapshot": SNAP, "detail": {"plan": {"reboot": True}}}
    res = journal_module(args)
    assert res["changed"] is True and res["ansible_facts"] == {"k3fleet_stage": "snapshot"}
    res = journal_module(dict(args, stage="draining", snapshot=None, detail="by hand"))
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["snapshot", "draining"]
    assert rows[0]["snapshot"] == SNAP and "snapshot" not in rows[1] and rows[1]["detail"] == "by hand"
    assert rows[0]["ts"].endswith("Z") and rows[0]["ts"] <= rows[1]["ts"]


def test_module_check_mode_writes_nothing(patched_exits: None, tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    res = journal_module({"path": str(path), "run": "R1", "change_id": "C", "host": "n1", "stage": "failed"},
                         check=True)
    assert res["changed"] is False and res["k3fleet"]["written"] is False
    assert res["ansible_facts"] == {"k3fleet_stage": "failed"}
    assert not path.exists()


def test_module_refuses_an_unknown_stage(patched_exits: None, tmp_path: Path) -> None:
    with patch_module_args({"path": str(tmp_path / "j"), "run": "R", "change_id": "C", "host": "h",
                            "stage": "upgraded"}), pytest.raises(FailJson) as exc:
        k3fleet_journal.main()
    assert "value of stage must be one of" in exc.value.args[0]["msg"]


def test_module_reports_an_unwritable_journal(patched_exits: None, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with patch_module_args({"path": str(blocker / "journal.jsonl"), "run": "R", "change_id": "C", "host": "h",
                            "stage": "draining"}), pytest.raises(FailJson) as exc:
        k3fleet_journal.main()
    assert exc.value.args[0]["msg"].startswith(f"cannot append stage draining of host h to journal {blocker}")


def _writer(path: str, host: str, n: int) -> None:
    big = {"packages": [{"name": f"pkg-{i}", "version": "1.0-" + "x" * 200} for i in range(40)]}
    for i in range(n):
        k3fleet_journal.append_line(path, line(host, "snapshot", f"2026-01-01T00:00:{i:02d}Z", snapshot=big))


def test_concurrent_writers_leave_whole_lines(tmp_path: Path) -> None:
    # Forks journal different hosts at once; each line is larger than PIPE_BUF.
    path = str(tmp_path / "journal.jsonl")
    procs = [multiprocessing.Process(target=_writer, args=(path, f"n{i}", 15)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    journal = read_journal(Path(path))
    assert journal.problems == []
    assert sorted({e.host for e in journal.entries}) == ["n0", "n1", "n2", "n3"]
    assert len(journal.entries) == 60


# -- reading and replay -----------------------------------------------------------------------------


def test_truncated_last_line_is_a_problem_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n1", "draining", "t2")])
    with path.open("a") as fh:
        fh.write('{"ts": "t3", "run": "R1", "change_id": "CHG-1", "host": "n1", "stage": "dra')
    journal = read_journal(path)
    assert [e.stage for e in journal.entries] == ["snapshot", "draining"]
    assert journal.problems == [f"{path}:3: truncated last line (the writer was killed mid-line)"]


def test_bad_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('not json\n{"ts": "t", "run": "R", "change_id": "C", "host": "h", "stage": "upgraded"}\n\n'
                    + json.dumps(line("h", "returned", "t9")) + "\n")
    journal = read_journal(path)
    assert [e.stage for e in journal.entries] == ["returned"]
    assert journal.problems[0].startswith(f"{path}:1: not JSON")
    assert journal.problems[1].startswith(f"{path}:2: stage: Input should be")


def test_missing_journal_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_journal(tmp_path / "nope.jsonl")


HAPPY = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned"]


@pytest.mark.parametrize(
    ("stages", "outcome", "touched"),
    [
        (HAPPY, "upgraded", True),
        (HAPPY[:4], "in_progress", True),
        (HAPPY[:3], "in_progress", False),
        (["snapshot", "draining", "drained", "upgrading", "failed", "rolled_back"], "rolled_back", True),
        (["snapshot", "draining", "failed"], "failed", False),
        ([*HAPPY, "draining", "drained", "upgrading", "rolled_back", "returned"], "rolled_back", True),
        ([], "not_started", False),
    ],
)
def test_outcome_per_history(stages: list[str], outcome: str, touched: bool) -> None:
    assert set(stages) <= set(STAGES)
    h = replay([read_line(line("n1", s, f"t{i}")) for i, s in enumerate(stages)]).get("n1")
    if not stages:
        assert h is None
        return
    assert h is not None
    assert (h.outcome, h.touched) == (outcome, touched)


def read_line(data: dict[str, Any]) -> Any:
    from k3fleet.journal import JournalEntry

    return JournalEntry.model_validate(data)


def test_history_keeps_the_first_snapshot_and_the_drain_owner(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    later = dict(SNAP, driver={"loaded_version": "580.95.05"})
    write(path, [
        line("n1", "snapshot", "t1", snapshot=SNAP),
        line("n1", "draining", "t2"),
        line("n1", "drained", "t3", detail={"drained_by_us": False, "decision": "other"}),
        line("n1", "snapshot", "t4", snapshot=later),  # a resumed night must not trust this one
        line("n1", "upgrading", "t5"),
        line("n1", "failed", "t6", detail={"task": "Check Fabric Manager", "msg": "unit failed"}),
    ])
    h = replay(read_journal(path).entries)["n1"]
    assert h.snapshot == SNAP
    assert h.drained_by_us is False
    assert h.failure == "Check Fabric Manager: unit failed"
    assert summarize({"n1": h})["n1"]["stages"] == ["snapshot", "draining", "drained", "snapshot", "upgrading",
                                                   "failed"]


def test_resume_plan_continues_only_what_is_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("canary", s, f"t{i}") for i, s in enumerate(HAPPY)]
          + [line("w1", "snapshot", "t10", snapshot=SNAP), line("w1", "draining", "t11"),
             line("w1", "drained", "t12", detail={"drained_by_us": True}), line("w1", "upgrading", "t13")])
    rp = resume_plan(replay(read_journal(path).entries), ["canary", "w1", "w2"])
    assert (rp.done, rp.resume, rp.pending, rp.failed) == (["canary"], ["w1"], ["w2"], {})
    assert rp.snapshots == {"w1": SNAP}
    assert rp.todo == ["w1", "w2"]


def test_resume_plan_stops_at_a_failed_host(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("canary", "snapshot", "t1", snapshot=SNAP),
                 line("canary", "failed", "t2", detail={"task": "Verify", "msg": "FM inactive"}),
                 line("canary", "rolled_back", "t3")])
    rp = resume_plan(replay(read_journal(path).entries), ["canary", "w1"])
    assert rp.failed == {"canary": "Verify: FM inactive"} and rp.pending == ["w1"]


def test_rollback_targets_need_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n1", "returned", "t2"),
                 line("n2", "returned", "t3", detail={"noop": True})])
    targets, skipped = rollback_targets(replay(read_journal(path).entries), ["n1", "n2", "n3"])
    assert [(t.host, t.change_id, t.run, t.snapshot) for t in targets] == [("n1", "CHG-1", "R1", SNAP)]
    assert skipped == {"n2": "no snapshot line (last stage returned): nothing was changed on it",
                       "n3": "not in the journal"}


# -- the flow's helpers -----------------------------------------------------------------------------


PLAN = {
    "target_branch": 580, "target_version": "580.95.05",
    "needs_upgrade": [{"host": h} for h in ("a", "b", "c", "d", "e")],
    "blocked": [{"host": "e", "reasons": ["dkms build missing"]}],
    "done": ["z"], "canary": {"host": "b"}, "waves": [["a"], ["c", "b"]],
}


@pytest.mark.parametrize(
    ("canary", "waves", "expected"),
    [
        (None, False, ("b", [])),
        (None, True, ("b", [["a"], ["c"], ["d"]])),
        ("a", True, ("a", [["c", "b"], ["d"]])),
    ],
)
def test_plan_batches(canary: str | None, waves: bool, expected: tuple[str, list[list[str]]]) -> None:
    assert plan_batches(PLAN, canary, waves) == expected


def test_accepted_findings_clear_a_blocked_host() -> None:
    plan = dict(PLAN, blocked=[{"host": "e", "check_ids": ["rdma.rail_count", "container.runtime"], "reasons": []},
                               {"host": "d", "check_ids": ["rdma.rail_count", "packages.dkms"], "reasons": ["dkms"]}])
    from k3fleet.change import accepted_blocked

    assert accepted_blocked(plan, ["rdma.*", "container.*"]) == ["e"]
    assert accepted_blocked(plan, ["rdma.*"]) == []
    assert plan_batches(plan, "e", True, ["rdma.*", "container.*"]) == ("e", [["a"], ["c", "b"]])
    with pytest.raises(UsageError, match="--canary d is blocked by the audit: dkms"):
        plan_batches(plan, "d", True, ["rdma.*", "container.*"])


@pytest.mark.parametrize(
    ("plan", "canary", "message"),
    [
        (PLAN, "e", "--canary e is blocked by the audit: dkms build missing"),
        (PLAN, "z", "--canary z is not a host the audit plans to upgrade"),
        (dict(PLAN, canary=None, canary_note="no idle host"), None, "no canary: no idle host"),
        (dict(PLAN, needs_upgrade=[{"host": "e"}]), None, "nothing to change: no host is cleared for R580"),
    ],
)
def test_plan_batches_refuses(plan: dict[str, Any], canary: str | None, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan_batches(plan, canary, True)


def test_host_timings_split_tool_from_waiting(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "2026-11-29T21:00:00.000Z"),
                 line("n1", "returned", "2026-11-29T21:02:00.000Z")])
    h = replay(read_journal(path).entries)["n1"]
    tasks = [TaskTime("Slurm: drained node node01", "ok", 31.0, waited_s=30.0),
             TaskTime("Install the driver and Fabric Manager at exactly the target version", "ok", 20.0),
             TaskTime("Reboot the node into the new driver", "ok", 40.0),
             TaskTime("Read Fabric Manager until it has settled", "ok", 10.0),
             TaskTime("Journal the drain", "ok", 0.2)]
    t = host_timings(h, tasks)
    assert t["wall_s"] == 120.0
    assert t["external_s"] == {"drain_wait": 30.0, "package_manager": 20.0, "reboot": 40.0,
                               "fabricmanager_start": 10.0}
    assert (t["tool_s"], t["tool_share"]) == (20.0, 0.167)


def test_recorder_keeps_stages_and_waits() -> None:
    rec = ChangeRecorder()
    rec.host_done(HostOutcome("n1", "ok", task="Journal the drain", duration_s=0.1,
                              result={"k3fleet": {"line": {"stage": "draining"}, "written": True}}))
    rec.host_done(HostOutcome("n1", "ok", task="Slurm: drained node node01", duration_s=12.0,
                              result={"k3fleet": {"waited_s": 11.5, "decision": "drain"}}))
    assert rec.stages == [("n1", "draining")]
    assert rec.tasks["n1"][1].waited_s == 11.5
    start, end = rec.span["n1"]
    assert 12.0 <= end - start < 13.0  # the 12 s task started before the first one ended


def test_check_reports_from_play_results() -> None:
    play = PlayResult(playbook="change_night.yml", status="failed", rc=2)
    report = {"host": "a", "drain": {"actions": ["scontrol update ..."]}, "plan": {"reboot": True}, "transaction": []}
    play.hosts = {
        "a": [HostOutcome("a", "ok", task="Say what the night would do on the node", result={"k3fleet": {
            "check": report}})],
        "b": [HostOutcome("b", "ok", task="Leave a node that needs nothing")],
        "c": [HostOutcome("c", "failed", task="Simulate the package transaction", message="E: Unable to locate"),
              HostOutcome("c", "failed", task="Stop the node here", message="c: the change failed")],
    }
    out = check_reports(play, ["a", "b", "c", "d"])
    assert out["a"] == report
    assert out["b"]["noop"] is True
    assert out["c"] == {"error": "failed: Simulate the package transaction: E: Unable to locate"}
    assert out["d"] == {"error": "not reached: -: no message"}
