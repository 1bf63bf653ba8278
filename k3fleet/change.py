"""The change night, its resume, and the rollback (docs/architecture.md "Flows").

``run_upgrade``: a fresh audit gates the night (or, with ``resume``, the run's journal says
what is left) -> playbooks/change_night.yml with the canary as its first batch and the waves
after it -> the journal, replayed per host, says what happened -> run directory.
``run_rollback``: a run's journal (or the newest journal that touched the hosts) ->
playbooks/rollback.yml -> the same journal, now with the rollback's lines.

Everything a host went through is in the run directory's ``journal.jsonl``; ``run.json``
sums it up per host with timings, and ``check.json`` holds what ``--check`` would do.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, UsageError
from k3fleet.evidence import RunDir
from k3fleet.inventory import inventory_hosts, refuse_simulated
from k3fleet.journal import (
    JOURNAL_FILE,
    HostHistory,
    JournalEntry,
    read_journal,
    replay,
    resume_plan,
    rollback_targets,
    summarize,
)
from k3fleet.runner import HostOutcome, Observer, PlayResult, run_playbook

CHANGE_FILE = "change.json"
CHANGE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SCHEDULERS = ("slurm", "kubernetes", "manual", "none")
FLAVOURS = ("auto", "open", "proprietary")

# Where a host's wall time goes besides k3fleet itself, by the task names of the roles.
_EXTERNAL_TASKS: dict[str, frozenset[str]] = {
    "package_manager": frozenset({
        "Finish a dpkg run that was interrupted",
        "Release the holds on the NVIDIA packages that change",
        "Remove the packages of the other driver branch",
        "Install the driver and Fabric Manager at exactly the target version",
        "Hold the driver and Fabric Manager packages",
        "Release every hold on the driver packages that change",
        "Remove the packages the snapshot did not have",
        "Install the snapshot's exact package versions",
        "Hold the packages the snapshot held (apt)",
    }),
    "reboot": frozenset({"Reboot the node into the new driver", "Reboot into the snapshot's driver"}),
    "fabricmanager_start": frozenset({"Read Fabric Manager until it has settled"}),
}


def validate_change_id(change_id: str) -> str:
    import re

    cid = (change_id or "").strip()
    if not re.match(CHANGE_ID_PATTERN, cid):
        raise UsageError(f"--change-id {change_id!r} is not valid: letters, digits, '.', '_' and '-', "
                         "at most 64 characters, starting with a letter or digit (it goes into drain reasons)")
    return cid


def validate_operator(operator: str) -> str:
    name = (operator or "").strip()
    if not name or any(ch in name for ch in "\n\r\t") or len(name) > 64:
        raise UsageError(f"--operator {operator!r} is not valid: give who runs the change (one line, at most 64 "
                         "characters)")
    return name


# -- observing the play ----------------------------------------------------------------------


@dataclass
class TaskTime:
    task: str
    status: str
    duration_s: float
    waited_s: float = 0.0


class ChangeRecorder(Observer):
    """Passes events on to the display observer and keeps per-host task timings and journal stages."""

    def __init__(self, inner: Observer | None = None) -> None:
        self.inner = inner or Observer()
        self.tasks: dict[str, list[TaskTime]] = {}
        self.stages: list[tuple[str, str]] = []
        # Wall-clock span of each host's tasks: first start to last end (events arrive as tasks end).
        self.span: dict[str, tuple[float, float]] = {}

    def play_started(self, playbook: str, hosts: int | None) -> None:
        self.inner.play_started(playbook, hosts)

    def host_done(self, outcome: HostOutcome) -> None:
        res = outcome.result or {}
        raw = res.get("k3fleet")
        k3: dict[str, Any] = raw if isinstance(raw, dict) else {}
        waited = float(k3.get("waited_s") or 0.0) if "waited_s" in k3 else 0.0
        duration = float(outcome.duration_s or 0.0)
        self.tasks.setdefault(outcome.host, []).append(TaskTime(outcome.task or "", outcome.status, duration, waited))
        now = time.time()
        first, _ = self.span.get(outcome.host, (now - duration, now))
        self.span[outcome.host] = (min(first, now - duration), now)
        line = k3.get("line") if isinstance(k3.get("line"), dict) else None
        if line and k3.get("written"):
            self.stages.append((outcome.host, str(line.get("stage"))))
        self.inner.host_done(outcome)

    def play_finished(self, result: PlayResult) -> None:
        self.inner.play_finished(result)


def _ts(text: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def host_timings(history: HostHistory, tasks: Sequence[TaskTime],
                 span: tuple[float, float] | None = None) -> dict[str, Any]:
    """Wall time of one host (its first task's start to its last task's end, else first to last
    journal line) and how much of it k3fleet itself spent.

    External: waiting for jobs to leave the node, the package manager, the reboot, and Fabric
    Manager starting. The rest is the tool: Ansible, SSH round trips, collectors, journal.
    """
    if span is not None:
        wall = max(0.0, span[1] - span[0])
    else:
        first = _ts(history.entries[0].ts) if history.entries else None
        last = _ts(history.entries[-1].ts) if history.entries else None
        wall = (last - first).total_seconds() if first and last else 0.0
    external: dict[str, float] = {"drain_wait": 0.0}
    for key, names in _EXTERNAL_TASKS.items():
        external[key] = round(sum(t.duration_s for t in tasks if t.task in names), 2)
    external["drain_wait"] = round(sum(t.waited_s for t in tasks), 2)
    outside = sum(external.values())
    tool = max(0.0, wall - outside)
    return {
        "wall_s": round(wall, 2),
        "external_s": external,
        "tool_s": round(tool, 2),
        "tool_share": round(tool / wall, 3) if wall > 0 else None,
    }


# -- upgrade ---------------------------------------------------------------------------------


@dataclass
class UpgradeOptions:
    inventory: Path
    change_id: str
    operator: str
    canary: str | None = None
    waves: bool = False
    check: bool = False
    resume: Path | None = None
    target_version: str | None = None
    flavour: str = "auto"
    limit: str | None = None
    forks: int = 20
    failure_budget: int = 0
    drain_timeout: int = 3600
    force: bool = False
    audit_max_age: int = 3600
    target: Path | None = None
    accept_findings: list[str] = field(default_factory=list)
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    out: Path | None = None


@dataclass
class ChangeResult:
    run_dir: RunDir
    change: dict[str, Any]
    play: PlayResult | None
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    exit_code: int = EXIT_OK
    message: str = ""


class NothingToChange(UsageError):
    """The audit cleared no host: all are on the target (exit 0) or the rest are blocked (exit 1)."""

    def __init__(self, message: str, blocked: bool) -> None:
        super().__init__(message)
        self.exit_code = EXIT_FAILED if blocked else EXIT_OK


def accepted_blocked(plan: Mapping[str, Any], accept: Sequence[str]) -> list[str]:
    """Blocked hosts whose every blocking check id matches one of the operator's ``accept`` patterns."""
    import fnmatch

    return [b["host"] for b in plan.get("blocked") or []
            if b.get("check_ids") and all(any(fnmatch.fnmatchcase(c, p) for p in accept) for c in b["check_ids"])]


