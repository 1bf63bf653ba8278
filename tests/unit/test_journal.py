"""The change journal: the k3fleet_journal module that writes it (tearing, slots), and its replay
on the controller; the gate's arithmetic (batches, max-unavailable, accepted findings).

Journal lines are k3fleet's own format, so the tests write them with the real module code
(append_line) rather than recorded output; a torn line is made the way a killed writer leaves
one, by cutting a real line short. The plan helpers are tested on the ChangePlan JSON shape the
audit writes.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_journal_format as fmt
from ansible_collections.k3fleet.gpu.plugins.modules import k3fleet_journal
from k3fleet.audit.runner import HostOutcome, PlayResult
from k3fleet.change import ChangeRecorder, check_reports, host_timings, plan_batches
from k3fleet.change.journal import (
    STAGES,
    mark_interrupted,
    read_journal,
    replay,
    replay_journal,
    resume_plan,
    rollback_targets,
    summarize,
)
from k3fleet.errors import UsageError

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
        fmt.append_line(str(path), entry)


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
        fmt.append_line(path, line(host, "snapshot", f"2026-01-01T00:00:{i:02d}Z", snapshot=big))


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


def tear(path: Path, keep: int) -> int:
    """Cut the journal's last line after ``keep`` bytes, as a writer killed mid-line leaves it;
    returns the byte offset where the torn line starts."""
    raw = path.read_bytes()
    start = raw.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(raw[:start + keep])
    return start


def test_torn_last_line_is_reported_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n1", "draining", "t2"),
                 line("n1", "drained", "t3")])
    offset = tear(path, 70)
    journal = read_journal(path)
    assert [e.stage for e in journal.entries] == ["snapshot", "draining"]
    assert [(u.offset, u.length, u.host, u.stage) for u in journal.unreadable] == [(offset, 70, "n1", None)]
    assert journal.problems == [f"{path}: byte {offset}: unterminated last line (the writer stopped mid-line) "
                                "(70 bytes, host n1)"]


def test_an_append_after_a_torn_line_starts_on_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n2", "snapshot", "t2", snapshot=SNAP)])
    offset = tear(path, 90)
    torn = fmt.append_line(str(path), line("n3", "snapshot", "t3", snapshot=SNAP))
    assert torn == {"offset": offset, "length": 90}
    journal = read_journal(path)
    # The line after the torn one is whole and counts; the torn one is named with its offset and host.
    assert [(e.host, e.stage) for e in journal.entries] == [("n1", "snapshot"), ("n3", "snapshot")]
    assert journal.entries[1].offset == offset + 91
    assert [(u.offset, u.host, u.stage) for u in journal.unreadable] == [(offset, "n2", "snapshot")]
    assert "torn line" in journal.unreadable[0].why
    # A host whose snapshot line is the torn one is refused, never "nothing changed".
    targets, skipped, refused = rollback_targets(replay_journal(journal), ["n1", "n2", "n3"], journal)
    assert [t.host for t in targets] == [] and set(skipped) == {"n1", "n3"}
    assert refused["n2"].startswith(f"its snapshot cannot be read (unreadable journal line at byte {offset}:")


def test_a_torn_line_merged_with_the_next_one_loses_neither(tmp_path: Path) -> None:
    # An older writer appended straight after a torn tail: both ended up on one line.
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP)])
    offset = tear(path, 120)
    with path.open("ab") as fh:
        fh.write((json.dumps(line("n1", "draining", "t2")) + "\n").encode())
    journal = read_journal(path)
    assert [e.stage for e in journal.entries] == ["draining"]
    assert journal.entries[0].offset == offset + 120
    assert [(u.offset, u.length, u.host, u.why) for u in journal.unreadable] == [
        (offset, 120, "n1", "torn line merged with the next one")]


def test_a_host_whose_last_stage_was_a_change_is_not_taken_for_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n1", "draining", "t2"),
                 line("n1", "upgrading", "t3")])
    raw = path.read_bytes().split(b"\n")
    # The snapshot line itself torn in the middle, the later lines whole.
    path.write_bytes(raw[0][:60] + b"\n" + b"\n".join(raw[1:]))
    journal = read_journal(path)
    h = replay_journal(journal)["n1"]
    assert h.snapshot is None and h.touched
    assert h.snapshot_problem is not None and "cannot be read" in h.snapshot_problem
    _, skipped, refused = rollback_targets(replay_journal(journal), ["n1"], journal)
    assert skipped == {} and "last readable stage upgrading" in refused["n1"]
    rp = resume_plan(replay_journal(journal), ["n1"], journal)
    assert rp.resume == [] and "cannot be read" in rp.refused["n1"]


def test_a_line_that_names_no_host_keeps_every_unknown_host_out(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", s, f"t{i}", **({"snapshot": SNAP} if s == "snapshot" else {}))
                 for i, s in enumerate(HAPPY)])
    with path.open("ab") as fh:
        fh.write(b'{"ts": "t9", "ru')
    journal = read_journal(path)
    assert journal.unattributed()
    targets, skipped, refused = rollback_targets(replay_journal(journal), ["n1", "n2"], journal)
    assert [t.host for t in targets] == ["n1"]
    assert "a line naming no host cannot be read" in refused["n2"] and not skipped
    rp = resume_plan(replay_journal(journal), ["n1", "n2"], journal)
    assert rp.done == ["n1"] and "naming no host" in rp.refused["n2"]


def test_bad_lines_are_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('not json\n{"ts": "t", "run": "R", "change_id": "C", "host": "h", "stage": "upgraded"}\n\n'
                    + json.dumps(line("h", "returned", "t9")) + "\n")
    journal = read_journal(path)
    assert [e.stage for e in journal.entries] == ["returned"]
    assert journal.problems[0] == f"{path}: byte 0: torn line (not a whole JSON object) (8 bytes)"
    assert journal.problems[1].startswith(f"{path}: byte 9: not a journal line: stage: Input should be")
    # A wrong-schema line is described by its real length, never "(0 bytes)".
    assert journal.problems[1].endswith("(75 bytes, host h)"), journal.problems[1]


HAPPY = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned"]


def test_missing_journal_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        read_journal(tmp_path / "nope.jsonl")


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
    from k3fleet.change.journal import JournalEntry

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
    write(path, [line("n1", "snapshot", "t1", snapshot=SNAP), line("n1", "draining", "t2"),
                 line("n1", "returned", "t3"), line("n2", "returned", "t4", detail={"noop": True}),
                 line("n4", "snapshot", "t5", snapshot=SNAP), line("n4", "draining", "t6"),
                 line("n4", "held", "t7", detail={"holder": "CHG-9"})])
    journal = read_journal(path)
    targets, skipped, refused = rollback_targets(replay_journal(journal), ["n1", "n2", "n3", "n4"], journal)
    assert [(t.host, t.change_id, t.run, t.snapshot) for t in targets] == [("n1", "CHG-1", "R1", SNAP)]
    assert skipped == {"n2": "no snapshot line (last stage returned): nothing was changed on it",
                       "n3": "not in the journal",
                       "n4": "held by change CHG-9 before anything changed on it"}
    assert refused == {}


# -- the slot gate (the journal module with gate) ---------------------------------------------------


GATE = {"max_unavailable": 2, "failure_budget": 0, "canary": "c", "wait_timeout": 0}


def slot(path: Path, host: str, gate: dict[str, Any] = GATE) -> tuple[bool, str]:
    granted, why, _torn, _waited, _line = fmt.take_slot(str(path), line(host, "snapshot", "t", snapshot=SNAP), gate)
    return granted, why


@pytest.mark.parametrize(
    ("history", "host", "gate", "granted", "why"),
    [
        ([], "a", GATE, True, "1 of 2 node(s) out of service"),
        ([("b", "snapshot"), ("b", "drained")], "a", GATE, True, "2 of 2 node(s) out of service"),
        # Both slots taken by hosts still moving: wait (here no time to wait, so refused with why).
        ([("b", "upgrading"), ("d", "rebooting")], "a", GATE, False,
         "max-unavailable 2 reached (b, d): no slot within 0s"),
        # A host that returned gives its slot back; one rolled back and left drained keeps it.
        ([("b", "upgrading"), ("d", "returned")], "a", GATE, True, "2 of 2 node(s) out of service"),
        ([("b", "rolled_back")], "a", dict(GATE, max_unavailable=1, failure_budget=5), False,
         "max-unavailable 1 reached by node(s) left out of service: b"),
        # A host that failed is still rolling back: wait for it, do not give up.
        ([("b", "failed")], "a", dict(GATE, max_unavailable=1, failure_budget=5), False,
         "max-unavailable 1 reached (b): no slot within 0s"),
        ([("b", "failed"), ("b", "failed_rollback")], "a", dict(GATE, max_unavailable=1, failure_budget=5), False,
         "max-unavailable 1 reached by node(s) left out of service: b"),
        ([("b", "upgrading"), ("b", "failed")], "a", GATE, False,
         "failure budget spent: 1 host(s) failed (b), budget 0"),
        ([("b", "upgrading"), ("b", "failed")], "a", dict(GATE, failure_budget=1), True,
         "2 of 2 node(s) out of service"),
        ([("c", "failed")], "a", dict(GATE, failure_budget=3), False, "the canary c failed: the waves stop"),
        # A resumed host is out already: no new slot needed.
        ([("a", "upgrading"), ("b", "upgrading"), ("d", "upgrading")], "a", GATE, True,
         "already out of service for this change (upgrading)"),
        # Lines of another change id do not count.
        ([("b", "upgrading"), ("d", "upgrading")], "a", dict(GATE, max_unavailable=2), True,
         "1 of 2 node(s) out of service"),
    ],
)
def test_slot_gate(tmp_path: Path, history: list[tuple[str, str]], host: str, gate: dict[str, Any],
                   granted: bool, why: str) -> None:
    path = tmp_path / "journal.jsonl"
    other = why == "1 of 2 node(s) out of service" and history
    details = {"rolled_back": {"left_drained": True}, "failed_rollback": {"at": "rollback"}}
    write(path, [dict(line(h, st.replace("failed_rollback", "failed"), f"t{i}", detail=details.get(st, {})),
                      change_id="CHG-OTHER" if other else "CHG-1") for i, (h, st) in enumerate(history)])
    size = path.stat().st_size if path.exists() else 0
    assert slot(path, host, gate) == (granted, why)
    written = read_journal(path).entries[len(history):] if path.exists() else []
    if granted:
        assert [(e.host, e.stage) for e in written] == [(host, "snapshot")]
        assert written[0].detail["slot"]["max_unavailable"] == gate["max_unavailable"]
    else:
        assert (path.stat().st_size if path.exists() else 0) == size


def test_slot_gate_counts_a_torn_line_as_out(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("b", "snapshot", "t1", snapshot=SNAP), line("b", "returned", "t2")])
    with path.open("ab") as fh:
        fh.write(json.dumps(line("d", "draining", "t3")).encode()[:80])
    assert slot(path, "a", dict(GATE, max_unavailable=1)) == (
        False, "max-unavailable 1 reached by node(s) left out of service: d")


def _taker(path: str, host: str, gate: dict[str, Any]) -> None:
    fmt.take_slot(path, line(host, "snapshot", "t", snapshot=SNAP), gate)


def test_concurrent_hosts_never_take_more_slots_than_allowed(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.jsonl")
    gate = dict(GATE, max_unavailable=3, canary=None)
    procs = [multiprocessing.Process(target=_taker, args=(path, f"h{i}", gate)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    entries = read_journal(Path(path)).entries
    assert len(entries) == 3
    assert sorted(len(e.detail["slot"]["out"]) for e in entries) == [1, 2, 3]


def test_module_with_gate_reports_a_refused_slot(patched_exits: None, tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("b", "failed", "t1")])
    res = journal_module({"path": str(path), "run": "R1", "change_id": "CHG-1", "host": "a", "stage": "snapshot",
                          "snapshot": SNAP, "gate": GATE})
    k = res["k3fleet"]
    assert (k["granted"], k["written"], res["changed"]) == (False, False, False)
    assert k["why"] == "failure budget spent: 1 host(s) failed (b), budget 0"
    assert "ansible_facts" not in res
    with patch_module_args({"path": str(path), "run": "R", "change_id": "C", "host": "h", "stage": "snapshot",
                            "gate": {"max_unavailable": 0}}), pytest.raises(FailJson) as exc:
        k3fleet_journal.main()
    assert "max_unavailable must be at least 1" in exc.value.args[0]["msg"]


def test_module_terminates_a_torn_tail_and_says_where(patched_exits: None, tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("b", "snapshot", "t1", snapshot=SNAP), line("b", "draining", "t2")])
    offset = tear(path, 50)
    res = journal_module({"path": str(path), "run": "R1", "change_id": "CHG-1", "host": "b", "stage": "draining"})
    assert res["k3fleet"]["torn_tail"] == {"offset": offset, "length": 50}
    assert [e.stage for e in read_journal(path).entries] == ["snapshot", "draining"]


# -- the gate's arithmetic ------------------------------------------------------------------------------


PLAN = {
    "target_branch": 580, "target_version": "580.95.05",
    "needs_upgrade": [{"host": h} for h in ("a", "b", "c", "d", "e")],
    "blocked": [{"host": "e", "reasons": ["dkms build missing"]}],
    "done": ["z"], "canary": {"host": "b"}, "waves": [["a"], ["c", "b"]], "wave_size": 2,
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


def test_accepted_findings_clear_blocked_hosts_into_waves_of_the_plans_size() -> None:
    hosts = ("a", "b", "c", "d", "e", "f", "g")
    plan = dict(PLAN, needs_upgrade=[{"host": h} for h in hosts], waves=[["c", "d"]],
                blocked=[{"host": h, "check_ids": ["rdma.rail_count", "container.runtime"], "reasons": []}
                         for h in ("e", "f", "g")]
                + [{"host": "a", "check_ids": ["rdma.rail_count", "packages.dkms"], "reasons": ["dkms"]}])
    from k3fleet.change import accepted_blocked

    assert accepted_blocked(plan, ["rdma.*", "container.*"]) == ["e", "f", "g"]
    assert accepted_blocked(plan, ["rdma.*"]) == []
    # Not one final batch of any size: waves of the plan's size (2).
    assert plan_batches(plan, "e", True, ["rdma.*", "container.*"]) == ("e", [["c", "d"], ["b", "f"], ["g"]])
    assert plan_batches(plan, None, True, ["rdma.*", "container.*"]) == ("b", [["c", "d"], ["e", "f"], ["g"]])
    with pytest.raises(UsageError, match="--canary a is blocked by the audit: dkms"):
        plan_batches(plan, "a", True, ["rdma.*", "container.*"])


def test_hosts_another_change_holds_are_left_out() -> None:
    assert plan_batches(PLAN, None, True, held={"c": "CHG-9"}) == ("b", [["a"], ["d"]])
    with pytest.raises(UsageError, match="--canary a is held by change CHG-9"):
        plan_batches(PLAN, "a", True, held={"a": "CHG-9"})
    with pytest.raises(UsageError, match="the audit's canary b is held by change CHG-9"):
        plan_batches(PLAN, None, True, held={"b": "CHG-9"})


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


@pytest.mark.parametrize(
    ("value", "fleet", "batches", "expected"),
    [
        (None, 40, [1, 4, 4], 4),
        ("2", 40, [1, 4, 4], 2),
        ("10%", 40, [1, 4, 4], 4),
        ("10%", 45, [1, 4, 4], 4),  # rounded down, as Kubernetes' maxUnavailable
        ("2.5%", 200, [1], 5),
        ("100%", 3, [1, 2], 3),
    ],
)
def test_max_unavailable(value: str | None, fleet: int, batches: list[int], expected: int) -> None:
    from k3fleet.change import check_max_unavailable, resolve_max_unavailable

    assert resolve_max_unavailable(check_max_unavailable(value), fleet, batches) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("0", "give a number of nodes"), ("-1", "give a number"), ("abc", "give a number"), ("101%", "give a number"),
    ("0%", "give a number"), ("5 %", "give a number"),
])
def test_max_unavailable_refused(value: str, message: str) -> None:
    from k3fleet.change import check_max_unavailable

    with pytest.raises(UsageError, match=message):
        check_max_unavailable(value)


def test_max_unavailable_that_rounds_to_nothing_is_refused() -> None:
    from k3fleet.change import resolve_max_unavailable

    with pytest.raises(UsageError, match="--max-unavailable 5% of 10 host\\(s\\) is 0 nodes"):
        resolve_max_unavailable("5%", 10, [1, 2])


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (["*"], "would accept every finding"),
        (["*.*"], "would accept every finding"),
        ([""], "would accept every finding"),
        (["rdma.nope"], "'rdma.nope' matches no known check"),
        (["rdma.rail_count", "gpu*"], None),
    ],
)
def test_accept_patterns_must_name_known_checks(patterns: list[str], message: str | None) -> None:
    from k3fleet.change import check_accept_patterns

    known = ["rdma.rail_count", "rdma.port_state", "gpu.count", "container.runtime"]
    if message is None:
        assert check_accept_patterns(patterns, known) == patterns
    else:
        with pytest.raises(UsageError, match=message):
            check_accept_patterns(patterns, known)


def test_accept_patterns_must_match_a_finding() -> None:
    from k3fleet.change import check_accept_found

    check_accept_found(["rdma.*"], ["rdma.rail_count", "gpu.count"], "the audit")
    with pytest.raises(UsageError, match=re.escape("--accept-finding 'container.*' matches no finding of the audit")):
        check_accept_found(["rdma.*", "container.*"], ["rdma.rail_count"], "the audit")


# -- timings and the recorder -----------------------------------------------------------------------


def test_host_timings_key_on_journal_stages(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("n1", "snapshot", "2026-11-29T21:00:00.000Z"),
                 line("n1", "draining", "2026-11-29T21:00:01.000Z"),
                 line("n1", "drained", "2026-11-29T21:00:32.000Z", detail={"waited_s": 30.0}),
                 line("n1", "upgrading", "2026-11-29T21:00:33.000Z"),
                 line("n1", "rebooting", "2026-11-29T21:00:53.000Z"),
                 line("n1", "verifying", "2026-11-29T21:01:33.000Z"),
                 line("n1", "returned", "2026-11-29T21:02:00.000Z")])
    h = replay(read_journal(path).entries)["n1"]
    t = host_timings(h)
    assert t["wall_s"] == 120.0
    assert t["external_s"] == {"drain_wait": 30.0, "package_manager": 20.0, "reboot": 40.0}
    assert (t["tool_s"], t["tool_share"]) == (30.0, 0.25)
    assert t["stages_s"] == {"snapshot": 1.0, "draining": 31.0, "drained": 1.0, "upgrading": 20.0,
                             "rebooting": 40.0, "verifying": 27.0}
    assert host_timings(h, (1000.0, 1150.0))["wall_s"] == 150.0


def test_recorder_keeps_lines_slots_and_spans() -> None:
    rec = ChangeRecorder()
    rec.host_done(HostOutcome("n1", "ok", task="Journal the drain", duration_s=0.1,
                              result={"k3fleet": {"line": {"host": "n1", "stage": "draining"}, "written": True,
                                                  "granted": True}}))
    rec.host_done(HostOutcome("n2", "ok", task="Take a slot", duration_s=0.1,
                              result={"k3fleet": {"line": {"host": "n2", "stage": "snapshot"}, "written": False,
                                                  "granted": False, "why": "failure budget spent"}}))
    rec.host_done(HostOutcome("n1", "ok", task="Slurm: make the node drained", duration_s=12.0,
                              result={"k3fleet": {"waited_s": 11.5, "decision": "drain"}}))
    assert rec.stages == [("n1", "draining")]
    assert rec.gate == {"n2": "failure budget spent"}
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


# -- a signal stops the play (docs/change-night.md "Interrupted") ------------------------------------


def test_an_interruption_is_journaled_at_each_half_way_hosts_stage(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    write(path, [line("done", s, f"2026-12-05T01:00:0{i}.000Z") for i, s in enumerate(HAPPY)]
          + [line("w1", "snapshot", "2026-12-05T01:01:00.000Z", snapshot=SNAP),
             line("w1", "draining", "2026-12-05T01:01:01.000Z"),
             line("w1", "drained", "2026-12-05T01:01:02.000Z", detail={"drained_by_us": True}),
             line("w1", "upgrading", "2026-12-05T01:01:03.000Z"),
             line("w2", "snapshot", "2026-12-05T01:01:04.000Z", snapshot=SNAP)])
    before = path.read_bytes()
    marks = mark_interrupted(path, replay_journal(read_journal(path)), ["done", "w1", "w2", "w3"], run="R1",
                             signal="SIGTERM", during="change night", next_step="k3fleet upgrade --resume R1",
                             now="2026-12-05T01:01:05.000Z")
    # Appended through the journal's writer: the lines before stay byte for byte.
    assert path.read_bytes().startswith(before)
    assert [(m["host"], m["stage"]) for m in marks] == [("w1", "upgrading"), ("w2", "snapshot")]
    journal = read_journal(path)
    histories = replay_journal(journal)
    # The history is what it was: same stage, outcome, snapshot, drain owner; resume and rollback agree.
    assert histories["w1"].stage == "upgrading" and histories["w1"].outcome == "in_progress"
    assert histories["w1"].drained_by_us is True and histories["w1"].snapshot == SNAP
    assert [e.stage for e in histories["w1"].entries] == ["snapshot", "draining", "drained", "upgrading"]
    rp = resume_plan(histories, ["done", "w1", "w2", "w3"], journal)
    assert (rp.done, rp.resume, rp.pending) == (["done"], ["w1", "w2"], ["w3"])
    targets, _skipped, _refused = rollback_targets(histories, ["w1"], journal)
    assert [(t.host, t.stage) for t in targets] == [("w1", "upgrading")]
    row = summarize(histories)["w1"]
    assert row["interrupted"] == {"stage": "upgrading", "ts": "2026-12-05T01:01:05.000Z", "signal": "SIGTERM",
                                  "during": "change night", "next": "k3fleet upgrade --resume R1"}
    assert "interrupted" not in summarize(histories)["done"]
    # The slot gate counts the interrupted hosts as they were: still out of service.
    out, failed = fmt.slot_state(path.read_bytes(), "CHG-1")
    assert out == {"w1": "upgrading", "w2": "snapshot"} and failed == []
    # A later line of the host (the resume going on) ends the interruption.
    write(path, [line("w1", "rebooting", "2026-12-05T01:02:00.000Z")])
    assert "interrupted" not in summarize(replay_journal(read_journal(path)))["w1"]
