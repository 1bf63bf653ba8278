"""`k3fleet verify`: check a run directory against its manifest (docs/safety.md "Verify")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from k3fleet.cli.base import app, err, out
from k3fleet.errors import EXIT_INCOMPLETE, EXIT_OK


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