def plan_batches(plan: Mapping[str, Any], canary: str | None, waves: bool,
                 accept: Sequence[str] = ()) -> tuple[str, list[list[str]]]:
    """The canary and the waves after it, from an audit's change plan (``ChangePlan`` as JSON).

    ``canary`` overrides the plan's choice; it must be a host the plan upgrades and did not block.
    ``accept`` (check id patterns, e.g. ``rdma.*``) clears hosts blocked by nothing else: an explicit,
    recorded operator decision that those findings do not stop a driver change.
    """
    planned = [item["host"] for item in plan.get("needs_upgrade") or []]
    cleared = set(accepted_blocked(plan, accept))
    blocked = {b["host"]: "; ".join(b.get("reasons") or []) for b in plan.get("blocked") or []
               if b["host"] not in cleared}
    eligible = [h for h in planned if h not in blocked]
    if not eligible:
        done = ", ".join(plan.get("done") or []) or "none"
        why = "; ".join(f"{h}: {r}" for h, r in blocked.items())
        raise NothingToChange(f"nothing to change: no host is cleared for R{plan.get('target_branch')} "
                              f"(already on target: {done}; blocked: {why or 'none'})", blocked=bool(blocked))
    if canary is not None:
        if canary in blocked:
            raise UsageError(f"--canary {canary} is blocked by the audit: {blocked[canary]}")
        if canary not in eligible:
            raise UsageError(f"--canary {canary} is not a host the audit plans to upgrade "
                             f"(planned: {', '.join(eligible)})")
        chosen = canary
    else:
        c = plan.get("canary")
        if not c:
            raise UsageError(f"no canary: {plan.get('canary_note') or 'the audit chose none'}; "
                             "name one with --canary HOST")
        chosen = c["host"]
    batches: list[list[str]] = []
    if waves:
        seen = {chosen}
        for wave in plan.get("waves") or []:
            batch = [h for h in wave if h not in seen and h in eligible]
            seen.update(batch)
            if batch:
                batches.append(batch)
        rest = [h for h in eligible if h not in seen]
        if rest:
            batches.append(rest)
    return chosen, batches


