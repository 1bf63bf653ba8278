"""The `k3fleet` command line: one module per command group, one progress observer.

- ``base``: the Typer application, the consoles and ``main`` (errors -> one line + exit code);
  ``main`` imports only the command module its command line needs
- ``progress``: the progress observer every playbook-driving command uses
- ``audit``: audit, plan, checks, schema
- ``change``: upgrade, rollback
- ``lab``: the simulated lab fleet and the real testbed
- ``accept``, ``accept_load``: the serving acceptance probes
- ``decide``: decide, verify-evidence, report, triage, watch
- ``evidence``, ``merge``, ``serve_vllm``, ``sshfleet``

``k3fleet.cli.app`` is the Typer application with every command registered (for in-process callers
such as Typer's test runner).
"""

# lazy: `import k3fleet.cli` loads only base; the command modules load when ``app`` is asked for.
from __future__ import annotations

from typing import Any

from k3fleet.cli.base import main

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from k3fleet.cli.base import app, register_commands

        register_commands()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
