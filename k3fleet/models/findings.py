"""Findings, per-host verdicts, the change plan and the fleet verdict.

A :class:`Finding` is one problem (or note) a rule found on a host or across the fleet,
with the facts it used as evidence and a fix. Only problems and notes are findings: a
check that has nothing to say about a host passed (the check catalogue lists them all).
A fact that could not be read yields a finding of kind ``unknown``, never a pass.

The one :class:`Finding` is what the audit, the acceptance probes, triage and the decision emit; its
severity scale and kinds are ``k3fleet.contracts``'s. Run files written before it
(acceptance results, triage records, decision summaries) are read through :func:`earlier_finding`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from k3fleet.contracts import (
    EARLIER_SEVERITY,
    SEVERITY_RANK,
    AuditOutcome,
    FindingKind,
    Severity,
    is_blocking,
    is_failure,
    result_code,
)
from k3fleet.models.target import Strategy, StrategySetting

__all__ = ["SEVERITY_RANK", "Finding", "FindingKind", "Severity", "earlier_finding"]

HostStatus = Literal["pass", "warn", "fail", "unreachable"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Finding(_Out):
    check_id: str = Field(description="stable dotted id: the check catalogue's, or accept.<probe>.<what>")
    severity: Severity
    kind: FindingKind = Field(default="fail", description="fail: a problem; unknown: could not be read; note")
    host: str | None = Field(default=None, description="None for fleet-wide findings")
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    fix: str | None = None
    chain: bool = Field(
        default=False,
        description="part of the image -> CUDA -> driver version chain (the planned driver change resolves it)",
    )
    layer: str | None = Field(
        default=None, description="where a served model's defect sits (acceptance, triage): http (the raw "
        "response: model or server parser), client (the reference SDK), environment (host, driver, topology), "
        "config (server flags), traffic, model")

    @property
    def blocking(self) -> bool:
        """error or critical, whatever the kind."""
        return is_blocking(self.severity)

    @property
    def failed(self) -> bool:
        """A definite failure: blocking and of kind ``fail`` (exit 1)."""
        return is_failure(self.kind, self.severity)


def earlier_finding(data: Any) -> Any:
    """A finding as run files written before the one :class:`Finding` hold it, in today's shape.

    Acceptance results, triage records and decision summaries named the id ``id``; acceptance rated
    ``fail`` / ``warn`` / ``info`` (read as error / warning / info) without a kind (read as fail for a
    fail and note otherwise, as every reader took them) and gave its evidence as text (kept as
    ``evidence.detail``); triage named the stored capture beside (kept as ``evidence.file``). Anything
    else is returned as it is.
    """
    if not isinstance(data, dict) or not ("id" in data or "file" in data or data.get("severity") in EARLIER_SEVERITY):
        return data
    out = dict(data)
    old = out.get("severity")
    if "id" in out and "check_id" not in out:
        out["check_id"] = out.pop("id")
        # An acceptance finding had no kind: every reader took a fail for a failure, the rest for notes.
        out.setdefault("kind", "fail" if old == "fail" else "note")
    if old in EARLIER_SEVERITY:
        out["severity"] = EARLIER_SEVERITY[old]
    evidence = out.pop("evidence", None)
    evidence = {"detail": evidence} if isinstance(evidence, str) else evidence or {}
    file = out.pop("file", None)
    if file:
        evidence = {**evidence, "file": file}
    if evidence:
        out["evidence"] = evidence
    return out


class HostVerdict(_Out):
    host: str
    status: HostStatus
    reason: str | None = Field(default=None, description="why the host was unreachable")
    findings: list[Finding] = Field(default_factory=list)
    driver_version: str | None = None
    driver_branch: int | None = Field(default=None, description=(
        "the data-center driver branch the verdict read from the loaded driver (580 of 580.95.05); None when "
        "unknown or on a platform with no branch (a Jetson's L4T release 35.3.1 is no R35)"))
    gpu_model: str | None = None
    gpu_count: int | None = None


class PackageChange(_Out):
    name: str | None = Field(description="installed package; None when the package is to be added")
    from_version: str | None = None
    to_name: str
    to_version: str | None = Field(
        description="upstream version (the package manager resolves the revision); None where the package "
        "is versioned by something else, e.g. prebuilt kernel modules follow the kernel"
    )


UpgradeScope = Literal["driver", "fabricmanager"]


class UpgradeItem(_Out):
    host: str
    scope: UpgradeScope = Field(
        default="driver",
        description="driver: the driver branch change with its Fabric Manager; fabricmanager: the driver is "
        "already at the target, only the Fabric Manager packages move to its version",
    )
    current_version: str
    current_branch: int
    target_version: str
    target_branch: int
    gpu_model: str | None = None
    gpu_count: int | None = None
    profile: str
    idle: bool | None = Field(default=None, description="idle per scheduler facts; None when not known")
    packages: list[PackageChange] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class BlockedHost(_Out):
    host: str
    current_version: str | None = None
    check_ids: list[str]
    reasons: list[str]


class Canary(_Out):
    host: str
    profile: str
    reason: str = Field(description="why this host, in one short clause")
    note: str | None = Field(default=None, description="why not a host of the most common profile, when it is not")


class ChangePlan(_Out):
    target_branch: int
    target_version: str
    needs_upgrade: list[UpgradeItem] = Field(
        default_factory=list,
        description="every host with something to change (blocked or not): below the target driver, or on "
        "it with a Fabric Manager of another version (scope fabricmanager)",
    )
    done: list[str] = Field(
        default_factory=list,
        description="hosts with nothing left to change: on the target branch (or newer) at or above the "
        "minimum driver, Fabric Manager (where needed) at the driver's version; fleet.driver_drift "
        "still shows those short of target_version",
    )
    blocked: list[BlockedHost] = Field(default_factory=list, description="fix these before changing them")
    unreachable: list[str] = Field(default_factory=list)
    canary: Canary | None = None
    canary_note: str | None = Field(default=None, description="why there is no canary, when there is none")
    wave_size: int = 0
    waves: list[list[str]] = Field(default_factory=list, description="after the canary, in order")


class NodeMemory(_Out):
    gpu_model: str
    hosts: int = Field(description="hosts of this model whose GPU memory is known")
    gpu_memory_gib: float = Field(description="smallest per-GPU memory reported for the model")
    node_memory_gib: float = Field(description="gpu_memory_gib x the target's GPUs per node")
    holds_weights: bool


class StrategyDecision(_Out):
    """Which serving strategy the verdict used, and why (derived from GPU memory or named by the target)."""

    strategy: Strategy = Field(description="the strategy capacity and RDMA checks were judged by")
    setting: StrategySetting = Field(description="gpus.strategy in the target: auto or an explicit strategy")
    derived: bool = Field(description="true when strategy was derived from the hosts' GPU memory")
    reason: str
    rdma_required: bool
    weights_gb: float | None = None
    weights_confirmed: bool | None = Field(default=None, description="false: the memory figure is an estimate")
    weights_source: str | None = None
    nodes: list[NodeMemory] = Field(default_factory=list, description="per GPU model, largest first")
    hosts_unknown_memory: int = Field(default=0, description="hosts whose GPU memory could not be read")
    tensor_parallel_size: int | None = Field(default=None, description="the tensor-parallel size of the strategy")
    serve_command: list[str] = Field(
        default_factory=list, description="the vLLM serve command for the strategy (serve.flags, tensor-parallel "
        "size set from the strategy)")


class InterconnectSummary(_Out):
    """What the serving group's hosts offer an all-to-all backend's transport (k3fleet.verdict.all2all)."""

    serving_hosts: int = 0
    multi_node: bool = Field(default=False, description="the strategy spans nodes")
    backend: str | None = Field(default=None, description="the target's --all2all-backend (or VLLM_ALL2ALL_BACKEND)")
    backend_source: str | None = None
    rdma_missing: dict[str, str] = Field(default_factory=dict, description="host -> why it has no working RDMA path")
    rdma_unknown: dict[str, str] = Field(default_factory=dict)
    nvlink_domains: dict[str, int] = Field(default_factory=dict, description="ClusterUUID -> serving hosts in it")
    nvlink_single_node: list[str] = Field(default_factory=list, description="hosts with the zero ClusterUUID")
    nvlink_missing: dict[str, str] = Field(default_factory=dict, description="host -> why it has no NVLink fabric")
    nvlink_unknown: dict[str, str] = Field(default_factory=dict)
    imex_not_ready: dict[str, str] = Field(default_factory=dict, description="host of a multi-node NVLink domain "
                                                                             "-> why IMEX is not ready there")
    imex_unknown: dict[str, str] = Field(default_factory=dict)


class VerdictSummary(_Out):
    hosts: int
    passed: int
    warned: int
    failed: int
    unreachable: int
    findings: dict[str, int] = Field(description="finding count per severity, hosts and fleet together")
    unknown_findings: int
    gpus_healthy: int = Field(description="GPUs on hosts that pass or only warn")
    gpus_after_plan: int = Field(description="healthy GPUs once the planned driver change is done")
    gpus_required: int
    evidence_incomplete: bool


class FleetVerdict(_Out):
    # The JSON carries the computed checks_failed / exit_code; reading it back recomputes them.
    model_config = ConfigDict(extra="ignore")

    target: str
    outcome: AuditOutcome
    reasons: list[str]
    summary: VerdictSummary
    hosts: dict[str, HostVerdict]
    fleet_findings: list[Finding] = Field(default_factory=list)
    plan: ChangePlan
    strategy: StrategyDecision | None = Field(default=None, description="the serving strategy judged against")
    interconnect: InterconnectSummary | None = Field(
        default=None, description="the serving group's RDMA and NVLink facts, for judging an all-to-all backend")
    unconfirmed_matrix_rows: list[str] = Field(
        default_factory=list, description="matrix rows marked confirmed: false that a finding relied on"
    )

    def all_findings(self) -> list[Finding]:
        out = [f for h in self.hosts.values() for f in h.findings]
        out.extend(self.fleet_findings)
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def checks_failed(self) -> bool:
        """A check definitely failed: an error or critical finding of kind ``fail``."""
        return any(f.failed for f in self.all_findings())

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        """0 pass, 1 checks failed, 3 hosts unreachable or evidence incomplete.

        When both apply, 1 wins: a definite failure is a no-go whatever the missing
        hosts would show, and a caller that retries on 3 must not retry a known no-go.
        """
        return result_code(failed=self.checks_failed,
                           incomplete=bool(self.summary.unreachable or self.summary.evidence_incomplete))


def fleet_verdict_json_schema() -> dict[str, Any]:
    schema = FleetVerdict.model_json_schema(mode="serialization")
    schema["$id"] = "https://k3fleet.invalid/schema/fleet-verdict-1.json"
    return schema
