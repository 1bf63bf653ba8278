"""The run files as their writers model them, and the go-live decision's data.

Each run file that more than one part reads is modelled here once, by the part that writes it, below
every reader (``decide``, ``report``, ``merge``): ``run.json`` (:class:`RunRecord`, every run kind),
``accept.json`` (:class:`AcceptRecord`, written by ``k3fleet.accept.run``), ``triage.json``
(:class:`TriageRecord`, written by ``k3fleet triage``), and the decision's own files
(:class:`Decision`, :class:`EvidenceSummary`, :class:`Baseline`). The writer dumps the model, every
reader validates the same model.

The reader layer (:mod:`k3fleet.decide.readers`) turns run directories into an
:class:`EvidenceSummary`; :func:`k3fleet.decide.decide` is a pure function of that summary
(docs/decision.md). Every fact carries a :class:`Ref` naming the run and the file it rests on,
so every reason and checklist item can point at its evidence.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from k3fleet.contracts import EXIT_CODES, Outcome
from k3fleet.errors import UsageError, validation_line
from k3fleet.models.findings import Finding, InterconnectSummary, earlier_finding

ItemStatus = Literal["pass", "fail", "missing"]
Track = Literal["official", "custom"]
RunKind = Literal["audit", "change", "accept", "triage"]


SCHEMA_VERSION = "1.0"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _contract_code(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v in EXIT_CODES else None


# A recorded exit code: anything but one of the contract's codes is read as absent, never shown as one.
RecordedExitCode = Annotated[int | None, BeforeValidator(_contract_code)]


# -- run.json ---------------------------------------------------------------------------------------


class RunRecord(BaseModel):
    """``run.json``: how a run ended, as every reader takes it. Each kind's writer adds its own fields
    (the subclasses below); a reader keeps what it does not know (``extra="allow"``), so a later
    writer's field never breaks an older reader."""

    model_config = ConfigDict(extra="allow")

    status: str | None = None
    exit_code: RecordedExitCode = None
    message: str | None = None
    wall_s: float | None = None
    unreachable: dict[str, str] = Field(default_factory=dict, description="audit: host -> why")
    invalid_evidence: dict[str, str] = Field(default_factory=dict, description="audit: host -> why")
    hosts: dict[str, dict[str, Any]] = Field(default_factory=dict, description="change: host -> its outcome")
    journal_problems: list[str] = Field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    def dump(self) -> dict[str, Any]:
        """The JSON a writer puts in run.json: the fields it set, nothing a reader would take as said."""
        return self.model_dump(mode="json", exclude_unset=True)


class _Written(RunRecord):
    # A writer's record: a field it does not declare is a mistake, refused when the file is written.
    model_config = ConfigDict(extra="forbid")


class AuditRunRecord(_Written):
    """``run.json`` of ``k3fleet audit`` (k3fleet/audit/run.py)."""

    ansible_rc: int | None = None
    hosts_total: int = 0
    hosts_with_facts: int = 0
    controller_cpu_s: float = 0.0
    ansible_stats: dict[str, Any] = Field(default_factory=dict)


class MergeRunRecord(_Written):
    """``run.json`` of ``k3fleet merge`` (k3fleet/audit/merge.py)."""

    slices: list[dict[str, Any]] = Field(default_factory=list, description="each slice: source, kind, status")
    incomplete_slices: list[str] = Field(default_factory=list)
    hosts_total: int = 0
    hosts_with_facts: int = 0
    duplicates: int = 0
    slices_wall_s: float = 0.0


class ChangeRunRecord(_Written):
    """``run.json`` of a change night (k3fleet/change/night.py), and of a night with nothing to do."""

    ansible_rc: int | None = None
    skipped: dict[str, str] = Field(default_factory=dict, description="host -> why the night left it")
    smoke: dict[str, Any] | None = Field(default=None, description="the serving smoke as the night ran it")
    warnings: list[str] = Field(default_factory=list)
    pauses: list[dict[str, Any]] = Field(default_factory=list, description="--pause-after: each pause point "
                                                                           "reached and how it was continued")
    rollback_kit: bool | None = Field(default=None, description="the rollback kit as the night chose it (false: "
                                                                "--no-rollback-kit)")
    controller_cpu_s: float = 0.0
    ansible_stats: dict[str, Any] = Field(default_factory=dict)
    done: list[str] = Field(default_factory=list, description="nothing to do: hosts already on the target")
    blocked: list[dict[str, Any]] = Field(default_factory=list, description="nothing to do: blocked hosts")
    held: dict[str, Any] = Field(default_factory=dict, description="nothing to do: hosts held back")


