"""The change night: gate -> playbooks/change_night.yml (canary, then the waves) -> run directory.

``run_night`` validates the request, takes the state directory's lock, runs a fresh audit,
plans the batches and hands the playbook everything as values (lease, per-host package plans,
slot gate, timeouts from the target). ``execute`` runs the play (shared with the resume) and
reads the journal once, afterwards, to say what happened to every host.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.audit.inventory import inventory_hosts, refuse_simulated
from k3fleet.audit.runner import Observer, PlayResult, run_playbook
from k3fleet.change.gate import (
    NothingToChange,
    UpgradeOptions,
    accepted_blocked,
    audit_reasons,
    check_accept_found,
    check_accept_patterns,
    check_max_unavailable,
    finding_ids,
    fresh_audit,
    held_by_others,
    host_plans,
    plan_batches,
    resolve_max_unavailable,
)
from k3fleet.change.interrupt import signal_name
from k3fleet.change.journal import Journal, journal_now, mark_interrupted, read_journal, replay_journal, summarize
from k3fleet.change.kit import kit_choice, kit_extravar, kit_timeouts, kit_warnings
from k3fleet.change.lease import DRAIN_TEXT, Lease, validate_change_id, validate_operator
from k3fleet.change.lock import NightLock, PlayGuard
from k3fleet.change.pause import PauseWatcher, check_pause, continue_dir
from k3fleet.change.record import ChangeRecord, SmokeChoice
from k3fleet.change.smoke import check_one_node, smoke_choice, smoke_extravar, smoke_timeouts, smoke_warnings
from k3fleet.change.textfile import NightTextfile, check_textfile
from k3fleet.change.timing import ChangeRecorder, host_timings
from k3fleet.change.verifyplan import verify_plan
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, combine
from k3fleet.errors import UsageError
from k3fleet.evidence import RunDir, layout, sha256_file, verify_run
from k3fleet.models.evidence import ChangeRunRecord
from k3fleet.models.target import Target
from k3fleet.targets import load_target


@dataclass
class ChangeResult:
    run_dir: RunDir
    change: dict[str, Any]
    play: PlayResult | None
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Lines the operator must read besides the outcome (a night without the serving smoke).
    warnings: list[str] = field(default_factory=list)
    # --pause-after: each pause point reached and how it was continued.
    pauses: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int = EXIT_OK
    message: str = ""


def change_timeouts(target: Target, opts: UpgradeOptions, *, smoke: bool = True) -> dict[str, int]:
    """Every timeout of the night, in seconds, from the target (``change`` section) unless the
    command line says otherwise."""
    c = target.change
    out = {"drain": opts.drain_timeout if opts.drain_timeout is not None else c.drain_timeout_s,
           "reboot": c.reboot_timeout_s, "fabricmanager_settle": c.fabricmanager_settle_s,
           "command": c.command_timeout_s,
           "audit_max_age": opts.audit_max_age if opts.audit_max_age is not None else c.audit_max_age_s,
           "lease_ttl": c.lease_ttl_s, **smoke_timeouts(target), **kit_timeouts(target),
           # The verify's NCCL runs (within the node, and the canary's pair test), each under the target's bound.
           "verify_nccl": target.active.timeouts.nccl_s}
    out["slot_wait"] = slot_wait(out, smoke=smoke)
    return {k: int(v) for k, v in out.items()}


def resumed_timeouts(recorded: Mapping[str, Any], target: Target, *, smoke: bool) -> dict[str, int]:
    """A resume's timeouts: the night's as recorded (a night recorded before the smoke existed gets
    the target's smoke bounds), with the slot wait for the resume's own smoke choice: a resume that
    turns the smoke on (or off) makes each host's change longer (or shorter) than the night planned."""
    out = {k: int(v) for k, v in recorded.items()}
    for key, seconds in {**smoke_timeouts(target), **kit_timeouts(target)}.items():
        out.setdefault(key, seconds)
    if all(k in out for k in ("drain", "reboot", "fabricmanager_settle", "command")):
        out["slot_wait"] = slot_wait(out, smoke=smoke)
    return out


def slot_wait(timeouts: Mapping[str, Any], *, smoke: bool) -> int:
    """How long a host waits for a slot: one other host's whole change (its serving smoke too when
    the night runs it: the server's start and two requests), with room for Ansible itself. A resume
    recomputes it for its own smoke choice (docs/change-night.md "Serving smoke")."""
    t = timeouts
    wait = int(t["drain"]) + int(t["reboot"]) + int(t["fabricmanager_settle"]) + 10 * int(t["command"])
    if smoke:
        wait += int(t["smoke_ready"]) + 2 * int(t["smoke_request"])
    # The verify steps (docs/change-night.md "Verify steps"): the container probe (6 commands' time, as the
    # probe module gives it) and two NCCL runs at most (within the node; the canary's pair test).
    if "verify_nccl" in t:
        wait += 6 * int(t["command"]) + 2 * int(t["verify_nccl"])
    return wait


def real_ansible_playbook() -> str:
    """The ansible-playbook the play would start (the running interpreter's first)."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    if beside.exists():
        return str(beside)
    found = shutil.which("ansible-playbook")
    if found is None:
        raise UsageError("ansible-playbook not found on PATH: install ansible-core in this environment")
    return found


@contextlib.contextmanager
def night_lock(opts: UpgradeOptions, kind: str, change_id: str | None, operator: str | None
               ) -> Iterator[NightLock | None]:
    """The state directory's lock for a night that changes nodes; none for --check (it changes nothing)."""
    if opts.check:
        yield None
        return
    with NightLock(opts.runs_dir, kind=kind, change_id=change_id, operator=operator) as lock:
        yield lock


def validate_request(opts: UpgradeOptions) -> tuple[str, str, str | None, list[str]]:
    """Everything about the command line that can be refused before anything runs."""
    # lazy: the check catalogue imports the verdict rules, which `k3fleet upgrade --help` and the
    # other commands whose modules import this one do not need
    from k3fleet.verdict.catalogue import CHECKS

    change_id = validate_change_id(opts.change_id)
    operator = validate_operator(opts.operator)
    if opts.failure_budget < 0:
        raise UsageError(f"--failure-budget must be 0 or more, got {opts.failure_budget}")
    max_arg = check_max_unavailable(opts.max_unavailable)
    check_textfile(opts.textfile)
    check_pause(opts.pause_after)
    accept = check_accept_patterns(opts.accept_findings, CHECKS) if opts.accept_findings else []
    return change_id, operator, max_arg, accept


def run_night(opts: UpgradeOptions, argv: Sequence[str], observer: Observer | None = None,
              cancel: threading.Event | None = None) -> ChangeResult:
    """A fresh change night (``k3fleet.change.upgrade.run_upgrade`` sends ``--resume`` elsewhere).
    Never raises for host failures: they are in the result, the journal and the exit code."""
    change_id, operator, max_arg, accept = validate_request(opts)
    smoke = smoke_choice(opts)
    kit = kit_choice(opts)
    target = load_target(opts.target)
    # --check only simulates (apt-get -s): a lab host may be checked, never changed.
    (inventory_hosts if opts.check else refuse_simulated)(opts.inventory, opts.limit)
    with night_lock(opts, "change night", change_id, operator) as lock:
        rd = RunDir.create(opts.runs_dir, "change", argv, out=opts.out)
        if lock is not None:
            lock.set_run(rd.path)
        rd.copy_inventory(opts.inventory)
        audit = fresh_audit(opts, argv, rd.path / layout.gate_audit_dir(), opts.limit, observer, cancel)
        plan: dict[str, Any] = audit.verdict.plan.model_dump(mode="json")
        check_accept_found(accept, finding_ids(audit.verdict), f"the audit {rd.path / 'audit'}")
        target_version = opts.target_version or plan["target_version"]
        if str(target_version).split(".")[0] != str(plan["target_branch"]):
            raise UsageError(f"--target-version {target_version} is not in branch R{plan['target_branch']} that "
                             "the audit planned for")
        planned = {i["host"] for i in plan.get("needs_upgrade") or []}
        held = {h: c for h, c in held_by_others(audit_reasons(audit), change_id).items() if h in planned}
        try:
            canary, waves = plan_batches(plan, opts.canary, opts.waves, accept, held)
        except NothingToChange as exc:
            return _nothing(rd, opts, operator, plan, target_version, held, exc, smoke.model_dump(mode="json"))
        # Refused (or, in --check, a warning) before any node is touched.
        smoke_notes = check_one_node(smoke, audit.verdict.strategy, check=opts.check)
        hosts = [canary] + [h for w in waves for h in w]
        serial = [1] + [len(w) for w in waves]
        timeouts = change_timeouts(target, opts, smoke=smoke.enabled)
        record = ChangeRecord(
            change_id=change_id, operator=operator, target_version=target_version,
            target_branch=plan["target_branch"], canary=canary, waves=waves, with_waves=opts.waves, check=opts.check,
            failure_budget=opts.failure_budget, max_unavailable_arg=max_arg,
            max_unavailable=resolve_max_unavailable(max_arg, len(audit.verdict.hosts), serial),
            drain_timeout=int(timeouts["drain"]), force=opts.force, audit_max_age=int(timeouts["audit_max_age"]),
            audit=str((rd.path / layout.gate_audit_dir() / layout.VERDICT).resolve()), inventory=str(opts.inventory),
            blocked=plan.get("blocked") or [], done=plan.get("done") or [], held=held, accept_findings=accept,
            accepted_blocked=accepted_blocked(plan, accept), hosts=host_plans(plan, hosts, opts.target_version),
            timeouts=timeouts, image=target.image.ref, smoke=smoke, rollback_kit=kit,
            preflight=preflight_policy(target),
            verify=verify_plan(target, audit.verdict.hosts, audit.verdict.strategy, canary, hosts, accept,
                               int(timeouts["command"])))
        rd.write_json(layout.CHANGE, record.model_dump(mode="json"))
        skipped = {h: f"held by change {c}: not touched by this one" for h, c in held.items()}
        ev = extravars(record, rd, hosts, serial, audit_dir=rd.path / layout.gate_audit_dir())
        return execute(rd, record, opts, ev, hosts, layout.ansible_dir(), layout.events_file(), observer, cancel,
                       journal=None, skipped=skipped, warnings=smoke_warnings(smoke, opts.check) + smoke_notes
                       + kit_warnings(kit, opts.check))


def preflight_policy(target: Target) -> dict[str, Any]:
    """The target's part of the preflight: the oldest NVIDIA Container Toolkit a node may run, with its reason."""
    return {"min_container_toolkit": target.container.toolkit_min_version,
            "min_container_toolkit_source": (target.container.toolkit_advisory
                                             or "the target's container.toolkit_min_version")}


def extravars(record: ChangeRecord, rd: RunDir, hosts: Sequence[str], serial: Sequence[int], *, audit_dir: Path,
              snapshots: Mapping[str, Any] | None = None, resume: bool = False,
              operator: str | None = None) -> dict[str, Any]:
    """Everything the playbook needs, as values: nothing in it is worked out again in Jinja."""
    verify_run(audit_dir).raise_if_bad()
    t = record.timeouts
    lease = Lease.build(record.change_id, operator or record.operator, DRAIN_TEXT, int(t["lease_ttl"]))
    ev: dict[str, Any] = {
        "k3fleet_change_id": record.change_id,
        "k3fleet_operator": operator or record.operator,
        "k3fleet_run_id": rd.path.name,
        "k3fleet_journal": str((rd.path / layout.JOURNAL).resolve()),
        "k3fleet_change_hosts": list(hosts),
        "k3fleet_serial": list(serial),
        "k3fleet_canary": record.canary,
        "k3fleet_lease": lease.extravar(),
        "k3fleet_gate": {"max_unavailable": record.max_unavailable, "failure_budget": record.failure_budget,
                         "canary": record.canary, "wait_timeout": t["slot_wait"]},
        "k3fleet_hosts": {h: record.hosts[h].model_dump(mode="json") for h in hosts},
        "k3fleet_timeouts": {k: t[k] for k in ("drain", "reboot", "fabricmanager_settle", "command")},
        "k3fleet_drain_force": record.force,
        "k3fleet_image": record.image,
        "k3fleet_audit": str((audit_dir / layout.VERDICT).resolve()),
        "k3fleet_audit_sha256": sha256_file(audit_dir / layout.VERDICT),
        "k3fleet_audit_max_age": record.audit_max_age,
        "k3fleet_resume": resume,
        "k3fleet_accepted_blocked": list(record.accepted_blocked),
        # The serving smoke after each host's verification (null: none); the role never runs it in --check.
        "k3fleet_smoke": smoke_extravar(record),
        # What the preflight before each drain holds the node to (docs/change-night.md "Preflight").
        "k3fleet_preflight": dict(record.preflight),
        # The rollback kit staged before each host's first change (null: --no-rollback-kit).
        "k3fleet_rollback_kit": kit_extravar(record),
        # The verify steps beyond the driver (null: a night recorded before them; docs/change-night.md "Verify steps").
        "k3fleet_verify": dict(record.verify) or None,
    }
    if snapshots:
        ev["k3fleet_snapshots"] = dict(snapshots)
    return ev


def _nothing(rd: RunDir, opts: UpgradeOptions, operator: str, plan: Mapping[str, Any], target_version: str,
             held: Mapping[str, str], exc: NothingToChange, smoke: Mapping[str, Any]) -> ChangeResult:
    """A second night over a done fleet changes nothing and says so (exit 0; 1 when hosts are blocked)."""
    # change.json through its model, as a night with hosts to change writes it (the fields set, no more).
    change = ChangeRecord(
        change_id=opts.change_id, operator=operator, target_version=target_version,
        target_branch=plan["target_branch"], canary=None, waves=[], check=opts.check,
        done=plan.get("done") or [], blocked=plan.get("blocked") or [], held=dict(held),
        smoke=SmokeChoice.model_validate(dict(smoke))).model_dump(mode="json", exclude_unset=True)
    rd.write_json(layout.CHANGE, change)
    result = ChangeResult(run_dir=rd, change=change, play=None, exit_code=exc.exit_code, message=str(exc))
    rd.write_json(layout.RUN, ChangeRunRecord(status="nothing_to_do", exit_code=result.exit_code,
                                              message=result.message, hosts={}, done=change["done"],
                                              blocked=change["blocked"], held=change["held"]).dump())
    rd.write_manifest()
    return result


def execute(rd: RunDir, record: ChangeRecord, opts: UpgradeOptions, ev: dict[str, Any], hosts: Sequence[str],
            private: str, events_file: str, observer: Observer | None, cancel: threading.Event | None, *,
            journal: Journal | None, skipped: Mapping[str, str] | None = None,
            report_hosts: Sequence[str] | None = None, warnings: Sequence[str] = ()) -> ChangeResult:
    """Run change_night.yml and sum it up. ``journal`` is the journal as read before the play (a
    resume); the play's own lines are added from its events, so the file is read once per run."""
    # What the night is planned from is fixed by a manifest as the play starts: a resume or a
    # rollback of a night killed mid-play checks it.
    recorder = ChangeRecorder(inner=observer or Observer(), started=rd.write_manifest)
    textfile = None
    if opts.textfile is not None and not opts.check:
        serial = [int(n) for n in ev.get("k3fleet_serial") or []]
        order = list(ev.get("k3fleet_change_hosts") or hosts)
        batches = [order[sum(serial[:i]):sum(serial[:i + 1])] for i in range(len(serial))] or [order]
        textfile = NightTextfile(opts.textfile, change_id=record.change_id, run=rd.path.name, batches=batches,
                                 failure_budget=record.failure_budget)
        # A resume starts from what the journal already says.
        textfile.add(e.model_dump(mode="json") for e in (journal.entries if journal is not None else []))
    watcher = None
    if opts.pause_after is not None and not opts.check:
        serial = [int(n) for n in ev.get("k3fleet_serial") or []]
        order = list(ev.get("k3fleet_change_hosts") or hosts)
        batches = [order[sum(serial[:i]):sum(serial[:i + 1])] for i in range(len(serial))] or [order]
        watcher = PauseWatcher(opts.pause_after, batches, continue_dir(opts.runs_dir, rd.path.name),
                               int(opts.pause_timeout), say=opts.say or (lambda _text: None), run=rd.path)
        gate = dict(ev["k3fleet_gate"], pause=watcher.gate())
        gate["wait_timeout"] = max(int(gate.get("wait_timeout") or 0), int(opts.pause_timeout))
        ev = dict(ev, k3fleet_gate=gate)
    if textfile is not None or watcher is not None:
        recorder.on_line = functools.partial(_line_seen, textfile, watcher)
    with PlayGuard(opts.runs_dir, f"{rd.path.name}-{private}", real_ansible_playbook()):
        play = run_playbook("change_night.yml", opts.inventory, rd.path / private, extravars=ev,
                            forks=opts.forks, check=opts.check, observer=recorder, cancel=cancel,
                            host_key_checking=opts.host_key_checking)
    rd.write_jsonl(events_file, play.events)
    change = record.model_dump(mode="json")
    result = ChangeResult(run_dir=rd, change=change, play=play, skipped=dict(skipped or {}),
                          warnings=list(warnings))
    if opts.check:
        result.check = check_reports(play, hosts)
        rd.write_json(layout.CHECK, result.check)
    path = rd.path / layout.JOURNAL
    if journal is None:
        journal = read_journal(path) if path.exists() else Journal(path=path)
    else:
        journal.extend(recorder.lines)
    if play.interrupted and not opts.check:
        # Where each host was when the signal came, in the journal itself (docs/change-night.md "Interrupted").
        journal.extend(mark_interrupted(
            path, replay_journal(journal), report_hosts or hosts, run=rd.path.name, signal=signal_name(cancel),
            during="resume" if ev.get("k3fleet_resume") else "change night", now=journal_now(),
            next_step=f"k3fleet upgrade --resume {rd.path} (continues each host from its snapshot) or "
                      f"k3fleet rollback --run {rd.path}"))
    summarize_hosts(result, report_hosts or hosts, recorder, journal)
    if watcher is not None:
        result.pauses = watcher.record()
        watcher.close()
    if textfile is not None:
        textfile.add(e.model_dump(mode="json") for e in journal.entries)
        if textfile.problem:
            result.warnings.append(f"the textfile could not always be written: {textfile.problem}")
    finish(result, journal)
    return result


def _line_seen(textfile: NightTextfile | None, watcher: PauseWatcher | None, line: dict[str, Any]) -> None:
    """A journal line the play reported: the textfile and the pauses follow it."""
    if textfile is not None:
        textfile.add([line])
    if watcher is not None:
        watcher.on_line(line)


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


def summarize_hosts(result: ChangeResult, hosts: Sequence[str], recorder: ChangeRecorder, journal: Journal) -> None:
    play = result.play
    histories = replay_journal(journal)
    result.problems.extend(journal.problems)
    result.problems.extend(f"{journal.path}: byte {t['offset']}: a torn line ({t['length']} bytes) was "
                           "terminated before the next append" for t in recorder.torn)
    summary = summarize(histories)
    failed_any = any(h.outcome in ("failed", "rolled_back") for h in histories.values())
    for host in hosts:
        entry = summary.get(host) or {"outcome": "not_started", "stage": None, "stages": []}
        last = play.last(host) if play else None
        if host in recorder.gate and entry["outcome"] in ("not_started", "upgraded", "held"):
            entry = {"outcome": "not_started", "stage": entry.get("stage"), "stages": entry.get("stages", []),
                     "failure": f"stopped before its drain: {recorder.gate[host]}"}
        elif entry["outcome"] == "not_started" and last is not None and last.status in ("failed", "unreachable",
                                                                                            "timeout"):
            entry["failure"] = f"{last.status}: {last.task}: {last.message or 'no message'}"
        elif entry["outcome"] == "not_started" and failed_any:
            entry["failure"] = "not started: the waves stopped after a failure"
        if host in histories and histories[host].entries:
            entry["timing"] = host_timings(histories[host], recorder.span.get(host))
        summary[host] = entry
    result.hosts = {h: summary[h] for h in hosts if h in summary}
    for h, why in result.skipped.items():
        kind = why.split(" ", 1)[0].rstrip(":")
        outcome = {"held": "held", "refused": "refused"}.get(kind, "skipped")
        row = result.hosts.get(h) or {"stage": None, "stages": []}
        result.hosts[h] = {**row, "outcome": outcome, "failure": why}


def finish(result: ChangeResult, journal: Journal | None) -> None:
    rd, play = result.run_dir, result.play
    outcomes = [h.get("outcome") for h in result.hosts.values()]
    held = [h for h, s in result.hosts.items() if s.get("outcome") == "held"]
    if play is not None and play.interrupted:
        result.exit_code = EXIT_INCOMPLETE
        result.message = result.message or (f"interrupted: resume with --resume {rd.path}, or roll back with "
                                            f"k3fleet rollback --run {rd.path}")
    elif result.change.get("check"):
        bad = [h for h, r in result.check.items() if "error" in r]
        unreachable = [h for h, r in result.check.items() if str(r.get("error", "")).startswith("unreachable")]
        # A host that could not be planned for a known reason is a no-go (1) even when others were
        # not reached (3): k3fleet.contracts.combine.
        result.exit_code = combine(EXIT_FAILED if set(bad) - set(unreachable) else EXIT_OK,
                                   EXIT_INCOMPLETE if unreachable else EXIT_OK)
        result.message = result.message or (f"check: {len(result.check) - len(bad)} host(s) planned, "
                                             f"{len(bad)} could not be planned")
    elif any(o in ("failed", "rolled_back") for o in outcomes):
        result.exit_code = EXIT_FAILED
        failed = [h for h, s in result.hosts.items() if s.get("outcome") in ("failed", "rolled_back")]
        result.message = f"change failed on {', '.join(failed)}: waves stopped, see {rd.path / layout.JOURNAL}"
    elif held:
        result.exit_code = EXIT_INCOMPLETE
        holders = ", ".join(f"{h} ({result.hosts[h].get('failure')})" for h in held)
        result.message = result.message or f"{len(held)} host(s) held by other changes, not touched: {holders}"
    elif any(o in ("in_progress", "not_started", "refused") for o in outcomes) or (
            play is not None and play.status != "successful" and not outcomes):
        result.exit_code = EXIT_INCOMPLETE
        result.message = result.message or "some hosts did not finish: resume with --resume " + str(rd.path)
    else:
        result.exit_code = EXIT_OK
        result.message = result.message or f"{len(outcomes)} host(s) on {result.change.get('target_version')}"
    rd.write_json(layout.RUN, ChangeRunRecord(
        status=("interrupted" if play is not None and play.interrupted else
                (play.status if play is not None else "nothing_to_do")),
        ansible_rc=play.rc if play is not None else None,
        exit_code=result.exit_code,
        message=result.message,
        hosts=result.hosts,
        skipped=result.skipped,
        journal_problems=result.problems,
        # The serving smoke as the night ran it, and a warning when it skipped it.
        smoke=result.change.get("smoke"),
        warnings=result.warnings,
        pauses=result.pauses,
        # The rollback kit as the night chose it (false: --no-rollback-kit, with its warning).
        rollback_kit=result.change.get("rollback_kit"),
        wall_s=round(play.wall_s, 3) if play is not None else 0.0,
        controller_cpu_s=round(play.cpu_s, 3) if play is not None else 0.0,
        ansible_stats=play.stats if play is not None else {},
    ).dump())
    if journal is not None:
        # Each host's pre-change snapshot as its own file too: readable without parsing the journal.
        for host, h in replay_journal(journal).items():
            if h.snapshot is not None:
                rd.write_json(layout.host_file(layout.SNAPSHOTS, host), h.snapshot)
    rd.write_manifest()