def _extravars(change: Mapping[str, Any], rd: RunDir, hosts: Sequence[str], serial: Sequence[int],
               snapshots: Mapping[str, Any] | None = None, resume: bool = False) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "k3fleet_change_id": change["change_id"],
        "k3fleet_operator": change["operator"],
        "k3fleet_target_version": change["target_version"],
        "k3fleet_flavour": change["flavour"],
        "k3fleet_run_id": rd.path.name,
        "k3fleet_journal": str((rd.path / JOURNAL_FILE).resolve()),
        "k3fleet_change_hosts": list(hosts),
        "k3fleet_serial": list(serial),
        "k3fleet_failure_budget": change["failure_budget"],
        "k3fleet_drain_timeout": change["drain_timeout"],
        "k3fleet_drain_force": change["force"],
        "k3fleet_audit": change["audit"],
        "k3fleet_audit_max_age": change["audit_max_age"],
        "k3fleet_resume": resume,
        "k3fleet_accepted_blocked": list(change.get("accepted_blocked") or []),
    }
    if snapshots:
        ev["k3fleet_snapshots"] = dict(snapshots)
    return ev


def _fresh_audit(opts: UpgradeOptions, argv: Sequence[str], dest: Path, limit: str | None,
                 observer: Observer | None, cancel: threading.Event | None) -> dict[str, Any]:
    from k3fleet.audit import AuditOptions, run_audit

    audit = run_audit(AuditOptions(inventory=opts.inventory, limit=limit, forks=opts.forks, target=opts.target,
                                   out=dest, runs_dir=opts.runs_dir), argv, observer=observer, cancel=cancel)
    if audit.play.interrupted:
        raise UsageError(f"the gating audit was interrupted; nothing was changed (evidence: {dest})")
    plan: dict[str, Any] = audit.verdict.plan.model_dump(mode="json")
    return plan


