"""`k3fleet upgrade` and `k3fleet rollback`: the change night, its resume, and the rollback.

Both commands register themselves on the main Typer app when this module is imported. Progress (one line per stage
transition of each host) goes to stderr; the result table, the ``--check`` plan or ``--json``
to stdout. Exit codes: 0 every host done, 1 a host failed (and was rolled back), 2 bad input,
3 interrupted or unreachable (resume or roll back).
"""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from k3fleet.bounds import whole_seconds_option
from k3fleet.cli.base import app, err, out
from k3fleet.cli.progress import ProgressObserver, cancel_on_interrupt
from k3fleet.errors import UsageError
from k3fleet.report.escapes import safe_markup, safe_text

_OUTCOME_STYLE = {"upgraded": "green", "rolled_back": "yellow", "failed": "red", "in_progress": "magenta",
                  "not_started": "dim", "skipped": "dim", "checked": "green", "not_finished": "magenta",
                  "held": "yellow", "refused": "red"}
_WHAT_NEXT = "stopping the play; resume with --resume RUN or roll back with --run RUN"

# The options both commands take, spelled once.
Inventory = Annotated[Path, typer.Option("-i", "--inventory", help="Ansible inventory of the fleet.")]
Forks = Annotated[int, typer.Option("--forks", "-f", min=1, max=500, help="Hosts Ansible works on at once.")]
DrainTimeout = Annotated[int | None, typer.Option(
    "--drain-timeout", parser=whole_seconds_option("--drain-timeout", "--drain-timeout"),
    help="Seconds to wait for running jobs (default: the target's; at most 7 days).")]
ForceDrain = Annotated[bool, typer.Option("--force-drain", help="Cancel jobs still running after the drain timeout.")]
TargetFile = Annotated[Path | None, typer.Option("--target", help="Target file (default: Kimi K3).")]
NoHostKeyChecking = Annotated[bool, typer.Option(
    "--no-host-key-checking",
    help="Connect without checking SSH host keys (recorded in command.json; see docs/safety.md).")]
OutDir = Annotated[Path | None, typer.Option("--out", help="Run directory to write.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")]


def night_switch(flag: str, does: str, also: str = "") -> Any:
    """--FLAG/--no-FLAG for a safeguard of the night that is on unless turned off. Not given, it is None, so
    --resume keeps what the night was started with; turning it off is recorded and warned about."""
    return typer.Option(f"--{flag}/--no-{flag}", help=f"{does} (default: on; --resume: as the night was started"
                                                      f"{also}). --no-{flag} is recorded and warned about.")


def _fmt_s(value: Any) -> str:
    return f"{float(value):.0f}s" if isinstance(value, int | float) else ""


def _batches(change: dict[str, Any]) -> dict[str, str]:
    """Each host's batch: the canary, or its wave."""
    batch_of = {change["canary"]: "canary"} if change.get("canary") else {}
    for i, wave in enumerate(change.get("waves") or [], 1):
        for h in wave:
            batch_of.setdefault(h, f"wave {i}")
    return batch_of


def print_change(console: Console, result: Any) -> None:
    change = result.change
    # The change id, versions and operator are given on the command line: text, never markup.
    table = Table(title=f"change {safe_markup(change['change_id'])}: R{safe_markup(change.get('target_branch', ''))} "
                        f"{safe_markup(change['target_version'])} ({safe_markup(change['operator'])})")
    for col in ("host", "batch", "outcome", "last stage", "wall", "k3fleet", "note"):
        table.add_column(col)
    batch_of = _batches(change)
    for host, h in result.hosts.items():
        outcome = str(h.get("outcome"))
        style = _OUTCOME_STYLE.get(outcome, "white")
        timing = h.get("timing") or {}
        share = timing.get("tool_share")
        note = h.get("failure") or ""
        table.add_row(escape(safe_text(host)), batch_of.get(host, ""), f"[{style}]{outcome}[/{style}]",
                      escape(str(h.get("stage") or "")), _fmt_s(timing.get("wall_s")),
                      f"{share:.0%}" if isinstance(share, float) else "", escape(safe_text(note)))
    console.print(table)
    for problem in result.problems:
        console.print(f"  journal: {safe_text(problem)}", markup=False)
    _print_smoke(console, change)


