"""`k3fleet merge RUN...`: audit slices (run directories, ansible-runner artifacts) into one verdict."""

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
    is refused, exit 3). A host seen twice: the newer facts win; merge.json records it.
    """
    from k3fleet.merge import check_inputs_exist, run_merge
    from k3fleet.report import terminal

    check_inputs_exist(runs)
    result = run_merge(runs, sys.argv, out=out_dir, runs_dir=runs_dir, target=target)
    merged = result.merged
    err.print(f"merged {len(merged.slices)} slice(s), {len(merged.chosen)} hosts, "
              f"{len(merged.duplicates)} seen more than once")
    if as_json:
        out.print_json(json.dumps(result.verdict.model_dump(mode="json")))
    else:
        terminal.print_audit(out, result)
    err.print(f"run directory: {result.run_dir.path}")
    raise typer.Exit(result.exit_code)