def run_upgrade(opts: UpgradeOptions, argv: Sequence[str], observer: Observer | None = None,
                cancel: threading.Event | None = None) -> ChangeResult:
    """The change night, or its continuation with ``opts.resume``. Never raises for host failures:
    they are in the result, the journal and the exit code."""
    change_id = validate_change_id(opts.change_id)
    operator = validate_operator(opts.operator)
    if opts.flavour not in FLAVOURS:
        raise UsageError(f"--flavour {opts.flavour!r}: choose one of {', '.join(FLAVOURS)}")
    if opts.failure_budget < 0:
        raise UsageError(f"--failure-budget must be 0 or more, got {opts.failure_budget}")
    if opts.resume is not None:
        return _resume(opts, change_id, operator, argv, observer, cancel)
    # --check only simulates (apt-get -s): a lab host may be checked, never changed.
    (inventory_hosts if opts.check else refuse_simulated)(opts.inventory, opts.limit)
    rd = RunDir.create(opts.runs_dir, "change", argv, out=opts.out)
    rd.copy_input(opts.inventory, "inputs/inventory" + (opts.inventory.suffix or ""))
    plan = _fresh_audit(opts, argv, rd.path / "audit", opts.limit, observer, cancel)
    target_version = opts.target_version or plan["target_version"]
    if str(target_version).split(".")[0] != str(plan["target_branch"]):
        raise UsageError(f"--target-version {target_version} is not in branch R{plan['target_branch']} that the "
                         "audit planned for")
    try:
        canary, waves = plan_batches(plan, opts.canary, opts.waves, opts.accept_findings)
    except NothingToChange as exc:
        return _nothing(rd, opts, plan, target_version, exc)
    hosts = [canary] + [h for w in waves for h in w]
    serial = [1] + [len(w) for w in waves]
    change: dict[str, Any] = {
        "change_id": change_id, "operator": operator, "target_version": target_version,
        "target_branch": plan["target_branch"], "flavour": opts.flavour, "canary": canary, "waves": waves,
        "with_waves": opts.waves, "check": opts.check, "failure_budget": opts.failure_budget,
        "drain_timeout": opts.drain_timeout, "force": opts.force, "audit_max_age": opts.audit_max_age,
        "audit": str((rd.path / "audit" / "verdict.json").resolve()), "inventory": str(opts.inventory),
        "blocked": plan.get("blocked") or [], "done": plan.get("done") or [],
        "accept_findings": list(opts.accept_findings),
        "accepted_blocked": accepted_blocked(plan, opts.accept_findings),
    }
    rd.write_json(CHANGE_FILE, change)
    ev = _extravars(change, rd, hosts, serial)
    return _execute(rd, change, opts, ev, hosts, "ansible", "events.jsonl", observer, cancel)


def _nothing(rd: RunDir, opts: UpgradeOptions, plan: Mapping[str, Any], target_version: str,
             exc: NothingToChange) -> ChangeResult:
    """A second night over a done fleet changes nothing and says so (exit 0; 1 when hosts are blocked)."""
    change = {"change_id": opts.change_id, "operator": opts.operator, "target_version": target_version,
              "target_branch": plan["target_branch"], "canary": None, "waves": [], "check": opts.check,
              "done": plan.get("done") or [], "blocked": plan.get("blocked") or []}
    rd.write_json(CHANGE_FILE, change)
    result = ChangeResult(run_dir=rd, change=change, play=None, exit_code=exc.exit_code, message=str(exc))
    rd.write_json("run.json", {"status": "nothing_to_do", "exit_code": result.exit_code, "message": result.message,
                               "hosts": {}, "done": change["done"], "blocked": change["blocked"]})
    rd.write_manifest()
    return result


