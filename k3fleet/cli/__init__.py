"""The `k3fleet` command line: one module per command group, one progress observer.

- ``app``: the Typer application, the consoles and ``main`` (errors -> one line + exit code)
- ``progress``: the progress observer every playbook-driving command uses
- ``audit``: audit, plan, checks, schema
- ``change``: upgrade, rollback
- ``lab``: the simulated lab fleet and the real testbed
"""

from __future__ import annotations

from k3fleet.cli.app import app, main

__all__ = ["app", "main"]
