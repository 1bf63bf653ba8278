"""Fleet verdict: every host's findings, fleet-wide drift and capacity, outcome and change plan.

The serving strategy comes first: named by the target, or (``gpus.strategy: auto``)
derived from the hosts' GPU memory (:mod:`k3fleet.verdict.strategy`). It sets the GPU
minimum and whether every node needs RDMA; the verdict's ``strategy`` and its last
reason say which strategy was used and why.

Outcome precedence (``k3fleet.contracts.AUDIT_PRECEDENCE``, the first that applies; ``incomplete``
before all when no host was measured; the decision ranks expand_capacity and rebuild_environment the
other way, for the reason written beside the two orders):

1. ``expand_capacity``: even after the planned driver change the healthy GPUs stay
   below the target's minimum; no driver work reaches go-live.
2. ``rebuild_environment``: some host fails the image -> CUDA -> driver chain (driver
   below the branch the image's CUDA needs, or the container probe shows a docs/facts.md
   section 8 failure).
3. ``observe_with_limits``: enough healthy GPUs, but there are warnings, failed hosts
   (left out of serving), unreachable hosts or incomplete evidence.
4. ``go_live``: nothing above info, every host reached.

Drift checks count values with Counters: one pass over the hosts, nothing quadratic.

Hosts are folded one at a time (:class:`FleetFold`): :func:`evaluate_stream` takes (host, raw
facts) pairs from any iterator and never holds more of a host than its scheduler section, its
context and its results; :func:`evaluate_fleet` folds facts validated beforehand. Both give the
same verdict for the same facts.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from types import MappingProxyType
from typing import Any

from k3fleet.contracts import AuditOutcome, first_outcome
from k3fleet.models.facts import HostFacts, SchedulerFacts, unchecked
from k3fleet.models.findings import (
    SEVERITY_RANK,
    BlockedHost,
    ChangePlan,
    Finding,
    FleetVerdict,
    HostStatus,
    HostVerdict,
    InterconnectSummary,
    Severity,
    StrategyDecision,
    VerdictSummary,
)
from k3fleet.models.target import Target, is_multi_node
from k3fleet.verdict import all2all
from k3fleet.verdict.check import Check, check, registered
from k3fleet.verdict.intake import Intake, gc_paused
from k3fleet.verdict.plan import HostEval, build_plan
from k3fleet.verdict.rules import CompiledTarget, HostContext, RuleCache, host_rails, rule_key

_NO_HOSTS: Mapping[str, str] = MappingProxyType({})
# The catalogue entries of the fleet-scope checks this module emits (docs/architecture.md "Adding a check").
CHECKS: tuple[Check, ...] = (
    check("fleet.driver_drift", "One driver version across the fleet",
          "Mixed driver versions make failures host-dependent and can break cross-node NCCL.",
          "warning",
          "Bring every host to {target_version} in the change night.",
          scope="fleet",
          source='docs/facts.md section 2'),
    check("fleet.image_digest_drift", "One image build across the fleet",
          "The same tag can point at different builds on different hosts; every host must run one digest.",
          "error",
          "Pull the image by digest on every host (pin image.digest in the target).",
          scope="fleet",
          source='docs/facts.md section 1'),
    check("fleet.nccl_drift", "Consistent NCCL settings",
          "NCCL settings that differ between hosts give hangs or slow collectives that are hard to trace.",
          "warning",
          "Distribute one /etc/nccl.conf (or one serving environment) to every host.",
          scope="fleet",
          source='docs/facts.md section 6'),
    check("fleet.rdma_rail_drift", "Same RDMA rail count on every host",
          "Hosts with fewer rails drag every collective down to their bandwidth.",
          "warning",
          "Repair or exclude hosts with missing rails.",
          scope="fleet",
          source='docs/facts.md section 6'),
    check("fleet.strategy", "Serving strategy fits the GPUs' memory",
          "One node must hold the model's weights ({weights_memory}) to serve single-node; otherwise every "
          "instance spans nodes, which needs more GPUs and RDMA on every node.",
          "warning",
          "Set gpus.strategy: auto (or a multi_node_* strategy) in the target; if the weights figure is wrong "
          "for your checkpoint, correct gpus.weights_memory.gb.",
          scope="fleet",
          source='docs/facts.md section 1 (MXFP4 weights about 1.42 TiB measured, 1680 GB pre-release; GPUs per '
          'strategy)'),
    check("fleet.capacity", "Enough healthy GPUs",
          "The serving strategy ({strategy}) needs a minimum number of GPUs that pass the checks.",
          "error",
          "Fix failing hosts or add nodes until the healthy GPU count reaches the minimum.",
          scope="fleet",
          source='docs/facts.md section 1 (Kimi K3 recipe: GPUs per strategy, 32 on H100)'),
    check("fleet.all2all_topology", "All-to-all backend fits the interconnect",
          "The expert-parallel all-to-all backend the serving command names (--all2all-backend, formerly "
          "VLLM_ALL2ALL_BACKEND) needs its transport on every node of the serving group: the DeepEP backends "
          "(deepep_v2) RDMA with every rail Active and nvidia_peermem or DMA-BUF, the FlashInfer NVLink backends "
          "(flashinfer_nvlink_one_sided) one NVLink fabric spanning the nodes. Without it the engine fails at "
          "start-up or runs on a fallback: the environment must be rebuilt.",
          "error",
          "Give every serving node the backend's transport (rails up, nvidia_peermem or DMA-BUF; or one NVLink "
          "domain with Fabric Manager and IMEX), leave the hosts without it out of the serving group, or choose the "
          "backend the interconnect has (deepep_v2 over RDMA, flashinfer_nvlink_one_sided on MNNVL).",
          scope="fleet",
          source='docs/facts.md section 15 (vLLM expert parallel deployment: --all2all-backend, DeepEP over RDMA, '
          'FlashInfer over multi-node NVLink: one ClusterUUID and clique, IMEX ready on every node)'),
    check("target.unconfirmed", "Verdict relied on unconfirmed data",
          "Some CUDA -> driver matrix rows are not confirmed by the primary source.",
          "info",
          "Confirm the row against NVIDIA's release notes and set confirmed: true in the matrix file.",
          scope="fleet",
          source='docs/facts.md section 2 (rows marked confirmed: false)'),
)

# Drift evidence names at most this many outlying hosts: a 10,000-host report stays readable.
MAX_LISTED = 50


def host_status(findings: Iterable[Finding]) -> HostStatus:
    return status_of(max((SEVERITY_RANK[f.severity] for f in findings), default=0))


def status_of(worst: int) -> HostStatus:
    if worst >= SEVERITY_RANK["error"]:
        return "fail"
    if worst == SEVERITY_RANK["warning"]:
        return "warn"
    return "pass"


class _Fleet:
    def __init__(self, ct: CompiledTarget) -> None:
        self.ct = ct
        self.out: list[Finding] = []

    def add(self, check_id: str, message: str, evidence: dict[str, Any], *, severity: Severity | None = None,
            chain: bool = False) -> None:
        sev: Severity = severity or registered(check_id).severity
        self.out.append(Finding(
            check_id=check_id, severity=sev, kind="note" if sev == "info" else "fail",
            host=None, message=message, evidence=evidence, fix=self.ct.fix[check_id], chain=chain))


def _outliers(odd: list[list[str]]) -> dict[str, Any]:
    """The first outlying hosts by name and how many: ``odd`` holds lists of names, each in name order."""
    return {"outliers": list(islice(heapq.merge(*odd), MAX_LISTED)), "outlier_count": sum(map(len, odd))}


def _spread(counter: Counter[str]) -> str:
    return ", ".join(f"{v} ({n})" for v, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:6])


def _drift(groups: list[_Group], fl: _Fleet) -> None:
    ct = fl.ct
    # (value, the hosts with it) per check, one entry per group of hosts sharing facts and context.
    versions: list[tuple[str, list[str]]] = []
    images: list[tuple[str, list[str]]] = []
    rail_counts: list[tuple[str, list[str]]] = []
    # Hosts validated together share one NCCL section object: read its values once per object.
    nccl_groups: dict[int, tuple[tuple[str, ...], list[list[str]]]] = {}
    keys = ct.target.nccl.consistent_keys
    for g in groups:
        f, names = g.facts, g.hosts
        if g.ctx.version:
            versions.append((g.ctx.version, names))
        img = f.container.image
        if img is not None and img.present and (img.digest or img.id):
            images.append((img.digest or img.id or "", names))
        if ct.rdma_required and f.rdma.status == "ok":
            rail_counts.append((str(len(host_rails(f, g.ctx, ct)[0])), names))
        if f.nccl.status == "ok":
            nccl = nccl_groups.get(id(f.nccl))
            if nccl is None:
                s = f.nccl.settings
                nccl = nccl_groups[id(f.nccl)] = (tuple(s[k].value if k in s else "<unset>" for k in keys), [])
            nccl[1].append(names)

    for check_id, values, what in (
        ("fleet.driver_drift", versions, "driver versions"),
        ("fleet.image_digest_drift", images, "image builds (digest or id)"),
        ("fleet.rdma_rail_drift", rail_counts, "RDMA rail counts"),
    ):
        counter: Counter[str] = Counter()
        for value, names in values:
            counter[value] += len(names)
        if len(counter) > 1:
            majority = min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            fl.add(check_id, f"{len(counter)} {what} across {counter.total()} hosts: {_spread(counter)}",
                   {"values": dict(counter.most_common(20)), "majority": majority,
                    **_outliers([names for value, names in values if value != majority])})

    drifting: dict[str, Any] = {}
    spreads: list[str] = []
    for i, k in enumerate(keys):
        seen: Counter[str] = Counter()
        for row, members in nccl_groups.values():
            seen[row[i]] += sum(map(len, members))
        if len(seen) > 1:
            top = min(seen.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            drifting[k] = {"values": dict(seen.most_common(10)), "majority": top,
                           **_outliers([names for row, members in nccl_groups.values() if row[i] != top
                                        for names in members])}
            spreads.append(f"{k}: {_spread(seen)}")
    if drifting:
        fl.add("fleet.nccl_drift", "NCCL settings differ between hosts: " + "; ".join(spreads), {"keys": drifting})


def evaluate_fleet(
    facts: Mapping[str, HostFacts],
    target: Target,
    unreachable: Mapping[str, str] = _NO_HOSTS,
    *,
    invalid: Mapping[str, str] = _NO_HOSTS,
    wave_size: int | None = None,
    extra: Mapping[str, Sequence[Finding]] | None = None,
) -> FleetVerdict:
    """The fleet verdict for validated host facts (keyed by inventory name) against ``target``.

    ``unreachable`` maps hosts that could not be audited to the reason; such a host is
    listed as unreachable (never as failed checks), even if stale facts for it were passed.
    ``invalid`` maps hosts whose facts did not validate (see ``validate_facts``) to the
    reason: each gets one ``facts.schema`` finding of kind unknown (evidence incomplete).
    ``wave_size`` overrides the target's wave fraction for the change plan. ``extra`` adds findings a
    host's own facts cannot give, judged across hosts beforehand (the NCCL pair test,
    :func:`k3fleet.verdict.pairs.judge_pairs`), to that host's findings and status.
    """
    with gc_paused():
        fold = FleetFold(target, unreachable, invalid=invalid)
        for name, host_facts in facts.items():
            fold.add_facts(name, host_facts)
        return fold.verdict(wave_size, extra=extra)


def evaluate_stream(
    hosts: Iterable[tuple[str, Any]],
    target: Target,
    unreachable: Mapping[str, str] = _NO_HOSTS,
    *,
    invalid: Mapping[str, str] = _NO_HOSTS,
    wave_size: int | None = None,
    freeze: bool = True,
) -> FleetVerdict:
    """The fleet verdict for (host, raw facts dict) pairs taken one at a time, as :func:`evaluate_fleet`
    gives it for ``validate_facts`` of the same facts.

    Each host is validated and folded as it comes; what is kept per host is its scheduler section and
    a reference to its node kind's facts (:class:`FleetFold`), so memory grows with the verdict, not
    with the facts. ``freeze`` as for ``validate_facts``. A host named twice: the later facts count.
    """
    with gc_paused(freeze=freeze):
        fold = FleetFold(target, unreachable, invalid=invalid)
        for name, data in hosts:
            fold.add(name, data)
        return fold.verdict(wave_size)


class FleetFold:
    """The fleet verdict built host by host: :meth:`add` (raw facts) or :meth:`add_facts` (validated)
    per host, then :meth:`verdict` once.

    Per host it keeps the facts the rules read (for a host of a node kind, the kind's facts, one
    object per kind), the host's own scheduler section and its context (one per kind); the strategy
    needs every host's hardware before any rule runs, so the rules run in :meth:`verdict`.
    """

    def __init__(self, target: Target, unreachable: Mapping[str, str] = _NO_HOSTS, *,
                 invalid: Mapping[str, str] = _NO_HOSTS) -> None:
        self.target = target
        self.unreachable = unreachable
        self.ct = CompiledTarget(target)
        self._cache = RuleCache(self.ct)
        self._intake = Intake()
        self._kinds: dict[tuple[Any, ...], HostFacts] = {}
        self._contexts: dict[int, HostContext] = {}
        self._given = invalid
        self._found: dict[str, str] = {}
        self._hosts: dict[str, tuple[HostFacts, SchedulerFacts, HostContext]] = {}
        self._closed = False
        self._measured = 0

    @property
    def invalid(self) -> dict[str, str]:
        """Host -> why its facts could not be read: those given, then those found invalid here."""
        return {**self._given, **self._found}

    @property
    def measured(self) -> int:
        """Hosts with valid facts that are not unreachable (the hosts the verdict judges)."""
        return self._measured if self._closed else len(self._hosts)

    def add(self, host: str, data: Any) -> None:
        """One host's raw facts (a collector JSON object), validated here."""
        self._check_open(host)
        judged = self._intake.judged(host, data)
        if isinstance(judged, str):
            self._hosts.pop(host, None)
            self._found[host] = judged
            return
        self._found.pop(host, None)
        self._keep(host, *judged)

    def add_facts(self, host: str, facts: HostFacts) -> None:
        """One host's validated facts; a host of a node kind is kept as its kind's facts and scheduler."""
        self._check_open(host)
        key = rule_key(facts)
        self._found.pop(host, None)
        self._keep(host, facts if key is None else self._kinds.setdefault(key, facts), facts.scheduler)

    def _check_open(self, host: str) -> None:
        if self._closed:
            raise ValueError(f"host {host}: added after the fold gave its verdict")

    def _keep(self, host: str, facts: HostFacts, scheduler: SchedulerFacts) -> None:
        if host in self.unreachable:
            self._hosts.pop(host, None)
            return
        # A kind's facts object has one context: looked up by the object (alive in the kinds held).
        ctx = self._contexts.get(id(facts))
        if ctx is None:
            ctx = self._cache.context(facts, host)
            if rule_key(facts) is not None:
                self._contexts[id(facts)] = ctx
        self._hosts[host] = (facts, scheduler, ctx)

    def verdict(self, wave_size: int | None = None,
                extra: Mapping[str, Sequence[Finding]] | None = None) -> FleetVerdict:
        """The fleet verdict over the hosts added; call once, after the last host. ``extra``: findings
        per host judged across hosts (as for :func:`evaluate_fleet`), added to the host's own."""
        if self._closed:
            raise ValueError("the fold already gave its verdict: a fold gives one")
        self._closed = True
        target, ct, unreachable = self.target, self.ct, self.unreachable
        hosts: dict[str, HostVerdict] = {}
        evals: list[HostEval] = []
        unconfirmed: set[str] = {r.label for r in target.unconfirmed_rows_used()}
        invalid_findings: list[Finding] = []

        # The strategy (RDMA or not) depends on every audited host's hardware: decided before any rule
        # runs. Hosts of one kind share their context and rule results.
        names = sorted(self._hosts)
        kept = [self._hosts[n] for n in names]
        self._hosts, self._measured = {}, len(names)
        decision = ct.decide([row[2] for row in kept])
        cache = self._cache
        # Hosts sharing a context (a node kind, whose hosts share one facts object too), for the fleet
        # checks that read each once.
        groups: dict[int, _Group] = {}
        tally = _Tally()
        healthy = 0
        statuses: Counter[str] = Counter()
        facts_of: list[HostFacts] = []
        run, add_eval, add_facts, tally_add = cache.run, evals.append, facts_of.append, tally.add
        for name, (facts, scheduler, ctx) in zip(names, kept, strict=True):
            add_facts(facts)
            findings, worst, of_kind = run(facts, name, ctx, scheduler)
            more = extra.get(name) if extra else None
            if more:
                # The host's findings are its own now, no longer its node kind's.
                findings = [*findings, *more]
                worst = max(worst, *(SEVERITY_RANK[f.severity] for f in more))
                of_kind = False
            status = status_of(worst)
            if ctx.unconfirmed:
                unconfirmed |= ctx.unconfirmed
            kind = id(ctx)
            add_eval(HostEval(name, facts, ctx, findings, status, scheduler, kind if of_kind else None))
            group = groups.get(kind)
            if group is None:
                group = groups[kind] = _Group(facts, ctx, findings)
            group.hosts.append(name)
            tally_add(findings, kind if of_kind else None)
            statuses[status] += 1
            if status == "pass" or status == "warn":
                healthy += ctx.gpu_count or 0
            # Built from the verdict's own typed values: validating them again would cost more than the
            # host's rules.
            hosts[name] = unchecked(
                HostVerdict, host=name, status=status, reason=None, findings=findings,
                driver_version=ctx.version, driver_branch=ctx.branch, gpu_model=ctx.gpu_model,
                gpu_count=ctx.gpu_count)
        invalid = self.invalid
        for name in sorted(invalid):
            if name in unreachable or name in hosts:
                continue
            bad = Finding(check_id="facts.schema", severity="error", kind="unknown", host=name,
                          message=f"host facts could not be read: {invalid[name]}", evidence={"reason": invalid[name]},
                          fix=ct.fix["facts.schema"])
            hosts[name] = HostVerdict(host=name, status="fail", reason=None, findings=[bad])
            invalid_findings.append(bad)
            statuses["fail"] += 1
        for name in sorted(unreachable):
            hosts[name] = HostVerdict(
                host=name, status="unreachable", reason=unreachable[name], findings=[], driver_version=None,
                gpu_model=None, gpu_count=None)
        statuses["unreachable"] += len(unreachable)
        del kept
        return _fleet_verdict(target, ct, decision, hosts, evals, names, facts_of, list(groups.values()), tally,
                              statuses, healthy, invalid_findings, unconfirmed, unreachable, wave_size)


