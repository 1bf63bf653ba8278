"""The gate of a change night: who may be changed, in which batches, with how many nodes out at once.

Pure where it can be (tested as tables): accepted findings, the canary and the waves, the
max-unavailable arithmetic, the nodes other changes hold. The fresh audit that the gate rests
on is run here too (docs/change-night.md "Gate").
"""

from __future__ import annotations

import fnmatch
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.audit.runner import Observer
from k3fleet.change.lease import lease_holder, lease_owner
from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, combine
from k3fleet.errors import UsageError


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
    limit: str | None = None
    forks: int = 20
    failure_budget: int = 0
    # "N" or "P%" of the audited fleet; None: no bound beyond the batch sizes.
    max_unavailable: str | None = None
    # None: the target's value (targets/*.yaml, section change).
    drain_timeout: int | None = None
    force: bool = False
    audit_max_age: int | None = None
    target: Path | None = None
    accept_findings: list[str] = field(default_factory=list)
    # False: connect without checking host keys (an explicit choice, recorded in command.json).
    host_key_checking: bool = True
    runs_dir: Path = field(default_factory=lambda: Path("runs"))
    out: Path | None = None
    # The serving smoke after each host's verification: None is the default (on for a night, as the
    # night was started for a resume); launch_file replaces the audit's serve command.
    smoke: bool | None = None
    launch_file: Path | None = None
    # node_exporter's textfile collector: the night's gauges, rewritten at every stage (k3fleet.change.textfile).
    textfile: Path | None = None
    # An operator in the loop (k3fleet.change.pause): pause after the canary, each host or each wave, each
    # pause at most pause_timeout seconds (then the next host stops before its drain: resume later).
    pause_after: str | None = None
    pause_timeout: int = 3600
    # Where pause prompts go (the CLI's stderr); None: nowhere.
    say: Callable[[str], None] | None = None
    # The rollback kit staged before each host's first change: None is the default (on for a night, as
    # the night was started for a resume); False is --no-rollback-kit.
    rollback_kit: bool | None = None


class NothingToChange(UsageError):
    """The audit cleared no host: all are on the target (exit 0), the rest are blocked (exit 1) or
    held by other changes (exit 3)."""

    def __init__(self, message: str, blocked: bool, held: bool = False) -> None:
        super().__init__(message)
        self.exit_code = combine(EXIT_FAILED if blocked else EXIT_OK, EXIT_INCOMPLETE if held else EXIT_OK)


# -- accepted findings ------------------------------------------------------------------------------


def check_accept_patterns(patterns: Sequence[str], known: Iterable[str]) -> list[str]:
    """Each ``--accept-finding`` must name known checks (an id or a pattern matching one); a bare
    ``*`` would accept everything and is refused."""
    ids = sorted(set(known))
    out: list[str] = []
    for raw in patterns:
        p = (raw or "").strip()
        if not p or p.strip("*?.") == "":
            raise UsageError(f"--accept-finding {raw!r} would accept every finding: name check ids or patterns "
                             "such as 'rdma.*' (k3fleet checks lists them)")
        if not any(fnmatch.fnmatchcase(c, p) for c in ids):
            raise UsageError(f"--accept-finding {p!r} matches no known check (k3fleet checks --json lists them)")
        out.append(p)
    return out


def check_accept_found(patterns: Sequence[str], finding_ids: Iterable[str], where: str) -> None:
    """Each accepted pattern must match at least one finding of the audit it is applied to."""
    found = sorted(set(finding_ids))
    for p in patterns:
        if not any(fnmatch.fnmatchcase(c, p) for c in found):
            raise UsageError(f"--accept-finding {p!r} matches no finding of {where}: nothing to accept "
                             f"(findings there: {', '.join(found) or 'none'})")


def accepted_blocked(plan: Mapping[str, Any], accept: Sequence[str]) -> list[str]:
    """Blocked hosts whose every blocking check id matches one of the operator's ``accept`` patterns."""
    return [b["host"] for b in plan.get("blocked") or []
            if b.get("check_ids") and all(any(fnmatch.fnmatchcase(c, p) for p in accept) for c in b["check_ids"])]


# -- canary and waves -------------------------------------------------------------------------------


def plan_batches(plan: Mapping[str, Any], canary: str | None, waves: bool, accept: Sequence[str] = (),
                 held: Mapping[str, str] | None = None) -> tuple[str, list[list[str]]]:
    """The canary and the waves after it, from an audit's change plan (``ChangePlan`` as JSON).

    ``canary`` overrides the plan's choice; it must be a host the plan upgrades and did not block.
    ``accept`` (check id patterns, e.g. ``rdma.*``) clears hosts blocked by nothing else: an explicit,
    recorded operator decision that those findings do not stop a driver change. Cleared hosts join
    the waves in waves of the plan's size. Hosts in ``held`` (another change's lease) are left out.
    """
    planned = [item["host"] for item in plan.get("needs_upgrade") or []]
    held = {h: c for h, c in (held or {}).items() if h in planned}
    cleared = set(accepted_blocked(plan, accept))
    blocked = {b["host"]: "; ".join(b.get("reasons") or []) for b in plan.get("blocked") or []
               if b["host"] not in cleared}
    eligible = [h for h in planned if h not in blocked and h not in held]
    if not eligible:
        done = ", ".join(plan.get("done") or []) or "none"
        why = "; ".join([f"{h}: {r}" for h, r in blocked.items()]
                        + [f"{h}: held by change {c}" for h, c in held.items()])
        raise NothingToChange(f"nothing to change: no host is cleared for R{plan.get('target_branch')} "
                              f"(already on target: {done}; blocked: {why or 'none'})",
                              blocked=bool(blocked), held=bool(held))
    if canary is not None:
        if canary in held:
            raise UsageError(f"--canary {canary} is held by change {held[canary]}: choose another canary")
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
        if c["host"] in held:
            raise UsageError(f"the audit's canary {c['host']} is held by change {held[c['host']]}: "
                             "name another with --canary HOST")
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
        size = int(plan.get("wave_size") or 0) or max((len(w) for w in plan.get("waves") or []), default=0) \
            or len(rest) or 1
        for i in range(0, len(rest), size):
            batches.append(rest[i:i + size])
    return chosen, batches


