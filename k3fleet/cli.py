"""The `k3fleet` command line.

Exit codes: 0 pass / go, 1 checks failed / no-go, 2 usage or bad input,
3 hosts unreachable or evidence incomplete. Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from k3fleet import __version__
from k3fleet.errors import EXIT_INCOMPLETE, EXIT_USAGE, K3FleetError, UsageError
from k3fleet.interrupt import cancel_on_signals
from k3fleet.runner import HostOutcome, Observer, PlayResult

app = typer.Typer(
    name="k3fleet",
    help="Audit a GPU fleet for Kimi K3 on vLLM, run the R575 -> R580 change night, roll back, decide.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
lab_app = typer.Typer(help="The simulated lab fleet and the real testbed.", no_args_is_help=True)
testbed_app = typer.Typer(help="The real testbed: SSH into booted systemd guests (root).", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
lab_app.add_typer(testbed_app, name="testbed")

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


class ProgressObserver(Observer):
    """One line per host on stderr as hosts finish."""

    _STYLE = {"ok": "green", "failed": "red", "unreachable": "magenta", "timeout": "magenta",
              "skipped": "dim", "ignored": "yellow"}

    def __init__(self, console: Console, total: int | None = None, quiet: bool = False) -> None:
        self.console = console
        self.total = total
        self.done = 0
        self.quiet = quiet

    def play_started(self, playbook: str, hosts: int | None) -> None:
        self.total = hosts or self.total
        if not self.quiet:
            n = f" on {self.total} hosts" if self.total else ""
            self.console.print(f"[bold]running {playbook}{n}[/bold]")

    def host_done(self, outcome: HostOutcome) -> None:
        self.done += 1
        if self.quiet:
            return
        style = self._STYLE.get(outcome.status, "white")
        count = f"[{self.done}/{self.total}] " if self.total else ""
        msg = f" {outcome.message}" if outcome.message and outcome.status != "ok" else ""
        self.console.print(f"{count}[{style}]{outcome.status:<11}[/{style}] {outcome.host}{msg}")

    def play_finished(self, result: PlayResult) -> None:
        if not self.quiet:
            self.console.print(f"{result.playbook}: {result.status} in {result.wall_s:.1f}s")


def _cancel_on_sigint() -> threading.Event:
    """First Ctrl-C asks ansible-runner to stop cleanly; evidence gathered so far is still written."""
    return cancel_on_signals(lambda: err.print(
        "[yellow]interrupt: stopping the play, writing the evidence gathered so far[/yellow]"))


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit(0)


@app.command()
def audit(
    inventory: Annotated[Path | None, typer.Option("-i", "--inventory",
                                                   help="Ansible inventory (with --lab: a lab fleet spec).")] = None,
    lab: Annotated[bool, typer.Option("--lab", help="Audit the simulated lab fleet.")] = False,
    lab_count: Annotated[int | None, typer.Option("--lab-count", min=1,
                                                  help="Scale the lab fleet to N hosts.")] = None,
    limit: Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern.")] = None,
    forks: Annotated[int, typer.Option("--forks", "-f", min=1, max=500)] = 20,
    target: Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdict as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    probe: Annotated[bool, typer.Option("--probe", help="Run the serving image on each node (CUDA init).")] = False,
    host_timeout: Annotated[int, typer.Option("--host-timeout", min=1, help="Seconds per host.")] = 300,
    command_timeout: Annotated[float, typer.Option("--command-timeout", min=0.1,
                                                   help="Seconds per command on a node.")] = 20.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-host progress.")] = False,
) -> None:
    """Audit every node against the target and print the verdict and change plan."""
    from k3fleet.audit import AuditOptions, run_audit
    from k3fleet.report import terminal

    if inventory is None and not lab:
        raise UsageError("give an inventory with -i INVENTORY, or --lab for the simulated fleet")
    opts = AuditOptions(inventory=inventory, lab=lab, lab_count=lab_count, limit=limit, forks=forks,
                        target=target, out=out_dir, runs_dir=runs_dir, probe=probe, host_timeout=host_timeout,
                        command_timeout=command_timeout)
    observer = ProgressObserver(err, quiet=quiet or as_json)
    result = run_audit(opts, sys.argv, observer=observer, cancel=_cancel_on_sigint())
    if as_json:
        out.print_json(json.dumps(result.verdict.model_dump(mode="json")))
    else:
        terminal.print_audit(out, result)
    err.print(f"run directory: {result.run_dir.path}")
    if result.play.interrupted:
        err.print("[yellow]interrupted: evidence is incomplete[/yellow]")
    raise typer.Exit(result.exit_code)


@app.command()
def plan(
    run: Annotated[Path, typer.Option("--run", help="An audit run directory.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print the change plan of an audit run: hosts to upgrade, canary, waves."""
    from k3fleet.evidence import RunDir
    from k3fleet.report import terminal

    rd = RunDir.open(run)
    verdict = rd.read_json("verdict.json")
    plan_data = verdict.get("plan")
    if plan_data is None:
        raise UsageError(f"{run}/verdict.json has no change plan")
    if as_json:
        out.print_json(json.dumps(plan_data))
    else:
        terminal.print_plan(out, plan_data)


