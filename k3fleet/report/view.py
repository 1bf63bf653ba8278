"""One view of any run (audit, change, accept, triage, decision) for the report renderers.

``k3fleet report`` reads the run through decide's readers (k3fleet/decide/views.py), builds a
:class:`ReportView` here from the typed evidence they return, and hands it to the Markdown, HTML,
JUnit or Prometheus renderer, so the four formats always say the same thing (docs/decision.md
"Reports"). Nothing here reads a file: the flows that write a report (decide, triage) and the report
command hand this module what they read, so it imports none of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from k3fleet.accept.probes import PROBES
from k3fleet.accept.result import ProbeResult
from k3fleet.contracts import finding_status
from k3fleet.models.evidence import (
    AcceptEvidence,
    AuditEvidence,
    ChangeEvidence,
    Decision,
    EvidenceSummary,
    OwnerEntry,
    TriageRecord,
)
from k3fleet.models.facts import Gpu, HostFacts
from k3fleet.models.findings import Finding
from k3fleet.verdict import CHECKS

CheckStatus = Literal["pass", "warn", "fail", "error", "skipped"]
# Worst first: a heat-map cell, a folded row and a host take the worst status of what they hold.
STATUS_ORDER: tuple[str, ...] = ("fail", "error", "warn", "skipped", "pass")


@dataclass
class CheckRow:
    """One test case: a check on a host (or ``fleet``), a probe, a checklist item."""

    group: str  # host name, "fleet", "accept.<probe>", "checklist"
    check: str
    status: CheckStatus
    message: str = ""
    severity: str | None = None
    evidence: str | None = None


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    # The x range the phase's charts share, so its panels line up (None: this chart's own points).
    x_range: tuple[float, float] | None = None


@dataclass
class TimelineRow:
    ts: str | None
    host: str
    stage: str
    detail: str | None = None


@dataclass
class HostRow:
    host: str
    status: str
    driver: str | None
    gpus: str | None
    findings: list[str]


@dataclass
class FindingRow:
    """One finding with its fix; identical findings on several hosts are one row naming them all."""

    check: str
    severity: str
    status: str  # fail, error (could not be read), warn, pass (a note)
    message: str
    fix: str | None
    hosts: list[str]  # "fleet" for a fleet finding


@dataclass
class HeatRow:
    host: str
    status: str
    cells: list[str]  # worst status per check group, in HeatMap.groups order


@dataclass
class HeatMap:
    """Hosts x check groups (the check id up to its first dot), each cell the worst status there."""

    groups: list[str]
    rows: list[HeatRow]


@dataclass
class GpuCell:
    index: int
    name: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    status: str  # pass, warn, fail
    problems: list[str]


@dataclass
class GpuHost:
    host: str
    gpus: list[GpuCell]
    # The host's GPU findings from the verdict (an Xid, NVML unreadable...): a fault the per-GPU facts
    # alone do not show; and whether no GPU could be read at all. Either keeps the host out of "healthy".
    faults: list[str] = field(default_factory=list)
    unreadable: bool = False

    @property
    def needs_attention(self) -> bool:
        return self.unreadable or bool(self.faults) or any(g.status != "pass" for g in self.gpus)


@dataclass
class ProbeSummary:
    """One acceptance probe in figures: what an SRE reads before the curves."""

    name: str
    status: str
    reason: str
    figures: list[tuple[str, str]]


@dataclass
class ReportView:
    kind: str
    run: str
    title: str
    meta: list[tuple[str, str]] = field(default_factory=list)
    outcome: str | None = None
    approved: bool | None = None
    draft: bool = False
    next_step: str | None = None  # "do this next": the one action the page leads with
    exit_code: int | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)
    limits: list[dict[str, Any]] = field(default_factory=list)
    checklist: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[HostRow] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    timeline: list[TimelineRow] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    baseline: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    findings: list[FindingRow] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    heatmap: HeatMap | None = None
    gpus: list[GpuHost] = field(default_factory=list)
    probes: list[ProbeSummary] = field(default_factory=list)
    # Chart title suffix ("latency") -> (label, value): the profile's or the load run's SLO, drawn as a line.
    slo: dict[str, tuple[str, float]] = field(default_factory=dict)

    def folded_problems(self) -> list[tuple[CheckRow, int]]:
        """The checks not passed, each host's unreachable rows folded into one ("32 checks skipped:
        host unreachable"), with how many rows each stands for."""
        out: list[tuple[CheckRow, int]] = []
        skipped: dict[str, list[CheckRow]] = {}
        for c in self.checks:
            if c.status == "pass" or c.group in ("checklist", "decision"):
                continue
            if c.status == "skipped" and c.message.startswith("host unreachable"):
                if c.group not in skipped:
                    out.append((c, 0))
                skipped.setdefault(c.group, []).append(c)
                continue
            out.append((c, 1))
        folded: list[tuple[CheckRow, int]] = []
        for c, n in out:
            if n == 0:
                rows = skipped[c.group]
                folded.append((CheckRow(c.group, f"{len(rows)} checks", "skipped", c.message), len(rows)))
            else:
                folded.append((c, n))
        return folded


