"""Markdown report of an audit run (written into the run directory)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from k3fleet.contracts import OUTCOME_TEXT
from k3fleet.models.findings import SEVERITY_RANK, FleetVerdict
from k3fleet.models.target import Target
from k3fleet.report.escapes import safe_markdown
from k3fleet.report.plan import plan_lines, plan_title

if TYPE_CHECKING:
    # The audit imports this module to write report.md: the type only, never at run time.
    from k3fleet.audit.run import AuditResult


def _cell(value: object) -> str:
    """A table cell: redacted, one line, no control characters, pipes and markup escaped."""
    return safe_markdown(value, cell=True)


def _text(value: object) -> str:
    return safe_markdown(value)


def render_audit(result: AuditResult, target: Target) -> str:
    v: FleetVerdict = result.verdict
    s = v.summary
    lines = [
        f"# k3fleet audit: {OUTCOME_TEXT[v.outcome]}",
        "",
        f"- Target: **{v.target}** (image `{target.image.ref}`, CUDA {target.image.cuda}, "
        f"driver R{target.driver.branch} {target.driver.target_version})",
        f"- Run: `{result.run_dir.path.name}`; Ansible {result.play.status} in {result.play.wall_s:.1f}s",
        f"- Hosts: {s.hosts} ({s.passed} pass, {s.warned} warn, {s.failed} fail, {s.unreachable} unreachable)",
        f"- GPUs: {s.gpus_healthy} healthy now, {s.gpus_after_plan} after the plan, {s.gpus_required} required",
        f"- Exit code: {result.exit_code}",
        "",
        "## Why",
        "",
        *[f"- {_text(r)}" for r in v.reasons],
        "",
    ]
    if v.unconfirmed_matrix_rows:
        lines += ["Matrix rows used that are **unconfirmed** (override them in the target if you know better): "
                  + ", ".join(v.unconfirmed_matrix_rows), ""]
    lines += ["## Hosts", "", "| host | status | driver | GPUs | top finding |", "|---|---|---|---|---|"]
    for name in sorted(v.hosts):
        h = v.hosts[name]
        top = max(h.findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
        top_text = f"`{top.check_id}` {_cell(top.message)}" if top else _cell(h.reason or "")
        gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
        lines.append(f"| {_cell(name)} | {h.status} | {_cell(h.driver_version)} | {_cell(gpus)} | {top_text} |")
    lines += ["", "## Findings", ""]
    findings = sorted(v.all_findings(), key=lambda f: (-SEVERITY_RANK[f.severity], f.check_id, f.host or ""))
    if not findings:
        lines.append("None.")
    else:
        lines += ["| severity | check | host | finding | fix |", "|---|---|---|---|---|"]
        for f in findings:
            lines.append(f"| {f.severity} | `{f.check_id}` | {_cell(f.host or 'fleet')} | {_cell(f.message)} | "
                         f"{_cell(f.fix)} |")
    lines += ["", *render_plan(v.plan.model_dump(mode="json"))]
    if result.unreachable or result.invalid:
        lines += ["", "## Hosts without evidence", ""]
        for host, why in sorted({**result.unreachable, **result.invalid}.items()):
            why = _text(why)
            lines.append(f"- {why}" if why.startswith(f"{_text(host)}: ") else f"- {_text(host)}: {why}")
    lines.append("")
    return "\n".join(lines)


def render_plan(plan: dict[str, Any]) -> list[str]:
    lines = [f"## {_text(plan_title(plan))}", "", *(f"- {_text(line)}" for line in plan_lines(plan))]
    items = plan.get("needs_upgrade") or []
    if items:
        lines += ["", "| host | from | to | packages |", "|---|---|---|---|"]
        for it in items:
            pk = ", ".join(f"{p['name'] or '(new)'} -> {p['to_name']}={p['to_version']}" for p in it["packages"])
            lines.append(f"| {_cell(it['host'])} | {_cell(it['current_version'])} | {_cell(it['target_version'])} | "
                         f"{_cell(pk)} |")
    return lines
