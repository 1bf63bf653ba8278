"""Human tables on the terminal (Rich). The run directory holds the full evidence.

Everything a node said is printed as plain text (never Rich markup) and without terminal
escapes (k3fleet.report.escapes).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from k3fleet.contracts import OUTCOME_STATUS
from k3fleet.models.findings import SEVERITY_RANK, FleetVerdict, HostVerdict
from k3fleet.report.escapes import safe_text
from k3fleet.report.plan import host_list, package_groups, plan_lines, plan_title

if TYPE_CHECKING:
    # The audit's CLI prints through this module: the type only, never at run time.
    from k3fleet.audit.merge import MergeResult
    from k3fleet.audit.run import AuditResult

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "unreachable": "magenta"}
# One style per step of the severity scale (k3fleet.contracts), for every table that prints findings.
SEVERITY_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "dim"}
# An outcome printed in its report status's colour (k3fleet.contracts.OUTCOME_STATUS).
_OUTCOME_STATUS_STYLE = {"pass": "bold green", "warn": "bold yellow", "fail": "bold red", "missing": "bold magenta"}


def whole_column(table: Table, header: str, values: Any, **kw: Any) -> None:
    """A column of names that are looked up (check ids, file names, probe names): never cut with an
    ellipsis, never folded mid-name; the other columns wrap around it."""
    width = max([len(header), *(len(str(v)) for v in values)])
    table.add_column(header, no_wrap=True, min_width=width, overflow="fold", **kw)


def wrapped(text: str, width: int, first: str = "  - ", rest: str = "    ") -> str:
    """``text`` wrapped at ``width`` with a hanging indent, words (and ids) whole."""
    import textwrap

    return textwrap.fill(text, width=max(width, 40), initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def outcome_style(outcome: str) -> str:
    """The Rich style an outcome (the audit's or the decision's) is printed in."""
    status = OUTCOME_STATUS.get(outcome)  # type: ignore[call-overload]
    return _OUTCOME_STATUS_STYLE[status] if status else "bold"


# Rows of the attention table by default (hosts sharing status and findings are one row); --all
# prints one row per host.
_ATTENTION_ROWS = 6
# The audit's summary and its host table fit one screen of this many lines (at any width).
_SCREEN_LINES = 40
_FLEET_LINES = 6


def _host_status(h: HostVerdict) -> tuple[str, str]:
    """``ok``, ``warn N``, ``failing N`` or ``unreachable``, and its style."""
    if h.status == "unreachable":
        return "unreachable", "magenta"
    bad = {f.check_id for f in h.findings if f.blocking}
    if bad:
        return f"failing {len(bad)}", "red"
    warns = {f.check_id for f in h.findings if f.severity == "warning"}
    return (f"warn {len(warns)}", "yellow") if warns else ("ok", "green")


def _ids(h: HostVerdict) -> list[str]:
    return sorted({f.check_id for f in h.findings if f.severity != "info"})


def next_command(v: FleetVerdict, run: object) -> str:
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


def print_audit(console: Console, result: AuditResult | MergeResult, show_all: bool = False) -> None:
    """The summary first (outcome, hosts by status, failures per check, fleet findings, the plan,
    the next command), then the hosts that need attention (every host with ``show_all``).

    A 1,000-host audit fits one screen: counts, not rows; identical hosts are one row."""
    # The summary is measured at the console's width first (a few dozen short lines: cheap), so the
    # host table gets the lines the screen has left.
    import io

    measure = Console(width=console.width, file=io.StringIO(), color_system=None, soft_wrap=False)
    _print_summary(measure, result)
    used = measure.file.getvalue().count("\n")  # type: ignore[attr-defined]
    _print_summary(console, result)
    _print_hosts(console, result.verdict, show_all, budget=_SCREEN_LINES - used)


def _print_summary(console: Console, result: Any) -> None:
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
    # Each reason whole, wrapped with a hanging indent: a cut reason (or a cut check id) cannot be
    # looked up; the counts below and the report carry the detail.
    for r in v.reasons:
        console.print(Text(wrapped(safe_text(r), console.width - 1)), soft_wrap=False)
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


def _print_hosts(console: Console, v: FleetVerdict, show_all: bool, budget: int = 10**9) -> None:
    """The hosts that need attention, in the lines ``budget`` leaves (every host with ``show_all``);
    the rows left out are counted, and the unreachable or blocked hosts among them named."""
    blocked = {b.host for b in v.plan.blocked}
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
        # Unreachable hosts first, then those the plan blocks (fix before the night), then the other
        # failing ones, then warnings: the first rows are the ones the 3 a.m. reader must act on, never
        # behind "N more row(s)".
        def rank(kv: tuple[tuple[str, tuple[str, ...]], list[str]]) -> tuple[int, int, str]:
            (st, _), hosts = kv
            tier = (0 if st == "unreachable" else 1 if blocked.intersection(hosts)
                    else 2 if st.startswith("failing") else 3)
            return tier, -len(hosts), hosts[0]

        order = sorted(groups.items(), key=rank)
        for (st, ids), hosts in order:
            h = v.hosts[hosts[0]]
            gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
            rows.append((hosts, st, style[(st, ids)], h.driver_version or "", gpus,
                         [*ids] or ([h.reason] if h.reason and len(hosts) == 1 else [])))
    if not rows:
        return
    if show_all:
        console.print(_hosts_table(rows, show_all))
        return
    # As many rows as the screen has lines for (at least the first), at most _ATTENTION_ROWS; one line
    # is kept for the "more" line.
    shown = rows[:1]
    table = _hosts_table(shown, show_all)
    for count in range(2, min(len(rows), _ATTENTION_ROWS) + 1):
        bigger = _hosts_table(rows[:count], show_all)
        if len(console.render_lines(bigger, console.options, pad=False)) > budget - 2:
            break
        shown, table = rows[:count], bigger
    console.print(table)
    if len(shown) < len(rows):
        rest = rows[len(shown):]
        more = sum(len(r[0]) for r in rest)
        urgent = [(f"{r[0][0]} +{len(r[0]) - 1}" if len(r[0]) > 1 else r[0][0]) for r in rest
                  if r[1] == "unreachable" or blocked.intersection(r[0])]
        named = f"; unreachable or blocked: {', '.join(urgent)}" if urgent else ""
        console.print(f"  {len(rest)} more row(s), {more} host(s){named} (--all lists every host)", markup=False)


def _hosts_table(shown: list[tuple[list[str], str, str, str, str, list[str]]], show_all: bool) -> Table:
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
    return table


def print_plan(console: Console, plan: dict[str, Any], brief: bool = False, show_all: bool = False) -> None:
    """The plan; ``brief``: one line of counts and the canary (the audit summary). Otherwise every
    line, host lists cut at 12 names (``show_all``: every name, every blocked host's reasons), then
    the package transactions grouped by hosts."""
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
    limit = None if show_all else 12
    lines = plan_lines(plan, limit=limit)
    for line in lines:
        console.print(f"  {safe_text(line)}", markup=False)
    groups = package_groups(plan)
    if groups:
        console.print("Package transactions", style="bold", markup=False)
        for tx, hosts in groups:
            console.print(f"  {safe_text(host_list(hosts, limit))} ({len(hosts)}):", markup=False)
            _scope, _, pkgs = tx.partition(": ")
            for pkg in pkgs.split(", "):
                console.print(f"    {safe_text(pkg)}", markup=False)