def _print_smoke(console: Console, change: dict[str, Any], when: str = "") -> None:
    """The night's serving smoke choice, one line (the launch file's path is the operator's: text), and
    its rollback kit choice."""
    from k3fleet.change.kit import describe as describe_kit
    from k3fleet.change.smoke import describe

    line = describe(change)
    if line is not None:
        console.print(line + when, markup=False)
    kit = describe_kit(change)
    if kit is not None:
        console.print(kit, markup=False)


def preflight_lines(pre: dict[str, Any]) -> list[str]:
    """What the night's preflight read on a host (docs/change-night.md "Preflight"), as the check shows it."""
    if not pre:
        return []
    holders = pre.get("holders")
    kinds = [h.get("kind") for h in holders or []]
    held = ("unreadable" if holders is None else
            ", ".join(f"{kinds.count(k)} {k}" for k in ("job", "service", "other") if kinds.count(k)) or "none")
    disk = ", ".join(f"{d.get('path')} {d.get('available_mb')} MB" for d in pre.get("disk") or [])
    repo = pre.get("repository") or {}
    missing = repo.get("missing") or []
    toolkit = pre.get("toolkit") or {}
    versions = ("not offered: " + ", ".join("=".join(m) for m in missing)) if missing else "offered"
    headers = "present" if (pre.get("headers") or {}).get("present") else "missing"
    kernel = f"{pre.get('kernel') or '?'}" + (f" (DKMS: headers {headers})" if pre.get("dkms") else "")
    lines = [f"  preflight {'blocked' if pre.get('problems') else 'ok'}: GPU holders {held}; MIG "
             f"{'instances' if pre.get('mig') else 'none'}; free {disk or 'unknown'}",
             f"            target versions {versions}; kernel {kernel}; container toolkit "
             f"{toolkit.get('version') or 'not installed'}"]
    lines += [f"            [{p.get('check')}] {p.get('found')}" for p in pre.get("problems") or []]
    return [safe_text(line) for line in lines]


def verify_lines(change: dict[str, Any], host: str) -> list[str]:
    """The verify steps the night would run on ``host`` after its reboot (docs/change-night.md "Verify steps")."""
    plan = change.get("verify") or {}
    if not plan:
        return []
    mine = (plan.get("hosts") or {}).get(host) or {}
    probe = "on" if mine.get("probe_skip") is None else f"skipped, {mine['probe_skip']}"
    floor = mine.get("nccl_min_busbw_gbs")
    nccl = (f"floor {floor:g} GB/s for {mine.get('gpu_model')}" if floor is not None
            else f"no floor for {mine.get('gpu_model') or 'this GPU'}")
    lines = [f"  verify   container CUDA probe {probe}; all_reduce_perf within the node where installed ({nccl}); "
             "IMEX where installed"]
    pair = plan.get("canary_pair") or {}
    if host == change.get("canary") and pair:
        if not pair.get("needed"):
            what = f"not needed: {pair.get('reason')}"
        elif pair.get("run"):
            what = f"with {pair.get('peer')} before any wave ({pair.get('reason')})"
        else:
            what = f"{'skipped' if pair.get('accepted') else 'would fail the canary'}: {pair.get('reason')}"
        lines.append(f"           NCCL pair test {what}")
    return [safe_text(line) for line in lines]


