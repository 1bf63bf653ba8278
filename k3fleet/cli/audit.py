"""`k3fleet audit`, `plan`, `checks` and `schema`: the read-only side of the fleet."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from k3fleet.bounds import seconds_option, whole_seconds_option
from k3fleet.cli.base import app, err, out
from k3fleet.cli.progress import ProgressObserver, cancel_on_interrupt
from k3fleet.errors import UsageError, validation_line
from k3fleet.report.escapes import safe_markup


@app.command()
def audit(
    inventory: Annotated[Path | None, typer.Option("-i", "--inventory",
                                                   help="Ansible inventory (with --lab: a lab fleet spec).")] = None,
    lab: Annotated[bool, typer.Option("--lab", help="Audit the simulated lab fleet.")] = False,
    lab_count: Annotated[int | None, typer.Option("--lab-count", min=1,
                                                  help="Scale the lab fleet to N hosts.")] = None,
    limit: Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern.")] = None,
    forks: Annotated[int, typer.Option("--forks", "-f", min=1, max=500, help="Hosts Ansible works on at once.")] = 20,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    probe: Annotated[bool, typer.Option("--probe", help="Run the serving image on each node (CUDA init).")] = False,
    active: Annotated[str, typer.Option(
        "--active", metavar="LEVEL",
        help="Active checks: none, quick (dcgmi diag -r 1 and the probe's matmul) or full (also dcgmi -r 3, "
             "all_reduce_perf, ib_write_bw per rail); never on nodes whose GPUs are in use.")] = "none",
    host_timeout: Annotated[int, typer.Option("--host-timeout", parser=whole_seconds_option(
        "--host-timeout", "audit --host-timeout"), help="Seconds per host (1 to 86400).")] = 300,
    command_timeout: Annotated[float, typer.Option("--command-timeout", parser=seconds_option(
        "--command-timeout", "audit --command-timeout"), help="Seconds per command on a node (0.1 to 3600).")] = 20.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar on stderr.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="List every host, not only those that need attention.")
                        ] = False,
    no_host_key_checking: Annotated[bool, typer.Option(
        "--no-host-key-checking",
        help="Connect without checking SSH host keys (recorded in command.json; see docs/safety.md).")] = False,
    health_evidence: Annotated[list[str] | None, typer.Option(
        "--health-evidence", metavar="HOST=FILE",
        help="Another tool's health output for HOST, judged with the audit's check ids: gpud's /v1/states or "
             "/v1/events JSON, or dcgmi health -c -j (repeatable).")] = None,
) -> None:
    """Audit every node against the target and print the verdict and change plan."""
    from k3fleet.audit.run import ACTIVE_LEVELS, AuditOptions, run_audit
    from k3fleet.evidence import redact
    from k3fleet.report import terminal

    if active not in ACTIVE_LEVELS:
        raise UsageError(f"--active {active!r}: choose one of {', '.join(ACTIVE_LEVELS)}")
    if inventory is None and not lab:
        raise UsageError("give an inventory with -i INVENTORY, or --lab for the simulated fleet")
    opts = AuditOptions(inventory=inventory, lab=lab, lab_count=lab_count, limit=limit, forks=forks,
                        target=target, out=out_dir, runs_dir=runs_dir, probe=probe, active=active,
                        host_timeout=host_timeout,
                        command_timeout=command_timeout, host_key_checking=not no_host_key_checking,
                        health_evidence=_health_evidence(health_evidence or []))
    observer = ProgressObserver(err, quiet=quiet or as_json)
    cancel = cancel_on_interrupt(err, "stopping the play, writing the evidence gathered so far")
    result = run_audit(opts, sys.argv, observer=observer, cancel=cancel)
    if as_json:
        # What stdout shows passes the evidence's redactor: terminals end up in CI logs.
        out.print_json(json.dumps(redact(result.verdict.model_dump(mode="json"))))
    else:
        terminal.print_audit(out, result, show_all=show_all)
    err.print(f"run directory: {result.run_dir.path}", markup=False)
    if result.play.interrupted:
        err.print("[yellow]interrupted: evidence is incomplete[/yellow]")
    raise typer.Exit(result.exit_code)


def _health_evidence(values: list[str]) -> dict[str, list[Path]]:
    """--health-evidence HOST=FILE values, by host; one line and exit 2 for one that is not HOST=FILE."""
    out_: dict[str, list[Path]] = {}
    for value in values:
        host, sep, path = value.partition("=")
        if not sep or not host.strip() or not path.strip():
            raise UsageError(f"--health-evidence {value!r}: give HOST=FILE (the host's gpud states or events "
                             "JSON, or dcgmi health -c -j output)")
        out_.setdefault(host.strip(), []).append(Path(path.strip()))
    return out_


@app.command()
def plan(
    run: Annotated[Path, typer.Option("--run", help="An audit run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Every host name and every blocked host's reasons "
                                                         "(host lists are cut at 12 names otherwise).")] = False,
) -> None:
    """Print the change plan of an audit run: hosts to upgrade, canary, waves (verified first)."""
    from k3fleet.report import terminal
    from k3fleet.report.escapes import safe_text

    plan_data = read_audit_plan(run)
    if as_json:
        from k3fleet.evidence import redact

        out.print_json(json.dumps(redact(plan_data)))
    else:
        terminal.print_plan(out, plan_data, show_all=show_all)
        if not show_all and _plan_is_cut(plan_data, 12):
            out.print(f"(host lists cut at 12 names: k3fleet plan --run {safe_text(str(run))} --all lists every "
                      "host)", markup=False)
        if plan_data.get("canary"):
            out.print("next: k3fleet upgrade -i INVENTORY --change-id ID --operator YOU --check   (the night as a dry "
                      "run: per host the drain and the package transaction)", markup=False)


def _plan_is_cut(plan: dict[str, Any], limit: int) -> bool:
    """Whether the terminal's plan cut a host list (what --all would show whole)."""
    from k3fleet.report.plan import package_groups

    lists = [*(plan.get("waves") or []), plan.get("done") or [], plan.get("unreachable") or [],
             *(hosts for _tx, hosts in package_groups(plan))]
    return any(len(x) > limit for x in lists) or len(plan.get("blocked") or []) > limit