def with_run(view: ReportView, run: str, started_at: str | None) -> ReportView:
    """The run's name and start first in the view's facts, as every report shows them."""
    view.meta.insert(0, ("run", run))
    if started_at:
        view.meta.insert(1, ("started", started_at))
    return view


# -- audit -------------------------------------------------------------------------------------------


def audit_checks(hosts: Iterable[tuple[str, str, str | None]], findings: Sequence[dict[str, Any]],
                 ) -> list[CheckRow]:
    """Every host-scope check on every host, plus fleet findings: (host, status, unreachable reason)."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in findings:
        by.setdefault((f.get("host") or "fleet", f["check_id"]), []).append(f)
    rows: list[CheckRow] = []
    for host, status, reason in hosts:
        for check in CHECKS.values():
            if check.scope != "host":
                continue
            if status == "unreachable":
                rows.append(CheckRow(host, check.id, "skipped", f"host unreachable: {reason or ''}".strip()))
                continue
            rows.append(_row(host, check.id, by.get((host, check.id), [])))
    for check in CHECKS.values():
        if check.scope == "fleet":
            rows.append(_row("fleet", check.id, by.get(("fleet", check.id), [])))
    return rows


def worst(statuses: Iterable[str]) -> str:
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    return min(statuses, key=lambda s: rank.get(s, len(rank)), default="pass")


def _row(group: str, check: str, found: list[dict[str, Any]]) -> CheckRow:
    if not found:
        return CheckRow(group, check, "pass")
    status = worst(finding_status(f.get("kind", "fail"), f.get("severity")) for f in found)
    pick = [f for f in found if finding_status(f.get("kind", "fail"), f.get("severity")) == status]
    return CheckRow(group, check, status, "; ".join(str(f.get("message", "")) for f in pick),  # type: ignore[arg-type]
                    severity=str(pick[0].get("severity")), evidence=pick[0].get("evidence"))


def check_group(check_id: str) -> str:
    return check_id.split(".", 1)[0]


def finding_rows(findings: Iterable[Finding]) -> list[FindingRow]:
    """Findings folded: one row per identical finding, naming its hosts; worst first, then by check id."""
    by: dict[tuple[str, str, str, str, str], FindingRow] = {}
    for f in findings:
        cid = f.check_id
        status = finding_status(f.kind, f.severity)
        key = (cid, f.severity, status, f.message, f.fix or "")
        row = by.get(key)
        if row is None:
            row = by[key] = FindingRow(cid, f.severity, status, f.message, f.fix, [])
        row.hosts.append(f.host or "fleet")
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    return sorted(by.values(), key=lambda r: (rank.get(r.status, 9), r.check, -len(r.hosts), r.hosts[0]))


def heat_map(hosts: Iterable[tuple[str, str]], findings: Iterable[Finding]) -> HeatMap:
    """Hosts (name, status) x the host-scope check groups of the catalogue."""
    groups = sorted({check_group(c.id) for c in CHECKS.values() if c.scope == "host"})
    cell: dict[tuple[str, str], list[str]] = {}
    for f in findings:
        if f.host:
            cell.setdefault((f.host, check_group(f.check_id)), []).append(finding_status(f.kind, f.severity))
    rows = []
    for host, status in hosts:
        cells = ["skipped" if status == "unreachable" else worst(cell.get((host, g), [])) for g in groups]
        rows.append(HeatRow(host, status, cells))
    return HeatMap(groups, rows)


def audit_view(a: AuditEvidence, run: str, exit_code: int | None, facts: Iterable[tuple[str, HostFacts]]) -> ReportView:
    """An audit run: its evidence summary (``k3fleet.decide.readers.read_audit``), the exit code its
    run.json recorded (None: none of the contract's), and the validated facts of its reachable hosts
    (for the GPU grid)."""
    view = ReportView(kind="audit", run=run, title=f"k3fleet audit: {a.outcome}", outcome=a.outcome)
    view.exit_code = exit_code
    view.reasons = [{"rule": "audit", "outcome": a.outcome, "text": r, "evidence": str(a.ref)} for r in a.reasons]
    view.meta += [("hosts", str(len(a.hosts))), ("GPUs healthy / required", f"{a.gpus_healthy} / {a.gpus_required}"),
                  ("strategy", a.strategy or "?")]
    _hosts_into(view, a)
    view.gpus = gpu_hosts(facts, a.findings)
    view.next_step = audit_next_step(a.outcome, run, [h.host for h in a.hosts if h.status == "unreachable"],
                                     sum(1 for h in a.hosts if h.status == "fail"))
    return view


# The check groups whose failures are about a host's GPUs (k3fleet checks gpu.* nvml.*).
_GPU_GROUPS = ("gpu", "nvml")


def gpu_hosts(facts: Iterable[tuple[str, HostFacts]], findings: Iterable[Any] = ()) -> list[GpuHost]:
    """Per GPU of each host's facts: memory total and in use, and its health (ECC, remapped rows,
    fabric, PCIe link, clock events), as the audit's facts files hold them; beside them the host's
    failed GPU checks from the verdict (an Xid says a GPU fell off the bus, not its memory figures)."""
    faults: dict[str, list[str]] = {}
    for f in findings:
        if (f.host and check_group(f.check_id) in _GPU_GROUPS
                and finding_status(f.kind, f.severity) in ("fail", "error")):
            faults.setdefault(f.host, []).append(f"{f.check_id}: {f.message}")
    out = []
    for host, f in facts:
        cells = [_gpu_cell(g) for g in f.driver.gpus]
        out.append(GpuHost(host, cells, faults.get(host, []), unreadable=not cells))
    return out


def _dict(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _gpu_cell(g: Gpu) -> GpuCell:
    fails: list[str] = []
    warns: list[str] = []
    if g.ecc is not None and (g.ecc.volatile_uncorrected or 0) > 0:
        fails.append(f"{g.ecc.volatile_uncorrected} uncorrectable ECC errors since the driver loaded")
    rows = g.remapped_rows
    if rows is not None and rows.failure:
        fails.append("row remapping failed")
    elif rows is not None and rows.pending:
        fails.append("row remap pending (reset or reboot)")
    if g.fabric_state not in (None, "completed", "not_supported"):
        fails.append(f"fabric {g.fabric_state}")
    pcie = g.pcie
    gen, gen_max = (pcie.gen_current, pcie.gen_max) if pcie is not None else (None, None)
    width, width_max = (pcie.width_current, pcie.width_max) if pcie is not None else (None, None)
    if width and width_max and width < width_max:
        warns.append(f"PCIe x{width} of x{width_max}")
    active = [a for a in (g.throttle.active if g.throttle is not None else [])
              if a not in ("idle", "none", "applications_clocks")]
    if active:
        warns.append("clocks held: " + ", ".join(active))
    used = g.memory_used_mib
    if used:
        warns.append(f"{used} MiB in use")
    if gen and gen_max and gen < gen_max and not width:
        warns.append(f"PCIe gen {gen} of {gen_max}")
    return GpuCell(g.index, g.name or "?", g.memory_total_mib, used, "fail" if fails else "warn" if warns else "pass",
                   fails + warns)


def _hosts_into(view: ReportView, a: AuditEvidence) -> None:
    findings = [{"check_id": f.check_id, "severity": f.severity, "kind": f.kind, "host": f.host, "message": f.message,
                 "evidence": str(f.ref)} for f in a.findings]
    for h in a.hosts:
        ids = sorted({f.check_id for f in a.findings if f.host == h.host and f.severity != "info"})
        view.hosts.append(HostRow(h.host, h.status, h.driver_version,
                                  f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else None, ids or
                                  ([h.reason] if h.reason else [])))
    view.checks += audit_checks(((h.host, h.status, h.reason) for h in a.hosts), findings)
    view.findings = finding_rows(a.findings)
    unreachable = [h for h in a.hosts if h.status == "unreachable"]
    if unreachable:
        view.findings.append(FindingRow("host.unreachable", "error", "skipped", "host unreachable: its checks were "
                                        "skipped and its GPUs are not counted", "reach the host (SSH, inventory "
                                        "address) and audit it again", [h.host for h in unreachable]))
    view.heatmap = heat_map(((h.host, h.status) for h in a.hosts), a.findings)
    view.plan = a.plan


# -- change night ------------------------------------------------------------------------------------


def change_view(c: ChangeEvidence, run: str) -> ReportView:
    """A change run from its evidence summary (``k3fleet.decide.readers.read_change``)."""
    mode = "check (nothing changed)" if c.check else "change night"
    view = ReportView(kind="change", run=run, title=f"k3fleet change {c.change_id or ''}: {mode}".strip(),
                      exit_code=c.exit_code)
    view.meta += [("change id", c.change_id or "?"), ("operator", c.operator or "?"),
                  ("target version", c.target_version or "?"), ("status", c.status or "?")]
    if c.message:
        view.notes.append(c.message)
    view.notes += c.journal_problems
    view.timeline = [TimelineRow(e.ts, e.host, e.stage, e.detail) for e in c.timeline]
    for host, outcome in sorted(c.hosts.items()):
        status: CheckStatus = ("pass" if outcome == "upgraded" or (c.check and outcome == "not_started")
                               else "fail" if outcome in ("failed", "rolled_back") else "skipped")
        view.checks.append(CheckRow(host, "change.outcome", status, outcome))
    return view


# -- acceptance --------------------------------------------------------------------------------------


def _status(s: str) -> CheckStatus:
    return {"pass": "pass", "fail": "fail", "skipped": "skipped"}.get(s, "error")  # type: ignore[return-value]


def accept_view(acc: AcceptEvidence, run: str, exit_code: int | None, results: Mapping[str, ProbeResult],
                curves: Sequence[dict[str, Any]]) -> ReportView:
    """An acceptance run: its evidence summary (``k3fleet.decide.readers.read_accept``), the exit code
    its accept.json recorded, each probe's result (:class:`k3fleet.accept.result.ProbeResult`, in
    probe order) and the load curves."""
    view = ReportView(kind="accept", run=run, title=f"k3fleet accept: {acc.model or '?'}",
                      exit_code=exit_code)
    view.meta += [("endpoint", acc.base_url or "?"), ("model", acc.model or "?")]
    for name in PROBES:
        probe = getattr(acc, name)
        if probe is None:
            view.checks.append(CheckRow(f"accept.{name}", name, "skipped", "probe not run: missing evidence"))
            continue
        view.checks.append(CheckRow(f"accept.{name}", name, _status(probe.status), probe.reason or "",
                                    evidence=str(probe.ref)))
        for f in probe.findings:
            st: CheckStatus = "fail" if f.failed else "pass"
            view.checks.append(CheckRow(f"accept.{name}", f.check_id, st, f.message, severity=f.severity,
                                        evidence=str(f.ref)))
    if acc.agent is not None:
        for case in acc.agent.cases:
            view.checks.append(CheckRow("accept.agent.cases", case.name, "fail" if case.failures else "pass",
                                        f"{case.passed}/{case.runs} passed"
                                        + (f"; {case.defects}" if case.defects else "")))
    view.probes = probe_summaries(results)
    if acc.load is not None and "load" in results:
        data = results["load"].data or {}
        view.charts = load_charts(curves) + gpu_charts(data.get("gpu"))
        view.slo = load_slo(data)
    return view


def plain_number(v: object, unit: str = "") -> str:
    """A number as people write it: no exponent, integers without decimals, 2-3 significant digits."""
    n = _num(v)
    if n is None:
        return "?"
    if n == int(n) and abs(n) < 1e15:
        text = f"{int(n):,}"
    elif abs(n) >= 100:
        text = f"{n:,.0f}"
    elif abs(n) >= 10:
        text = f"{n:.1f}"
    elif abs(n) >= 1:
        text = f"{n:.2f}"
    elif n:
        # Two significant digits however small (0.00025, not "0"), never an exponent.
        places = max(3, 1 - math.floor(math.log10(abs(n))) + 1)
        text = f"{n:.{places}f}".rstrip("0").rstrip(".")
    else:
        text = "0"
    return f"{text} {unit}".rstrip() if unit else text


def plain_value(v: object) -> str:
    """A setting as people read it: a mapping as ``key=value, ...``, a list comma-separated, never a
    Python or JSON literal."""
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={plain_value(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(plain_value(x) for x in v)
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "none"}[v]
    return str(v)


def _median(values: object) -> float | None:
    nums = [float(v) for v in values if _num(v) is not None] if isinstance(values, list) else []
    if not nums:
        return None
    nums.sort()
    mid = len(nums) // 2
    return nums[mid] if len(nums) % 2 else (nums[mid - 1] + nums[mid]) / 2


def load_slo(data: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """The load run's own TTFT p95 SLO (its options), drawn on its latency charts."""
    opts = _dict(data.get("options"))
    slo = _num(opts.get("ttft_p95_slo_s"))
    return {"latency": ("TTFT p95 SLO", slo)} if slo else {}