def print_check(console: Console, result: Any) -> None:
    """Per host: the drain and the package transaction the night would run."""
    change = result.change
    console.print(f"[bold]check[/bold] change {safe_markup(change['change_id'])} -> "
                  f"{safe_markup(change['target_version'])}: nothing was changed")
    batch_of = _batches(change)
    for host, rep in result.check.items():
        console.print(f"[bold]{escape(safe_text(host))}[/bold] ({batch_of.get(host, '?')})")
        if "error" in rep:
            console.print(f"  cannot plan: {safe_text(rep['error'])}", markup=False)
            continue
        if rep.get("noop"):
            console.print(f"  nothing to do: {safe_text(rep.get('why'))}", markup=False)
            continue
        for line in preflight_lines(rep.get("preflight") or {}):
            console.print(line, markup=False)
        for line in verify_lines(change, host):
            console.print(line, markup=False)
        drain = rep.get("drain") or {}
        actions = drain.get("actions") or [f"{drain.get('backend', '?')}: {drain.get('decision', '?')}"]
        console.print(f"  drain   ({drain.get('backend', '?')}): "
                      + "\n           ".join(safe_text(a) for a in actions), markup=False)
        plan = rep.get("plan") or {}
        for key in ("remove", "unhold", "install", "hold"):
            if plan.get(key):
                console.print(f"  {key:<8} " + " ".join(safe_text(p) for p in plan[key]), markup=False)
        console.print(f"  reboot   {'yes, loaded ' + str(plan.get('loaded_version')) if plan.get('reboot') else 'no'}",
                      markup=False)
        kit = rep.get("rollback_kit") or {}
        if kit.get("path"):
            fetched = kit.get("fetched") or []
            console.print(f"  rollback kit {safe_text(kit['path'])}: "
                          + (f"{len(fetched)} package(s) to fetch" if fetched else "complete"), markup=False)
            for line in fetched:
                console.print(f"    {safe_text(line)}", markup=False)
        elif kit.get("why"):
            console.print(f"  rollback kit: none, {safe_text(kit['why'])}", markup=False)
        lines = rep.get("transaction") or []
        if lines:
            console.print("  package transaction:")
            for line in lines:
                console.print(f"    {safe_text(line)}", markup=False)
    _print_smoke(console, change, " (after each host's verification; not started in --check)")


