"""The audit flow: inventory -> audit.yml -> validated facts -> verdict and plan -> run directory.

Each host's facts are folded into the streaming verdict (:class:`k3fleet.verdict.FleetFold`) one at a
time, in the play's host order: a node kind's facts are held once, not every host's validated model
(only the NCCL pair test of ``--active full`` needs each host's own).
"""

from __future__ import annotations

import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.audit.inventory import inventory_hosts
from k3fleet.audit.pairs import run_pair_phase
from k3fleet.audit.runner import Observer, PlayResult, run_playbook
from k3fleet.bounds import read_json
from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_OK, combine
from k3fleet.errors import UsageError
from k3fleet.evidence import JsonEntries, RunDir, layout
from k3fleet.models.evidence import AuditRunRecord
from k3fleet.models.facts import HostFacts, schema_mismatch
from k3fleet.models.findings import Finding, FleetVerdict
from k3fleet.models.pairs import PairPhase
from k3fleet.models.target import Target
from k3fleet.report import markdown
from k3fleet.targets import load_target
from k3fleet.verdict import FleetFold, validate_facts
from k3fleet.verdict.foreign import foreign_findings, sniff_foreign
from k3fleet.verdict.intake import gc_paused
from k3fleet.verdict.pairs import judge_pairs


@dataclass
class AuditOptions:
    inventory: Path | None
    lab: bool = False
    lab_count: int | None = None
    limit: str | None = None
    forks: int = 20
    target: Path | None = None
    out: Path | None = None
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    probe: bool = False
    # Active checks (docs/facts.md section 17): none, quick or full.
    active: str = "none"
    host_timeout: int = 300
    command_timeout: float = 20.0
    # False: connect without checking host keys (an explicit choice, recorded in command.json).
    host_key_checking: bool = True
    # Other tools' health output per host (gpud states or events, dcgmi health -c -j): k3fleet.verdict.foreign.
    health_evidence: dict[str, list[Path]] = field(default_factory=dict)


ACTIVE_LEVELS = ("none", "quick", "full")


def active_spec(target: Target, level: str) -> tuple[dict[str, Any], int]:
    """The node module's ``active_spec`` from the target, and the most seconds the checks may take.

    Full runs one ib_write_bw per rail: the budget counts the target's expected rails. The NCCL pair
    test runs after the per-host play, with its own bound (:mod:`k3fleet.audit.pairs`).
    """
    a = target.active
    t = a.timeouts
    spec = {
        "dcgm_level": dict(a.dcgm_level), "dcgm_timeout_s": {"quick": t.dcgm_quick_s, "full": t.dcgm_full_s},
        "nccl_timeout_s": t.nccl_s, "nccl_max_bytes": a.nccl_max_bytes, "ib_write_bw_timeout_s": t.ib_write_bw_s,
        "gpu_util": target.serve.gpu_memory_utilization, "nccl_pair_launcher": list(a.nccl_pair_launcher),
    }
    budget = t.dcgm_quick_s if level == "quick" else (
        t.dcgm_full_s + t.nccl_s + (t.ib_write_bw_s + 2) * max(1, target.rdma.rails_per_node))
    return spec, int(budget)


@dataclass
class AuditResult:
    run_dir: RunDir
    verdict: Any  # k3fleet.verdict FleetVerdict
    # Hosts whose facts validated (the fold holds a node kind's facts once, not each host's).
    hosts_with_facts: int
    unreachable: dict[str, str]
    invalid: dict[str, str]
    play: PlayResult
    # audit --active full: the NCCL pair test (None when it was not asked for or the audit stopped first).
    pairs: PairPhase | None = None
    # Each host's scheduler reason as its facts gave it (the change night reads other changes' leases
    # from it); one string per host, kept while the facts themselves are folded and dropped.
    scheduler_reasons: dict[str, str | None] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        stopped = self.play.interrupted or (self.pairs is not None and self.pairs.interrupted)
        if stopped:
            # Stopped by a signal (Ctrl-C, SIGTERM, SIGHUP): the verdict rests on the hosts that
            # answered before the stop, so the run says it was interrupted, whatever they found.
            return EXIT_INCOMPLETE
        return combine(int(self.verdict.exit_code), EXIT_INCOMPLETE if self.invalid else EXIT_OK)


