"""The reader layer: verified run directories -> the typed evidence summary ``decide`` works on.

Each run is verified against its manifest before anything in it is read (a missing, changed or
extra file refuses the run, exit 3). Readers keep only what the decision and the reports need
and attach to every fact the file it came from (docs/decision.md "Sources").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from k3fleet.bounds import read_bounded
from k3fleet.decide.models import (
    AcceptEvidence,
    AgentCase,
    AgentEvidence,
    AuditEvidence,
    ChangeEvidence,
    Fact,
    HostEvidence,
    LoadEvidence,
    OomRecord,
    PrefixCacheEvidence,
    Ref,
    RunInfo,
    StartupEvidence,
    TargetBrief,
    TimelineEvent,
    TriageEvidence,
)
from k3fleet.errors import IncompleteError, UsageError, validation_line
from k3fleet.evidence import RunDir, verify_run
from k3fleet.evidence.redact import excerpt
from k3fleet.verdict import all2all

KINDS = ("audit", "change", "accept", "triage")


class RunVerificationError(IncompleteError):
    """A run whose files do not match its manifest: tampered or incomplete evidence."""


def verify(path: Path) -> list[str]:
    """Differences between a run directory and its manifest (empty: intact)."""
    return verify_run(path).problems


def _load_json(path: Path, rel: str, label: str) -> Any:
    p = path / rel
    try:
        return json.loads(read_bounded(p, "run_json").decode("utf-8"))
    except FileNotFoundError as exc:
        raise IncompleteError(f"run {label}: {rel} is missing") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"run {label}: {rel} is not valid JSON ({exc})") from exc


def _obj(data: Any, label: str, rel: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UsageError(f"run {label}: {rel} is not a JSON object")
    return data


def open_run(path: Path, *, label: str | None = None) -> tuple[RunInfo, dict[str, Any]]:
    """Verify a run directory and read its command.json: (info, command)."""
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory")
    if not (path / "command.json").is_file():
        raise UsageError(f"{path} is not a k3fleet run directory (no command.json)")
    name = label or path.name
    problems = verify(path)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise RunVerificationError(f"run {name} does not match its manifest: {'; '.join(problems[:3])}{more}")
    cmd = _obj(_load_json(path, "command.json", name), name, "command.json")
    kind = cmd.get("kind")
    if kind not in KINDS:
        raise UsageError(f"run {name} is of kind {kind!r}; decide reads {', '.join(KINDS)} runs")
    files = sum(1 for p in path.rglob("*") if p.is_file())
    argv = cmd.get("argv") if isinstance(cmd.get("argv"), list) else []
    info = RunInfo(label=name, kind=kind, path=str(path), started_at=cmd.get("started_at"),
                   argv=[str(a) for a in argv or []], user=cmd.get("user"),
                   operator=cmd.get("operator") if isinstance(cmd.get("operator"), str) else None,
                   k3fleet_version=cmd.get("k3fleet_version"), operator_supplied=kind == "triage", files=files)
    return info, cmd


def _invalid(label: str, rel: str, exc: ValidationError) -> UsageError:
    return UsageError(f"run {label}: {rel}: {validation_line(exc)}")


# -- audit -------------------------------------------------------------------------------------------


def read_target(path: Path, label: str) -> TargetBrief | None:
    """The target the audit judged against (inputs/target.json), when the run kept it."""
    from k3fleet.models.target import Target

    p = path / "inputs" / "target.json"
    if not p.is_file():
        return None
    try:
        target = Target.model_validate(_load_json(path, "inputs/target.json", label))
    except ValidationError as exc:
        raise _invalid(label, "inputs/target.json", exc) from exc
    return target_brief(target, Ref(run=label, file="inputs/target.json"))


def target_brief(target: Any, ref: Ref | None = None) -> TargetBrief:
    from k3fleet.decide.checklist import image_repository

    return TargetBrief(name=target.name, image=target.image.ref, image_repository=image_repository(target.image.ref)
                       or target.image.ref, image_cuda=target.image.cuda, image_digest=target.image.digest,
                       vllm_min=target.vllm.min_version, driver_branch=target.driver.branch,
                       gpus_per_node=target.gpus.per_node, required_flags=dict(target.serve.required_flags), ref=ref)


def read_audit(path: Path, info: RunInfo) -> AuditEvidence:
    from k3fleet.models.findings import FleetVerdict

    label = info.label
    raw = _obj(_load_json(path, "verdict.json", label), label, "verdict.json")
    try:
        v = FleetVerdict.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(label, "verdict.json", exc) from exc
    ref = Ref(run=label, file="verdict.json")
    run = _obj(_load_json(path, "run.json", label), label, "run.json")
    hosts: list[HostEvidence] = []
    nccl_seen: dict[str, set[str]] = {}
    facts_hosts = 0
    for name, hv in v.hosts.items():
        he = HostEvidence(host=name, status=hv.status, driver_version=hv.driver_version, gpu_model=hv.gpu_model,
                          gpu_count=hv.gpu_count, reason=hv.reason)
        he.branch = _branch(hv.driver_version)
        rel = RunDir.host_file("facts", name)
        if (path / rel).is_file():
            facts = _load_json(path, rel, label)
            if isinstance(facts, dict):
                facts_hosts += 1
                image = ((facts.get("container") or {}).get("image") or {}) if isinstance(
                    facts.get("container"), dict) else {}
                if isinstance(image, dict):
                    he.image_ref, he.image_digest = image.get("ref"), image.get("digest")
                    he.image_cuda, he.image_vllm = image.get("cuda_version"), image.get("vllm_version")
                settings = (facts.get("nccl") or {}).get("settings") if isinstance(facts.get("nccl"), dict) else None
                for k, s in (settings or {}).items():
                    if isinstance(s, dict) and "value" in s:
                        nccl_seen.setdefault(k, set()).add(str(s["value"]))
        hosts.append(he)
    findings = [Fact(id=f.check_id, severity=f.severity, kind=f.kind, host=f.host, message=f.message, fix=f.fix,
                     chain=f.chain, ref=ref) for f in v.all_findings()]
    nccl = {k: next(iter(vals)) for k, vals in nccl_seen.items() if len(vals) == 1}
    return AuditEvidence(
        run=label, ref=ref, started_at=info.started_at, outcome=v.outcome, reasons=v.reasons, hosts=hosts,
        findings=findings, gpus_healthy=v.summary.gpus_healthy, gpus_after_plan=v.summary.gpus_after_plan,
        gpus_required=v.summary.gpus_required, strategy=v.strategy.strategy if v.strategy else None,
        rdma_required=v.strategy.rdma_required if v.strategy else None,
        unreachable=sorted(h.host for h in hosts if h.status == "unreachable"),
        evidence_incomplete=v.summary.evidence_incomplete, interrupted=run.get("status") == "interrupted",
        nccl=nccl, plan=v.plan.model_dump(mode="json"), interconnect=v.interconnect)


def _branch(version: str | None) -> int | None:
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


# -- change night ------------------------------------------------------------------------------------


def read_change(path: Path, info: RunInfo) -> ChangeEvidence:
    from k3fleet.change.journal import JOURNAL_FILE, read_journal

    label = info.label
    change = _obj(_load_json(path, "change.json", label), label, "change.json")
    run = _load_json(path, "run.json", label) if (path / "run.json").is_file() else {}
    run = run if isinstance(run, dict) else {}
    ref = Ref(run=label, file="run.json" if run else "change.json")
    hosts: dict[str, str] = {}
    for host, h in (run.get("hosts") or {}).items():
        if isinstance(h, dict):
            hosts[str(host)] = str(h.get("outcome") or "unknown")
    timeline: list[TimelineEvent] = []
    problems: list[str] = [str(p) for p in run.get("journal_problems") or []]
    jp = path / JOURNAL_FILE
    if jp.is_file():
        journal = read_journal(jp)
        problems += [p.replace(str(path), label) for p in journal.problems]
        for e in journal.entries:
            timeline.append(TimelineEvent(ts=e.ts, host=e.host, stage=e.stage, detail=_detail(e.detail)))
        ref = Ref(run=label, file=JOURNAL_FILE)
    elif (path / "check.json").is_file():
        check = _load_json(path, "check.json", label)
        for host, rep in (check.items() if isinstance(check, dict) else []):
            for stage, text in _check_steps(rep):
                timeline.append(TimelineEvent(ts=None, host=str(host), stage=stage, detail=text))
    return ChangeEvidence(
        run=label, ref=ref, change_id=change.get("change_id"), operator=change.get("operator"),
        check=bool(change.get("check")), started_at=info.started_at, status=run.get("status"),
        exit_code=run.get("exit_code") if isinstance(run.get("exit_code"), int) else None,
        message=run.get("message"), target_version=change.get("target_version"), hosts=hosts, timeline=timeline,
        journal_problems=sorted(set(problems)))


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


def _probe(path: Path, label: str, rel: str) -> tuple[Any, Ref] | None:
    from k3fleet.accept.result import result_from_json

    if not (path / rel).is_file():
        return None
    data = _obj(_load_json(path, rel, label), label, rel)
    try:
        return result_from_json(data), Ref(run=label, file=rel)
    except ValidationError as exc:
        raise _invalid(label, rel, exc) from exc


def _facts_of(result: Any, ref: Ref) -> list[Fact]:
    return [Fact(id=f.id, severity=f.severity, kind="fail" if f.severity == "fail" else "note", message=f.message,
                 layer=f.layer, ref=ref) for f in result.findings]


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
        findings=_facts_of(result, ref))


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
    if any(f.id == "accept.prefix_cache.caching_off" for f in result.findings):
        caching = False
    reuse = True if result.status == "pass" else False if result.status == "fail" else None
    return PrefixCacheEvidence(
        ref=ref, status=result.status, reason=result.reason,
        cold_saved="cold" in windows and ttft.get("cold") is not None,
        warm_saved="warm" in windows and bool(ttft.get("warm")),
        cache_metrics=cache_metrics, controlled_reuse=reuse, caching_enabled=caching, hit_ratio=ratio,
        findings=_facts_of(result, ref))


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
        raise UsageError(f"run {ref.run}: {ref.file}: data.cases.{validation_line(exc)}") from None
    cases = [AgentCase(name=name, runs=c.runs, passed=c.passed, pass_rate=c.pass_rate, defects=c.defects,
                       layer=c.layer, critical=c.critical) for name, c in records.items()]
    return AgentEvidence(ref=ref, status=result.status, reason=result.reason, cases=cases,
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
        raise UsageError(f"run {ref.run}: {ref.file}: data.oom_records.{validation_line(exc)}") from None
    return [OomRecord(t_s=r.t_s, phase=r.phase, step=r.step, concurrency=r.concurrency,
                      context_tokens=r.context_tokens, node=r.node, engine=r.engine, message=r.message,
                      last_success_t_s=r.last_success.t_s if r.last_success else None,
                      last_success_id=r.last_success.id if r.last_success else None,
                      kv_by_engine=dict(r.memory_before.kv_by_engine) if r.memory_before else {},
                      topology=r.topology) for r in records]


def _load_evidence(path: Path, label: str, result: Any, ref: Ref) -> LoadEvidence:
    d = result.data if isinstance(result.data, dict) else {}
    curves_ref = Ref(run=label, file="load/curves.jsonl") if (path / "load" / "curves.jsonl").is_file() else None
    points = curve_points(path, d)
    phases = sorted({str(p.get("phase")) for p in points if p.get("phase")})
    params = any(_has_any(p, ("prompt_tokens", "max_tokens", "input_tokens", "context_tokens")) for p in points
                 if p.get("phase") == "long_input")
    queue = any(_has_any(p, ("waiting", "num_requests_waiting", "queue")) and
                _has_any(p, ("ttft_p50_s", "ttft_p95_s", "latency", "e2e_p50_s", "ttft_p50")) for p in points
                if p.get("phase") == "agent_ramp")
    counts: dict[str, Any] = d["counts"] if isinstance(d.get("counts"), dict) else d
    envelope: dict[str, Any] = d["envelope"] if isinstance(d.get("envelope"), dict) else {}
    from k3fleet.decide.envelope import held_envelope, traffic_baseline

    options = d.get("options")
    held = held_envelope(points, options if isinstance(options, dict) else {})
    return LoadEvidence(**held,
        ref=ref, status=result.status, reason=result.reason, outcome=d.get("outcome"), ceiling=_int(d.get("ceiling")),
        envelope=envelope, phases=phases, traffic=traffic_baseline(points),
        curves_ref=curves_ref, request_params_saved=params, queue_latency_saved=queue,
        restarts=_int(counts.get("restarts")), health_failures=_int(counts.get("health_failures")),
        oom_events=_int(counts.get("oom_events")), oom_records=_oom_records(d, ref), findings=_facts_of(result, ref))


def _has_any(point: Mapping[str, Any], keys: Sequence[str]) -> bool:
    return any(any(k in key for k in keys) for key in point)


def curve_points(path: Path, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Load curve points: ``load/curves.jsonl`` when saved, else ``data["curves"]``."""
    p = path / "load" / "curves.jsonl"
    rows: list[dict[str, Any]] = []
    if p.is_file():
        for line in read_bounded(p, "run_json").decode("utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows
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
    label = info.label
    head = _load_json(path, "accept.json", label) if (path / "accept.json").is_file() else {}
    head = head if isinstance(head, dict) else {}
    out = AcceptEvidence(run=label, base_url=head.get("base_url"), model=head.get("model"),
                         started_at=head.get("started_at") or info.started_at)
    got = _probe(path, label, "startup.json")
    if got:
        out.startup = startup_evidence(*got)
    got = _probe(path, label, "prefix_cache.json")
    if got:
        out.prefix_cache = _prefix_evidence(*got)
    got = _probe(path, label, "agent.json")
    if got:
        out.agent = _agent_evidence(*got)
    got = _probe(path, label, "load.json")
    if got:
        out.load = _load_evidence(path, label, *got)
    if (path / "profile.json").is_file():
        prof = _load_json(path, "profile.json", label)
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
        for probe in ("startup", "prefix_cache", "agent", "load"):
            if getattr(merged, probe) is None and getattr(older, probe) is not None:
                setattr(merged, probe, getattr(older, probe))
    return merged


# -- triage ------------------------------------------------------------------------------------------


def read_triage(path: Path, info: RunInfo) -> TriageEvidence:
    from k3fleet.triage.record import parse_triage_record

    label = info.label
    data = parse_triage_record(_load_json(path, "triage.json", label), label)
    ref = Ref(run=label, file="triage.json", operator_supplied=True)
    findings = [Fact(id=f.id, severity=f.severity, kind=f.kind, host=f.host, message=f.message, chain=f.chain,
                     layer=f.layer, ref=Ref(run=label, file=f.file or "triage.json", operator_supplied=True))
                for f in data.findings]
    startup = None
    if data.startup is not None:
        from k3fleet.accept.result import result_from_json

        try:
            startup = startup_evidence(result_from_json(data.startup),
                                       Ref(run=label, file="triage.json", operator_supplied=True))
        except ValidationError as exc:
            raise _invalid(label, "triage.json", exc) from exc
    return TriageEvidence(run=label, ref=ref, host=data.host, kinds=data.kinds, findings=findings,
                          driver_version=data.driver_version, image_digest=data.image_digest, startup=startup)