@app.command("upgrade")
def upgrade(
    change_id: Annotated[str, typer.Option("--change-id", help="Change id; goes into drain reasons and the journal.")],
    operator: Annotated[str, typer.Option("--operator", help="Who runs the change.")],
    inventory: Annotated[Path | None, typer.Option("-i", "--inventory", help="Ansible inventory of the fleet "
                                                   "(required but with --continue).")] = None,
    canary: Annotated[str | None, typer.Option("--canary", help="Canary host (default: the audit's choice).")] = None,
    waves: Annotated[bool, typer.Option("--waves", help="Continue with the waves after a good canary.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Print per host the drain and package transaction; "
                                                        "change nothing.")] = False,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue an interrupted run (its directory).")
                      ] = None,
    target_version: Annotated[str | None, typer.Option("--target-version",
                                                       help="Exact driver version (default: the audit plan's).")
                              ] = None,
    limit: Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern for the audit.")] = None,
    forks: Forks = 20,
    failure_budget: Annotated[int, typer.Option("--failure-budget", min=0,
                                                help="Failed hosts tolerated before further drains stop.")] = 0,
    max_unavailable: Annotated[str | None, typer.Option(
        "--max-unavailable", help="Most nodes this change has out of service at any moment: a number, or a "
                                  "percentage of the audited fleet like 10% (default: the largest wave).")] = None,
    drain_timeout: DrainTimeout = None,
    force: ForceDrain = False,
    audit_max_age: Annotated[int | None, typer.Option(
        "--audit-max-age", parser=whole_seconds_option("--audit-max-age", "--audit-max-age"),
        help="Seconds an audit stays fresh for the gate (default: the target's; at most 30 days).")] = None,
    target: TargetFile = None,
    accept_finding: Annotated[list[str] | None, typer.Option(
        "--accept-finding", help="Check id (or pattern like 'rdma.*') that does not stop the driver change; it must "
                                 "name known checks and match a finding of the audit; repeat it. Recorded in the "
                                 "run directory.")] = None,
    smoke: Annotated[bool | None, night_switch(
        "smoke", "After each host's verification, start the target's image with the serve command, wait until it "
                 "is ready and send one chat request; a failure rolls the host back", "; never in --check")] = None,
    launch_file: Annotated[Path | None, typer.Option(
        "--launch-file", help="File with the command the smoke runs inside the image (vllm serve MODEL ...) instead "
                              "of the audit's serve command.")] = None,
    pause_after: Annotated[str | None, typer.Option(
        "--pause-after", help="canary, each-host or wave: no host is drained past that point until the operator "
                              "continues (Enter on a terminal; else k3fleet upgrade --continue RUN, or touch the "
                              "file the pause names).")] = None,
    pause_timeout: Annotated[int, typer.Option(
        "--pause-timeout", parser=whole_seconds_option("--pause-timeout", "--pause-timeout"),
        help="Seconds a pause waits; then the next host stops before its drain and the night can be resumed "
             "(default 3600).")] = 3600,
    continue_run: Annotated[Path | None, typer.Option(
        "--continue", help="Continue a night paused by --pause-after (its run directory); needs --change-id and "
                           "--operator, recorded.")] = None,
    textfile: Annotated[Path | None, typer.Option(
        "--textfile", help="A *.prom file in node_exporter's textfile directory: the night's gauges (hosts by "
                           "stage, failures and budget left, the current wave), replaced atomically at every "
                           "stage.")] = None,
    rollback_kit: Annotated[bool | None, night_switch(
        "rollback-kit", "Before each host's first change, fetch the exact driver packages it runs onto the node "
                        "with their sha256, so a rollback works when the repository no longer offers them; a host "
                        "whose kit cannot be made is not changed")] = None,
    no_host_key_checking: NoHostKeyChecking = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    out_dir: OutDir = None,
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Run the change night: canary, then (with --waves) the waves; or --resume an interrupted one."""
    from k3fleet.change import UpgradeOptions, run_upgrade

    if resume is not None and (canary is not None or target_version is not None or max_unavailable is not None):
        raise UsageError("--resume continues a run as it was planned: drop --canary, --target-version and "
                         "--max-unavailable")
    from k3fleet.lab import changelab

    if continue_run is not None:
        from k3fleet.change.lease import validate_change_id, validate_operator
        from k3fleet.change.pause import continue_run as do_continue

        validate_change_id(change_id)
        points = do_continue(runs_dir, continue_run, validate_operator(operator))
        err.print(f"continued {continue_run.name} ({', '.join(points)}) as {operator}", markup=False)
        return
    if inventory is None:
        raise UsageError("Missing option '-i' / '--inventory'.")
    opts = UpgradeOptions(inventory=inventory, change_id=change_id, operator=operator, canary=canary, waves=waves,
                          check=check, resume=resume, target_version=target_version, limit=limit,
                          forks=forks, failure_budget=failure_budget, max_unavailable=max_unavailable,
                          drain_timeout=drain_timeout, force=force, audit_max_age=audit_max_age, target=target,
                          accept_findings=list(accept_finding or []), host_key_checking=not no_host_key_checking,
                          runs_dir=runs_dir, out=out_dir, smoke=smoke, launch_file=launch_file,
                          textfile=textfile, pause_after=pause_after, pause_timeout=pause_timeout,
                          say=lambda text: err.print(text, markup=False), rollback_kit=rollback_kit)
    lab = changelab.lab_source(inventory) if resume is None else None
    if lab is not None and not check:
        raise UsageError(f"{inventory} is the simulated lab fleet: a change there would run apt on this machine; "
                         "rehearse the night on it with --check (README \"Rehearse the night\")")
    if lab is not None:
        # The rehearsal: the lab made plannable (a private apt state, the hosts' replayed scheduler).
        with changelab.rehearsing(inventory) as rehearsal:
            opts.inventory = rehearsal.inventory
            opts.canary = opts.canary or rehearsal.canary
            if not quiet and not as_json:
                err.print(f"rehearsal on the lab fleet {inventory}: canary {opts.canary}, packages from a private apt "
                          "state over the stand-in driver repository, the scheduler as the lab replays it",
                          markup=False)
            result = _run(run_upgrade, opts, quiet=quiet or as_json)
    else:
        result = _run(run_upgrade, opts, quiet=quiet or as_json)
    if as_json:
        _print_json(result, change=result.change, hosts=result.hosts, check=result.check, skipped=result.skipped,
                    warnings=result.warnings)
    elif check:
        print_check(out, result)
    else:
        print_change(out, result)
    for warning in result.warnings:
        err.print(f"warning: {warning}", markup=False)
    _finish(result)


def _run(run: Callable[..., Any], opts: Any, *, quiet: bool) -> Any:
    """The change night or the rollback, with stage progress on stderr and Ctrl-C as a clean stop."""
    return run(opts, sys.argv, observer=ProgressObserver(err, quiet=quiet, stages=True),
               cancel=cancel_on_interrupt(err, _WHAT_NEXT))


def _print_json(result: Any, **fields: Any) -> None:
    """The result as one JSON document: its run directory, exit code and message, ``fields``, the journal's problems."""
    out.print_json(json.dumps({"run_dir": str(result.run_dir.path), "exit_code": result.exit_code,
                               "message": result.message, **fields, "journal_problems": result.problems},
                              default=str))


