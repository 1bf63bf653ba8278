"""`k3fleet accept`: serving acceptance probes against a running vLLM endpoint.

Commands: ``startup`` (a start-up log), ``prefix-cache``, ``prefix-lint``, ``agent``, ``all``; ``load``
registers itself on ``accept_app`` from its own module. Exit codes as the audit's (docs/acceptance.md).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from k3fleet.accept.result import ProbeResult
from k3fleet.cli.app import app, out

accept_app = typer.Typer(help="Serving acceptance: start-up log, prefix cache, agent tool calls, load.",
                         no_args_is_help=True)
app.add_typer(accept_app, name="accept")

_STATUS_STYLE = {"pass": "green", "fail": "red", "inconclusive": "yellow", "error": "red", "skipped": "dim"}
_SEVERITY_STYLE = {"fail": "red", "warn": "yellow", "info": "dim"}


def print_result(result: ProbeResult, *, as_json: bool, lines: list[str] | None = None) -> None:
    """One probe's result: JSON on stdout for machines, or a status line, the facts and the findings."""
    if as_json:
        out.print_json(json.dumps(result.model_dump(mode="json")))
        return
    style = _STATUS_STYLE.get(result.status, "")
    out.print(f"[bold]{result.probe}[/bold]: [{style}]{result.status.upper()}[/{style}]  {result.reason}",
              markup=True)
    for line in lines or []:
        out.print(f"  {line}", markup=False)
    if result.findings:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("severity")
        table.add_column("id")
        table.add_column("layer")
        table.add_column("finding", overflow="fold")
        for f in result.findings:
            sev = _SEVERITY_STYLE.get(f.severity, "")
            table.add_row(f"[{sev}]{f.severity}[/{sev}]", f.id, f.layer or "", f.message)
        out.print(table)


@accept_app.command("startup")
def startup(
    log: Annotated[Path, typer.Option("--log", help="vLLM start-up log (container or journal output).")],
    launch_command: Annotated[Path | None, typer.Option(
        "--launch-command", help="File with the launch command (vllm serve ... or docker run ...).")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")] = False,
) -> None:
    """Read a vLLM start-up log: versions, parallel layout, caching, parsers, and start-up failures."""
    from k3fleet.accept.startup import run_startup, summary_lines
    from k3fleet.targets import load_target

    result = run_startup(log, launch_command, target=load_target(target))
    print_result(result, as_json=as_json, lines=list(summary_lines(result)))
    raise typer.Exit(result.exit_code)


# `accept load` lives in its own module (another owner); it hangs itself on accept_app when present.
if importlib.util.find_spec("k3fleet.cli.accept_load") is not None:
    importlib.import_module("k3fleet.cli.accept_load")
