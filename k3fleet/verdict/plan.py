"""The change plan: who moves to the target driver, who is done, who is blocked, canary, waves.

The change night installs the driver together with the Fabric Manager of exactly its
version. A host already at the target driver whose Fabric Manager differs (or is
missing on an NVSwitch system) still has something to change: it is planned with scope
``fabricmanager``, only the Fabric Manager packages moving to the driver's version.
``done`` means nothing is left to change.

The canary is a host the driver change is meant for (scope ``driver``), idle, free of
problem warnings, of the profile most hosts share: it should show how the change goes
on an ordinary host, not on one with its own trouble. A host whose GPUs other processes
hold (``gpu.in_use``) is never the canary and never idle: the scheduler may not know the
workload, and the reboot would end it.

Pure and O(n log n) in hosts: one pass to classify, one sort to order the canary
candidates and waves. Ordering is deterministic (ties broken by host name), so two
audits of the same facts give the same plan.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from k3fleet.models.facts import HostFacts, SchedulerFacts, unchecked
from k3fleet.models.findings import (
    BlockedHost,
    Canary,
    ChangePlan,
    Finding,
    PackageChange,
    UpgradeItem,
    UpgradeScope,
)
from k3fleet.models.target import version_tuple
from k3fleet.verdict.rules import DRIVER_ROLES, CompiledTarget, HostContext, state_words, tenants
from k3fleet.verdict.tenants import summary as tenant_summary

# The change night installs and holds the packages itself, so these do not block it.
RESOLVED_BY_CHANGE = frozenset({"packages.held", "packages.unattended_upgrades"})
# Fabric Manager findings that installing the Fabric Manager of the driver's version settles.
FM_MISMATCH = frozenset({"fabricmanager.version_match", "fabricmanager.present"})
# Fabric Manager refuses to start against another driver version; without it an NVSwitch
# system's GPUs never finish fabric training and cannot run CUDA work. On a host whose
# Fabric Manager is the wrong version, these follow from it and the FM change settles them
# (the change night's verify step proves it: FM active, CUDA initialises in the container).
RESOLVED_BY_FM_CHANGE = FM_MISMATCH | {"fabricmanager.active", "gpu.fabric_state"}


@dataclass(slots=True)
class HostEval:
    host: str
    # What the rules read: for a host of a node kind, the facts of one host of that kind (equal in
    # every section the rule key covers); the host's own scheduler section is ``scheduler``.
    facts: HostFacts
    ctx: HostContext
    findings: list[Finding]
    status: str
    scheduler: SchedulerFacts
    # The node kind (validate_facts' rule key) whose findings these exactly are, or None: then what
    # the plan reads from them holds for every host of the kind.
    kind: int | None = None


def idle(sc: SchedulerFacts, ct: CompiledTarget, ctx: HostContext | None = None) -> bool | None:
    """Idle: no GPU held by a process (``ctx``), no running jobs and a state the target calls idle
    (the host's scheduler section ``sc``); None if unknown."""
    if ctx is not None and ctx.gpus_in_use:
        return False
    if sc.jobs_running:
        return False
    if sc.kind == "none" or (sc.kind is None and sc.status == "absent"):
        return None if sc.jobs_running is None else True
    if sc.status != "ok" or not sc.state:
        return None
    words = state_words(sc.state)
    # A flag such as maint, reserved or not_responding makes an idle node no canary.
    return bool(words) and words <= ct.idle_states and not sc.state_flags


def profile(c: HostContext) -> str:
    """What makes two hosts interchangeable for a canary: hardware, current driver, fabric, flavour."""
    fabric = "NVSwitch" if c.fm_required else ("no NVSwitch" if c.fm_required is False else "NVSwitch ?")
    return (f"{c.gpu_count if c.gpu_count is not None else '?'}x {c.gpu_model or 'unknown GPU'}, "
            f"driver {c.version}, {fabric}, {c.flavour or '?'} modules")


def _branch_of(name: str, branch_field: str | None) -> int | None:
    if branch_field and branch_field.isdigit():
        return int(branch_field)
    m = re.search(r"(?<![0-9.])([0-9]{3})(?![0-9.])", name)
    return int(m.group(1)) if m else None


_PkgKey = (tuple[int | None, bool | None, tuple[tuple[str, str, str, str | None], ...]]
           | tuple[int, int | None, bool | None])


def package_changes(
    facts: HostFacts, c: HostContext, ct: CompiledTarget, memo: dict[_PkgKey, tuple[list[PackageChange], list[str]]]
) -> tuple[list[PackageChange], list[str]]:
    """Driver-side packages of the current branch renamed to the target branch, plus Fabric Manager.

    Hosts of one profile carry identical package sets: ``memo`` computes each set once
    and the plan shares the (read-only) results.
    """
    # Hosts validated together share one package section object (validate_facts): its identity is
    # the cheap key; the content key catches equal sets validated apart.
    fast = (id(facts.packages), c.branch, c.fm_required)
    hit = memo.get(fast)
    if hit is not None:
        return hit
    key: _PkgKey = (c.branch, c.fm_required,
                    tuple((p.name, p.version, p.role, p.branch) for p in facts.packages.packages))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _package_changes(facts, c, ct)
    memo[fast] = hit
    return hit


def _package_changes(facts: HostFacts, c: HostContext, ct: CompiledTarget) -> tuple[list[PackageChange], list[str]]:
    t = ct.target
    changes: list[PackageChange] = []
    notes: list[str] = []
    unnamed: list[str] = []
    have_fm = False
    for p in facts.packages.packages:
        if p.role not in DRIVER_ROLES:
            continue
        have_fm = have_fm or p.role == "fabricmanager"
        if _branch_of(p.name, p.branch) != c.branch:
            continue
        to_name = re.sub(rf"(?<![0-9]){c.branch}(?![0-9])", str(t.driver.branch), p.name, count=1)
        if to_name == p.name:
            unnamed.append(p.name)
            continue
        changes.append(PackageChange(
            name=p.name, from_version=p.version, to_name=to_name,
            to_version=None if p.role == "kernel_modules" else t.driver.target_version))
    if c.fm_required and not have_fm:
        changes.append(PackageChange(name=None, from_version=None, to_name=f"nvidia-fabricmanager-{t.driver.branch}",
                                     to_version=t.driver.target_version))
        notes.append("NVSwitch system without a Fabric Manager package: it is added at the driver's version")
    if unnamed:
        notes.append(f"packages without a branch in their name ({', '.join(sorted(unnamed))}): move them with "
                     f"the package manager's stream/pinning (e.g. nvidia-driver:{t.driver.branch}-open)")
    if not facts.packages.packages:
        notes.append("no driver packages recorded: a runfile install cannot be changed by this plan")
    return changes, notes


def fm_mismatch(ev: HostEval) -> bool:
    """The host's Fabric Manager is missing or of another version than its driver (a definite failure)."""
    return any(f.check_id in FM_MISMATCH and f.kind == "fail" for f in ev.findings)


_FmKey = tuple[str | None, tuple[tuple[str, str, str | None], ...]]


def fm_package_changes(
    facts: HostFacts, c: HostContext, memo: dict[_FmKey, tuple[list[PackageChange], list[str]]]
) -> tuple[list[PackageChange], list[str]]:
    """Only the Fabric Manager packages, to the loaded driver's version (memoised per package set)."""
    key: _FmKey = (c.version, tuple((p.name, p.version, p.branch) for p in facts.packages.packages
                                    if p.role == "fabricmanager"))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _fm_package_changes(facts, c)
    return hit


def _fm_package_changes(facts: HostFacts, c: HostContext) -> tuple[list[PackageChange], list[str]]:
    assert c.version is not None and c.branch is not None
    want = version_tuple(c.version)
    changes: list[PackageChange] = []
    notes: list[str] = []
    for p in facts.packages.packages:
        if p.role != "fabricmanager":
            continue
        b = _branch_of(p.name, p.branch)
        to_name = p.name
        if b is not None and b != c.branch:
            to_name = re.sub(rf"(?<![0-9]){b}(?![0-9])", str(c.branch), p.name, count=1)
        if to_name == p.name and version_tuple(p.version) == want:
            continue
        changes.append(PackageChange(name=p.name, from_version=p.version, to_name=to_name, to_version=c.version))
    if not changes:
        changes.append(PackageChange(name=None, from_version=None, to_name=f"nvidia-fabricmanager-{c.branch}",
                                     to_version=c.version))
        notes.append("NVSwitch system without a Fabric Manager package: it is added at the driver's version")
    notes.append(f"the driver is already at {c.version}: only Fabric Manager changes, to the driver's version")
    return changes, notes


def _fm_explains_probe(f: Finding, ev: HostEval) -> bool:
    """A failed in-container CUDA start on an NVSwitch host whose Fabric Manager is not running."""
    return (f.check_id == "container.probe" and f.kind == "fail" and ev.ctx.fm_required is True
            and ev.facts.fabricmanager.unit.active != "active")


def _idle_rank(v: bool | None) -> int:
    return 0 if v is True else (1 if v is None else 2)


def _idle_text(v: bool | None) -> str:
    return "idle per the scheduler and the GPUs" if v is True else (
        "idle state unknown (no scheduler facts)" if v is None else "busy: the drain will wait for its jobs")


def _in_use_note(c: HostContext) -> str:
    pids = sorted({p.pid for g in c.gpus_in_use for p in g.processes or () if p.pid is not None})
    held = f"compute process(es) {', '.join(map(str, pids[:4]))}" if pids else "memory another process holds"
    return (f"GPU {','.join(str(g.index) for g in c.gpus_in_use[:8])}{'...' if len(c.gpus_in_use) > 8 else ''} "
            f"in use ({held}), not a scheduler job the drain waits for: stop that workload first, the reboot "
            "ends it")


# (blocking check ids, their reasons, problem warnings, all warnings) of one host's findings.
_Judged = tuple[list[str], list[str], int, int]


def _judge(ev: HostEval, scope: UpgradeScope, resolved: frozenset[str]) -> _Judged:
    blockers = [f for f in ev.findings if f.blocking and not f.chain and f.check_id not in resolved
                and not (scope == "fabricmanager" and _fm_explains_probe(f, ev))]
    if blockers:
        return sorted({f.check_id for f in blockers}), [f"{f.check_id}: {f.message}" for f in blockers], 0, 0
    warnings = [f for f in ev.findings if f.severity == "warning"]
    problems = sum(1 for f in warnings if f.kind == "fail" and f.check_id not in resolved)
    return [], [], problems, len(warnings)


def build_plan(
    evals: Sequence[HostEval], unreachable: Sequence[str], ct: CompiledTarget, wave_size: int | None = None
) -> tuple[ChangePlan, int]:
    """The plan, and the GPUs of the hosts it can change that do not count as healthy today (failed
    hosts the change repairs: they count after it). ``evals`` come in host name order."""
    if wave_size is not None and wave_size < 1:
        raise ValueError(f"wave_size must be at least 1, got {wave_size}")
    t = ct.target
    needs: list[UpgradeItem] = []
    done: list[str] = []
    blocked: list[BlockedHost] = []
    # (item, host, problem warnings, all warnings)
    eligible: list[tuple[UpgradeItem, HostEval, int, int]] = []
    repaired = 0
    memo: dict[_PkgKey, tuple[list[PackageChange], list[str]]] = {}
    fm_memo: dict[_FmKey, tuple[list[PackageChange], list[str]]] = {}
    # Hosts of one kind share their context: its profile text, and what its findings say for the
    # plan, are worked out once.
    profiles: dict[int, str] = {}
    judgements: dict[tuple[int, str], _Judged] = {}
    for ev in evals:
        c = ev.ctx
        if c.version_t is None or c.branch is None:
            ids = sorted({f.check_id for f in ev.findings if f.blocking}) or ["driver.branch"]
            # A Jetson has a version but no branch: say what it is, never plan a driver change for it.
            why = c.platform_note or "the current driver version is unknown"
            blocked.append(BlockedHost(host=ev.host, current_version=c.version if c.platform_note else None,
                                       check_ids=ids, reasons=[why]))
            continue
        scope: UpgradeScope
        if c.below_target:
            scope, resolved = "driver", RESOLVED_BY_CHANGE
            changes, notes = package_changes(ev.facts, c, ct, memo)
            to_version, to_branch = t.driver.target_version, t.driver.branch
        elif c.fm_required and fm_mismatch(ev):
            scope, resolved = "fabricmanager", RESOLVED_BY_CHANGE | RESOLVED_BY_FM_CHANGE
            changes, notes = fm_package_changes(ev.facts, c, fm_memo)
            to_version, to_branch = c.version or "", c.branch
        else:
            done.append(ev.host)
            continue
        if c.gpus_in_use:
            notes = [*notes, _in_use_note(c)]
        others = tenants(ev.facts, ct) if scope == "driver" else None
        if others:
            # Which of the node's other CUDA work keeps working on the target branch and which breaks
            # (workloads.cuda_compat blocks the host on a break; docs/facts.md section 16).
            notes = [*notes, tenant_summary(others, t.driver.branch)]
        item = unchecked(
            UpgradeItem, host=ev.host, scope=scope, current_version=c.version or "", current_branch=c.branch,
            target_version=to_version, target_branch=to_branch,
            gpu_model=c.gpu_model, gpu_count=c.gpu_count, profile=profiles.get(id(c)) or profiles.setdefault(
                id(c), profile(c)), idle=idle(ev.scheduler, ct, c),
            packages=changes, notes=notes,
        )
        needs.append(item)
        judged = judgements.get((ev.kind, scope)) if ev.kind is not None else None
        if judged is None:
            judged = _judge(ev, scope, resolved)
            if ev.kind is not None:
                judgements[(ev.kind, scope)] = judged
        check_ids, reasons, problems, warns = judged
        if check_ids:
            blocked.append(BlockedHost(host=ev.host, current_version=c.version, check_ids=check_ids,
                                       reasons=reasons))
        else:
            eligible.append((item, ev, problems, warns))
            if ev.status not in ("pass", "warn"):
                repaired += c.gpu_count or 0

    counts = Counter(i.profile for i in needs if i.scope == "driver")
    # Driver-change hosts first (the canary proves that change), then idle, then hosts without
    # problem warnings (a canary's trouble should be the change's), then the commonest profile, then
    # by name. The hosts came in name order and a fleet has few distinct orderings of the rest: each
    # host goes to its ordering's bucket and the buckets are sorted, which is the same order as
    # sorting every host (and linear in hosts, where a sort of every host is not).
    buckets: dict[tuple[bool, int, bool, int, str, int], list[tuple[UpgradeItem, HostEval, int, int]]] = {}
    for x in eligible:
        item = x[0]
        order = (item.scope != "driver", _idle_rank(item.idle), x[2] > 0, -counts[item.profile], item.profile, x[3])
        bucket = buckets.get(order)
        if bucket is None:
            buckets[order] = [x]
        else:
            bucket.append(x)
    eligible = [x for order in sorted(buckets) for x in buckets[order]]
    plan = ChangePlan(
        target_branch=t.driver.branch, target_version=t.driver.target_version, needs_upgrade=needs,
        done=done, blocked=blocked, unreachable=sorted(unreachable),
    )
    if not eligible:
        plan.canary_note = (
            "no host needs the change" if not needs else
            f"all {len(needs)} hosts needing the change are blocked: fix their findings first")
        return plan, 0
    pick = next((x for x in eligible if not x[1].ctx.gpus_in_use), None)
    if pick is None:
        plan.canary_note = (f"every one of the {len(eligible)} unblocked hosts has GPUs in use by processes "
                            "outside the scheduler: free one before the night, the canary must be idle")
        return plan, repaired
    eligible.remove(pick)
    eligible.insert(0, pick)
    item, _, problems, warns = pick
    n_driver = sum(counts.values())
    noted = "" if warns == 0 else f" ({warns} warning(s){f', {problems} of them problems' if problems else ''})"
    # The reason is short (it is printed beside the host and its profile); why not the commonest
    # profile is a separate note.
    note = None
    if item.scope == "driver":
        top_profile, top_n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        reason = (f"no blocking findings{noted}, {_idle_text(item.idle)}, its profile shared by "
                  f"{counts[item.profile]} of {n_driver} hosts needing the driver change")
        if item.profile != top_profile:
            note = (f"the most common profile '{top_profile}' ({top_n} hosts) has no host that is idle, "
                    "unblocked and free of problem warnings")
    else:
        reason = f"no blocking findings{noted}, {_idle_text(item.idle)}; only Fabric Manager changes on it"
        if n_driver:
            note = f"none of the {n_driver} hosts needing the driver change is unblocked"
    plan.canary = Canary(host=item.host, profile=item.profile, reason=reason, note=note)
    size = wave_size if wave_size is not None else max(
        t.change.min_wave_size, math.ceil(t.change.wave_fraction * len(eligible)))
    rest = [x[0].host for x in eligible[1:]]
    plan.wave_size = size
    plan.waves = [rest[i:i + size] for i in range(0, len(rest), size)]
    return plan, repaired