def _finish(result: Any) -> None:
    """The result's one line and its run directory on stderr, then its exit code."""
    err.print(result.message, markup=False)
    err.print(f"run directory: {result.run_dir.path}")
    raise typer.Exit(result.exit_code)


@app.command("rollback")
def rollback(
    inventory: Inventory,
    limit: Annotated[str | None, typer.Option("--limit", "-l", help="Hosts to roll back (their latest change).")
                     ] = None,
    run: Annotated[Path | None, typer.Option("--run", help="Roll back every host a change run touched.")] = None,
    operator: Annotated[str | None, typer.Option("--operator", help="Who runs the rollback.")] = None,
    forks: Forks = 20,
    serial: Annotated[str, typer.Option("--serial", help="Hosts at a time (a number or a percentage).")] = "100%",
    drain_timeout: DrainTimeout = None,
    force: ForceDrain = False,
    check: Annotated[bool, typer.Option("--check", help="Say what would be restored; change nothing.")] = False,
    target: TargetFile = None,
    no_host_key_checking: NoHostKeyChecking = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories are.")] = Path("runs"),
    out_dir: OutDir = None,
    as_json: AsJson = False,
    quiet: Quiet = False,
) -> None:
    """Roll hosts back to their journal snapshot: one host (--limit) or a whole run (--run)."""
    from k3fleet.change import RollbackOptions, run_rollback

    if run is None and limit is None:
        raise UsageError("say what to roll back: --run RUN (a whole night) or --limit HOSTS (their latest change)")
    if not re.match(r"^([1-9][0-9]*|[1-9][0-9]?%|100%)$", serial):
        raise UsageError(f"--serial {serial!r}: a number of hosts or a percentage like 25%")
    opts = RollbackOptions(inventory=inventory, limit=limit, run=run, operator=operator, forks=forks, serial=serial,
                           drain_timeout=drain_timeout, force=force, check=check, target=target,
                           host_key_checking=not no_host_key_checking, runs_dir=runs_dir, out=out_dir)
    result = _run(run_rollback, opts, quiet=quiet or as_json)
    if as_json:
        _print_json(result, hosts=result.hosts, skipped=result.skipped, refused=result.refused, sources=result.sources)
    else:
        table = Table(title="rollback")
        for col in ("host", "outcome", "stages", "packages from", "back in service", "from", "note"):
            table.add_column(col)
        for host, h in result.hosts.items():
            style = _OUTCOME_STYLE.get(h["outcome"], "white")
            table.add_row(escape(safe_text(host)), f"[{style}]{h['outcome']}[/{style}]", " ".join(h["stages"]),
                          escape(safe_text(h.get("source") or "")), "yes" if h.get("returned_to_service") else "no",
                          escape(Path(h["from"]).parent.name), escape(safe_text(h.get("failure") or "")))
        out.print(table)
        for host, h in result.hosts.items():
            if h.get("source"):
                out.print(f"  {safe_text(host)}: packages from the {h['source']} ({safe_text(h.get('source_why'))})",
                          markup=False)
        for host, why in result.skipped.items():
            out.print(f"  not rolled back {host}: {safe_text(why)}", markup=False)
        for host, why in result.refused.items():
            out.print(f"  refused {host}: {safe_text(why)}", markup=False)
    for problem in result.problems:
        err.print(f"journal: {safe_text(problem)}", markup=False)
    _finish(result)
