"""The rollback kit as the controller chooses it (docs/change-night.md "Rollback kit").

Before a host's first change the night stages on the node the exact driver packages it runs (role
``k3_rollback_kit``), so that a rollback can put them back when the repository no longer offers
them. A host whose kit cannot be made is not changed. ``k3fleet upgrade --no-rollback-kit`` changes
hosts without one: the choice is recorded in change.json (``rollback_kit``), and the result and
run.json carry a warning. A resume runs as the night was started unless the command line says
otherwise. The play gets one extra var, ``k3fleet_rollback_kit``: ``{timeout}`` (the target's
``change.rollback_kit_timeout_s``) or null for no kit.
"""

from __future__ import annotations

from typing import Any

from k3fleet.change.gate import UpgradeOptions
from k3fleet.change.record import ChangeRecord
from k3fleet.models.target import Target

SKIPPED = ("the night makes no rollback kit (--no-rollback-kit): a changed host whose old driver packages the "
           "repository no longer offers cannot be rolled back")


def kit_choice(opts: UpgradeOptions, recorded: bool | None = None) -> bool:
    """On unless ``--no-rollback-kit``; a resume keeps the night's choice (a night recorded before the
    kit existed: on) unless ``--rollback-kit`` or ``--no-rollback-kit`` is given."""
    if opts.rollback_kit is not None:
        return bool(opts.rollback_kit)
    return True if recorded is None else bool(recorded)


def kit_timeouts(target: Target) -> dict[str, int]:
    """The kit's bound from the target, in seconds (``change`` section): one package's download."""
    return {"rollback_kit": int(target.change.rollback_kit_timeout_s)}


def kit_extravar(record: ChangeRecord) -> dict[str, int] | None:
    """``k3fleet_rollback_kit`` for the play: the download bound, or None for no kit."""
    if record.rollback_kit is False:
        return None
    return {"timeout": int(record.timeouts["rollback_kit"])}


def kit_warnings(enabled: bool, check: bool) -> list[str]:
    """The result's warning for a night that changes nodes without a kit (--check changes nothing)."""
    return [] if check or enabled else [SKIPPED]


def describe(change: dict[str, Any]) -> str | None:
    """One line for the result; None for a night with no recorded choice."""
    kit = change.get("rollback_kit")
    if kit is None:
        return None
    return ("rollback kit: on, staged on each host before its first change" if kit
            else "rollback kit: off (--no-rollback-kit)")
