"""The reader layer: verified run directories -> the typed evidence summary ``decide`` works on.

Each run is verified against its manifest before anything in it is read (a missing, changed or
extra file refuses the run, exit 3), then read through the one reader of run directories
(:mod:`k3fleet.evidence.reader`): every file a validated model. Readers keep only what the decision
and the reports need and attach to every fact the file it came from (docs/decision.md "Sources").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from k3fleet.accept import identity
from k3fleet.accept.probes import PROBES
from k3fleet.accept.result import ProbeResult, result_from_json
from k3fleet.change.journal import read_journal
from k3fleet.change.record import ChangeRecord
from k3fleet.decide.checklist import image_repository
from k3fleet.decide.envelope import held_envelope, repeat_intervals, slo_rate, traffic_baseline
from k3fleet.errors import UsageError, validation_line
from k3fleet.evidence import layout, sha256_file
from k3fleet.evidence.reader import RunReader
from k3fleet.evidence.reader import open_run as open_checked
from k3fleet.evidence.redact import excerpt
from k3fleet.models.evidence import (
    AcceptEvidence,
    AcceptRecord,
    AgentCase,
    AgentEvidence,
    AuditEvidence,
    ChangeEvidence,
    Decision,
    EvidenceSummary,
    Fact,
    HostEvidence,
    LoadEvidence,
    OomRecord,
    PrefixCacheEvidence,
    Ref,
    RunInfo,
    RunRecord,
    StartupEvidence,
    TargetBrief,
    TimelineEvent,
    TriageEvidence,
    TriageRecord,
    parse_triage_record,
)
from k3fleet.models.facts import HostFacts
from k3fleet.models.target import Target
from k3fleet.verdict import all2all

KINDS = ("audit", "change", "accept", "triage")


def open_run(path: Path, *, label: str | None = None, kinds: Sequence[str] = KINDS,
             reads: str = "decide reads") -> tuple[RunInfo, RunReader]:
    """Verify a run directory and read its command.json: (info, the run's reader)."""
    run = open_checked(path, kinds, reads, label=label)
    cmd = run.command
    info = RunInfo(label=run.label, kind=cmd.kind, path=str(path), started_at=cmd.started_at,  # type: ignore[arg-type]
                   argv=list(cmd.argv), user=cmd.user, operator=cmd.operator, k3fleet_version=cmd.k3fleet_version,
                   operator_supplied=cmd.kind == "triage", files=run.file_count(),
                   manifest_sha256=sha256_file(path / layout.MANIFEST))
    return info, run


def _reader(path: Path, info: RunInfo) -> RunReader:
    """The reader of a run ``open_run`` has already verified."""
    return RunReader(path, info.label)


# -- audit -------------------------------------------------------------------------------------------


def read_target(path: Path, label: str) -> TargetBrief | None:
    """The target the audit judged against (inputs/target.json), when the run kept it."""
    target = RunReader(path, label).target()
    return target_brief(target, Ref(run=label, file=layout.TARGET)) if target is not None else None


def target_brief(target: Target, ref: Ref | None = None) -> TargetBrief:
    return TargetBrief(name=target.name, image=target.image.ref, image_repository=image_repository(target.image.ref)
                       or target.image.ref, image_cuda=target.image.cuda, image_digest=target.image.digest,
                       vllm_min=target.vllm.min_version, driver_branch=target.driver.branch,
                       gpus_per_node=target.gpus.per_node, required_flags=dict(target.serve.required_flags), ref=ref)


def audit_facts(run: RunReader, hosts: Iterable[str]) -> Iterator[tuple[str, HostFacts]]:
    """Each host's validated facts, for the hosts the run kept valid facts of."""
    for host in hosts:
        facts = run.facts(host)
        if facts is not None:
            yield host, facts


def read_audit(path: Path, info: RunInfo) -> AuditEvidence:
    run = _reader(path, info)
    label = info.label
    v = run.verdict()
    ref = Ref(run=label, file=layout.VERDICT)
    record = run.model(layout.RUN, RunRecord)
    hosts = {name: HostEvidence(host=name, status=hv.status, driver_version=hv.driver_version,
                                gpu_model=hv.gpu_model, gpu_count=hv.gpu_count, reason=hv.reason,
                                branch=hv.driver_branch) for name, hv in v.hosts.items()}
    nccl_seen: dict[str, set[str]] = {}
    for name, facts in audit_facts(run, v.hosts):
        he, image = hosts[name], facts.container.image
        if image is not None:
            he.image_ref, he.image_digest = image.ref, image.digest
            he.image_cuda, he.image_vllm = image.cuda_version, image.vllm_version
        for k, s in facts.nccl.settings.items():
            nccl_seen.setdefault(k, set()).add(s.value)
    findings = [Fact(check_id=f.check_id, severity=f.severity, kind=f.kind, host=f.host, message=f.message,
                     fix=f.fix, chain=f.chain, ref=ref) for f in v.all_findings()]
    nccl = {k: next(iter(vals)) for k, vals in nccl_seen.items() if len(vals) == 1}
    return AuditEvidence(
        run=label, ref=ref, started_at=info.started_at, outcome=v.outcome, reasons=v.reasons,
        hosts=list(hosts.values()), findings=findings, gpus_healthy=v.summary.gpus_healthy,
        gpus_after_plan=v.summary.gpus_after_plan, gpus_required=v.summary.gpus_required,
        strategy=v.strategy.strategy if v.strategy else None,
        rdma_required=v.strategy.rdma_required if v.strategy else None,
        unreachable=sorted(h for h, he in hosts.items() if he.status == "unreachable"),
        evidence_incomplete=v.summary.evidence_incomplete, interrupted=record.interrupted,
        nccl=nccl, plan=v.plan.model_dump(mode="json"), interconnect=v.interconnect)


# -- change night ------------------------------------------------------------------------------------


def read_change(path: Path, info: RunInfo) -> ChangeEvidence:
    run = _reader(path, info)
    label = info.label
    change = run.model(layout.CHANGE, ChangeRecord)
    record = run.run_record()
    ref = Ref(run=label, file=layout.RUN if record is not None else layout.CHANGE)
    hosts = {str(host): str(h.get("outcome") or "unknown") for host, h in (record.hosts if record else {}).items()}
    timeline: list[TimelineEvent] = []
    problems: list[str] = list(record.journal_problems) if record else []
    if run.has(layout.JOURNAL):
        journal = read_journal(path / layout.JOURNAL)
        problems += [p.replace(str(path), label) for p in journal.problems]
        for e in journal.entries:
            timeline.append(TimelineEvent(ts=e.ts, host=e.host, stage=e.stage, detail=_detail(e.detail)))
        ref = Ref(run=label, file=layout.JOURNAL)
    elif run.has(layout.CHECK):
        for host, rep in run.object(layout.CHECK).items():
            for stage, text in _check_steps(rep):
                timeline.append(TimelineEvent(ts=None, host=str(host), stage=stage, detail=text))
    return ChangeEvidence(
        run=label, ref=ref, change_id=change.change_id, operator=change.operator, check=change.check,
        started_at=info.started_at, status=record.status if record else None,
        exit_code=record.exit_code if record else None, message=record.message if record else None,
        target_version=change.target_version, hosts=hosts, timeline=timeline, journal_problems=sorted(set(problems)))


def _detail(detail: Any) -> str | None:
    if detail is None:
        return None
    if isinstance(detail, str):
        return str(excerpt(detail, 300, tail="", one_line=False))
    return str(excerpt(json.dumps(detail, sort_keys=True, default=str), 300, tail=""))


def _check_steps(rep: Any) -> Iterable[tuple[str, str]]:
    """What ``--check`` says a host would go through, as timeline steps."""
    if not isinstance(rep, dict):
        return []
    if rep.get("noop"):
        return [("noop", str(rep.get("why") or "nothing to do"))]
    steps: list[tuple[str, str]] = []
    drain = rep.get("drain")
    if isinstance(drain, dict):
        steps += [("draining", str(a)) for a in drain.get("actions") or []]
    plan = rep.get("plan")
    if isinstance(plan, dict):
        if plan.get("remove"):
            steps.append(("upgrading", "remove " + " ".join(map(str, plan["remove"]))))
        if plan.get("install"):
            steps.append(("upgrading", "install " + " ".join(map(str, plan["install"]))))
        if plan.get("reboot"):
            steps.append(("rebooting", f"reboot (loaded {plan.get('loaded_version') or '?'})"))
    if rep.get("error"):
        steps.append(("failed", str(excerpt(rep["error"], 300, tail="", one_line=False))))
    return steps


# -- acceptance --------------------------------------------------------------------------------------


def probe_result(run: RunReader, probe: str) -> tuple[ProbeResult, Ref] | None:
    """A probe's result file as its :class:`k3fleet.accept.result.ProbeResult`, with its ref; None when
    the probe did not run."""
    rel = layout.probe_file(probe)
    if not run.has(rel):
        return None
    data = run.object(rel)
    try:
        return result_from_json(data), Ref(run=run.label, file=rel)
    except ValidationError as exc:
        raise run.invalid(rel, exc) from exc


def _facts_of(result: Any, ref: Ref) -> list[Fact]:
    return [Fact(check_id=f.check_id, severity=f.severity, kind=f.kind, message=f.message, layer=f.layer, ref=ref)
            for f in result.findings]


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    return None


def _flag(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


def startup_evidence(result: Any, ref: Ref) -> StartupEvidence:
    d = result.data if isinstance(result.data, dict) else {}
    env = d.get("env") or d.get("runtime_env") or {}
    return StartupEvidence(
        ref=ref, status=result.status, reason=result.reason, vllm_version=d.get("vllm_version"),
        image=d.get("image"), image_digest=d.get("image_digest"), cuda_version=_str(d.get("cuda_version")),
        torch_version=_str(d.get("torch_version")), tensor_parallel_size=_int(d.get("tensor_parallel_size")),
        pipeline_parallel_size=_int(d.get("pipeline_parallel_size")),
        expert_parallel_size=_int(d.get("expert_parallel_size")), data_parallel_size=_int(d.get("data_parallel_size")),
        enable_expert_parallel=_flag(d.get("enable_expert_parallel")), max_model_len=_int(d.get("max_model_len")),
        prefix_caching=_flag(d.get("prefix_caching")), tool_call_parser=_str(d.get("tool_call_parser")),
        reasoning_parser=_str(d.get("reasoning_parser")), launch_command=_str(d.get("launch_command")),
        all2all_backend=_str(d.get("all2all_backend"))
        or (_str(env.get(all2all.ENV)) if isinstance(env, dict) else None),
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        server=d["server"] if isinstance(d.get("server"), dict) else identity.from_startup(d),
        findings=_facts_of(result, ref))


def _server(d: Mapping[str, Any]) -> dict[str, Any]:
    """What a live probe recorded of the server (``data.server``); {} in runs from before it did."""
    return dict(d["server"]) if isinstance(d.get("server"), Mapping) else {}


def _str(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, list):
        return " ".join(str(x) for x in v)
    return str(v)


def _prefix_evidence(result: Any, ref: Ref) -> PrefixCacheEvidence:
    """accept prefix-cache: windows {cold, warm, control} of /metrics deltas, TTFT per window."""
    d = result.data if isinstance(result.data, dict) else {}
    windows = d["windows"] if isinstance(d.get("windows"), dict) else {}
    ttft = d["ttft_s"] if isinstance(d.get("ttft_s"), dict) else {}
    warm = windows["warm"] if isinstance(windows.get("warm"), dict) else {}
    cache_metrics = any(isinstance(v, int | float) for v in warm.values())
    hits, queries = warm.get("vllm:prefix_cache_hits"), warm.get("vllm:prefix_cache_queries")
    ratio = (float(hits) / float(queries) if isinstance(hits, int | float) and isinstance(queries, int | float)
             and queries > 0 else None)
    caching = _flag(d.get("prefix_caching_enabled"))
    if any(f.check_id == "accept.prefix_cache.caching_off" for f in result.findings):
        caching = False
    reuse = True if result.status == "pass" else False if result.status == "fail" else None
    return PrefixCacheEvidence(
        ref=ref, status=result.status, reason=result.reason,
        cold_saved="cold" in windows and ttft.get("cold") is not None,
        warm_saved="warm" in windows and bool(ttft.get("warm")),
        cache_metrics=cache_metrics, controlled_reuse=reuse, caching_enabled=caching, hit_ratio=ratio,
        server=_server(d), findings=_facts_of(result, ref))


class _AgentCaseRecord(BaseModel):
    """One case of ``agent.json``'s data as the agent probe writes it (k3fleet/accept/agent.py)."""

    model_config = ConfigDict(extra="ignore")
    runs: int = 0
    passed: int = 0
    pass_rate: float | None = Field(default=None, allow_inf_nan=False)
    defects: dict[str, int] = Field(default_factory=dict)
    layer: str | None = None
    critical: bool = False


_AGENT_CASES = TypeAdapter(dict[str, _AgentCaseRecord])


def _agent_evidence(result: Any, ref: Ref) -> AgentEvidence:
    d = result.data if isinstance(result.data, dict) else {}
    try:
        records = _AGENT_CASES.validate_python(d.get("cases") or {})
    except ValidationError as exc:
        raise UsageError(validation_line(exc, f"run {ref.run}: {ref.file}", at="data.cases.")) from None
    cases = [AgentCase(name=name, runs=c.runs, passed=c.passed, pass_rate=c.pass_rate, defects=c.defects,
                       layer=c.layer, critical=c.critical) for name, c in records.items()]
    return AgentEvidence(ref=ref, status=result.status, reason=result.reason, cases=cases, server=_server(d),
                         findings=_facts_of(result, ref))


class _LastSuccess(BaseModel):
    model_config = ConfigDict(extra="ignore")
    t_s: float | None = Field(default=None, allow_inf_nan=False)
    id: str | None = None


class _Memory(BaseModel):
    model_config = ConfigDict(extra="ignore")
    kv_by_engine: dict[str, float] = Field(default_factory=dict)


class _OomRecordData(BaseModel):
    """One entry of ``load.json``'s ``oom_records`` as the load probe writes it (k3fleet/accept/oom.py)."""

    model_config = ConfigDict(extra="ignore")
    t_s: float | None = Field(default=None, allow_inf_nan=False)
    phase: str | None = None
    step: str | int | None = None
    concurrency: int | None = None
    context_tokens: int | None = None
    node: str | None = None
    engine: str | None = None
    message: str | None = None
    last_success: _LastSuccess | None = None
    memory_before: _Memory | None = None
    topology: bool = False


_OOM_RECORDS = TypeAdapter(list[_OomRecordData])


def _oom_records(d: Mapping[str, Any], ref: Ref) -> list[OomRecord]:
    try:
        records = _OOM_RECORDS.validate_python(d.get("oom_records") or [])
    except ValidationError as exc:
        raise UsageError(validation_line(exc, f"run {ref.run}: {ref.file}", at="data.oom_records.")) from None
    return [OomRecord(t_s=r.t_s, phase=r.phase, step=r.step, concurrency=r.concurrency,
                      context_tokens=r.context_tokens, node=r.node, engine=r.engine, message=r.message,
                      last_success_t_s=r.last_success.t_s if r.last_success else None,
                      last_success_id=r.last_success.id if r.last_success else None,
                      kv_by_engine=dict(r.memory_before.kv_by_engine) if r.memory_before else {},
                      topology=r.topology) for r in records]


def _load_evidence(run: RunReader, result: Any, ref: Ref) -> LoadEvidence:
    d = result.data if isinstance(result.data, dict) else {}
    curves_ref = Ref(run=run.label, file=layout.LOAD_CURVES) if run.has(layout.LOAD_CURVES) else None
    points = curve_points(run, d)
    phases = sorted({str(p.get("phase")) for p in points if p.get("phase")})
    params = any(_has_any(p, ("prompt_tokens", "max_tokens", "input_tokens", "context_tokens")) for p in points
                 if p.get("phase") == "long_input")
    queue = any(_has_any(p, ("waiting", "num_requests_waiting", "queue")) and
                _has_any(p, ("ttft_p50_s", "ttft_p95_s", "latency", "e2e_p50_s", "ttft_p50")) for p in points
                if p.get("phase") == "agent_ramp")
    counts: dict[str, Any] = d["counts"] if isinstance(d.get("counts"), dict) else d
    envelope: dict[str, Any] = d["envelope"] if isinstance(d.get("envelope"), dict) else {}
    options = d.get("options")
    held = held_envelope(points, options if isinstance(options, dict) else {})
    return LoadEvidence(**held, **slo_rate(d), **repeat_intervals(d),
        replayed=d["trace"] if isinstance(d.get("trace"), dict) else None,
        ref=ref, status=result.status, reason=result.reason, outcome=d.get("outcome"), ceiling=_int(d.get("ceiling")),
        envelope=envelope, phases=phases, traffic=traffic_baseline(points),
        curves_ref=curves_ref, request_params_saved=params, queue_latency_saved=queue,
        restarts=_int(counts.get("restarts")), health_failures=_int(counts.get("health_failures")),
        oom_events=_int(counts.get("oom_events")), oom_records=_oom_records(d, ref), server=_server(d),
        findings=_facts_of(result, ref))


def _has_any(point: Mapping[str, Any], keys: Sequence[str]) -> bool:
    return any(any(k in key for k in keys) for key in point)


def curve_points(run: RunReader, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Load curve points: ``load/curves.jsonl`` when saved, else ``data["curves"]``."""
    if run.has(layout.LOAD_CURVES):
        return run.rows(layout.LOAD_CURVES)
    rows: list[dict[str, Any]] = []
    curves = data.get("curves")
    if isinstance(curves, list):
        return [r for r in curves if isinstance(r, dict)]
    if isinstance(curves, dict):
        for phase, pts in curves.items():
            for r in pts if isinstance(pts, list) else []:
                if isinstance(r, dict):
                    rows.append({"phase": phase, **r})
    return rows


def read_accept(path: Path, info: RunInfo) -> AcceptEvidence:
    run = _reader(path, info)
    head = run.model(layout.ACCEPT, AcceptRecord) if run.has(layout.ACCEPT) else AcceptRecord()
    out = AcceptEvidence(run=run.label, base_url=head.base_url, model=head.model,
                         started_at=head.started_at or info.started_at)
    got = probe_result(run, "startup")
    if got:
        try:
            out.startup = startup_evidence(*got)
        except ValidationError as exc:
            # One line naming the run and the file, as for any other malformed run file (docs/safety.md).
            raise UsageError(f"run {run.label}: {layout.probe_file('startup')}: "
                             f"{validation_line(exc, at='data.')}") from exc
    got = probe_result(run, "prefix_cache")
    if got:
        out.prefix_cache = _prefix_evidence(*got)
    got = probe_result(run, "agent")
    if got:
        out.agent = _agent_evidence(*got)
    got = probe_result(run, "load")
    if got:
        out.load = _load_evidence(run, *got)
    if run.has(layout.PROFILE):
        prof = run.json(layout.PROFILE)
        inner = prof.get("profile") if isinstance(prof, dict) else None
        out.profile_name = str(inner.get("name")) if isinstance(inner, dict) and inner.get("name") else None
        out.profile_sha256 = str(prof.get("sha256")) if isinstance(prof, dict) and prof.get("sha256") else None
    return out


def merge_accept(runs: Sequence[AcceptEvidence]) -> AcceptEvidence | None:
    """The newest run's probes; a probe it lacks comes from the newest older run that has it."""
    if not runs:
        return None
    ordered = sorted(runs, key=lambda r: r.started_at or "", reverse=True)
    merged = ordered[0].model_copy()
    for older in ordered[1:]:
        for probe in PROBES:
            if getattr(merged, probe) is None and getattr(older, probe) is not None:
                setattr(merged, probe, getattr(older, probe))
    return merged


# -- triage ------------------------------------------------------------------------------------------


def triage_record(run: RunReader) -> TriageRecord:
    """``triage.json`` as its :class:`k3fleet.models.evidence.TriageRecord`."""
    return parse_triage_record(run.json(layout.TRIAGE), run.label)


def read_triage(path: Path, info: RunInfo) -> TriageEvidence:
    run = _reader(path, info)
    label = info.label
    data = triage_record(run)
    ref = Ref(run=label, file=layout.TRIAGE, operator_supplied=True)
    findings = [Fact(check_id=f.check_id, severity=f.severity, kind=f.kind, host=f.host, message=f.message,
                     chain=f.chain, layer=f.layer,
                     ref=Ref(run=label, file=f.evidence.get("file") or layout.TRIAGE, operator_supplied=True))
                for f in data.findings]
    startup = None
    if data.startup is not None:
        try:
            startup = startup_evidence(result_from_json(data.startup), ref)
        except ValidationError as exc:
            raise run.invalid(layout.TRIAGE, exc) from exc
    return TriageEvidence(run=label, ref=ref, host=data.host, kinds=data.kinds, findings=findings,
                          driver_version=data.driver_version, image_digest=data.image_digest, startup=startup)


# -- decision ----------------------------------------------------------------------------------------


def read_decision(run: RunReader) -> tuple[Decision, EvidenceSummary, list[dict[str, Any]]]:
    """A decision run's decision, the evidence it was taken on, and the load curves it drew."""
    try:
        d = Decision.model_validate(run.json(layout.DECISION))
        s = EvidenceSummary.model_validate(run.json(layout.SUMMARY))
    except ValueError as exc:
        raise UsageError(f"{run.path}: {layout.DECISION} or {layout.SUMMARY} does not validate "
                         f"({str(exc).splitlines()[0]})") from exc
    curves = run.json(layout.CURVES) if run.has(layout.CURVES) else []
    return d, s, curves if isinstance(curves, list) else []