@dataclass(slots=True)
class _Group:
    """Hosts sharing one context and facts object (a node kind, or one host of no kind), by name."""

    facts: HostFacts
    ctx: HostContext
    # The first host's findings: what the kind's rules found (a host's own findings come on top).
    findings: list[Finding]
    hosts: list[str] = field(default_factory=list)


class _Tally:
    """Findings by severity and of kind unknown: a host whose findings are exactly its node kind's
    (HostEval.kind) counts by its kind, whose findings are read once and weighed by its hosts."""

    __slots__ = ("kinds", "lists")

    def __init__(self) -> None:
        self.kinds: dict[int, list[Any]] = {}
        self.lists: list[tuple[list[Finding], int]] = []

    def add(self, findings: list[Finding], kind: int | None) -> None:
        if kind is None:
            if findings:
                self.lists.append((findings, 1))
            return
        counted = self.kinds.get(kind)
        if counted is None:
            self.kinds[kind] = [findings, 1]
        else:
            counted[1] += 1

    def counts(self, others: list[list[Finding]]) -> tuple[Counter[str], int, int]:
        """(by severity, of kind unknown, unknown and blocking), with the findings of ``others``."""
        by_sev: Counter[str] = Counter()
        unknown = unknown_blocking = 0
        for findings, n in [*self.lists, *((fs, n) for fs, n in self.kinds.values()), *((fs, 1) for fs in others)]:
            for f in findings:
                by_sev[f.severity] += n
                if f.kind == "unknown":
                    unknown += n
                    if f.blocking:
                        unknown_blocking += n
        return by_sev, unknown, unknown_blocking


