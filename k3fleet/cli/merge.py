"""`k3fleet merge RUN...`: audit slices (run directories, ansible-runner artifacts) into one verdict."""

# lazy: a command imports its flow inside its function, so the CLI's start-up and the other commands
# do not load it (k3fleet/cli/base.py COMMAND_OWNERS).
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import app, err, out


@app.command()
def merge(
    runs: Annotated[list[Path], typer.Argument(
        help="Audit run directories, ansible-runner artifact directories, or AWX job artifact JSON files.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the merged verdict as JSON on stdout.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory to write.")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    target: Annotated[Path | None, typer.Option("--target", help="Judge by this target (default: the slices').")]
    = None,
) -> None:
    """Merge audit slices into one run directory with one verdict over the whole fleet.

    Each run directory is verified against its manifest first (a tampered or unfinished slice
    is refused, exit 3). A host seen twice: a verified slice's observation outranks an unverifiable
    one (runner artifacts, artifact files) whatever their times; among equals the newer facts win;
    merge.json records it and stderr names each slice ignored for trust.
    """
    from k3fleet.audit.merge import check_inputs_exist, run_merge
    from k3fleet.report import terminal

    check_inputs_exist(runs)
    result = run_merge(runs, sys.argv, out=out_dir, runs_dir=runs_dir, target=target)
    merged = result.merged
    err.print(f"merged {len(merged.slices)} slice(s), {len(merged.chosen)} hosts, "
              f"{len(merged.duplicates)} seen more than once")
    _print_overruled(merged.overruled)
    if as_json:
        out.print_json(json.dumps(result.verdict.model_dump(mode="json")))
    else:
        terminal.print_audit(out, result)
    err.print(f"run directory: {result.run_dir.path}")
    raise typer.Exit(result.exit_code)


def _print_overruled(overruled: list[tuple[str, str, str]]) -> None:
    """One line per ignored slice: which hosts it lost and why (merge.json has every host)."""
    from k3fleet.report.escapes import safe_text

    by_source: dict[str, list[str]] = {}
    reason: dict[str, str] = {}
    for host, source, why in overruled:
        by_source.setdefault(source, []).append(host)
        reason.setdefault(source, why)
    for source, hosts in by_source.items():
        shown = ", ".join(safe_text(h) for h in hosts[:5]) + (f" and {len(hosts) - 5} more" if len(hosts) > 5 else "")
        err.print(f"ignored {safe_text(source)} for {len(hosts)} host(s) ({shown}): {safe_text(reason[source])}",
                  markup=False)
