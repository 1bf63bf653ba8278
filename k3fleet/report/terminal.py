"""Human tables on the terminal (Rich). The run directory holds the full evidence.

Everything a node said is printed as plain text (never Rich markup) and without terminal
escapes (k3fleet.report.escapes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from k3fleet.contracts import OUTCOME_STATUS
from k3fleet.models.findings import SEVERITY_RANK, FleetVerdict
from k3fleet.report.escapes import safe_text
from k3fleet.report.plan import host_list, package_groups, plan_lines, plan_title

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "unreachable": "magenta"}
# One style per step of the severity scale (k3fleet.contracts), for every table that prints findings.
SEVERITY_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "dim"}
# An outcome printed in its report status's colour (k3fleet.contracts.OUTCOME_STATUS).
_OUTCOME_STATUS_STYLE = {"pass": "bold green", "warn": "bold yellow", "fail": "bold red", "missing": "bold magenta"}


def outcome_style(outcome: str) -> str:
    """The Rich style an outcome (the audit's or the decision's) is printed in."""
    status = OUTCOME_STATUS.get(outcome)  # type: ignore[call-overload]
    return _OUTCOME_STATUS_STYLE[status] if status else "bold"


# Rows of the attention table by default (hosts sharing status and findings are one row); --all
# prints one row per host.
_ATTENTION_ROWS = 6
_FLEET_LINES = 6


def _host_status(h: Any) -> tuple[str, str]:
    """``ok``, ``warn N``, ``failing N`` or ``unreachable``, and its style."""
    if h.status == "unreachable":
        return "unreachable", "magenta"
    bad = {f.check_id for f in h.findings if f.blocking}
    if bad:
        return f"failing {len(bad)}", "red"
    warns = {f.check_id for f in h.findings if f.severity == "warning"}
    return (f"warn {len(warns)}", "yellow") if warns else ("ok", "green")


def _ids(h: Any) -> list[str]:
    return sorted({f.check_id for f in h.findings if f.severity != "info"})


def next_command(v: FleetVerdict, run: Any) -> str:
    """The one command to run next, from the outcome and the plan."""
    run_s = safe_text(run)
    if v.outcome == "incomplete" or (v.summary.unreachable and not v.checks_failed):
        return f"reach the unreachable hosts and audit again; so far: k3fleet report {run_s} --format html"
    if v.outcome == "go_live":
        return "k3fleet accept all --base-url URL --model MODEL   (prove serving, then k3fleet decide)"
    if v.plan.canary is not None:
        return f"k3fleet plan --run {run_s}"
    if v.outcome == "expand_capacity":
        short = v.summary.gpus_required - v.summary.gpus_after_plan
        return (f"add GPU nodes ({short} more healthy GPUs needed) or fix the failing hosts, then audit again"
                if short > 0 else "fix the failing hosts, then audit again")
    return f"k3fleet report {run_s} --format html --out audit.html   (every finding with its fix)"


def print_audit(console: Console, result: Any, show_all: bool = False) -> None:
    """The summary first (outcome, hosts by status, failures per check, fleet findings, the plan,
    the next command), then the hosts that need attention (every host with ``show_all``).

    A 1,000-host audit fits one screen: counts, not rows; identical hosts are one row."""
    v: FleetVerdict = result.verdict
    s = v.summary
    run = result.run_dir.path
    style = outcome_style(v.outcome)
    console.print(Text("verdict: ").append(v.outcome, style=style).append(f" (exit {result.exit_code})"))
    warned = sum(1 for h in v.hosts.values() if _host_status(h)[0].startswith("warn"))
    failing = sum(1 for h in v.hosts.values() if _host_status(h)[0].startswith("failing"))
    ok = s.hosts - warned - failing - s.unreachable
    console.print(Text(f"{s.hosts} hosts: ").append(f"{ok} ok", style="green").append(", ")
                  .append(f"{warned} warn", style="yellow").append(", ").append(f"{failing} failing", style="red")
                  .append(", ").append(f"{s.unreachable} unreachable", style="magenta")
                  .append(f"; GPUs: {s.gpus_healthy} healthy, {s.gpus_required} required"))
    # One line per reason: the counts below and the report carry the detail.
    for r in v.reasons:
        console.print(Text(f"  - {safe_text(r)}"), no_wrap=True, overflow="ellipsis", soft_wrap=False)
    per_check: Counter[str] = Counter()
    warn_check: Counter[str] = Counter()
    for h in v.hosts.values():
        per_check.update({f.check_id for f in h.findings if f.blocking})
        warn_check.update({f.check_id for f in h.findings if f.severity == "warning"} - {
            f.check_id for f in h.findings if f.blocking})
    for title, counts, colour in (("failing checks (hosts)", per_check, "red"),
                                  ("warnings (hosts)", warn_check, "yellow")):
        if not counts:
            continue
        console.print(Text(title + ":", style="bold"))
        grid = Table.grid(padding=(0, 1))
        # Most hosts first, ties by check id: the same fleet prints the same summary every run (the
        # counts come from sets, whose order changes with the interpreter's string hashing).
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        cells = [Text(f"{n:>5} ", style=colour).append(safe_text(cid)) for cid, n in ranked]
        cols = max(1, min(4, (console.width - 1) // (max(len(c) for c in cells) + 1)))
        for _ in range(cols):
            grid.add_column(no_wrap=True)
        for i in range(0, len(cells), cols):
            grid.add_row(*cells[i:i + cols])
        console.print(grid)
    fleet = sorted(v.fleet_findings, key=lambda f: -SEVERITY_RANK[f.severity])
    for f in fleet[:_FLEET_LINES]:
        line = Text(f"{f.severity:<8}", style=SEVERITY_STYLE[f.severity])
        line.append(f" {f.check_id}: {safe_text(f.message)}")
        console.print(line)
    if len(fleet) > _FLEET_LINES:
        console.print(f"  ({len(fleet) - _FLEET_LINES} more fleet findings in the report)", markup=False)
    print_plan(console, v.plan.model_dump(mode="json"), brief=True)
    console.print(Text("next: ", style="bold").append(next_command(v, run)))
    _print_hosts(console, v, show_all)


def _print_hosts(console: Console, v: FleetVerdict, show_all: bool) -> None:
    names = sorted(v.hosts)
    rows: list[tuple[list[str], str, str, str, str, list[str]]] = []
    if show_all:
        for n in names:
            h = v.hosts[n]
            st, sty = _host_status(h)
            gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
            rows.append(([n], st, sty, h.driver_version or "", gpus, _ids(h) or ([h.reason] if h.reason else [])))
    else:
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        style: dict[tuple[str, tuple[str, ...]], str] = {}
        for n in names:
            h = v.hosts[n]
            st, sty = _host_status(h)
            if st == "ok":
                continue
            key: tuple[str, tuple[str, ...]] = (st, tuple(_ids(h)) if h.status != "unreachable" else ())
            groups.setdefault(key, []).append(n)
            style[key] = sty
        order = sorted(groups.items(), key=lambda kv: (not kv[0][0].startswith("failing"),
                                                       kv[0][0] != "unreachable", -len(kv[1]), kv[1][0]))
        for (st, ids), hosts in order:
            h = v.hosts[hosts[0]]
            gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
            rows.append((hosts, st, style[(st, ids)], h.driver_version or "", gpus,
                         [*ids] or ([h.reason] if h.reason and len(hosts) == 1 else [])))
    if not rows:
        return
    shown = rows if show_all else rows[:_ATTENTION_ROWS]
    table = Table(title="Hosts" if show_all else "Hosts that need attention", expand=False, title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("host" if show_all else "hosts", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("driver", no_wrap=True)
    if show_all:
        table.add_column("GPUs")
    # Check ids wrap whole, never cut ("fabricmanager.version_match").
    table.add_column("findings", overflow="fold", ratio=1)
    for hosts, st, sty, drv, gpus, found in shown:
        who = hosts[0] if len(hosts) == 1 else f"{hosts[0]} +{len(hosts) - 1}"
        cells = [Text(safe_text(who)), Text(st, style=sty), Text(safe_text(drv))]
        if show_all:
            cells.append(Text(safe_text(gpus)))
        cells.append(Text(safe_text(", ".join(found))))
        table.add_row(*cells)
    console.print(table)
    if len(shown) < len(rows):
        more = sum(len(r[0]) for r in rows[len(shown):])
        console.print(f"  {len(rows) - len(shown)} more row(s), {more} host(s): --all lists every host", markup=False)


def print_plan(console: Console, plan: dict[str, Any], brief: bool = False) -> None:
    """The plan; ``brief``: one line of counts and the canary (the audit summary). Otherwise every
    line, host lists cut at 12 names, then the package transactions grouped by hosts."""
    if brief:
        waves = plan.get("waves") or []
        canary = plan.get("canary")
        parts = [f"canary {canary['host']}" if canary else "no canary",
                 f"{len(waves)} wave(s) (up to {max((len(w) for w in waves), default=0)})",
                 f"{len(plan.get('done') or [])} done", f"{len(plan.get('blocked') or [])} blocked",
                 f"{len(plan.get('unreachable') or [])} unreachable"]
        console.print(Text(f"{plan_title(plan)}: ", style="bold").append(safe_text(", ".join(parts))))
        return
    console.print(safe_text(plan_title(plan)), style="bold", markup=False)
    for line in plan_lines(plan, limit=12):
        console.print(f"  {safe_text(line)}", markup=False)
    groups = package_groups(plan)
    if groups:
        console.print("Package transactions", style="bold", markup=False)
        for tx, hosts in groups:
            console.print(f"  {safe_text(host_list(hosts, 12))} ({len(hosts)}):", markup=False)
            _scope, _, pkgs = tx.partition(": ")
            for pkg in pkgs.split(", "):
                console.print(f"    {safe_text(pkg)}", markup=False)
