"""`k3fleet upgrade`: a fresh change night (night.py) or the continuation of an interrupted one
(resume.py, ``--resume``). Both build on night.py's steps; this module only chooses, so neither
of the two imports the other (docs/change-night.md)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from k3fleet.audit.runner import Observer
from k3fleet.change.night import ChangeResult, UpgradeOptions, run_night, validate_request
from k3fleet.change.resume import run_resume
from k3fleet.targets import load_target


def run_upgrade(opts: UpgradeOptions, argv: Sequence[str], observer: Observer | None = None,
                cancel: threading.Event | None = None) -> ChangeResult:
    """The change night, or its continuation with ``opts.resume``. Never raises for host failures:
    they are in the result, the journal and the exit code."""
    if opts.resume is None:
        return run_night(opts, argv, observer, cancel)
    change_id, operator, _max_arg, accept = validate_request(opts)
    return run_resume(opts, change_id, operator, accept, argv, observer, cancel, load_target(opts.target))