def _facts_from_play(play: PlayResult, hosts: Sequence[str]) -> tuple[
        dict[str, Any], dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
    """Split hosts into facts to judge, unreachable (with why) and invalid evidence (with why)."""
    raw = play.results_with_key()
    candidates: dict[str, Any] = {}
    unreachable: dict[str, str] = {}
    invalid: dict[str, str] = {}
    for host in hosts:
        if host in raw:
            data = raw[host]
            mismatch = schema_mismatch(host, data)
            if mismatch:
                invalid[host] = mismatch
            else:
                candidates[host] = {**data, "host": host}
            continue
        last = play.last(host)
        if last is None:
            why = "interrupted before this host answered" if play.interrupted else "no result (play aborted)"
            unreachable[host] = why
        elif last.status == "unreachable":
            unreachable[host] = last.message or "unreachable"
        elif last.status == "timeout":
            unreachable[host] = f"timed out: {last.message or 'task timeout'}"
        else:
            # The module itself failed (e.g. no Python on the node): evidence is missing, not a check result.
            invalid[host] = f"host {host}: {last.status}: {last.message or 'module failed without a message'}"
    return candidates, unreachable, invalid, raw


def _scheduler_reason(data: Mapping[str, Any]) -> str | None:
    """The scheduler's reason in one host's raw facts (None where there is none, or it is not text)."""
    scheduler = data.get("scheduler")
    reason = scheduler.get("reason") if isinstance(scheduler, Mapping) else None
    return reason if isinstance(reason, str) else None


def read_health_evidence(given: Mapping[str, Sequence[Path]], hosts: Sequence[str]) -> list[
        tuple[str, str, Path, Any]]:
    """Each --health-evidence file read and recognised before anything runs: (host, kind, path, data);
    a host the audit does not visit, a file that cannot be read or is no known tool's output is one
    UsageError line (exit 2, no run directory)."""
    known = set(hosts)
    out: list[tuple[str, str, Path, Any]] = []
    for host, paths in given.items():
        if host not in known:
            raise UsageError(f"--health-evidence {host}=...: {host} is not a host this audit visits")
        for path in paths:
            data = read_json(path, "--health-evidence file", kind="a health tool's JSON output")
            kind = sniff_foreign(data)
            if kind is None:
                raise UsageError(f"--health-evidence {host}={path}: not gpud's /v1/states or /v1/events JSON, nor "
                                 "dcgmi health -c -j output")
            out.append((host, kind, path, data))
    return out


def fold_hosts(candidates: dict[str, Any], target: Target, unreachable: dict[str, str], invalid: dict[str, str], *,
               keep: bool = False) -> tuple[FleetFold, dict[str, HostFacts]]:
    """Each host's facts into the streaming verdict, one at a time; ``invalid`` gains the hosts whose facts
    do not validate. ``keep``: also return each host's validated facts (the NCCL pair test plans by them)."""
    fold = FleetFold(target, unreachable, invalid=invalid)
    kept: dict[str, HostFacts] = {}
    if keep:
        kept, bad = validate_facts(candidates)
        invalid.update(bad)
        for host, facts in kept.items():
            fold.add_facts(host, facts)
        return fold, kept
    with gc_paused(freeze=True):
        for host, data in candidates.items():
            fold.add(host, data)
    invalid.update(fold.invalid)
    return fold, kept


def verdict_document(verdict: FleetVerdict) -> dict[str, Any]:
    """verdict.json: the verdict as ``model_dump(mode="json")`` gives it, its hosts dumped one at a time
    while the file is written (a 100,000-host verdict is never one dict or one string)."""
    head = verdict.model_dump(mode="json", exclude={"hosts"})
    hosts = JsonEntries((name, hv.model_dump(mode="json")) for name, hv in verdict.hosts.items())
    keys = list(head)
    at = list(type(verdict).model_fields).index("hosts")
    return {**{k: head[k] for k in keys[:at]}, "hosts": hosts, **{k: head[k] for k in keys[at:]}}


def run_audit(opts: AuditOptions, argv: Sequence[str], observer: Observer | None = None,
              cancel: threading.Event | None = None) -> AuditResult:
    target = load_target(opts.target)
    with tempfile.TemporaryDirectory(prefix="k3fleet-lab-") as labtmp:
        inventory = opts.inventory
        if opts.lab:
            # lazy: the simulated lab fleet and its renderer load only for a --lab audit
            from k3fleet.lab.fleet import generate_fleet, load_fleet

            spec = load_fleet(opts.inventory)
            inventory = generate_fleet(spec, Path(labtmp), count=opts.lab_count, image=target.image.ref)
        if inventory is None:
            raise UsageError("no inventory given: -i INVENTORY, or --lab for the simulated fleet")
        # Every usage error (a missing inventory, a --limit that matches nothing) comes before the run
        # directory exists: a usage error writes nothing (docs/architecture.md "Contracts").
        hosts = inventory_hosts(inventory, opts.limit)
        foreign = read_health_evidence(opts.health_evidence, hosts)
        rd = RunDir.create(opts.runs_dir, "audit", argv, out=opts.out)
        rd.copy_inventory(inventory)
        if opts.target is not None:
            rd.copy_input(opts.target, layout.TARGET_SOURCE)
        rd.write_json(layout.TARGET, target.model_dump(mode="json"))
        extravars: dict[str, Any] = {
            "k3fleet_image": target.image.ref,
            "k3fleet_host_timeout": opts.host_timeout,
            "k3fleet_command_timeout": opts.command_timeout,
            # The CLI reads every host's facts from the events; the job-artifact copy is for AWX
            # (docs/scale.md) and costs the controller CPU per host.
            "k3fleet_publish_artifacts": False,
            # The error counters' two samples, at least this far apart (docs/facts.md section 14).
            "k3fleet_counter_interval": target.health.counter_interval_s,
        }
        if opts.probe or opts.active != "none":
            # Extra vars beat host vars: only force the probe on, never off (hosts may opt in). Every
            # active level includes it: the probe's matmul is the container's real CUDA operation.
            extravars["k3fleet_probe"] = True
        if opts.active != "none":
            active, budget = active_spec(target, opts.active)
            extravars["k3fleet_active"] = opts.active
            extravars["k3fleet_active_spec"] = active
            # The host's time grows by what the active checks may take, so their timeouts decide.
            extravars["k3fleet_host_timeout"] = opts.host_timeout + budget
        play = run_playbook("audit.yml", inventory, rd, extravars=extravars, limit=opts.limit, forks=opts.forks,
                            observer=observer, cancel=cancel, hosts=len(hosts),
                            host_key_checking=opts.host_key_checking, once=True)
        candidates, unreachable, invalid, raw = _facts_from_play(play, hosts)
        pair_phase = opts.active == "full" and not play.interrupted and not (cancel is not None and cancel.is_set())
        reasons = {h: _scheduler_reason(d) for h, d in candidates.items()}
        fold, facts = fold_hosts(candidates, target, unreachable, invalid, keep=pair_phase)
        del candidates
        pairs = None
        if pair_phase:
            # The second play, while the (lab) inventory still exists: nodes idle at the audit, in pairs.
            pairs = run_pair_phase(inventory, rd, facts, target, extravars["k3fleet_active_spec"],
                                   forks=opts.forks, cancel=cancel, host_key_checking=opts.host_key_checking,
                                   observer=observer)
    rd.write_jsonl(layout.EVENTS, play.events)
    for host, data in raw.items():
        rd.write_json(layout.facts_file(host), data)
    extra: dict[str, list[Finding]] = {}
    if pairs is not None:
        rd.write_json(layout.PAIRS, pairs.model_dump(mode="json"))
        extra = {h: list(fs) for h, fs in judge_pairs(pairs.runs, pairs.not_paired, target).items()}
    for n, (host, kind, path, data) in enumerate(foreign, 1):
        # The tool's output kept beside the verdict it entered (through the redactor, as every input).
        stored = f"{layout.INPUTS}/health-evidence/{n:02d}-{re.sub(r'[^A-Za-z0-9._-]', '_', host)[:80]}-{kind}.json"
        rd.write_json(stored, data)
        if host in unreachable or host in invalid:
            continue
        extra.setdefault(host, []).extend(
            f.model_copy(update={"evidence": {**f.evidence, "file": stored, "given": str(path)}})
            for f in foreign_findings(kind, data, host, target))
    measured = fold.measured
    verdict = fold.verdict(extra=extra or None)
    result = AuditResult(rd, verdict, measured, unreachable, invalid, play, pairs,
                         scheduler_reasons={h: r for h, r in reasons.items() if h not in invalid})
    _write_outputs(result, target)
    return result


def _write_outputs(result: AuditResult, target: Target) -> None:
    rd, v, play = result.run_dir, result.verdict, result.play
    rd.write_json(layout.VERDICT, verdict_document(v))
    rd.write_json(layout.RUN, AuditRunRecord(
        status="interrupted" if play.interrupted else play.status,
        ansible_rc=play.rc,
        hosts_total=result.hosts_with_facts + len(result.unreachable) + len(result.invalid),
        hosts_with_facts=result.hosts_with_facts,
        unreachable=result.unreachable,
        invalid_evidence=result.invalid,
        wall_s=round(play.wall_s, 3),
        controller_cpu_s=round(play.cpu_s, 3),
        exit_code=result.exit_code,
        ansible_stats=play.stats,
    ).dump())
    rd.write_text(layout.REPORT, markdown.render_audit(result, target))
    rd.write_manifest()