def probe_summaries(results: Mapping[str, ProbeResult]) -> list[ProbeSummary]:
    """Each probe's figures from its result (a ProbeResult: status, reason, data): prefix-cache tokens
    and TTFT cold vs warm, agent pass rates per case, the load envelope and ceiling, start-up layout."""
    out: list[ProbeSummary] = []
    for name, res in results.items():
        data = _dict(res.data)
        figures: list[tuple[str, str]] = []
        if name == "prefix_cache":
            ttft = _dict(data.get("ttft_s"))
            cold, warm = _num(ttft.get("cold")), _num(ttft.get("warm_median")) or _median(ttft.get("warm"))
            figures.append(("TTFT cold -> warm (median)", f"{plain_number(cold, 's')} -> {plain_number(warm, 's')}"))
            if cold and warm:
                figures.append(("warm / cold TTFT", f"{warm / cold:.0%}"))
            cached = _dict(data.get("cached_tokens"))
            expected = _dict(data.get("expected_cached_tokens"))
            src = f" (from {cached['source']})" if cached.get("source") else ""
            figures.append(("cached tokens per warm request" + src, plain_number(_median(cached.get("warm")))))
            if expected:
                figures.append(("expected cached tokens", f"{plain_number(expected.get('low'))} to "
                                                          f"{plain_number(expected.get('high'))}"))
            figures.append(("cached tokens, control request", plain_number(cached.get("control"))))
            windows = _dict(data.get("windows"))
            warm_w = _dict(windows.get("warm"))
            hits, queries = _num(warm_w.get("vllm:prefix_cache_hits")), _num(warm_w.get("vllm:prefix_cache_queries"))
            if hits is not None and queries:
                figures.append(("prefix-cache hit rate, warm window", f"{hits / queries:.0%} of "
                                                                      f"{plain_number(queries)} tokens"))
        elif name == "agent":
            cases = _dict(data.get("cases"))
            runs = sum(int(_num(c.get("runs")) or 0) for c in cases.values() if isinstance(c, dict))
            passed = sum(int(_num(c.get("passed")) or 0) for c in cases.values() if isinstance(c, dict))
            if runs:
                figures.append(("all cases", f"{passed}/{runs} passed ({passed / runs:.0%})"))
            for case, c in sorted(cases.items()):
                if isinstance(c, dict) and _num(c.get("runs")):
                    r, p = int(_num(c.get("runs")) or 0), int(_num(c.get("passed")) or 0)
                    defects = _dict(c.get("defects"))
                    more = "; " + ", ".join(f"{k} {v}" for k, v in sorted(defects.items())) if defects else ""
                    figures.append((str(case), f"{p}/{r} ({p / r:.0%}){more}"))
        elif name == "load":
            env = _dict(data.get("envelope"))
            figures.append(("outcome", str(data.get("outcome") or "?")))
            if data.get("ceiling") is not None:
                figures.append(("ceiling (concurrent sessions)", plain_number(data.get("ceiling"))))
            figures.append(("tested envelope", f"{plain_number(env.get('max_concurrency'))} sessions, "
                                               f"{plain_number(env.get('max_context_tokens'))}-token context"))
            counts = _dict(data.get("counts"))
            figures.append(("requests ok / sent", f"{plain_number(counts.get('ok'))} / "
                                                  f"{plain_number(counts.get('requests'))}"))
            worst_p95 = max((float(r["ttft_p95_s"]) for r in data.get("curves") or []
                             if isinstance(r, dict) and _num(r.get("ttft_p95_s")) is not None), default=None)
            slo = load_slo(data).get("latency")
            figures.append(("worst step TTFT p95", plain_number(worst_p95, "s")
                            + (f" (SLO {plain_number(slo[1], 's')})" if slo else "")))
            figures.append(("restarts, preemptions", f"{plain_number(counts.get('restarts'))}, "
                                                      f"{plain_number(counts.get('preemptions'))}"))
        elif name == "startup":
            for key, label in (("vllm_version", "vLLM"), ("tensor_parallel_size", "tensor parallel"),
                               ("prefix_caching", "prefix caching"), ("tool_call_parser", "tool-call parser"),
                               ("max_model_len", "max model length")):
                if data.get(key) is not None:
                    figures.append((label, str(data[key])))
        out.append(ProbeSummary(name, str(res.status or "?"), str(res.reason or ""), figures))
    return out


