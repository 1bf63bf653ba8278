"""The error every lab harness raises, or subclasses: one line, exit 3 (the lab is not there).

The testbed's, the SSH fleet's and the lab vLLM's own errors derive from it, so a command the
shared helpers run fails the same way whichever harness called it.
"""

from __future__ import annotations

from k3fleet.contracts import EXIT_INCOMPLETE
from k3fleet.errors import K3FleetError


class LabError(K3FleetError):
    """A lab could not be brought up, inspected or torn down: what failed, on which object, the detail."""

    exit_code = EXIT_INCOMPLETE
