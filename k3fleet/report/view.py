"""One view of any run (audit, change, accept, triage, decision) for the report renderers.

``k3fleet report`` verifies the run against its manifest, builds a :class:`ReportView` here,
and hands it to the Markdown, HTML, JUnit or Prometheus renderer, so the four formats always
say the same thing (docs/decision.md "Reports").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from k3fleet.bounds import read_bounded
from k3fleet.contracts import EXIT_CODES
from k3fleet.errors import UsageError

CheckStatus = Literal["pass", "fail", "error", "skipped"]
REPORT_KINDS = ("audit", "change", "accept", "triage", "decision")


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
class ReportView:
    kind: str
    run: str
    title: str
    meta: list[tuple[str, str]] = field(default_factory=list)
    outcome: str | None = None
    approved: bool | None = None
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


def _read(path: Path, rel: str) -> Any:
    try:
        return json.loads(read_bounded(path / rel, "run_json").decode("utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"{path}: {rel} is missing") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: {rel} is not valid JSON ({exc})") from exc


def _exit_code(v: Any) -> int | None:
    """A recorded exit code, or None when the file holds anything but one of the contract's codes."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v in EXIT_CODES else None


def load_view(path: Path) -> ReportView:
    """Verify ``path`` against its manifest, then build its view."""
    from k3fleet.decide.readers import RunVerificationError, verify

    if not path.is_dir() or not (path / "command.json").is_file():
        raise UsageError(f"{path} is not a k3fleet run directory (no command.json)")
    problems = verify(path)
    if problems:
        raise RunVerificationError(f"run {path.name} does not match its manifest: {'; '.join(problems[:3])}")
    cmd = _read(path, "command.json")
    kind = cmd.get("kind") if isinstance(cmd, dict) else None
    if kind not in REPORT_KINDS:
        raise UsageError(f"run {path.name} is of kind {kind!r}; report renders {', '.join(REPORT_KINDS)} runs")
    builder = {"audit": _audit_view, "change": _change_view, "accept": _accept_view, "triage": _triage_view,
               "decision": _decision_view}[kind]
    view = builder(path, cmd)
    view.meta.insert(0, ("run", path.name))
    if cmd.get("started_at"):
        view.meta.insert(1, ("started", str(cmd["started_at"])))
    return view


# -- audit -------------------------------------------------------------------------------------------


def audit_checks(hosts: Iterable[tuple[str, str, str | None]], findings: Sequence[dict[str, Any]],
                 ) -> list[CheckRow]:
    """Every host-scope check on every host, plus fleet findings: (host, status, unreachable reason)."""
    from k3fleet.verdict import CHECKS

    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in findings:
        by.setdefault((f.get("host") or "fleet", f["id"]), []).append(f)
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


def _row(group: str, check: str, found: list[dict[str, Any]]) -> CheckRow:
    if not found:
        return CheckRow(group, check, "pass")
    fail = [f for f in found if f.get("kind", "fail") == "fail" and f.get("severity") in ("critical", "error",
                                                                                          "fail")]
    unknown = [f for f in found if f.get("kind") == "unknown" and f.get("severity") in ("critical", "error")]
    pick = fail or unknown or found
    status: CheckStatus = "fail" if fail else "error" if unknown else "pass"
    return CheckRow(group, check, status, "; ".join(str(f.get("message", "")) for f in pick),
                    severity=str(pick[0].get("severity")), evidence=pick[0].get("evidence"))


def _audit_view(path: Path, cmd: dict[str, Any]) -> ReportView:
    from k3fleet.decide.readers import RunInfo, read_audit

    info = RunInfo(label=path.name, kind="audit", path=str(path), started_at=cmd.get("started_at"))
    a = read_audit(path, info)
    view = ReportView(kind="audit", run=path.name, title=f"k3fleet audit: {a.outcome}", outcome=a.outcome)
    run = _read(path, "run.json")
    view.exit_code = _exit_code(run.get("exit_code") if isinstance(run, dict) else None)
    view.reasons = [{"rule": "audit", "outcome": a.outcome, "text": r, "evidence": str(a.ref)} for r in a.reasons]
    view.meta += [("hosts", str(len(a.hosts))), ("GPUs healthy / required", f"{a.gpus_healthy} / {a.gpus_required}"),
                  ("strategy", a.strategy or "?")]
    _hosts_into(view, a)
    return view


def _hosts_into(view: ReportView, a: Any) -> None:
    findings = [{"id": f.id, "severity": f.severity, "kind": f.kind, "host": f.host, "message": f.message,
                 "evidence": str(f.ref)} for f in a.findings]
    for h in a.hosts:
        ids = sorted({f.id for f in a.findings if f.host == h.host and f.severity not in ("info",)})
        view.hosts.append(HostRow(h.host, h.status, h.driver_version,
                                  f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else None, ids or
                                  ([h.reason] if h.reason else [])))
    view.checks += audit_checks(((h.host, h.status, h.reason) for h in a.hosts), findings)


# -- change night ------------------------------------------------------------------------------------


