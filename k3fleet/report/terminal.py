"""Human tables on the terminal (Rich). The run directory holds the full evidence.

Everything a node said is printed as plain text (never Rich markup) and without terminal
escapes (k3fleet.report.escapes).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from k3fleet.models.findings import SEVERITY_RANK, FleetVerdict
from k3fleet.report.escapes import safe_text
from k3fleet.report.plan import plan_lines, plan_title

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "unreachable": "magenta"}
_SEV_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "dim"}
_OUTCOME_STYLE = {"go_live": "bold green", "observe_with_limits": "bold yellow",
                  "rebuild_environment": "bold red", "expand_capacity": "bold magenta", "incomplete": "bold magenta"}


def print_audit(console: Console, result: Any) -> None:
    v: FleetVerdict = result.verdict
    table = Table(title="Hosts", show_lines=False, expand=False)
    for col in ("host", "status", "driver", "GPUs", "findings"):
        table.add_column(col)
    for name in sorted(v.hosts):
        h = v.hosts[name]
        style = _STATUS_STYLE.get(h.status, "white")
        ids = sorted({f.check_id for f in h.findings if f.severity != "info"},
                     key=lambda c: c)
        detail = ", ".join(ids) if ids else (h.reason or "")
        gpus = f"{h.gpu_count}x {h.gpu_model}" if h.gpu_count else ""
        table.add_row(Text(safe_text(name)), Text(h.status, style=style), Text(safe_text(h.driver_version)),
                      Text(safe_text(gpus)), Text(safe_text(detail)))
    console.print(table)
    fleet = sorted(v.fleet_findings, key=lambda f: -SEVERITY_RANK[f.severity])
    for f in fleet:
        line = Text(f"{f.severity:<8}", style=_SEV_STYLE[f.severity])
        line.append(f" {f.check_id}: {safe_text(f.message)}")
        console.print(line)
    print_plan(console, v.plan.model_dump(mode="json"))
    style = _OUTCOME_STYLE.get(v.outcome, "bold")
    console.print(Text("verdict: ").append(v.outcome, style=style).append(f" (exit {result.exit_code})"))
    for r in v.reasons:
        console.print(f"  - {safe_text(r)}", markup=False)


def print_plan(console: Console, plan: dict[str, Any]) -> None:
    console.print(safe_text(plan_title(plan)), style="bold", markup=False)
    for line in plan_lines(plan):
        console.print(f"  {safe_text(line)}", markup=False)