def _resume(opts: UpgradeOptions, change_id: str, operator: str, argv: Sequence[str], observer: Observer | None,
            cancel: threading.Event | None) -> ChangeResult:
    assert opts.resume is not None
    rd = RunDir.open(opts.resume)
    change = dict(rd.read_json(CHANGE_FILE))
    if change.get("check"):
        raise UsageError(f"run {rd.path} was a --check run: there is nothing to resume")
    if change["change_id"] != change_id:
        raise UsageError(f"run {rd.path} is change {change['change_id']}, not {change_id}")
    journal_path = rd.path / JOURNAL_FILE
    journal = read_journal(journal_path) if journal_path.exists() else None
    histories = replay(journal.entries) if journal else {}
    with_waves = bool(change.get("with_waves")) or opts.waves
    waves: list[list[str]] = change.get("waves") or []
    planned = [change["canary"]] + ([h for w in waves for h in w] if with_waves else [])
    rp = resume_plan(histories, planned)
    if rp.failed:
        why = "; ".join(f"{h}: {r}" for h, r in rp.failed.items())
        raise UsageError(f"run {rd.path.name} stopped after a failure ({why}); fix it and plan a new night, or roll "
                         f"back with: k3fleet rollback -i INVENTORY --run {rd.path}")
    n = 1 + sum(1 for p in rd.path.glob("ansible-resume-*") if p.is_dir())
    todo = rp.todo
    skipped: dict[str, str] = {}
    if rp.pending:
        # Hosts the night never reached are gated again by a fresh audit of just them.
        plan = _fresh_audit(opts, argv, rd.path / f"audit-resume-{n}", ",".join(rp.pending), observer, cancel)
        accept = list(change.get("accept_findings") or []) + list(opts.accept_findings)
        blocked_now = {b["host"] for b in plan.get("blocked") or []} - set(accepted_blocked(plan, accept))
        cleared = {i["host"] for i in plan.get("needs_upgrade") or []} - blocked_now
        for h in rp.pending:
            if h in (plan.get("done") or []):
                skipped[h] = "already on the target"
            elif h not in cleared:
                skipped[h] = "not cleared by the fresh audit (see " + f"audit-resume-{n})"
        todo = [h for h in todo if h not in skipped]
        change["audit"] = str((rd.path / f"audit-resume-{n}" / "verdict.json").resolve())
    change["operator_resume"] = operator
    change["with_waves"] = with_waves
    result_base = ChangeResult(run_dir=rd, change=change, play=None, skipped=skipped)
    if not todo:
        result_base.message = f"nothing left to do in run {rd.path.name}: {len(rp.done)} host(s) done"
        result_base.hosts = summarize(histories)
        _finish(result_base, recorder=None)
        return result_base
    # Keep the night's shape: the canary alone first if it is not done, then the rest of the waves.
    canary = change["canary"]
    batches: list[list[str]] = []
    if canary in todo:
        batches.append([canary])
    for wave in waves if with_waves else []:
        batch = [h for h in wave if h in todo and h != canary]
        if batch:
            batches.append(batch)
    hosts = [h for b in batches for h in b]
    serial = [len(b) for b in batches]
    rd.write_json(f"resume-{n}.json", {"resumed_hosts": rp.resume, "pending": rp.pending, "done": rp.done,
                                       "skipped": skipped, "hosts": hosts, "serial": serial, "operator": operator})
    ev = _extravars(change, rd, hosts, serial, snapshots=rp.snapshots, resume=True)
    return _execute(rd, change, opts, ev, hosts, f"ansible-resume-{n}", f"events-resume-{n}.jsonl", observer,
                    cancel, skipped=skipped, report_hosts=planned)


def _execute(rd: RunDir, change: dict[str, Any], opts: UpgradeOptions, extravars: dict[str, Any],
             hosts: Sequence[str], private: str, events_file: str, observer: Observer | None,
             cancel: threading.Event | None, skipped: dict[str, str] | None = None,
             report_hosts: Sequence[str] | None = None) -> ChangeResult:
    recorder = ChangeRecorder(observer)
    play = run_playbook("change_night.yml", opts.inventory, rd.path / private, extravars=extravars,
                        forks=opts.forks, check=opts.check, observer=recorder, cancel=cancel)
    rd.write_jsonl(events_file, play.events)
    result = ChangeResult(run_dir=rd, change=change, play=play, skipped=dict(skipped or {}))
    if opts.check:
        result.check = check_reports(play, hosts)
        rd.write_json("check.json", result.check)
    _summarize_hosts(result, report_hosts or hosts, recorder)
    _finish(result, recorder)
    return result


