"""`k3fleet verify` (a run directory against its manifest, docs/safety.md "Verify") and `k3fleet prune` (old run
directories out, the evidence of accepted decisions kept: docs/safety.md "Evidence privacy")."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import app, err, out
from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_OK


@app.command()
def verify(
    run: Annotated[Path, typer.Argument(help="A run directory (runs/<id>).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Check a run directory against its manifest: missing, changed or extra files exit 3."""
    from k3fleet.evidence import verify_run

    report = verify_run(run)
    if as_json:
        out.print_json(json.dumps({**report.model_dump(mode="json"), "ok": report.ok}))
    else:
        for line in report.problems:
            out.print(line, markup=False)
    err.print(report.summary(), markup=False)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_INCOMPLETE)


@app.command()
def prune(
    older_than: Annotated[str, typer.Option("--older-than", help="Remove run directories older than this (30d, "
                                                                 "12h; at most 3650d).")],
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    keep_cited_by: Annotated[list[Path] | None, typer.Option(
        "--keep-cited-by", help="An accepted decision's run directory outside --runs-dir: the runs it cites are "
                                "kept too (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
) -> None:
    """Remove old run directories, never one an accepted decision cites; say what was removed and kept, and why."""
    import datetime as _dt

    from k3fleet.bounds import parse_seconds
    from k3fleet.errors import UsageError
    from k3fleet.evidence import layout
    from k3fleet.evidence.prune import REMOVE, apply_prune, plan_prune
    from k3fleet.report.escapes import safe_text

    limit = parse_seconds(older_than, "--older-than", "prune --older-than")
    for d in keep_cited_by or []:
        if not (d / layout.DECISION).is_file():
            raise UsageError(f"--keep-cited-by {d}: not a decision run directory (no {layout.DECISION})")
    plan = plan_prune(runs_dir, limit, _dt.datetime.now(_dt.UTC), keep_cited_by or [])
    verb = "would remove" if dry_run else "removed"
    problems = {} if dry_run else apply_prune(plan)
    for v in plan:
        kind = f" ({v.kind})" if v.kind else ""
        if v.action == REMOVE and v.path not in problems:
            out.print(f"{verb} {safe_text(v.path)}{kind}: {v.why}", markup=False)
        elif v.action != REMOVE:
            out.print(f"kept {safe_text(v.path)}{kind}: {safe_text(v.why)}", markup=False)
    for path, why in problems.items():
        err.print(f"could not remove {safe_text(path)}: {safe_text(why)}", markup=False)
    held = [v for v in plan if v.held]
    for v in held:
        # An old run prune may not remove as asked (a mount inside it): left untouched, and not a success.
        err.print(f"left {safe_text(v.path)} untouched: {safe_text(v.why)}", markup=False)
    removed = sum(1 for v in plan if v.action == REMOVE) - len(problems)
    err.print(f"{removed} run director{'y' if removed == 1 else 'ies'} {verb}, "
              f"{sum(1 for v in plan if v.action != REMOVE)} kept", markup=False)
    raise typer.Exit(EXIT_INCOMPLETE if problems or held else EXIT_OK)
