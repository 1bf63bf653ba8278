"""The change night, its resume, and the rollback (docs/architecture.md "Flows", docs/change-night.md).

Rooms:

- ``lease``: the change-id rule and the lease a change puts on each node (one definition,
  shared with the drain module; handed to the playbooks as a value).
- ``lock``: one change at a time per runs directory; plays that die with their controller.
- ``gate``: options, accepted findings, canary and waves, max-unavailable, the fresh audit.
- ``record``: change.json and reading a run back only after checking it against its manifest.
- ``upgrade``: ``run_upgrade`` -> a fresh night (``night``: playbooks/change_night.yml -> run
  directory) or its continuation (``resume``).
- ``resume``: ``upgrade --resume`` from the journal.
- ``smoke``: the serving smoke as chosen (``--smoke/--no-smoke``, ``--launch-file``), recorded and
  handed to the play as ``k3fleet_smoke``.
- ``rollback``: ``run_rollback`` -> playbooks/rollback.yml, snapshots handed in from the journal.
- ``timing``: where each host's time went, keyed on its journal stages.
- ``journal``: the journal itself (format, tearing, replay); each run reads it once.
- ``interrupt``: Ctrl-C and SIGTERM during a play (the first stops it cleanly, the second aborts).
"""

from __future__ import annotations

from k3fleet.change.gate import (
    NothingToChange,
    UpgradeOptions,
    accepted_blocked,
    check_accept_found,
    check_accept_patterns,
    check_max_unavailable,
    plan_batches,
    resolve_max_unavailable,
)
from k3fleet.change.lease import Lease, validate_change_id, validate_operator
from k3fleet.change.night import ChangeResult, check_reports
from k3fleet.change.record import ChangeRecord, load_change
from k3fleet.change.rollback import RollbackOptions, RollbackResult, rollback_sources, run_rollback
from k3fleet.change.timing import ChangeRecorder, host_timings
from k3fleet.change.upgrade import run_upgrade

__all__ = [
    "ChangeRecord",
    "ChangeRecorder",
    "ChangeResult",
    "Lease",
    "NothingToChange",
    "RollbackOptions",
    "RollbackResult",
    "UpgradeOptions",
    "accepted_blocked",
    "check_accept_found",
    "check_accept_patterns",
    "check_max_unavailable",
    "check_reports",
    "host_timings",
    "load_change",
    "plan_batches",
    "resolve_max_unavailable",
    "rollback_sources",
    "run_rollback",
    "run_upgrade",
    "validate_change_id",
    "validate_operator",
]