def _fleet_verdict(
    target: Target, ct: CompiledTarget, decision: StrategyDecision, hosts: dict[str, HostVerdict],
    evals: list[HostEval], names: list[str], facts_of: list[HostFacts], groups: list[_Group], tally: _Tally,
    statuses: Counter[str], healthy: int, invalid_findings: list[Finding], unconfirmed: set[str],
    unreachable: Mapping[str, str], wave_size: int | None,
) -> FleetVerdict:
    """``names`` the hosts judged in name order, ``facts_of`` their facts, ``evals`` their results;
    ``statuses`` every host's status counted, ``healthy`` the GPUs of the hosts that pass or warn."""
    fl = _Fleet(ct)
    _strategy_findings(decision, target, fl)
    _drift(groups, fl)
    plan, repaired = build_plan(evals, list(unreachable), ct, wave_size)
    interconnect = _all2all(zip(names, facts_of, strict=True), decision, target, fl)
    if invalid_findings:
        # Hosts without readable facts cannot be planned: they are blocked until re-audited.
        plan.blocked = sorted(
            [*plan.blocked, *(BlockedHost(host=f.host or "", check_ids=["facts.schema"], reasons=[f.message])
                              for f in invalid_findings)],
            key=lambda b: b.host)

    after = healthy + repaired
    models = sorted({g.ctx.gpu_model for g in groups if g.ctx.gpu_model})
    need, basis = target.gpus.min_total(models, decision.strategy)
    if decision.derived and basis.startswith("strategy "):
        basis += ", derived from GPU memory"
    if healthy < need and groups:  # with no host measured there is no capacity to judge
        fl.add("fleet.capacity",
               f"{healthy} healthy GPUs, {need} required ({basis}); {after} after the planned driver change",
               {"gpus_healthy": healthy, "gpus_after_plan": after, "gpus_required": need, "basis": basis,
                "strategy": decision.strategy, "unreachable_hosts": len(unreachable)},
               chain=after >= need)
    if unconfirmed:
        fl.add("target.unconfirmed",
               f"the verdict relied on unconfirmed CUDA driver matrix rows: {', '.join(sorted(unconfirmed))}",
               {"rows": sorted(unconfirmed)})

    by_sev, unknown, unknown_blocking = tally.counts([invalid_findings, fl.out])
    summary = VerdictSummary(
        hosts=len(hosts), passed=statuses["pass"], warned=statuses["warn"], failed=statuses["fail"],
        unreachable=statuses["unreachable"],
        findings={s: by_sev.get(s, 0) for s in ("critical", "error", "warning", "info")},
        unknown_findings=unknown,
        gpus_healthy=healthy, gpus_after_plan=after, gpus_required=need,
        evidence_incomplete=unknown_blocking > 0,
    )
    outcome, reasons = _outcome(groups, summary, need, basis, plan, fl.out)
    reasons.append(f"strategy {decision.strategy} "
                   f"({'derived from GPU memory' if decision.derived else 'named by the target'}): {decision.reason}")
    return FleetVerdict(
        target=target.name, outcome=outcome, reasons=reasons, summary=summary, hosts=dict(sorted(hosts.items())),
        fleet_findings=fl.out, plan=plan, strategy=decision, unconfirmed_matrix_rows=sorted(unconfirmed),
        interconnect=interconnect,
    )


