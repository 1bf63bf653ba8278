"""Markdown of a report view: the decision's report.md and ``k3fleet report --format md``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from k3fleet.report.escapes import safe_markdown
from k3fleet.report.plan import host_list, package_groups, plan_lines, plan_title
from k3fleet.report.view import FindingRow, ReportView, plain_value

_STATUS = {"pass": "pass", "fail": "**FAIL**", "missing": "**MISSING**", "error": "**ERROR**", "skipped": "skipped",
           "warn": "*warn*"}
# Host names in one findings cell: the rest are counted (verdict.json names every host).
_HOSTS_PER_CELL = 40


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
    if view.next_step:
        lines += [f"**Do this next:** {_text(view.next_step)}", ""]
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
    if view.probes:
        lines += ["## Acceptance probes", ""]
        for p in view.probes:
            lines.append(f"- **{_text(p.name)}**: {_STATUS.get(p.status, _text(p.status))}"
                         + (f": {_text(p.reason)}" if p.reason else ""))
            lines += [f"  - {_text(k)}: {_text(v)}" for k, v in p.figures]
        lines.append("")
    if view.findings:
        lines += findings_markdown(view.findings)
    if view.plan:
        lines += plan_markdown(view.plan)
    if view.hosts:
        attention = [h for h in view.hosts if h.status != "pass"]
        passed = len(view.hosts) - len(attention)
        lines += ["## Hosts", "", f"{len(view.hosts)} hosts: {passed} pass, "
                  + ", ".join(f"{n} {st}" for st, n in _counts(h.status for h in attention)) + "."
                  if attention else f"{len(view.hosts)} hosts, all pass.", ""]
        if attention:
            lines += ["| host | status | driver | GPUs | findings |", "|---|---|---|---|---|"]
            lines += [f"| {_cell(h.host)} | {_cell(h.status)} | {_cell(h.driver)} | {_cell(h.gpus)} | "
                      f"{_cell(', '.join(h.findings))} |" for h in attention]
            lines.append("")
    problems = [] if view.findings else view.folded_problems()
    if problems:
        lines += ["## Checks not passed", "", "| where | check | status | message |", "|---|---|---|---|"]
        lines += [f"| {_cell(c.group)} | `{_code(c.check, cell=True)}` | {_STATUS.get(c.status, _cell(c.status))} | "
                  f"{_cell(c.message)} |" for c, _ in problems]
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
        lines += [f"- {_text(k)}: `{_code(plain_value(v))}`" for k, v in view.baseline.items()
                  if v not in (None, {}, [])
                  and k != "evidence"]
        lines.append("")
    if view.notes:
        lines += ["## Notes", "", *(f"- {_text(n)}" for n in view.notes), ""]
    return "\n".join(lines)


def _counts(statuses: Iterable[str]) -> list[tuple[str, int]]:
    return sorted(Counter(statuses).items(), key=lambda kv: (-kv[1], kv[0]))


def findings_markdown(rows: list[FindingRow]) -> list[str]:
    """Every finding with its fix, identical ones on several hosts folded into one row."""
    lines = ["## Findings and fixes", "", "| status | check | hosts | finding | fix |", "|---|---|---|---|---|"]
    for r in rows:
        hosts = (f"{len(r.hosts)}: " if len(r.hosts) > 1 else "") + host_list(r.hosts, _HOSTS_PER_CELL)
        status = f"{_STATUS.get(r.status, _cell(r.status))} ({_cell(r.severity)})"
        lines.append(f"| {status} | `{_code(r.check, cell=True)}` | {_cell(hosts)} | {_cell(r.message)} | "
                     f"{_cell(r.fix or '')} |")
    lines.append("")
    return lines


def plan_markdown(plan: dict[str, Any]) -> list[str]:
    """The change plan: canary, waves, blocked hosts, and each package transaction with its hosts."""
    lines = [f"## {_text(plan_title(plan))}", "", *(f"- {_text(line)}" for line in plan_lines(plan))]
    groups = package_groups(plan)
    if groups:
        lines += ["", "| hosts | package transaction |", "|---|---|"]
        lines += [f"| {_cell(f'{len(h)}: ' if len(h) > 1 else '')}{_cell(', '.join(h))} | {_cell(tx)} |"
                  for tx, h in groups]
    lines.append("")
    return lines