# -- blast radius --------------------------------------------------------------------------------------

_MAX_UNAVAILABLE = re.compile(r"^(?:(?P<n>[1-9][0-9]*)|(?P<p>[1-9][0-9]?(?:\.[0-9]+)?|100)%)$")


def check_max_unavailable(value: str | None) -> str | None:
    """``N`` (nodes) or ``P%`` (of the audited fleet); refused before anything runs when malformed."""
    if value is None:
        return None
    text = value.strip()
    if not _MAX_UNAVAILABLE.match(text):
        raise UsageError(f"--max-unavailable {value!r}: give a number of nodes (at least 1) or a percentage of "
                         "the fleet such as 10%")
    return text


def resolve_max_unavailable(value: str | None, fleet: int, batches: Sequence[int]) -> int:
    """Nodes this change may have out of service at once. A percentage is of the ``fleet`` (every host
    the audit saw), rounded down like Kubernetes' maxUnavailable; without a value, the largest batch."""
    widest = max(batches, default=1)
    if value is None:
        return max(1, widest)
    m = _MAX_UNAVAILABLE.match(value.strip())
    if m is None:
        raise UsageError(f"--max-unavailable {value!r}: give a number of nodes or a percentage such as 10%")
    if m.group("n"):
        return int(m.group("n"))
    n = math.floor(float(m.group("p")) * fleet / 100)
    if n < 1:
        raise UsageError(f"--max-unavailable {value} of {fleet} host(s) is 0 nodes: nothing could be changed; "
                         "give a larger share or a number of nodes")
    return n


# -- leases seen by the audit -------------------------------------------------------------------------


def held_by_others(reasons: Mapping[str, str | None], change_id: str) -> dict[str, str]:
    """Hosts whose scheduler reason (as the audit read it) is another change's lease: host -> change id."""
    out: dict[str, str] = {}
    for host, reason in reasons.items():
        if lease_owner(reason, change_id) == "k3fleet":
            out[host] = str(lease_holder(reason))
    return out


# -- per-host package plans ----------------------------------------------------------------------------


def host_plans(plan: Mapping[str, Any], hosts: Sequence[str], target_version: str | None) -> dict[str, Any]:
    """What each host's packages become, from the audit's plan (the one package planner; the
    nvidia_driver role only applies it). ``target_version`` (--target-version) replaces the plan's
    version on the driver change; a Fabric Manager-only change keeps the driver's own version."""
    items = {i["host"]: i for i in plan.get("needs_upgrade") or []}
    out: dict[str, Any] = {}
    for host in hosts:
        item = items.get(host)
        if item is None:
            raise UsageError(f"{host} is not in the audit's change plan")
        version = item["target_version"]
        if target_version and item.get("scope", "driver") == "driver":
            version = target_version
        packages = [{"name": p.get("name"), "to_name": p["to_name"],
                     "to_version": (version if p.get("to_version") else None)} for p in item.get("packages") or []]
        if not packages:
            raise UsageError(f"{host}: the audit planned no package change for it "
                             f"({'; '.join(item.get('notes') or []) or 'no driver packages recorded'})")
        out[host] = {"scope": item.get("scope", "driver"), "target_version": version,
                     "target_branch": int(str(version).split(".")[0]), "packages": packages}
    return out


def fresh_audit(opts: UpgradeOptions, argv: Sequence[str], dest: Path, limit: str | None,
                observer: Observer | None, cancel: threading.Event | None) -> Any:
    """Audit the hosts again (same inventory, target and forks) into ``dest``; its result, or UsageError."""
    # lazy: the audit flow (verdict rules, reports) stays off the CLI's start-up path, which imports this package
    from k3fleet.audit.run import AuditOptions, run_audit

    audit = run_audit(AuditOptions(inventory=opts.inventory, limit=limit, forks=opts.forks, target=opts.target,
                                   out=dest, runs_dir=opts.runs_dir, host_key_checking=opts.host_key_checking),
                      argv, observer=observer, cancel=cancel)
    if audit.play.interrupted:
        raise UsageError(f"the gating audit was interrupted; nothing was changed (evidence: {dest})")
    return audit


def audit_reasons(audit: Any) -> dict[str, str | None]:
    return dict(audit.scheduler_reasons)


def finding_ids(verdict: Any) -> list[str]:
    return [f.check_id for f in verdict.all_findings()]
