"""``k3fleet rollback``: put hosts back to the snapshot a change journal recorded (docs/change-night.md
"Rollback").

``--run RUN`` rolls back every host the run touched (the run directory checked against its
manifest first); ``--limit HOSTS`` each host's latest change under the runs directory. Every
journal is read once; the controller hands each host its snapshot and its change's lease as
values (the playbook parses no journal). A host whose snapshot cannot be read although a
change is recorded is refused with the reason, never taken for one where "nothing changed".
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.audit.inventory import inventory_hosts, refuse_simulated
from k3fleet.audit.runner import Observer, PlayResult, run_playbook
from k3fleet.change.interrupt import signal_name
from k3fleet.change.journal import (
    HostHistory,
    Journal,
    JournalEntry,
    journal_now,
    mark_interrupted,
    read_journal,
    replay,
    replay_journal,
    rollback_targets,
)
from k3fleet.change.lease import ROLLBACK_TEXT, Lease, validate_operator
from k3fleet.change.lock import NightLock, PlayGuard
from k3fleet.change.night import real_ansible_playbook
from k3fleet.change.record import verified
from k3fleet.change.timing import ChangeRecorder
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK
from k3fleet.errors import UsageError
from k3fleet.evidence import COMMAND, RunDir, layout
from k3fleet.evidence.reader import RunReader
from k3fleet.models.evidence import RollbackRunRecord
from k3fleet.models.target import Target
from k3fleet.targets import load_target


@dataclass
class RollbackOptions:
    inventory: Path
    limit: str | None = None
    run: Path | None = None
    operator: str | None = None
    forks: int = 20
    serial: str = "100%"
    # None: the target's value (targets/*.yaml, section change).
    drain_timeout: int | None = None
    force: bool = False
    check: bool = False
    target: Path | None = None
    # False: connect without checking host keys (an explicit choice, recorded in command.json).
    host_key_checking: bool = True
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    out: Path | None = None


@dataclass
class RollbackResult:
    run_dir: RunDir
    sources: dict[str, list[str]]
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    plays: list[PlayResult] = field(default_factory=list)
    # Journal lines that could not be used (torn, wrong schema): shown to the operator, not only stored.
    problems: list[str] = field(default_factory=list)
    exit_code: int = EXIT_OK
    message: str = ""


@dataclass
class Source:
    """One journal to roll back from: read once, with the hosts taken from it."""

    journal: Journal
    hosts: list[str]
    histories: dict[str, HostHistory]


def _journals_under(runs_dir: Path) -> list[Path]:
    """The journals of the change runs under ``runs_dir`` (a rollback run keeps a copy of its own
    lines, which the change's journal has too)."""
    if not runs_dir.is_dir():
        raise UsageError(f"runs directory {runs_dir} does not exist: give --run RUN")
    out = []
    for p in sorted(runs_dir.glob(f"*/{layout.JOURNAL}")):
        if p.is_file() and RunReader(p.parent).object(COMMAND).get("kind") == "change":
            out.append(p)
    return out


def rollback_sources(opts: RollbackOptions) -> tuple[list[Source], dict[str, str], dict[str, str]]:
    """Which journal each host is rolled back from, the hosts with nothing to roll back, and the
    hosts refused (a change recorded, no readable snapshot)."""
    if opts.run is None and not opts.limit:
        raise UsageError("say what to roll back: --run RUN (a whole night) or --limit HOSTS (their latest change)")
    hosts_of = inventory_hosts if opts.check else refuse_simulated
    wanted = hosts_of(opts.inventory, opts.limit) if opts.limit else None
    if opts.run is not None:
        rd = verified(opts.run)
        path = rd.path / layout.JOURNAL
        if not path.exists():
            raise UsageError(f"run {rd.path} has no {layout.JOURNAL}: nothing was changed in it")
        journal = read_journal(path)
        histories = replay_journal(journal)
        targets, skipped, refused_run = rollback_targets(histories, wanted, journal)
        if targets and wanted is None and not opts.check:
            # Every host of the run: those must not be simulated lab hosts either.
            refuse_simulated(opts.inventory, ",".join(t.host for t in targets))
        if not targets:
            why = "; ".join(f"{h}: {r}" for h, r in {**refused_run, **skipped}.items()) or "the journal is empty"
            if refused_run:
                raise UsageError(f"nothing can be rolled back from {path}: {why}")
            raise UsageError(f"nothing to roll back in {path}: {why}")
        return [Source(journal, [t.host for t in targets], histories)], skipped, refused_run
    assert wanted is not None
    newest: dict[str, tuple[str, Path]] = {}
    read: dict[Path, tuple[Journal, dict[str, HostHistory]]] = {}
    for path in _journals_under(opts.runs_dir):
        verified(path.parent)
        journal = read_journal(path)
        histories = replay_journal(journal)
        read[path] = (journal, histories)
        for host, h in histories.items():
            if host in wanted and (h.snapshot is not None or h.snapshot_problem):
                ts = h.entries[-1].ts if h.entries else ""
                if host not in newest or ts > newest[host][0]:
                    newest[host] = (ts, path)
    by_path: dict[Path, list[str]] = {}
    skipped = {h: f"no change journal under {opts.runs_dir} has a snapshot of it" for h in wanted if h not in newest}
    refused: dict[str, str] = {}
    for host, (_, path) in newest.items():
        by_path.setdefault(path, []).append(host)
    sources: list[Source] = []
    for path, hosts in sorted(by_path.items()):
        journal, histories = read[path]
        targets, skip, refuse = rollback_targets(histories, hosts, journal)
        skipped.update(skip)
        refused.update({h: f"{path}: {r}" for h, r in refuse.items()})
        if targets:
            sources.append(Source(journal, [t.host for t in targets], histories))
    if not sources:
        why = "; ".join(f"{h}: {r}" for h, r in {**refused, **skipped}.items())
        raise UsageError(f"nothing to roll back: {why}")
    return sources, skipped, refused


def run_rollback(opts: RollbackOptions, argv: Sequence[str], observer: Observer | None = None,
                 cancel: threading.Event | None = None) -> RollbackResult:
    operator = validate_operator(opts.operator) if opts.operator else None
    target = load_target(opts.target)
    c = target.change
    drain_timeout = opts.drain_timeout if opts.drain_timeout is not None else c.drain_timeout_s
    if opts.check:
        return _run(opts, argv, observer, cancel, operator, target, drain_timeout)
    with NightLock(opts.runs_dir, kind="rollback", change_id=None, operator=operator) as lock:
        result = _run(opts, argv, observer, cancel, operator, target, drain_timeout, lock)
    return result


def _run(opts: RollbackOptions, argv: Sequence[str], observer: Observer | None, cancel: threading.Event | None,
         operator: str | None, target: Target, drain_timeout: int, lock: NightLock | None = None) -> RollbackResult:
    sources, skipped, refused = rollback_sources(opts)
    rd = RunDir.create(opts.runs_dir, "rollback", argv, out=opts.out)
    if lock is not None:
        lock.set_run(rd.path)
    rd.copy_inventory(opts.inventory)
    c = target.change
    timeouts = {"drain": float(drain_timeout), "reboot": float(c.reboot_timeout_s),
                "fabricmanager_settle": float(c.fabricmanager_settle_s), "command": float(c.command_timeout_s)}
    result = RollbackResult(run_dir=rd, sources={str(s.journal.path): s.hosts for s in sources}, skipped=skipped,
                            refused=refused)
    rd.write_json(layout.ROLLBACK, {"sources": result.sources, "skipped": skipped, "refused": refused,
                                    "check": opts.check, "operator": operator})
    interrupted = False
    for i, src in enumerate(sources):
        journal = src.journal
        hosts = {}
        for host in src.hosts:
            first = src.histories[host].entries[0]
            lease = Lease.build(first.change_id, operator, ROLLBACK_TEXT, int(c.lease_ttl_s))
            hosts[host] = {"snapshot": src.histories[host].snapshot, "change_id": first.change_id, "run": first.run,
                           "lease": lease.extravar()}
        ev: dict[str, Any] = {
            "k3fleet_journal": str(journal.path.resolve()),
            "k3fleet_run_id": rd.path.name,
            "k3fleet_rollback": hosts,
            "k3fleet_rollback_hosts": list(hosts),
            "k3fleet_rollback_serial": opts.serial,
            "k3fleet_timeouts": timeouts,
            "k3fleet_drain_force": opts.force,
            "k3fleet_image": target.image.ref,
        }
        recorder = ChangeRecorder(inner=observer or Observer())
        with PlayGuard(opts.runs_dir, f"{rd.path.name}-{i + 1}", real_ansible_playbook()):
            play = run_playbook("rollback.yml", opts.inventory, rd.path / layout.ansible_dir(str(i + 1)), extravars=ev,
                                forks=opts.forks, check=opts.check, observer=recorder, cancel=cancel,
                                host_key_checking=opts.host_key_checking)
        result.plays.append(play)
        rd.write_jsonl(layout.events_file(str(i + 1)), play.events)
        # The rollback's own lines, from the play: the source journal keeps them too.
        mine = []
        for line in recorder.lines:
            try:
                mine.append(JournalEntry.model_validate(line))
            except ValueError:
                continue
        for e in mine:
            rd.append_jsonl(layout.JOURNAL, e.model_dump(mode="json", exclude_none=True))
        now = replay(mine)
        for host in src.hosts:
            h = now.get(host)
            stages = [e.stage for e in h.entries] if h else []
            last = play.last(host)
            if "rolled_back" in stages:
                outcome = "rolled_back"
            elif h is not None and h.stage == "held":
                outcome = "held"
            elif "failed" in stages or (last is not None and last.status in ("failed", "unreachable", "timeout")):
                outcome = "failed"
            elif opts.check and last is not None and last.status == "ok":
                outcome = "checked"
            else:
                outcome = "not_finished"
            failure = (h.failure if h else None) or (f"{last.status}: {last.task}: {last.message}"
                                                     if last is not None and last.status != "ok" else None)
            if outcome == "held" and h is not None:
                failure = f"held by change {h.held_by}: not touched by this rollback"
            result.hosts[host] = {"outcome": outcome, "from": str(journal.path), "stages": stages,
                                  "failure": failure, "returned_to_service": _returned(h), **_source(h)}
        if play.interrupted and not opts.check:
            # Where each host was when the signal came, in the source journal (and the rollback's copy).
            marks = mark_interrupted(
                journal.path, replay([*journal.entries, *mine]), list(src.hosts), run=rd.path.name,
                signal=signal_name(cancel), during="rollback", now=journal_now(),
                next_step=f"k3fleet rollback --run {journal.path.parent} (it is idempotent)")
            for line in marks:
                rd.append_jsonl(layout.JOURNAL, line)
                result.hosts[str(line["host"])]["interrupted"] = {"stage": line["stage"], **line["interrupted"]}
        # The source run's journal grew by the rollback's lines: its manifest says so again.
        RunDir(journal.path.parent).write_manifest()
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
    elif refused:
        result.exit_code = EXIT_INCOMPLETE
        result.message = (f"{len(outcomes)} host(s) {'checked' if opts.check else 'rolled back'}; refused "
                          + "; ".join(f"{h}: {r}" for h, r in refused.items()))
    elif any(o in ("not_finished", "held") for o in outcomes):
        result.exit_code, result.message = EXIT_INCOMPLETE, "some hosts did not finish: run the rollback again"
    else:
        result.exit_code = EXIT_OK
        result.message = f"{len(outcomes)} host(s) {'checked' if opts.check else 'rolled back'}"
    result.problems = [p for s in sources for p in s.journal.problems]
    rd.write_json(layout.RUN, RollbackRunRecord(
        exit_code=result.exit_code, message=result.message, hosts=result.hosts, skipped=skipped, refused=refused,
        sources=result.sources, journal_problems=result.problems,
        wall_s=round(sum(p.wall_s for p in result.plays), 3)).dump())
    rd.write_manifest()
    return result


def _returned(h: HostHistory | None) -> bool:
    back = h.last("returned") if h is not None else None
    return bool(back is not None and isinstance(back.detail, dict) and back.detail.get("returned_to_service"))


def _source(h: HostHistory | None) -> dict[str, Any]:
    """Where the rollback took the packages from (``repository`` or ``kit``, docs/change-night.md "Rollback
    kit") and why, from its ``rolled_back`` line; nothing when no package had to be installed."""
    back = h.last("rolled_back") if h is not None else None
    detail = back.detail if back is not None and isinstance(back.detail, dict) else {}
    if not detail.get("source"):
        return {"source": None, "source_why": None}
    return {"source": str(detail["source"]), "source_why": str(detail.get("source_why") or "")}