def _all2all(serving: Iterable[tuple[str, HostFacts]], decision: StrategyDecision, target: Target,
             fl: _Fleet) -> InterconnectSummary:
    """The serving group's interconnect and the target's all-to-all backend judged against it
    (docs/facts.md section 15). The serving group is every audited host with readable facts: the
    inventory is the nodes the engine is meant to span, and a node the backend cannot run on must be
    repaired or taken out of that group, whatever else it fails."""
    summary = all2all.summarise(serving, is_multi_node(decision.strategy), target.rdma.min_rate_gbps)
    backend, source = all2all.backend_of(target.serve.flags, target.serve.env)
    summary.backend, summary.backend_source = backend, source
    verdict = all2all.judge(backend, summary)
    if verdict is not None:
        hosts = sorted(verdict.hosts)[:all2all.MAX_LISTED]
        ev: dict[str, Any] = {"backend": backend, "source": f"target serve ({source})", "hosts": hosts,
                              "why": {h: verdict.hosts[h] for h in hosts}, "serving_hosts": summary.serving_hosts,
                              "multi_node": summary.multi_node}
        fl.out.append(Finding(check_id="fleet.all2all_topology", severity="error", kind=verdict.kind, host=None,
                              message=verdict.message, evidence=ev, fix=verdict.fix))
    return summary