def check_reports(play: PlayResult, hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per host, what ``--check`` says the night would do (the playbook's ``k3fleet.check``), or why not."""
    found = {h: data["check"] for h, data in play.results_with_key().items()
             if isinstance(data, dict) and isinstance(data.get("check"), dict)}
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        if host in found:
            out[host] = found[host]
            continue
        last = play.last(host)
        if last is not None and last.status == "ok":
            out[host] = {"noop": True, "why": "already on the target: nothing to drain or install"}
        else:
            status = last.status if last else ("interrupted" if play.interrupted else "not reached")
            # The first failure is the cause; later ones are the rescue's own "stop here".
            failing = next((o for o in play.hosts.get(host, []) if o.status in
                            ("failed", "unreachable", "timeout")), last)
            out[host] = {"error": f"{status}: {failing.task if failing else '-'}: "
                                  f"{(failing.message if failing else None) or 'no message'}"}
    return out


def _summarize_hosts(result: ChangeResult, hosts: Sequence[str], recorder: ChangeRecorder) -> None:
    rd, play = result.run_dir, result.play
    journal_path = rd.path / JOURNAL_FILE
    journal = read_journal(journal_path) if journal_path.exists() else None
    histories = replay(journal.entries) if journal else {}
    if journal:
        result.problems.extend(journal.problems)
    summary = summarize(histories)
    for host in hosts:
        entry = summary.get(host) or {"outcome": "not_started", "stage": None, "stages": []}
        last = play.last(host) if play else None
        if entry["outcome"] == "not_started" and last is not None and last.status in ("failed", "unreachable",
                                                                                          "timeout"):
            entry["failure"] = f"{last.status}: {last.task}: {last.message or 'no message'}"
            if last.task == "Stop the waves when the failure budget is spent":
                entry["outcome"] = "not_started"
                entry["failure"] = "waves stopped: failure budget spent"
        if host in histories and not result.change.get("check"):
            entry["timing"] = host_timings(histories[host], recorder.tasks.get(host, []), recorder.span.get(host))
        summary[host] = entry
    result.hosts = {h: summary[h] for h in hosts if h in summary}
    for h, why in result.skipped.items():
        result.hosts.setdefault(h, {"outcome": "skipped", "failure": why, "stages": []})


def _finish(result: ChangeResult, recorder: ChangeRecorder | None) -> None:
    rd, play = result.run_dir, result.play
    outcomes = [h.get("outcome") for h in result.hosts.values()]
    if play is not None and play.interrupted:
        result.exit_code = EXIT_INCOMPLETE
        result.message = result.message or "interrupted: resume with --resume " + str(rd.path)
    elif result.change.get("check"):
        bad = [h for h, r in result.check.items() if "error" in r]
        unreachable = [h for h, r in result.check.items() if str(r.get("error", "")).startswith("unreachable")]
        result.exit_code = EXIT_INCOMPLETE if unreachable else (EXIT_FAILED if bad else EXIT_OK)
        result.message = result.message or (f"check: {len(result.check) - len(bad)} host(s) planned, "
                                             f"{len(bad)} could not be planned")
    elif any(o in ("failed", "rolled_back") for o in outcomes):
        result.exit_code = EXIT_FAILED
        failed = [h for h, s in result.hosts.items() if s.get("outcome") in ("failed", "rolled_back")]
        result.message = f"change failed on {', '.join(failed)}: waves stopped, see {rd.path / JOURNAL_FILE}"
    elif any(o in ("in_progress", "not_started") for o in outcomes) or (play is not None and play.status != "successful"
                                                                        and not outcomes):
        result.exit_code = EXIT_INCOMPLETE
        result.message = result.message or "some hosts did not finish: resume with --resume " + str(rd.path)
    else:
        result.exit_code = EXIT_OK
        result.message = result.message or f"{len(outcomes)} host(s) on {result.change.get('target_version')}"
    rd.write_json("run.json", {
        "status": ("interrupted" if play is not None and play.interrupted else
                   (play.status if play is not None else "nothing_to_do")),
        "ansible_rc": play.rc if play is not None else None,
        "exit_code": result.exit_code,
        "message": result.message,
        "hosts": result.hosts,
        "skipped": result.skipped,
        "journal_problems": result.problems,
        "wall_s": round(play.wall_s, 3) if play is not None else 0.0,
        "controller_cpu_s": round(play.cpu_s, 3) if play is not None else 0.0,
        "ansible_stats": play.stats if play is not None else {},
    })
    _write_snapshots(rd)
    rd.write_manifest()


def _write_snapshots(rd: RunDir) -> None:
    """Each host's pre-change snapshot as its own file too: readable without parsing the journal."""
    path = rd.path / JOURNAL_FILE
    if not path.exists():
        return
    for host, h in replay(read_journal(path).entries).items():
        snap = h.snapshot
        if snap is not None:
            rd.write_json(f"snapshots/{host}.json", snap)


# -- rollback --------------------------------------------------------------------------------


@dataclass
class RollbackOptions:
    inventory: Path
    limit: str | None = None
    run: Path | None = None
    operator: str | None = None
    forks: int = 20
    serial: str = "100%"
    drain_timeout: int = 3600
    force: bool = False
    check: bool = False
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    out: Path | None = None


@dataclass
class RollbackResult:
    run_dir: RunDir
    sources: dict[str, list[str]]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    plays: list[PlayResult] = field(default_factory=list)
    exit_code: int = EXIT_OK
    message: str = ""


def _journals_under(runs_dir: Path) -> list[Path]:
    if not runs_dir.is_dir():
        raise UsageError(f"runs directory {runs_dir} does not exist: give --run RUN")
    return sorted(p for p in runs_dir.glob(f"*/{JOURNAL_FILE}") if p.is_file())


def rollback_sources(opts: RollbackOptions) -> tuple[dict[Path, list[str]], dict[str, str]]:
    """Which journal each host is rolled back from, and the hosts that cannot be."""
    if opts.run is None and not opts.limit:
        raise UsageError("say what to roll back: --run RUN (a whole night) or --limit HOSTS (their latest change)")
    hosts_of = inventory_hosts if opts.check else refuse_simulated
    wanted = hosts_of(opts.inventory, opts.limit) if opts.limit else None
    if opts.run is not None:
        rd = RunDir.open(opts.run)
        journal = rd.path / JOURNAL_FILE
        if not journal.exists():
            raise UsageError(f"run {rd.path} has no {JOURNAL_FILE}: nothing was changed in it")
        histories = replay(read_journal(journal).entries)
        targets, skipped = rollback_targets(histories, wanted)
        if not targets:
            why = "; ".join(f"{h}: {r}" for h, r in skipped.items()) or "the journal is empty"
            raise UsageError(f"nothing to roll back in {journal}: {why}")
        return {journal: [t.host for t in targets]}, skipped
    assert wanted is not None
    newest: dict[str, tuple[str, Path]] = {}
    for journal in _journals_under(opts.runs_dir):
        for host, h in replay(read_journal(journal).entries).items():
            if host in wanted and h.snapshot is not None:
                ts = h.entries[-1].ts
                if host not in newest or ts > newest[host][0]:
                    newest[host] = (ts, journal)
    sources: dict[Path, list[str]] = {}
    skipped = {h: f"no change journal under {opts.runs_dir} has a snapshot of it" for h in wanted if h not in newest}
    for host, (_, journal) in newest.items():
        sources.setdefault(journal, []).append(host)
    if not sources:
        raise UsageError(f"nothing to roll back: {'; '.join(f'{h}: {r}' for h, r in skipped.items())}")
    return sources, skipped


def run_rollback(opts: RollbackOptions, argv: Sequence[str], observer: Observer | None = None,
                 cancel: threading.Event | None = None) -> RollbackResult:
    sources, skipped = rollback_sources(opts)
    rd = RunDir.create(opts.runs_dir, "rollback", argv, out=opts.out)
    rd.copy_input(opts.inventory, "inputs/inventory" + (opts.inventory.suffix or ""))
    result = RollbackResult(run_dir=rd, sources={str(k): v for k, v in sources.items()}, skipped=skipped)
    rd.write_json("rollback.json", {"sources": result.sources, "skipped": skipped, "check": opts.check,
                                    "operator": opts.operator})
    interrupted = False
    for i, (journal, hosts) in enumerate(sorted(sources.items())):
        ev: dict[str, Any] = {
            "k3fleet_journal": str(journal.resolve()),
            "k3fleet_journal_out": str(journal.resolve()),
            "k3fleet_run_id": rd.path.name,
            "k3fleet_rollback_hosts": hosts,
            "k3fleet_rollback_serial": opts.serial,
            "k3fleet_drain_timeout": opts.drain_timeout,
            "k3fleet_drain_force": opts.force,
        }
        if opts.operator:
            ev["k3fleet_operator"] = opts.operator
        recorder = ChangeRecorder(observer)
        play = run_playbook("rollback.yml", opts.inventory, rd.path / f"ansible-{i + 1}", extravars=ev,
                            forks=opts.forks, check=opts.check, observer=recorder, cancel=cancel)
        result.plays.append(play)
        rd.write_jsonl(f"events-{i + 1}.jsonl", play.events)
        entries = [e for e in read_journal(journal).entries if e.run == rd.path.name]
        _copy_lines(rd, entries)
        histories = replay(entries)
        for host in hosts:
            h = histories.get(host)
            stages = [e.stage for e in h.entries] if h else []
            last = play.last(host)
            if "rolled_back" in stages:
                outcome = "rolled_back"
            elif "failed" in stages or (last is not None and last.status in ("failed", "unreachable", "timeout")):
                outcome = "failed"
            elif opts.check and last is not None and last.status == "ok":
                outcome = "checked"
            else:
                outcome = "not_finished"
            result.hosts[host] = {
                "outcome": outcome, "from": str(journal), "stages": stages,
                "failure": (h.failure if h else None) or (f"{last.status}: {last.task}: {last.message}"
                                                          if last is not None and last.status != "ok" else None),
                "returned_to_service": _returned(h),
            }
        if play.interrupted:
            interrupted = True
            break
    outcomes = [h["outcome"] for h in result.hosts.values()]
    if interrupted:
        result.exit_code, result.message = EXIT_INCOMPLETE, "interrupted: run the rollback again (it is idempotent)"
    elif any(o == "failed" for o in outcomes):
        result.exit_code = EXIT_FAILED
        failed = [h for h, s in result.hosts.items() if s["outcome"] == "failed"]
        result.message = "rollback failed on " + ", ".join(failed)
    elif any(o == "not_finished" for o in outcomes):
        result.exit_code, result.message = EXIT_INCOMPLETE, "some hosts did not finish: run the rollback again"
    else:
        result.exit_code = EXIT_OK
        result.message = f"{len(outcomes)} host(s) {'checked' if opts.check else 'rolled back'}"
    rd.write_json("run.json", {"exit_code": result.exit_code, "message": result.message, "hosts": result.hosts,
                               "skipped": skipped, "sources": result.sources,
                               "wall_s": round(sum(p.wall_s for p in result.plays), 3)})
    rd.write_manifest()
    return result


def _returned(h: HostHistory | None) -> bool:
    back = h.last("returned") if h is not None else None
    return bool(back is not None and isinstance(back.detail, dict) and back.detail.get("returned_to_service"))


def _copy_lines(rd: RunDir, entries: Sequence[JournalEntry]) -> None:
    """The rollback's own lines, also in the rollback run directory (the source journal keeps them too)."""
    for e in entries:
        rd.append_jsonl(JOURNAL_FILE, e.model_dump(mode="json", exclude_none=True))


def load_change(run: Path) -> dict[str, Any]:
    """A change run's change.json (for display)."""
    return dict(json.loads((RunDir.open(run).path / CHANGE_FILE).read_text()))