@app.command()
def checks(
    target: Annotated[Path | None, typer.Option("--target", help="Render fixes for this target.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="The catalogue as a Markdown table.")] = False,
) -> None:
    """List every check id with its scope, severity, title and fix."""
    from k3fleet.targets import load_target
    from k3fleet.verdict import catalogue_markdown, catalogue_rows

    tgt = load_target(target)
    if markdown:
        out.print(catalogue_markdown(tgt), markup=False)
        return
    rows = catalogue_rows(tgt)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table(title="k3fleet checks")
    for col in ("id", "scope", "severity", "title"):
        table.add_column(col)
    for row in rows:
        table.add_row(row.get("id", ""), row.get("scope", ""), row.get("severity", ""), row.get("title", ""))
    out.print(table)


@app.command()
def schema(what: Annotated[str, typer.Argument(help="facts or verdict")] = "facts") -> None:
    """Print a JSON Schema (host facts or verdict)."""
    from k3fleet.models.facts import host_facts_json_schema

    if what == "facts":
        out.print_json(json.dumps(host_facts_json_schema()))
    elif what == "verdict":
        from k3fleet.models.findings import fleet_verdict_json_schema

        out.print_json(json.dumps(fleet_verdict_json_schema()))
    else:
        raise UsageError(f"unknown schema {what!r}: choose facts or verdict")


def _register_change_commands() -> None:
    from k3fleet import change_cli

    change_cli.register(app)


_register_change_commands()


@lab_app.command("generate")
def lab_generate(
    dest: Annotated[Path, typer.Argument(help="Directory to write host roots and inventory.yml into.")],
    fleet: Annotated[Path | None, typer.Option("--fleet", help="Fleet spec (default: packaged lab).")] = None,
    count: Annotated[int | None, typer.Option("--count", min=1)] = None,
) -> None:
    """Generate the simulated lab fleet and print its inventory path."""
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    out.print(str(generate_fleet(load_fleet(fleet), dest, count=count)))


@testbed_app.command("up")
def testbed_up(
    hosts: Annotated[int, typer.Option("--hosts", "-n", min=1, max=32)] = 4,
    workdir: Annotated[Path, typer.Option("--workdir")] = Path(".testbed"),
) -> None:
    """Bring up the real testbed (root)."""
    from k3fleet.lab import testbed

    state = testbed.up(n=hosts, workdir=workdir)
    out.print(str(getattr(state, "inventory", workdir / "inventory.yml")))


@testbed_app.command("down")
def testbed_down(workdir: Annotated[Path, typer.Option("--workdir")] = Path(".testbed")) -> None:
    """Tear the testbed down: no process, namespace, mount or veth left."""
    from k3fleet.lab import testbed

    testbed.down(workdir)


@testbed_app.command("status")
def testbed_status(workdir: Annotated[Path, typer.Option("--workdir")] = Path(".testbed")) -> None:
    """Show the testbed's hosts and processes."""
    from k3fleet.lab import testbed

    state = testbed.status(workdir)
    data = state.model_dump(mode="json") if hasattr(state, "model_dump") else state.__dict__
    out.print_json(json.dumps(data, default=str))


def _input_errors() -> tuple[type[Exception], ...]:
    """Bad-input exceptions of the target loader and the lab, which speak in one line already."""
    from k3fleet.lab.fleet import LabFleetError, LabProfileError
    from k3fleet.targets import TargetError

    return (TargetError, LabProfileError, LabFleetError)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure is one line on stderr and a documented exit code."""
    try:
        rc = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        err.print("k3fleet: aborted")
        return EXIT_INCOMPLETE
    except typer.TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            err.print(exc.format_message(), markup=False)
        else:
            err.print(f"k3fleet: error: {exc.format_message()}", markup=False)
        return EXIT_USAGE
    except K3FleetError as exc:
        err.print(f"k3fleet: error: {exc}", markup=False)
        return exc.exit_code
    except _input_errors() as exc:
        err.print(f"k3fleet: error: {exc}", markup=False)
        return EXIT_USAGE
    except ValidationError as exc:
        err.print(f"k3fleet: error: invalid input ({exc.error_count()} problem(s))", markup=False)
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(root)"
            err.print(f"  {loc}: {e['msg']}", markup=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("k3fleet: interrupted")
        return EXIT_INCOMPLETE
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
