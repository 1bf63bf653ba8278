"""Markdown of a report view: the decision's report.md and ``k3fleet report --format md``."""

from __future__ import annotations

from k3fleet.report.escapes import safe_markdown
from k3fleet.report.view import ReportView

_STATUS = {"pass": "pass", "fail": "**FAIL**", "missing": "**MISSING**", "error": "**ERROR**", "skipped": "skipped"}


def _cell(value: object) -> str:
    """A table cell: redacted, one line, no control characters, pipes and markup escaped."""
    return safe_markdown(value, cell=True)


def _text(value: object) -> str:
    """A value in a heading or a list item: as a cell, pipes kept."""
    return safe_markdown(value)


def _code(value: object, cell: bool = False) -> str:
    """A value inside a code span."""
    return safe_markdown(value, cell=cell, code=True)


def render_markdown(view: ReportView) -> str:
    lines = [f"# {_text(view.title)}", ""]
    lines += [f"- {_text(k)}: {_text(v)}" for k, v in view.meta]
    if view.exit_code is not None:
        lines.append(f"- exit code: {view.exit_code}")
    lines.append("")
    if view.reasons:
        lines += ["## Why", ""]
        for r in view.reasons:
            tag = f"`{_code(r['rule'])}` -> {_text(r['outcome'])}" + (
                f" ({_text(r['approval'])})" if r.get("approval") else "")
            ev = f" \\[{_text(r['evidence'])}\\]" if r.get("evidence") else ""
            lines.append(f"- {tag}: {_text(r['text'])}{ev}")
        lines.append("")
    if view.limits:
        lines += ["## Limits", "", "| limit | value | owner | what |", "|---|---|---|---|"]
        lines += [f"| {_cell(lim['kind'])} | {_cell(lim['value'])} | {_cell(lim.get('owner') or '')} | "
                  f"{_cell(lim['text'])} |" for lim in view.limits]
        lines.append("")
    if view.checklist:
        lines += ["## Sign-off checklist", "", "| item | status | detail | evidence | owner |",
                  "|---|---|---|---|---|"]
        for i in view.checklist:
            title = i["title"] + (" (custom build)" if i.get("track") == "custom" else "")
            lines.append(f"| {_cell(title)} | {_STATUS.get(i['status'], _cell(i['status']))} | {_cell(i['detail'])} | "
                         f"{_cell(i.get('evidence'))} | {_cell(i.get('owner') or '')} |")
        lines.append("")
    if view.hosts:
        lines += ["## Hosts", "", "| host | status | driver | GPUs | findings |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(h.host)} | {_cell(h.status)} | {_cell(h.driver)} | {_cell(h.gpus)} | "
                  f"{_cell(', '.join(h.findings))} |" for h in view.hosts]
        lines.append("")
    problems = [c for c in view.checks if c.status != "pass" and c.group != "checklist"]
    if problems:
        lines += ["## Checks not passed", "", "| where | check | status | message |", "|---|---|---|---|"]
        lines += [f"| {_cell(c.group)} | `{_code(c.check, cell=True)}` | {_STATUS.get(c.status, _cell(c.status))} | "
                  f"{_cell(c.message)} |" for c in problems]
        lines.append("")
    if view.timeline:
        lines += ["## Change-night timeline", "", "| time | host | stage | detail |", "|---|---|---|---|"]
        lines += [f"| {_cell(t.ts or '(check)')} | {_cell(t.host)} | {_cell(t.stage)} | {_cell(t.detail)} |"
                  for t in view.timeline]
        lines.append("")
    for chart in view.charts:
        lines += [f"## {_text(chart.title)}", "", f"| series | points ({_cell(chart.x_label)}, value) |", "|---|---|"]
        lines += [f"| {_cell(s.label)} | {_cell(', '.join(f'({x:g}, {y:g})' for x, y in s.points))} |"
                  for s in chart.series]
        lines.append("")
    if view.baseline:
        lines += ["## Accepted baseline (serving rollback artifact)", ""]
        lines += [f"- {_text(k)}: `{_code(v)}`" for k, v in view.baseline.items() if v not in (None, {}, [])
                  and k != "evidence"]
        lines.append("")
    if view.notes:
        lines += ["## Notes", "", *(f"- {_text(n)}" for n in view.notes), ""]
    return "\n".join(lines)
