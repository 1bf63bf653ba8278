"""The change plan: who moves to the target driver, who is done, who is blocked, canary, waves.

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

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import BlockedHost, Canary, ChangePlan, Finding, PackageChange, UpgradeItem
from k3fleet.verdict.rules import DRIVER_ROLES, CompiledTarget, HostContext, state_words

# The change night installs and holds the packages itself, so these do not block it.
RESOLVED_BY_CHANGE = frozenset({"packages.held", "packages.unattended_upgrades"})


@dataclass(slots=True)
class HostEval:
    host: str
    facts: HostFacts
    ctx: HostContext
    findings: list[Finding]
    status: str


def idle(facts: HostFacts, ct: CompiledTarget) -> bool | None:
    """Idle per scheduler facts: no running jobs and a state the target calls idle; None if unknown."""
    sc = facts.scheduler
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


_PkgKey = tuple[int | None, bool | None, tuple[tuple[str, str, str, str | None], ...]]


def package_changes(
    facts: HostFacts, c: HostContext, ct: CompiledTarget, memo: dict[_PkgKey, tuple[list[PackageChange], list[str]]]
) -> tuple[list[PackageChange], list[str]]:
    """Driver-side packages of the current branch renamed to the target branch, plus Fabric Manager.

    Hosts of one profile carry identical package sets: ``memo`` computes each set once
    and the plan shares the (read-only) results.
    """
    key: _PkgKey = (c.branch, c.fm_required,
                    tuple((p.name, p.version, p.role, p.branch) for p in facts.packages.packages))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _package_changes(facts, c, ct)
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


def _idle_rank(v: bool | None) -> int:
    return 0 if v is True else (1 if v is None else 2)


def _idle_text(v: bool | None) -> str:
    return "idle per the scheduler" if v is True else (
        "idle state unknown (no scheduler facts)" if v is None else "busy: the drain will wait for its jobs")


def build_plan(
    evals: Sequence[HostEval], unreachable: Sequence[str], ct: CompiledTarget, wave_size: int | None = None
) -> tuple[ChangePlan, list[HostEval]]:
    """The plan and the hosts it can change (canary first, then wave order)."""
    if wave_size is not None and wave_size < 1:
        raise ValueError(f"wave_size must be at least 1, got {wave_size}")
    t = ct.target
    needs: list[UpgradeItem] = []
    done: list[str] = []
    blocked: list[BlockedHost] = []
    eligible: list[tuple[UpgradeItem, HostEval, int]] = []
    memo: dict[_PkgKey, tuple[list[PackageChange], list[str]]] = {}
    for ev in sorted(evals, key=lambda e: e.host):
        c = ev.ctx
        if c.version_t is None or c.branch is None:
            ids = sorted({f.check_id for f in ev.findings if f.blocking}) or ["driver.branch"]
            blocked.append(BlockedHost(host=ev.host, current_version=None, check_ids=ids,
                                       reasons=["the current driver version is unknown"]))
            continue
        if not c.below_target:
            done.append(ev.host)
            continue
        changes, notes = package_changes(ev.facts, c, ct, memo)
        item = UpgradeItem(
            host=ev.host, current_version=c.version or "", current_branch=c.branch,
            target_version=t.driver.target_version, target_branch=t.driver.branch,
            gpu_model=c.gpu_model, gpu_count=c.gpu_count, profile=profile(c), idle=idle(ev.facts, ct),
            packages=changes, notes=notes,
        )
        needs.append(item)
        blockers = [f for f in ev.findings if f.blocking and not f.chain and f.check_id not in RESOLVED_BY_CHANGE]
        if blockers:
            blocked.append(BlockedHost(
                host=ev.host, current_version=c.version, check_ids=sorted({f.check_id for f in blockers}),
                reasons=[f"{f.check_id}: {f.message}" for f in blockers]))
        else:
            warnings = sum(1 for f in ev.findings if f.severity == "warning")
            eligible.append((item, ev, warnings))

    counts = Counter(i.profile for i in needs)
    eligible.sort(key=lambda x: (_idle_rank(x[0].idle), -counts[x[0].profile], x[0].profile, x[2], x[0].host))
    plan = ChangePlan(
        target_branch=t.driver.branch, target_version=t.driver.target_version, needs_upgrade=needs,
        done=done, blocked=blocked, unreachable=sorted(unreachable),
    )
    if not eligible:
        plan.canary_note = (
            "no host needs the change" if not needs else
            f"all {len(needs)} hosts needing the change are blocked: fix their findings first")
        return plan, []
    item, _, warns = eligible[0]
    top_profile, top_n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    reason = (f"{item.host}: no blocking findings{'' if warns == 0 else f' ({warns} warning(s))'}, "
              f"{_idle_text(item.idle)}, profile '{item.profile}' shared by {counts[item.profile]} of "
              f"{len(needs)} hosts needing the change")
    if item.profile != top_profile:
        reason += f"; the most common profile '{top_profile}' ({top_n} hosts) has no host that is idle and unblocked"
    plan.canary = Canary(host=item.host, profile=item.profile, reason=reason)
    size = wave_size if wave_size is not None else max(
        t.change.min_wave_size, math.ceil(t.change.wave_fraction * len(eligible)))
    rest = [x[0].host for x in eligible[1:]]
    plan.wave_size = size
    plan.waves = [rest[i:i + size] for i in range(0, len(rest), size)]
    return plan, [x[1] for x in eligible]
