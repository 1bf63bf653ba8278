"""Markdown report of an audit run (written into the run directory)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from k3fleet.contracts import OUTCOME_TEXT
from k3fleet.models.findings import SEVERITY_RANK, FleetVerdict
from k3fleet.models.target import Target
from k3fleet.report.escapes import safe_markdown
from k3fleet.report.plan import package_groups, plan_lines, plan_title

if TYPE_CHECKING:
    # The audit imports this module to write report.md: the type only, never at run time.
    from k3fleet.audit.run import AuditResult


# report.md lists every host of a fleet up to this many; a larger fleet gets one row per group of hosts
# that share what the row says (status, driver, GPUs, top finding; a finding's check and fix; a plan's
# versions and packages), with the group's size and its first hosts. verdict.json keeps every host
# (docs/scale.md "Merging 100,000 hosts": a row per host made report.md 12 MB at 10,000 hosts).
HOST_ROWS = 500
_EXAMPLES = 3


def _examples(hosts: list[str]) -> str:
    """The group's first hosts, and how many more (names redacted and escaped as cells)."""
    shown = ", ".join(_cell(h) for h in hosts[:_EXAMPLES])
    return shown + (f" and {len(hosts) - _EXAMPLES} more" if len(hosts) > _EXAMPLES else "")


K = TypeVar("K")
T = TypeVar("T")


def _grouped(rows: Iterable[tuple[K, T]]) -> list[tuple[K, list[T]]]:
    """(key, item) pairs as (key, items) groups, in the order each key was first seen."""
    groups: dict[K, list[T]] = {}
    for key, item in rows:
        groups.setdefault(key, []).append(item)
    return list(groups.items())


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
    lines += ["## Hosts", ""]
    names = sorted(v.hosts)
    grouped = len(names) > HOST_ROWS
    rows = []
    for name in names:
        h = v.hosts[name]
        top = max(h.findings, key=lambda f: SEVERITY_RANK[f.severity], default=None)
        gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
        rows.append(((h.status, h.driver_version, gpus, top.check_id if top else h.reason or ""), name, top))

    def top_text(name: str, top: Any) -> str:
        return f"`{top.check_id}` {_cell(top.message)}" if top else _cell(v.hosts[name].reason or "")

    if grouped:
        lines += [f"{len(names)} hosts in groups that share status, driver, GPUs and top finding (the first "
                  "host's message); verdict.json lists every host.", "",
                  "| hosts | status | driver | GPUs | top finding | for example |", "|---|---|---|---|---|---|"]
        for (status, driver, gpus, _), members in _grouped((k, (n, top)) for k, n, top in rows):
            lines.append(f"| {len(members)} | {status} | {_cell(driver)} | {_cell(gpus)} | {top_text(*members[0])} | "
                         f"{_examples([n for n, _ in members])} |")
    else:
        lines += ["| host | status | driver | GPUs | top finding |", "|---|---|---|---|---|"]
        for (status, driver, gpus, _), name, top in rows:
            lines.append(f"| {_cell(name)} | {status} | {_cell(driver)} | {_cell(gpus)} | {top_text(name, top)} |")
    del rows
    lines += ["", "## Findings", ""]
    findings = sorted(v.all_findings(), key=lambda f: (-SEVERITY_RANK[f.severity], f.check_id, f.host or ""))
    if not findings:
        lines.append("None.")
    elif grouped:
        lines += ["Hosts' findings in groups that share severity, check and fix (the first host's message).", "",
                  "| severity | check | hosts | finding | fix |", "|---|---|---|---|---|"]
        for (severity, check, fix, fleet), same in _grouped(
                ((f.severity, f.check_id, f.fix, f.host is None), f) for f in findings):
            where = "fleet" if fleet else f"{len(same)}: {_examples([f.host or 'fleet' for f in same])}"
            lines.append(f"| {severity} | `{check}` | {where} | {_cell(same[0].message)} | {_cell(fix)} |")
    else:
        lines += ["| severity | check | host | finding | fix |", "|---|---|---|---|---|"]
        for f in findings:
            lines.append(f"| {f.severity} | `{f.check_id}` | {_cell(f.host or 'fleet')} | {_cell(f.message)} | "
                         f"{_cell(f.fix)} |")
    lines += ["", *render_plan(v.plan.model_dump(mode="json"), grouped=grouped)]
    if result.unreachable or result.invalid:
        lines += ["", "## Hosts without evidence", ""]
        without = sorted({**result.unreachable, **result.invalid}.items())
        if grouped:
            # Grouped by the reason with the host's own name taken out of it.
            for reason, hosts in _grouped((_text(why).removeprefix(f"{_text(host)}: "), host) for host, why in without):
                lines.append(f"- {len(hosts)} hosts ({_examples(hosts)}): {reason}")
        else:
            for host, why in without:
                why = _text(why)
                lines.append(f"- {why}" if why.startswith(f"{_text(host)}: ") else f"- {_text(host)}: {why}")
    lines.append("")
    return "\n".join(lines)


def render_plan(plan: dict[str, Any], *, grouped: bool = False) -> list[str]:
    """The plan's sentences and its package table; ``grouped`` (a fleet over HOST_ROWS): the sentences name
    at most a few hosts each and the table has a row per package transaction, not per host."""
    limit = _EXAMPLES if grouped else None
    lines = [f"## {_text(plan_title(plan))}", "", *(f"- {_text(line)}" for line in plan_lines(plan, limit=limit))]
    items = plan.get("needs_upgrade") or []
    if grouped and items:
        lines += ["", "| hosts | package transaction |", "|---|---|"]
        for transaction, hosts in package_groups(plan):
            lines.append(f"| {len(hosts)}: {_examples(hosts)} | {_cell(transaction)} |")
    elif items:
        lines += ["", "| host | from | to | packages |", "|---|---|---|---|"]
        for it in items:
            pk = ", ".join(f"{p['name'] or '(new)'} -> {p['to_name']}={p['to_version']}" for p in it["packages"])
            lines.append(f"| {_cell(it['host'])} | {_cell(it['current_version'])} | {_cell(it['target_version'])} | "
                         f"{_cell(pk)} |")
    return lines