def _strategy_findings(d: StrategyDecision, target: Target, fl: _Fleet) -> None:
    """Say when the strategy could not be derived, or when a named one does not fit the GPUs' memory."""
    w = target.gpus.weights_memory
    ev: dict[str, Any] = {"strategy": d.strategy, "setting": d.setting, "weights_gb": d.weights_gb,
                          "weights_confirmed": d.weights_confirmed,
                          "nodes": [n.model_dump() for n in d.nodes], "hosts_unknown_memory": d.hosts_unknown_memory}
    if d.derived and not d.nodes:
        fl.out.append(Finding(
            check_id="fleet.strategy", severity="warning", kind="unknown", host=None,
            message=f"the serving strategy could not be derived: {d.reason}", evidence=ev,
            fix="Make the GPUs' memory readable (NVML or nvidia-smi) on the hosts, or name gpus.strategy "
                "in the target, then re-run the audit."))
    elif w is not None and not d.derived and not is_multi_node(d.strategy):
        short = [n for n in d.nodes if not n.holds_weights]
        if short:
            small = short[-1]
            fl.add("fleet.strategy",
                   f"the target names {d.strategy}, but one node of {target.gpus.per_node}x {small.gpu_model} has "
                   f"{small.node_memory_gib:g} GiB of GPU memory, below the {w.gb:g} GB the weights need"
                   + ("" if w.confirmed else " (unconfirmed estimate)"),
                   {**ev, "short_models": [n.gpu_model for n in short]})