class RollbackRunRecord(_Written):
    """``run.json`` of ``k3fleet rollback`` (k3fleet/change/rollback.py)."""

    skipped: dict[str, str] = Field(default_factory=dict)
    refused: dict[str, str] = Field(default_factory=dict)
    sources: dict[str, list[str]] = Field(default_factory=dict, description="journal -> the hosts read from it")


# -- accept.json ------------------------------------------------------------------------------------


class AcceptRecord(BaseModel):
    """``accept.json`` as ``accept all`` and ``accept load`` write it (k3fleet/accept/run.py) and
    ``decide`` and ``report`` read it back: the endpoint, which probes ran and which did not, how the
    run ended. Each probe's own result is in its ``<probe>.json``."""

    # Records of earlier versions may hold keys this one dropped: a reader keeps them out.
    model_config = ConfigDict(extra="ignore")

    schema_version: str = SCHEMA_VERSION
    base_url: str | None = None
    model: str | None = None
    tls_verify: bool | None = None
    started_at: str | None = None
    finished_at: str | None = None
    server: dict[str, Any] = Field(default_factory=dict, description="what the server said about itself")
    probes: dict[str, dict[str, Any]] = Field(default_factory=dict, description="probe -> its summary")
    not_run: dict[str, str] = Field(default_factory=dict, description="probe -> why it did not run")
    aborted: dict[str, str] = Field(default_factory=dict, description="probe -> the endpoint error that ended the "
                                                                      "run while it ran")
    interrupted: bool = False
    error: str | None = None
    # None: no code recorded (a reader's default); a writer starts from EXIT_INCOMPLETE.
    exit_code: RecordedExitCode = None
    budget: dict[str, Any] | None = Field(default=None, description="accept all --budget: the plan and the "
                                                                      "time each probe took")

    def dump(self) -> dict[str, Any]:
        """The JSON of accept.json (``budget`` only when the run had one)."""
        return self.model_dump(mode="json", exclude={"budget"} if self.budget is None else None)


class Ref(_Model):
    """A file of a run directory that a fact rests on."""

    run: str = Field(description="the run's label (its directory name)")
    file: str = Field(description="path inside the run directory")
    operator_supplied: bool = Field(default=False, description="raw text pasted by an operator (k3fleet triage)")

    def __str__(self) -> str:
        return f"{self.run}/{self.file}" + (" (operator-supplied)" if self.operator_supplied else "")


class RunInfo(_Model):
    label: str
    kind: RunKind
    path: str
    started_at: str | None = None
    argv: list[str] = Field(default_factory=list)
    user: str | None = None
    operator: str | None = Field(default=None, description="an explicit --operator the run recorded")
    k3fleet_version: str | None = None
    operator_supplied: bool = False
    files: int = 0


class Fact(Finding):
    """A finding of any source (audit check ids, ``accept.*`` ids, triage), with the run file it rests on."""

    ref: Ref

    @model_validator(mode="before")
    @classmethod
    def _earlier(cls, data: Any) -> Any:
        # summary.json written before the one Finding: id, acceptance's fail / warn.
        return earlier_finding(data)


# -- per source ------------------------------------------------------------------------------------


class HostEvidence(_Model):
    host: str
    status: str
    driver_version: str | None = None
    branch: int | None = None
    gpu_model: str | None = None
    gpu_count: int | None = None
    image_ref: str | None = None
    image_digest: str | None = None
    image_cuda: str | None = None
    image_vllm: str | None = None
    reason: str | None = None


class AuditEvidence(_Model):
    run: str
    ref: Ref
    started_at: str | None = None
    outcome: str = Field(description="the audit's own outcome (its four, or incomplete)")
    reasons: list[str] = Field(default_factory=list)
    hosts: list[HostEvidence] = Field(default_factory=list)
    findings: list[Fact] = Field(default_factory=list)
    gpus_healthy: int = 0
    gpus_after_plan: int = 0
    gpus_required: int = 0
    strategy: str | None = None
    rdma_required: bool | None = None
    unreachable: list[str] = Field(default_factory=list)
    evidence_incomplete: bool = False
    interrupted: bool = False
    nccl: dict[str, str] = Field(default_factory=dict, description="NCCL settings every host agrees on")
    plan: dict[str, Any] | None = Field(default=None, description="the audit's change plan, as verdict.json has it")
    interconnect: InterconnectSummary | None = Field(
        default=None, description="the serving group's RDMA and NVLink facts (an all-to-all backend is judged on them)")


