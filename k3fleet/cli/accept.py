"""`k3fleet accept`: serving acceptance probes against a running vLLM endpoint.

Commands: ``startup`` (a start-up log), ``prefix-cache``, ``prefix-lint``, ``agent``, ``all``; ``load``
registers itself on ``accept_app`` from its own module. Exit codes as the audit's (docs/acceptance.md).
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

from k3fleet.cli.app import app

accept_app = typer.Typer(help="Serving acceptance: start-up log, prefix cache, agent tool calls, load.",
                         no_args_is_help=True)
app.add_typer(accept_app, name="accept")


# `accept load` lives in its own module (another owner); it hangs itself on accept_app when present.
if importlib.util.find_spec("k3fleet.cli.accept_load") is not None:
    importlib.import_module("k3fleet.cli.accept_load")