# Per phase: the x axis, then the charts as (title, unit, [(row key, label)]) (docs/acceptance.md, load rows).
_PHASE_X = {"long_input": ("prompt_tokens_mean", "prompt tokens"), "agent_ramp": ("concurrency", "concurrent sessions"),
            "sustained": ("t_start_s", "seconds into the run"), "rate_ramp": ("rate_rps", "requests per second"),
            "slo_search": ("rate_rps", "requests per second")}
_CHARTS = (
    ("latency", "seconds", (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95"), ("e2e_p50_s", "end-to-end p50"),
                            ("itl_p50_s", "inter-token p50"))),
    ("queue", "requests", (("running_max", "running (max)"), ("waiting_max", "waiting (max)"))),
    ("KV cache", "percent used", (("kv_usage_max", "KV usage (max)"),)),
    ("goodput", "share within the SLO", (("goodput", "goodput"),)),
)
# GPU telemetry curves (load.json data.gpu.curves rows: t_s, used, free, power, utilisation).
_GPU_CHARTS = (("GPU memory used", "MiB", 1), ("GPU power", "W", 3), ("GPU utilisation", "percent", 4))


def load_charts(points: Sequence[dict[str, Any]]) -> list[Chart]:
    """Per load phase, latency, queue and KV-cache charts against the phase's x axis."""
    charts: list[Chart] = []
    phases: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        phases.setdefault(str(p.get("phase") or "load"), []).append(p)
    for phase, pts in phases.items():
        x_key, x_label = _PHASE_X.get(phase, ("t_start_s", "seconds into the run"))
        xs = [float(p[x_key]) for p in pts if _num(p.get(x_key)) is not None]
        # One x range per phase: its latency, queue and KV panels line up point for point.
        x_range = (min(xs), max(xs)) if xs else None
        for title, unit, keys in _CHARTS:
            # vLLM reports KV usage as a fraction (0-1): drawn as a percentage, so a 0.04% cache reads 0.04.
            scale = 100.0 if unit == "percent used" else 1.0
            series = []
            for key, label in keys:
                xy = [(float(p[x_key]), float(p[key]) * scale) for p in pts
                      if _num(p.get(x_key)) is not None and _num(p.get(key)) is not None]
                if xy:
                    series.append(Series(label, sorted(xy)))
            if series:
                charts.append(Chart(title=f"{phase}: {title}", x_label=x_label, y_label=unit, series=series,
                                    x_range=x_range))
    return charts