class TimelineEvent(_Model):
    ts: str | None = None
    host: str
    stage: str
    detail: str | None = None


class ChangeEvidence(_Model):
    run: str
    ref: Ref
    change_id: str | None = None
    operator: str | None = None
    check: bool = False
    started_at: str | None = None
    status: str | None = None
    exit_code: int | None = None
    message: str | None = None
    target_version: str | None = None
    hosts: dict[str, str] = Field(default_factory=dict, description="host -> outcome (upgraded, failed, ...)")
    timeline: list[TimelineEvent] = Field(default_factory=list)
    journal_problems: list[str] = Field(default_factory=list)

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, o in self.hosts.items() if o in ("failed", "rolled_back", "in_progress"))


class StartupEvidence(_Model):
    ref: Ref
    status: str
    reason: str | None = None
    vllm_version: str | None = None
    image: str | None = None
    image_digest: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    expert_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    max_model_len: int | None = None
    prefix_caching: bool | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    all2all_backend: str | None = None
    launch_command: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict, description="the server the log names "
                                   "(k3fleet.accept.identity.from_startup)")
    findings: list[Fact] = Field(default_factory=list)

    @property
    def model_load_oom(self) -> list[Fact]:
        return [f for f in self.findings if f.failed and "oom" in f.check_id.split(".")[-1]]


class PrefixCacheEvidence(_Model):
    ref: Ref
    status: str
    reason: str | None = None
    cold_saved: bool = False
    warm_saved: bool = False
    cache_metrics: bool = Field(default=False, description="cache counters were read around the windows")
    controlled_reuse: bool | None = Field(default=None, description="hits rose by about the shared prefix")
    caching_enabled: bool | None = Field(default=None, description="cache_config_info enable_prefix_caching")
    hit_ratio: float | None = None
    server: dict[str, Any] = Field(default_factory=dict, description="what the probe saw of the server "
                                   "(k3fleet.accept.identity.live)")
    findings: list[Fact] = Field(default_factory=list)


class AgentCase(_Model):
    name: str
    runs: int = 0
    passed: int = 0
    pass_rate: float | None = None
    defects: dict[str, int] = Field(default_factory=dict)
    layer: str | None = None
    critical: bool = False

    @property
    def failures(self) -> int:
        return max(self.runs - self.passed, 0)


class AgentEvidence(_Model):
    ref: Ref
    status: str
    reason: str | None = None
    cases: list[AgentCase] = Field(default_factory=list)
    server: dict[str, Any] = Field(default_factory=dict, description="what the probe saw of the server "
                                   "(k3fleet.accept.identity.live)")
    findings: list[Fact] = Field(default_factory=list)


class OomRecord(_Model):
    """One OOM answer of the load run (``load.json`` ``oom_records``, k3fleet/accept/oom.py): where and when
    it happened, and whether the pressure across engines was uneven (a topology OOM)."""

    t_s: float | None = Field(default=None, description="seconds into the load run")
    phase: str | None = None
    step: str | int | None = None
    concurrency: int | None = None
    context_tokens: int | None = None
    node: str | None = None
    engine: str | None = Field(default=None, description="the engine (DP rank) whose KV cache was fullest")
    message: str | None = None
    last_success_t_s: float | None = Field(default=None, description="when the last request before it ended")
    last_success_id: str | None = None
    kv_by_engine: dict[str, float] = Field(default_factory=dict, description="KV usage per engine before it")
    topology: bool = Field(default=False, description="uneven KV pressure across engines (accept.load.topology_oom)")


