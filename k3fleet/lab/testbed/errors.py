"""Exceptions of the real testbed harness.

Every message is one line: what failed, on which object, and the detail (stderr tail, exit code).
"""

from __future__ import annotations

from k3fleet.errors import UsageError
from k3fleet.lab.common.errors import LabError


class TestbedError(LabError):
    """The testbed could not be brought up, inspected or torn down (exit 3)."""

    # pytest collects classes named Test*; this one is not a test case.
    __test__ = False


# What the machine lacks is the caller's to fix: a usage error (exit 2) that is also a testbed error.


class NotRootError(UsageError, TestbedError):
    """Namespaces, mounts and systemd-nspawn need root."""


class MissingToolError(UsageError, TestbedError):
    """A program the testbed needs is not installed (see scripts/testbed-deps.sh)."""
