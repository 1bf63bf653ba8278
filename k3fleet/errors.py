"""k3fleet's exceptions, in one place, with the exit code each one maps to.

Exit codes (docs/architecture.md "Contracts"): 0 pass / go, 1 checks failed / no-go, 2 usage or bad input,
3 hosts unreachable or evidence incomplete.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3


class K3FleetError(Exception):
    """Base class: every error the CLI turns into one line and an exit code."""

    exit_code = EXIT_USAGE


class UsageError(K3FleetError):
    """Bad input: arguments, inventory, target file, run directory."""

    exit_code = EXIT_USAGE


class IncompleteError(K3FleetError):
    """The run could not gather the evidence it needs (interrupted, Ansible failed to start)."""

    exit_code = EXIT_INCOMPLETE