class LoadEvidence(_Model):
    ref: Ref
    status: str
    reason: str | None = None
    outcome: str | None = Field(default=None, description="stable, ceiling, adjust_config, collapse")
    ceiling: int | None = None
    envelope: dict[str, Any] = Field(default_factory=dict)
    phases: list[str] = Field(default_factory=list, description="phases with saved curve points")
    curves_ref: Ref | None = None
    server: dict[str, Any] = Field(default_factory=dict, description="what the probe saw of the server "
                                   "(k3fleet.accept.identity.live)")
    request_params_saved: bool = False
    queue_latency_saved: bool = False
    restarts: int | None = None
    health_failures: int | None = None
    oom_events: int | None = None
    oom_records: list[OomRecord] = Field(default_factory=list)
    # The envelope the run held (curve rows with an ok verdict), and where it first failed.
    held_concurrency: int | None = Field(default=None, description="highest concurrency of an ok ramp or "
                                                                   "sustained step")
    failed_concurrency: int | None = Field(default=None, description="lowest concurrency of a failed ramp or "
                                                                     "sustained step")
    held_context: int | None = Field(default=None, description="longest ladder context that held")
    failed_context: int | None = Field(default=None, description="shortest ladder context that failed or was refused")
    sustained_s: float | None = Field(default=None, description="seconds the sustained run held at its concurrency")
    sustained_concurrency: int | None = None
    slo: dict[str, float] = Field(default_factory=dict, description="ttft_p95_s, itl_p95_s, error_rate the "
                                                                    "steps were judged by")
    # Open loop (docs/acceptance-load.md "Open-loop arrivals"): the rates that held and the SLO search's answer.
    held_rps: float | None = Field(default=None, description="highest open-loop rate whose goodput met the target")
    failed_rps: float | None = Field(default=None, description="lowest open-loop rate whose goodput missed it")
    slo_rps: float | None = Field(default=None, description="the SLO search's highest rate meeting the SLO")
    slo_rps_upper: float | None = Field(default=None, description="the lowest rate the search saw miss the SLO")
    rate_margin: float | None = Field(default=None, description="slo_rps over the profile's request rate, minus 1")
    # Repeated runs (docs/acceptance-load.md "Repeated runs"): how many, and the 95% interval of each figure
    # the envelope is judged by (slo_rps, held_concurrency, and the held steps' worst ttft_p95_s, itl_p95_s,
    # e2e_p95_s).
    repeats: int | None = None
    replayed: dict[str, Any] | None = Field(default=None, description="the replayed trace (file, sha256, requests, "
                                                                         "speed) when the run replayed one")
    intervals: dict[str, list[float]] = Field(default_factory=dict)
    traffic: dict[str, float] = Field(default_factory=dict, description="the held steps' real traffic: hit ratio, "
                                                                        "latency, queue, rate (watch's baseline)")
    findings: list[Fact] = Field(default_factory=list)


class AcceptEvidence(_Model):
    run: str
    base_url: str | None = None
    model: str | None = None
    started_at: str | None = None
    startup: StartupEvidence | None = None
    prefix_cache: PrefixCacheEvidence | None = None
    agent: AgentEvidence | None = None
    load: LoadEvidence | None = None
    profile_name: str | None = Field(default=None, description="the production profile the run was tested against")
    profile_sha256: str | None = None


class TriageEvidence(_Model):
    run: str
    ref: Ref
    host: str | None = None
    kinds: list[str] = Field(default_factory=list)
    findings: list[Fact] = Field(default_factory=list)
    driver_version: str | None = None
    image_digest: str | None = None
    startup: StartupEvidence | None = None


# -- operator-filled files ---------------------------------------------------------------------------


class OwnerEntry(_Model):
    """Who fixes a failed item, by when, and how the service goes back if it is not fixed."""

    owner: str = Field(min_length=1, max_length=128)
    deadline: _dt.date
    rollback: str = Field(min_length=1, description="the rollback action for this item")
    rate_limit: str | None = Field(default=None, description="for a bounded agent defect: the traffic limit")
    documented: str | None = Field(default=None, description="where the limited feature is documented")

    @field_validator("owner", "rollback")
    @classmethod
    def _one_line(cls, v: str) -> str:
        v = v.strip()
        if not v or "\n" in v:
            raise ValueError("must be one non-empty line")
        return v


class OwnersFile(_Model):
    """``--owners FILE.yaml``: an owner, deadline and rollback action per failed checklist item and per
    limit of ``observe_with_limits`` (by limit kind: concurrency_ceiling, max_context_tokens, ...)."""

    items: dict[str, OwnerEntry] = Field(default_factory=dict)
    limits: dict[str, OwnerEntry] = Field(default_factory=dict)


