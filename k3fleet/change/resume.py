"""``k3fleet upgrade --resume RUN``: continue an interrupted night from its journal (docs/change-night.md
"Resume").

The run directory is checked against its manifest first; change.json is read through its model.
The journal, read once, says per host: done (never touched again), half-way (continued from its
FIRST snapshot, handed to the play), never reached (gated again by a fresh audit of just them),
failed (the resume is refused: roll back or plan a new night), or unreadable (refused, with the
byte offset of the line that cannot be read).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from k3fleet.audit.inventory import refuse_simulated
from k3fleet.audit.runner import Observer
from k3fleet.change.gate import (
    UpgradeOptions,
    accepted_blocked,
    audit_reasons,
    check_accept_found,
    fresh_audit,
    held_by_others,
    host_plans,
)
from k3fleet.change.journal import Journal, read_journal, replay_journal, resume_plan, summarize
from k3fleet.change.kit import kit_choice, kit_warnings
from k3fleet.change.night import ChangeResult, execute, extravars, finish, night_lock, resumed_timeouts
from k3fleet.change.record import load_change, verified
from k3fleet.change.smoke import check_one_node, resumed_smoke, smoke_warnings
from k3fleet.errors import UsageError
from k3fleet.evidence import layout
from k3fleet.evidence.reader import RunReader
from k3fleet.models.target import Target


def run_resume(opts: UpgradeOptions, change_id: str, operator: str, accept: list[str], argv: Sequence[str],
               observer: Observer | None, cancel: threading.Event | None, target: Target) -> ChangeResult:
    assert opts.resume is not None
    if opts.check:
        raise UsageError("--resume continues a night that changes nodes: it cannot be a --check")
    with night_lock(opts, "resumed change night", change_id, operator) as lock:
        rd = verified(opts.resume)
        if lock is not None:
            lock.set_run(rd.path)
        record = load_change(rd)
        if record.check:
            raise UsageError(f"run {rd.path} was a --check run: there is nothing to resume")
        if record.change_id != change_id:
            raise UsageError(f"run {rd.path} is change {record.change_id}, not {change_id}")
        if record.canary is None or not record.hosts:
            raise UsageError(f"run {rd.path} planned no host: there is nothing to resume")
        # The serving smoke as the night was started, unless --smoke / --no-smoke / --launch-file say
        # otherwise (recorded in resume-N.json and run.json; change.json stays as the night wrote it).
        record.smoke = resumed_smoke(opts, record.smoke)
        record.timeouts = resumed_timeouts(record.timeouts, target, smoke=record.smoke.enabled)
        # The rollback kit likewise: as the night was started unless --rollback-kit / --no-rollback-kit.
        record.rollback_kit = kit_choice(opts, record.rollback_kit)
        gate = RunReader(rd.path / layout.gate_audit_dir())
        if gate.has(layout.VERDICT):
            check_one_node(record.smoke, gate.verdict().strategy, check=False)
        # A resume changes nodes like the night did: simulated lab hosts are refused here too.
        refuse_simulated(opts.inventory, ",".join(record.hosts))
        path = rd.path / layout.JOURNAL
        journal = read_journal(path) if path.exists() else Journal(path=path)
        histories = replay_journal(journal)
        with_waves = record.with_waves or opts.waves
        planned = [record.canary] + ([h for w in record.waves for h in w] if with_waves else [])
        rp = resume_plan(histories, planned, journal)
        if rp.failed:
            why = "; ".join(f"{h}: {r}" for h, r in rp.failed.items())
            raise UsageError(f"run {rd.path.name} stopped after a failure ({why}); fix it and plan a new night, or "
                             f"roll back with: k3fleet rollback -i INVENTORY --run {rd.path}")
        n = 1 + sum(1 for p in rd.path.glob(layout.ansible_dir(layout.RESUME_PREFIX) + "*") if p.is_dir())
        skipped = {h: f"refused: {why}" for h, why in rp.refused.items()}
        todo = rp.todo
        audit_dir = rd.path / layout.gate_audit_dir()
        accept_all = list(dict.fromkeys(record.accept_findings + accept))
        if rp.pending:
            # Hosts the night never reached are gated again by a fresh audit of just them.
            audit_dir = rd.path / layout.gate_audit_dir(layout.resume_tag(n))
            audit = fresh_audit(opts, argv, audit_dir, ",".join(rp.pending), observer, cancel)
            plan = audit.verdict.plan.model_dump(mode="json")
            check_accept_found(accept, [f.check_id for f in audit.verdict.all_findings()], f"the audit {audit_dir}")
            held = held_by_others(audit_reasons(audit), change_id)
            blocked_now = {b["host"] for b in plan.get("blocked") or []} - set(accepted_blocked(plan, accept_all))
            cleared = {i["host"] for i in plan.get("needs_upgrade") or []} - blocked_now
            for h in rp.pending:
                if h in held:
                    skipped[h] = f"held by change {held[h]}: not touched by this one"
                elif h in (plan.get("done") or []):
                    skipped[h] = "already on the target"
                elif h not in cleared:
                    skipped[h] = f"not cleared by the fresh audit (see {audit_dir.name})"
            fresh = [h for h in rp.pending if h not in skipped]
            record.hosts.update({h: p for h, p in host_plans(plan, fresh, None).items()})
            record.accepted_blocked = list(dict.fromkeys(record.accepted_blocked
                                                         + accepted_blocked(plan, accept_all)))
        todo = [h for h in todo if h not in skipped]
        change = record.model_dump(mode="json")
        change.update(operator_resume=operator, with_waves=with_waves)
        if not todo:
            result = ChangeResult(run_dir=rd, change=change, play=None, skipped=skipped)
            result.message = (f"nothing left to do in run {rd.path.name}: {len(rp.done)} host(s) done"
                              + (f", {len(skipped)} refused or skipped" if skipped else ""))
            result.hosts = summarize(histories)
            for h, why in skipped.items():
                result.hosts[h] = {"outcome": "refused" if why.startswith("refused") else "skipped",
                                   "failure": why, "stages": []}
            finish(result, journal)
            return result
        # Keep the night's shape: the canary alone first if it is not done, then the rest of the waves.
        batches: list[list[str]] = []
        if record.canary in todo:
            batches.append([record.canary])
        for wave in record.waves if with_waves else []:
            batch = [h for h in wave if h in todo and h != record.canary]
            if batch:
                batches.append(batch)
        hosts = [h for b in batches for h in b]
        serial = [len(b) for b in batches]
        rd.write_json(layout.resume_file(n), {"resumed_hosts": rp.resume, "pending": rp.pending, "done": rp.done,
                                           "skipped": skipped, "hosts": hosts, "serial": serial,
                                           "operator": operator, "journal_problems": journal.problems,
                                           "smoke": record.smoke.model_dump(mode="json"),
                                           "rollback_kit": record.rollback_kit})
        record.with_waves = with_waves
        ev = extravars(record, rd, hosts, serial, audit_dir=audit_dir, snapshots=rp.snapshots, resume=True,
                       operator=operator)
        result = execute(rd, record, opts, ev, hosts, layout.ansible_dir(layout.resume_tag(n)),
                         layout.events_file(layout.resume_tag(n)), observer,
                         cancel, journal=journal, skipped=skipped, report_hosts=planned,
                         warnings=smoke_warnings(record.smoke, check=False)
                         + kit_warnings(bool(record.rollback_kit), check=False))
        result.change.update(operator_resume=operator)
        return result
