"""k3fleet's exceptions, in one place, with the exit code each one maps to.

The exit codes and the rule that combines them are owned by ``k3fleet.contracts``.
"""

from __future__ import annotations

from typing import Any

from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, combine

__all__ = ["EXIT_FAILED", "EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "IncompleteError", "K3FleetError",
           "UsageError", "combine", "validation_line"]


class K3FleetError(Exception):
    """Base class: every error the CLI turns into one line and an exit code."""

    exit_code = EXIT_USAGE


class UsageError(K3FleetError):
    """Bad input: arguments, inventory, target file, run directory."""

    exit_code = EXIT_USAGE


class IncompleteError(K3FleetError):
    """The run could not gather the evidence it needs (interrupted, Ansible failed to start)."""

    exit_code = EXIT_INCOMPLETE


def validation_line(exc: Any) -> str:
    """The first error of a pydantic ValidationError as ``field.path: message`` (one line)."""
    errs = exc.errors(include_url=False)
    if not errs:
        return str(exc).splitlines()[0]
    e = errs[0]
    loc = ".".join(str(p) for p in e.get("loc", ())) or "(top level)"
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{loc}: {e.get('msg')}{more}"