_HEX_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class CustomBuild(_Model):
    """``--build FILE.yaml``: the separate evidence track of an image built by the operator."""

    image: str = Field(min_length=1, description="the image reference served")
    source_branch: str = Field(min_length=1)
    commit: str
    lockfile: str = Field(min_length=1, description="lockfile path and its sha256, or the lock itself")
    build_command: str = Field(min_length=1)
    digest: str
    rollback_image: str = Field(min_length=1, description="image (with digest) to return to")

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str) -> str:
        if not _HEX_COMMIT.match(v.strip().lower()):
            raise ValueError("expected a git commit id (7-40 hex digits)")
        return v.strip().lower()

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        if not _DIGEST.match(v.strip()):
            raise ValueError("expected sha256:<64 hex digits>")
        return v.strip()


class TargetBrief(_Model):
    name: str
    image: str
    image_repository: str
    image_cuda: str
    image_digest: str | None = None
    vllm_min: str
    driver_branch: int
    gpus_per_node: int
    required_flags: dict[str, str | None] = Field(default_factory=dict)
    ref: Ref | None = None


class DataProtectionBrief(_Model):
    """The profile's data_protection block (k3fleet/models/profile.py)."""

    log_retention_days: int
    run_retention_days: int
    evidence_readers: list[str] = Field(default_factory=list)
    request_logging: bool = False


class ProfileBrief(_Model):
    """The production profile the decision is held against (``decide --profile``)."""

    name: str
    concurrency: int
    request_rate_rps: float | None = None
    context_typical: int
    context_p99: int
    context_max: int
    sustained_s: float
    mix: dict[str, float] = Field(default_factory=dict)
    slo: dict[str, float] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list)
    schemas: list[str] = Field(default_factory=list)
    rate_limits: list[str] = Field(default_factory=list)
    data_protection: DataProtectionBrief | None = None
    sha256: str | None = None
    ref: Ref | None = None

    @property
    def multimodal(self) -> bool:
        return self.mix.get("multimodal", 0.0) > 0


class Policy(_Model):
    """Thresholds of the rules (docs/decision.md "Thresholds")."""

    max_noncritical_defect_rate: float = Field(default=0.10, ge=0, le=1)
    critical_repeated_failures: int = Field(default=2, ge=1)
    # A sustained run shorter than the profile's by timer granularity still covers it.
    sustained_tolerance: float = Field(default=0.95, gt=0, le=1)


class EvidenceSummary(_Model):
    schema_version: str = SCHEMA_VERSION
    runs: list[RunInfo] = Field(default_factory=list)
    target: TargetBrief
    audit: AuditEvidence | None = None
    change: ChangeEvidence | None = None
    accept: AcceptEvidence | None = None
    triage: list[TriageEvidence] = Field(default_factory=list)
    owners: OwnersFile | None = None
    owners_ref: Ref | None = None
    build: CustomBuild | None = None
    build_ref: Ref | None = None
    reviewer: str | None = None
    reviewed_at: str | None = None
    service_owner: str | None = None
    second_reviewer: str | None = None
    rollback_owner: str | None = None
    profile: ProfileBrief | None = None
    policy: Policy = Field(default_factory=Policy)
    signed: bool = Field(default=False, description="the decision is signed (decide --sign-key): an approval "
                                                    "needs it; unsigned, a decision that would be approved is "
                                                    "a draft (docs/decision.md)")


# -- what the decision returns ---------------------------------------------------------------------


class ChecklistItem(_Model):
    id: str
    title: str
    track: Literal["common", "official", "custom"] = "common"
    status: ItemStatus
    detail: str
    evidence: list[Ref] = Field(default_factory=list)
    owner: OwnerEntry | None = None


class Reason(_Model):
    rule: str = Field(description="the rule of the decision table that fired")
    outcome: Outcome
    approval: Literal["allows", "limits", "blocks"]
    text: str
    evidence: list[Ref] = Field(default_factory=list)


class Limit(_Model):
    kind: str = Field(description="concurrency_ceiling, max_context_tokens, rate_limit, hosts_left_out")
    value: str
    text: str
    owner: str | None = None
    deadline: _dt.date | None = None
    rollback: str | None = None
    evidence: list[Ref] = Field(default_factory=list)