def read_audit_plan(run: Path) -> dict[str, Any]:
    """The change plan of a finished, intact audit run, or one line saying why there is none.

    Exit 3 when the evidence cannot be trusted or is incomplete (manifest missing or not
    matching, the audit interrupted, no host measured); exit 2 when it is not an audit run or
    its verdict is not a k3fleet verdict.
    """
    from pydantic import ValidationError

    from k3fleet.errors import IncompleteError
    from k3fleet.evidence import COMMAND, RunDir, layout, verify_run
    from k3fleet.evidence.reader import RunReader
    from k3fleet.models.evidence import RunRecord
    from k3fleet.models.findings import FleetVerdict

    rd = RunDir.open(run)
    verify_run(rd.path).raise_if_bad()
    reader = RunReader(rd.path, label=str(run))
    kind = reader.kind
    if kind != "audit":
        gate = run / layout.gate_audit_dir()
        hint = f" (its gating audit is {gate})" if (gate / COMMAND).is_file() else ""
        raise UsageError(f"{run} is a {kind!r} run, not an audit{hint}")
    if reader.model(layout.RUN, RunRecord).interrupted:
        raise IncompleteError(f"the audit in {run} was interrupted: its plan covers only the hosts that answered; "
                              "run the audit again")
    data = reader.object(layout.VERDICT)
    try:
        verdict = FleetVerdict.model_validate(data)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, f"{run}/{layout.VERDICT} is not a k3fleet verdict")) from None
    if verdict.outcome == "incomplete":
        raise IncompleteError(f"the audit in {run} measured no host: {'; '.join(verdict.reasons[:1])}")
    return verdict.plan.model_dump(mode="json")


@app.command()
def checks(
    ids: Annotated[list[str] | None, typer.Argument(help="Check ids to explain (e.g. driver.branch); a group "
                                                         "such as 'gpu' or 'gpu.*' names all of its checks.")] = None,
    target: Annotated[Path | None, typer.Option("--target", help="Render fixes for this target.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The catalogue as JSON.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="The catalogue as a Markdown table.")] = False,
) -> None:
    """List every check id with its scope, severity, why it matters and its fix; with ids, explain those."""
    from k3fleet.report.escapes import safe_text
    from k3fleet.targets import load_target
    from k3fleet.verdict import catalogue_markdown, catalogue_rows

    tgt = load_target(target)
    if markdown:
        out.print(catalogue_markdown(tgt), markup=False)
        return
    rows = catalogue_rows(tgt)
    if ids:
        picked: list[dict[str, str]] = []
        for wanted in ids:
            group = wanted.removesuffix(".*")
            found = [r for r in rows if r["id"] == wanted or r["id"].startswith(group + ".")]
            if not found:
                import difflib

                near = difflib.get_close_matches(wanted, [r["id"] for r in rows], n=3)
                hint = f" (did you mean {', '.join(near)}?)" if near else " (k3fleet checks lists them all)"
                raise UsageError(f"no check {wanted!r}{hint}")
            picked += [r for r in found if r not in picked]
        rows = picked
    if as_json:
        out.print_json(json.dumps(rows))
        return
    if ids:
        for row in rows:
            out.print(f"[bold]{safe_markup(row['id'])}[/bold] ({row['scope']}, {row['severity']}): "
                      f"{safe_markup(row['title'])}")
            for key in ("why", "fix", "source"):
                if row.get(key):
                    out.print(f"  {key}: {safe_text(row[key])}", markup=False)
        return
    from k3fleet.report.terminal import whole_column

    table = Table(title="k3fleet checks (k3fleet checks ID explains one)", show_lines=True)
    whole_column(table, "id", (row.get("id", "") for row in rows))
    table.add_column("scope / severity", no_wrap=True)
    table.add_column("why", ratio=1, overflow="fold")
    table.add_column("fix", ratio=1, overflow="fold")
    for row in rows:
        table.add_row(row.get("id", ""), f"{row.get('scope', '')}\n{row.get('severity', '')}", row.get("why", ""),
                      row.get("fix", ""))
    out.print(table)


@app.command()
def schema(what: Annotated[str, typer.Argument(help="facts, verdict or profile")] = "facts") -> None:
    """Print a JSON Schema (host facts, verdict, or the production profile of --profile)."""
    from k3fleet.models.facts import host_facts_json_schema

    if what == "facts":
        out.print_json(json.dumps(host_facts_json_schema()))
    elif what == "verdict":
        from k3fleet.models.findings import fleet_verdict_json_schema

        out.print_json(json.dumps(fleet_verdict_json_schema()))
    elif what == "profile":
        from k3fleet.models.profile import profile_json_schema

        out.print_json(json.dumps(profile_json_schema()))
    else:
        raise UsageError(f"unknown schema {what!r}: choose facts, verdict or profile")