def gpu_charts(gpu: object) -> list[Chart]:
    """Per load phase, each GPU's memory used, power and utilisation against the run's seconds."""
    curves = gpu.get("curves") if isinstance(gpu, dict) else None
    charts: list[Chart] = []
    if not isinstance(curves, dict):
        return charts
    for phase, gpus in curves.items():
        if not isinstance(gpus, dict):
            continue
        for title, unit, col in _GPU_CHARTS:
            series = []
            for key, rows in sorted(gpus.items()):
                xy = [(float(r[0]), float(r[col])) for r in rows if isinstance(r, list) and len(r) > col
                      and _num(r[0]) is not None and _num(r[col]) is not None]
                if xy:
                    series.append(Series(f"GPU {key}", xy))
            if series:
                charts.append(Chart(title=f"{phase}: {title}", x_label="seconds into the run", y_label=unit,
                                    series=series))
    return charts


def _num(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    return float(v) if isinstance(v, int | float) else None


# -- triage ------------------------------------------------------------------------------------------


def triage_view(data: TriageRecord, run: str) -> ReportView:
    """A triage run from its record (``k3fleet.models.evidence.TriageRecord``)."""
    host = data.host or "capture"
    view = ReportView(kind="triage", run=run, title=f"k3fleet triage: {host} (operator-supplied)")
    view.meta += [("kinds", ", ".join(data.kinds)), ("files", str(len(data.files)))]
    for capture in data.files:
        view.notes.append(f"{capture.name}: {capture.kind}")
    for f in data.findings:
        status: CheckStatus = "fail" if f.failed else "error" if f.kind == "unknown" else "pass"
        view.checks.append(CheckRow(host, f.check_id, status, f.message, severity=f.severity,
                                    evidence=f.evidence.get("file") or ""))
    view.exit_code = data.exit_code
    return view


# -- decision ----------------------------------------------------------------------------------------


def _owner_text(entry: OwnerEntry | None) -> str | None:
    return f"{entry.owner}, by {entry.deadline}; rollback: {entry.rollback}" if entry is not None else None


def approval_words(approved: bool, draft: bool) -> str:
    """How every view says a decision's approval: a draft (unsigned) is never read as approved."""
    return "approved" if approved else "DRAFT: unsigned, not approved" if draft else "NOT approved"


def audit_next_step(outcome: str, run: str, unreachable: Sequence[str], failing: int) -> str:
    """The audit page's "do this next", from its outcome (the terminal's next line, for a report)."""
    if outcome == "incomplete" or (unreachable and not failing):
        return (f"reach the unreachable host(s) ({', '.join(unreachable[:5])}{' ...' if len(unreachable) > 5 else ''})"
                " and audit again")
    if outcome == "go_live":
        return "prove serving: k3fleet accept all --base-url URL --model MODEL, then k3fleet decide"
    if outcome == "rebuild_environment":
        return (f"plan the change night: k3fleet plan --run {run}, then k3fleet upgrade -i INVENTORY --change-id ID "
                "--operator YOU --check")
    if outcome == "expand_capacity":
        return "add GPU nodes or fix the failing hosts named below, then audit again"
    return f"fix the findings below (each with its fix), or decide with limits: k3fleet decide {run} ..."


def decision_next_step(d: Decision, run: str) -> str:
    """The decision page's "do this next", from its outcome, approval and what it misses."""
    if d.approved:
        return (f"watch the go-live: k3fleet watch --base-url URL --baseline {run}.tar.gz --allowed-signers FILE "
                "--for 15m")
    if d.draft:
        return "sign it: run the same k3fleet decide again with --sign-key KEY (a draft is not an approval)"
    if d.outcome == "rebuild_environment":
        return "rebuild: fix what 'Why' names (each reason with the file it rests on), then run that evidence again"
    if d.outcome == "expand_capacity":
        return "expand capacity: add GPUs or raise the tested ceiling (see 'Why'), then run accept and decide again"
    if d.missing:
        return f"bring the missing evidence ({', '.join(d.missing[:4])}{' ...' if len(d.missing) > 4 else ''}), " \
               "then decide again"
    return "resolve the blocking reasons under 'Why' (owners, limits, reviewers), then decide again"


def decision_view(d: Decision, s: EvidenceSummary, run: str, curves: Sequence[dict[str, Any]] = ()) -> ReportView:
    approval = approval_words(d.approved, d.draft)
    view = ReportView(kind="decision", run=run, title=f"k3fleet decision: {d.outcome} ({approval})",
                      outcome=d.outcome, approved=d.approved, exit_code=d.exit_code, draft=d.draft,
                      next_step=decision_next_step(d, run))
    view.meta += [("reviewer", f"{d.reviewer or '?'} at {d.reviewed_at or '?'}"), ("track", d.track),
                  ("target", f"{s.target.name} ({s.target.image})")]
    if d.service_owner:
        view.meta.append(("service owner", d.service_owner))
    view.meta.append(("runs", ", ".join(f"{r.label} ({r.kind}{', operator-supplied' if r.operator_supplied else ''})"
                                        for r in s.runs)))
    view.reasons = [{"rule": r.rule, "outcome": r.outcome, "approval": r.approval, "text": r.text,
                     "evidence": ", ".join(str(e) for e in r.evidence)} for r in d.reasons]
    view.limits = [{"kind": lim.kind, "value": lim.value, "text": lim.text, "owner": lim.owner,
                    "evidence": ", ".join(str(e) for e in lim.evidence)} for lim in d.limits]
    for item in d.checklist:
        view.checklist.append({"id": item.id, "title": item.title, "track": item.track, "status": item.status,
                               "detail": item.detail, "evidence": ", ".join(str(e) for e in item.evidence),
                               "owner": _owner_text(item.owner)})
        view.checks.append(CheckRow("checklist", item.id, {"pass": "pass", "fail": "fail"}.get(
            item.status, "error"), f"{item.title}: {item.detail}",  # type: ignore[arg-type]
            evidence=", ".join(str(e) for e in item.evidence)))
    view.checks.append(CheckRow("decision", "decision.approved", "pass" if d.approved else "fail",
                                f"{d.outcome}: " + "; ".join(r.text for r in d.reasons[:3])))
    if s.audit is not None:
        _hosts_into(view, s.audit)
    if s.change is not None:
        view.timeline = [TimelineRow(e.ts, e.host, e.stage, e.detail) for e in s.change.timeline]
    view.charts = load_charts(curves)
    if s.accept is not None:
        view.probes = evidence_probes(s.accept)
    # The production profile's TTFT SLO, when the evidence holds a profile (decide --profile).
    slo = _num(getattr(getattr(getattr(s, "profile", None), "slo", None), "ttft_p95_s", None))
    if slo:
        view.slo = {"latency": ("profile TTFT p95 SLO", slo)}
    view.baseline = d.baseline.model_dump(mode="json") if d.baseline is not None else None
    return view


def evidence_probes(acc: AcceptEvidence) -> list[ProbeSummary]:
    """The acceptance probes as the decision's evidence summary holds them."""
    out: list[ProbeSummary] = []
    if acc.startup is not None:
        st = acc.startup
        out.append(ProbeSummary("startup", st.status, st.reason or "", [
            (k, str(v)) for k, v in (("vLLM", st.vllm_version), ("tensor parallel", st.tensor_parallel_size),
                                     ("prefix caching", st.prefix_caching), ("tool-call parser", st.tool_call_parser))
            if v is not None]))
    if acc.prefix_cache is not None:
        pc = acc.prefix_cache
        figs = [("prefix caching enabled", str(pc.caching_enabled)), ("controlled reuse", str(pc.controlled_reuse))]
        if pc.hit_ratio is not None:
            figs.append(("prefix-cache hit rate, warm window", f"{pc.hit_ratio:.0%}"))
        out.append(ProbeSummary("prefix_cache", pc.status, pc.reason or "", figs))
    if acc.agent is not None:
        runs = sum(c.runs for c in acc.agent.cases)
        passed = sum(c.passed for c in acc.agent.cases)
        figs = [("all cases", f"{passed}/{runs} passed ({passed / runs:.0%})")] if runs else []
        figs += [(c.name, f"{c.passed}/{c.runs} ({c.passed / c.runs:.0%})") for c in acc.agent.cases if c.runs]
        out.append(ProbeSummary("agent", acc.agent.status, acc.agent.reason or "", figs))
    if acc.load is not None:
        ld = acc.load
        figs = [("outcome", str(ld.outcome or "?"))]
        if ld.ceiling is not None:
            figs.append(("ceiling (concurrent sessions)", plain_number(ld.ceiling)))
        figs.append(("tested envelope", f"{plain_number(ld.envelope.get('max_concurrency'))} sessions, "
                                        f"{plain_number(ld.envelope.get('max_context_tokens'))}-token context"))
        figs.append(("restarts, health failures", f"{plain_number(ld.restarts)}, {plain_number(ld.health_failures)}"))
        out.append(ProbeSummary("load", ld.status, ld.reason or "", figs))
    return out