class Baseline(_Model):
    """The accepted configuration: the serving side's rollback artifact (docs/decision.md)."""

    image: str | None = None
    image_digest: str | None = None
    vllm_version: str | None = None
    launch_command: str | None = None
    runtime_env: dict[str, str] = Field(default_factory=dict)
    parallel: dict[str, int | bool | None] = Field(default_factory=dict)
    parsers: dict[str, str | None] = Field(default_factory=dict)
    max_model_len: int | None = None
    prefix_caching: bool | None = None
    envelope: dict[str, Any] = Field(default_factory=dict, description="max concurrency / context / duration")
    concurrency_ceiling: int | None = None
    prefix_cache_hit_ratio: float | None = Field(default=None, description="the prefix-cache probe's synthetic "
                                                                         "ratio (a record, never watch's baseline)")
    load_traffic: dict[str, float] = Field(default_factory=dict, description="the accepted load's real traffic "
                                                                             "(hit ratio, latency, queue, rate): "
                                                                             "what watch judges live traffic by")
    base_url: str | None = None
    model: str | None = None
    rollback_image: str | None = Field(default=None, description="custom track: the build record's rollback image")
    evidence: list[Ref] = Field(default_factory=list)


class Decision(_Model):
    schema_version: str = SCHEMA_VERSION
    outcome: Outcome
    approved: bool
    exit_code: int
    draft: bool = Field(default=False, description="the evidence would approve it, but nobody signed it: not an "
                                                   "approval until decide runs with --sign-key")
    track: Track
    reasons: list[Reason]
    limits: list[Limit] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list, description="checklist items without evidence")
    warnings: list[str] = Field(default_factory=list,
                                description="what the reviewer must know, e.g. triaged hosts outside the audit")
    checklist: list[ChecklistItem]
    reviewer: str | None = None
    reviewed_at: str | None = None
    service_owner: str | None = None
    second_reviewer: str | None = None
    operators: list[str] = Field(default_factory=list, description="who ran the evidence runs (command.json "
                                                                   "user, --operator)")
    rollback_owner: str | None = None
    rate_limits: list[str] = Field(default_factory=list, description="the rate limits in force with this decision")
    profile: ProfileBrief | None = None
    unproven: list[str] = Field(default_factory=list, description="what the evidence does not prove about production")
    baseline: Baseline | None = None


# -- triage.json ------------------------------------------------------------------------------------


class _Lenient(BaseModel):
    # Fields a reader does not use may be added by later versions: kept out, not refused.
    model_config = ConfigDict(extra="ignore")


class TriageFile(_Lenient):
    name: str
    kind: str
    original_sha256: str | None = None
    bytes: int | None = None
    stored: str | None = None


class TriageRecord(_Lenient):
    """``triage.json`` as ``k3fleet triage`` writes it (k3fleet/triage/__init__.py) and ``decide`` and
    ``report`` read it. A triage run holds text an operator pasted: its record is validated before
    anything reads it, so a file of the wrong shape (a list, a count where a list belongs, a finding
    without an id) is one line naming the field, never a traceback (docs/safety.md "Bad input")."""

    schema_version: str | None = SCHEMA_VERSION
    host: str | None = None
    operator_supplied: bool = True
    kinds: list[str] = Field(default_factory=list)
    files: list[TriageFile] = Field(default_factory=list)
    driver_version: str | None = None
    image_digest: str | None = None
    findings: list[Finding] = Field(default_factory=list, description="each with evidence.file, the stored "
                                    "capture it was judged from")
    startup: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    chat: dict[str, Any] | None = None
    facts: dict[str, Any] = Field(default_factory=dict, description="the host facts built from the captures")
    exit_code: int | None = None

    @field_validator("findings", mode="before")
    @classmethod
    def _earlier_findings(cls, v: Any) -> Any:
        # Records written before the one Finding (id, the capture's file beside).
        return [earlier_finding(f) for f in v] if isinstance(v, list) else v

    @field_validator("exit_code")
    @classmethod
    def _known_code(cls, v: int | None) -> int | None:
        if v is not None and v not in EXIT_CODES:
            raise ValueError(f"{v} is not a k3fleet exit code")
        return v


def parse_triage_record(data: Any, label: str) -> TriageRecord:
    """``triage.json``'s content as a typed record, or one UsageError naming the first bad field."""
    if not isinstance(data, dict):
        raise UsageError(f"run {label}: triage.json is not a JSON object (got {type(data).__name__})")
    try:
        return TriageRecord.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"run {label}: triage.json is not a triage record: {validation_line(exc)}") from None