def _outcome(
    groups: list[_Group], s: VerdictSummary, need: int, basis: str, plan: ChangePlan, fleet_findings: list[Finding]
) -> tuple[AuditOutcome, list[str]]:
    if not groups:
        return "incomplete", [f"no host was measured ({s.unreachable} unreachable, {s.failed} without readable "
                              "facts): nothing can be judged; reach the hosts and audit again"]
    chain_ids: Counter[str] = Counter()
    n_chain = 0
    # Chain findings come from the rules hosts of one kind share (their context): read once per kind.
    for g in groups:
        ids = {f.check_id for f in g.findings if f.chain and f.kind == "fail" and f.blocking}
        if ids:
            n_chain += len(g.hosts)
            for check_id in ids:
                chain_ids[check_id] += len(g.hosts)
    unreachable = [f"{s.unreachable} host(s) unreachable: their GPUs are not counted"] if s.unreachable else []
    # Every outcome that applies, with its reasons; AUDIT_PRECEDENCE picks the one the audit gives.
    applies: dict[AuditOutcome, list[str]] = {}
    if s.gpus_after_plan < need:
        applies["expand_capacity"] = [f"{s.gpus_after_plan} GPUs would be healthy after the planned driver change, "
                                      f"{need} required ({basis})", *unreachable]
    # A backend whose transport the hosts lack fails the engine's start: the environment is rebuilt, not limited.
    a2a = [f"{f.message}; fix: {f.fix}" for f in fleet_findings
           if f.check_id == "fleet.all2all_topology" and f.kind == "fail"][:1]
    if n_chain:
        listed = ", ".join(f"{k} ({n})" for k, n in sorted(chain_ids.items()))
        n_driver = sum(1 for u in plan.needs_upgrade if u.scope == "driver")
        n_fm = len(plan.needs_upgrade) - n_driver
        moves = ([f"the change plan moves {n_driver} host(s) to the target driver"
                  + (f" and {n_fm} host(s) to the Fabric Manager of their driver's version" if n_fm else "")]
                 if n_driver or n_fm else [])
        applies["rebuild_environment"] = [f"{n_chain} host(s) fail the image -> CUDA -> driver chain: {listed}",
                                          *unreachable, *a2a, *moves]
    elif a2a:
        applies["rebuild_environment"] = [*a2a, *unreachable]
    fleet_errors = sorted({f.check_id for f in fleet_findings if f.blocking})
    warnings = s.findings.get("warning", 0)
    if not (fleet_errors or s.failed or s.unreachable or s.evidence_incomplete or warnings):
        applies["go_live"] = [f"all {s.hosts} host(s) pass; {s.gpus_healthy} healthy GPUs, {need} required"]
    else:
        # Enough healthy GPUs remain: serve on them, and say what limits that.
        limited = ([f"{s.failed} host(s) fail checks and are left out; {s.gpus_healthy} healthy GPUs "
                    f"meet the {need} required"] if s.failed else [])
        limited += unreachable
        if fleet_errors:
            limited.append(f"fleet-wide errors: {', '.join(fleet_errors)}")
        if s.evidence_incomplete:
            limited.append("some evidence could not be read (unknown findings of error severity)")
        if warnings:
            limited.append(f"{warnings} warning(s) to observe")
        applies["observe_with_limits"] = limited
    outcome = first_outcome(applies)
    return outcome, applies[outcome]
