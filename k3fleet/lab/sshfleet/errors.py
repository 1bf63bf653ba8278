"""Exceptions of the SSH lab fleet: one line each, with the exit code the CLI maps it to."""

from __future__ import annotations

from k3fleet.contracts import EXIT_USAGE
from k3fleet.lab.common.errors import LabError


class SshFleetError(LabError):
    """The SSH lab fleet could not be brought up, inspected or torn down (exit 3)."""


class SshFleetUsageError(SshFleetError):
    """Not root, a program missing, a fleet already up, a size out of range."""

    exit_code = EXIT_USAGE