def _change_view(path: Path, cmd: dict[str, Any]) -> ReportView:
    from k3fleet.decide.readers import RunInfo, read_change

    c = read_change(path, RunInfo(label=path.name, kind="change", path=str(path), started_at=cmd.get("started_at")))
    mode = "check (nothing changed)" if c.check else "change night"
    view = ReportView(kind="change", run=path.name, title=f"k3fleet change {c.change_id or ''}: {mode}".strip(),
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


def _accept_view(path: Path, cmd: dict[str, Any]) -> ReportView:
    from k3fleet.decide.readers import RunInfo, curve_points, read_accept

    acc = read_accept(path, RunInfo(label=path.name, kind="accept", path=str(path), started_at=cmd.get("started_at")))
    head = _read(path, "accept.json") if (path / "accept.json").is_file() else {}
    view = ReportView(kind="accept", run=path.name, title=f"k3fleet accept: {acc.model or '?'}",
                      exit_code=_exit_code(head.get("exit_code") if isinstance(head, dict) else None))
    view.meta += [("endpoint", acc.base_url or "?"), ("model", acc.model or "?")]
    for name in ("startup", "prefix_cache", "agent", "load"):
        probe = getattr(acc, name)
        if probe is None:
            view.checks.append(CheckRow(f"accept.{name}", name, "skipped", "probe not run: missing evidence"))
            continue
        view.checks.append(CheckRow(f"accept.{name}", name, _status(probe.status), probe.reason or "",
                                    evidence=str(probe.ref)))
        for f in probe.findings:
            st: CheckStatus = "fail" if f.severity == "fail" else "pass"
            view.checks.append(CheckRow(f"accept.{name}", f.id, st, f.message, severity=f.severity,
                                        evidence=str(f.ref)))
    if acc.agent is not None:
        for case in acc.agent.cases:
            view.checks.append(CheckRow("accept.agent.cases", case.name, "fail" if case.failures else "pass",
                                        f"{case.passed}/{case.runs} passed"
                                        + (f"; {case.defects}" if case.defects else "")))
    if acc.load is not None:
        data = _read(path, "load.json").get("data") or {}
        view.charts = load_charts(curve_points(path, data))
    return view


# Per phase: the x axis, then the charts as (title, unit, [(row key, label)]) (docs/acceptance.md, load rows).
_PHASE_X = {"long_input": ("prompt_tokens_mean", "prompt tokens"), "agent_ramp": ("concurrency", "concurrent sessions"),
            "sustained": ("t_start_s", "seconds into the run")}
_CHARTS = (
    ("latency", "seconds", (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95"), ("e2e_p50_s", "end-to-end p50"),
                            ("itl_p50_s", "inter-token p50"))),
    ("queue", "requests", (("running_max", "running (max)"), ("waiting_max", "waiting (max)"))),
    ("KV cache", "fraction used", (("kv_usage_max", "KV usage (max)"),)),
)


def load_charts(points: Sequence[dict[str, Any]]) -> list[Chart]:
    """Per load phase, latency, queue and KV-cache charts against the phase's x axis."""
    charts: list[Chart] = []
    phases: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        phases.setdefault(str(p.get("phase") or "load"), []).append(p)
    for phase, pts in phases.items():
        x_key, x_label = _PHASE_X.get(phase, ("t_start_s", "seconds into the run"))
        for title, unit, keys in _CHARTS:
            series = []
            for key, label in keys:
                xy = [(float(p[x_key]), float(p[key])) for p in pts
                      if _num(p.get(x_key)) is not None and _num(p.get(key)) is not None]
                if xy:
                    series.append(Series(label, sorted(xy)))
            if series:
                charts.append(Chart(title=f"{phase}: {title}", x_label=x_label, y_label=unit, series=series))
    return charts


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    return float(v) if isinstance(v, int | float) else None


# -- triage ------------------------------------------------------------------------------------------


def _triage_view(path: Path, cmd: dict[str, Any]) -> ReportView:
    from k3fleet.triage.record import parse_triage_record

    data = parse_triage_record(_read(path, "triage.json"), path.name)
    host = data.host or "capture"
    view = ReportView(kind="triage", run=path.name, title=f"k3fleet triage: {host} (operator-supplied)")
    view.meta += [("kinds", ", ".join(data.kinds)), ("files", str(len(data.files)))]
    for capture in data.files:
        view.notes.append(f"{capture.name}: {capture.kind}")
    for f in data.findings:
        status: CheckStatus = ("fail" if f.kind == "fail" and f.severity in ("critical", "error", "fail")
                               else "error" if f.kind == "unknown" else "pass")
        view.checks.append(CheckRow(host, f.id, status, f.message, severity=f.severity, evidence=f.file or ""))
    view.exit_code = data.exit_code
    return view


# -- decision ----------------------------------------------------------------------------------------


def _decision_view(path: Path, cmd: dict[str, Any]) -> ReportView:
    from k3fleet.decide.models import Decision, EvidenceSummary

    try:
        d = Decision.model_validate(_read(path, "decision.json"))
        s = EvidenceSummary.model_validate(_read(path, "summary.json"))
    except ValueError as exc:
        raise UsageError(f"{path}: decision.json or summary.json does not validate ({str(exc).splitlines()[0]})") \
            from exc
    return decision_view(d, s, path.name, curves=_read(path, "curves.json") if (path / "curves.json").is_file()
                         else [])


def _owner_text(entry: Any) -> str | None:
    return f"{entry.owner}, by {entry.deadline}; rollback: {entry.rollback}" if entry is not None else None


def decision_view(d: Any, s: Any, run: str, curves: Sequence[dict[str, Any]] = ()) -> ReportView:
    approval = "approved" if d.approved else "NOT approved"
    view = ReportView(kind="decision", run=run, title=f"k3fleet decision: {d.outcome} ({approval})",
                      outcome=d.outcome, approved=d.approved, exit_code=d.exit_code)
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
    view.baseline = d.baseline.model_dump(mode="json") if d.baseline is not None else None
    return view
