"""What a change run records about itself (``change.json``), and reading a run back safely.

``change.json`` is written once when the night starts: the plan the playbook was given. A resume
and a rollback read it back through ``load_change``, after the run directory has been checked
against its manifest (``verified``; the manifest is written as the play starts, so a killed
night has one): a tampered or malformed file is one line and exit 3, never a traceback and never
trusted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3fleet.errors import IncompleteError, UsageError, validation_line
from k3fleet.evidence import RunDir, layout, verify_run
from k3fleet.evidence.reader import RunReader


class PackagePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    to_name: str
    to_version: str | None = None


class HostPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: str = "driver"
    target_version: str
    target_branch: int
    packages: list[PackagePlan]


class SmokeChoice(BaseModel):
    """The night's serving smoke as the operator chose it (docs/change-night.md "Serving smoke")."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool
    # The launch command file whose command the smoke runs instead of the audit's serve command:
    # its absolute path on the controller and its sha256 when the night started.
    launch_file: str | None = None
    launch_file_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class ChangeRecord(BaseModel):
    """change.json: the night as planned."""

    model_config = ConfigDict(extra="allow")

    change_id: str
    operator: str
    target_version: str
    target_branch: int
    canary: str | None = None
    waves: list[list[str]] = Field(default_factory=list)
    with_waves: bool = False
    check: bool = False
    failure_budget: int = Field(default=0, ge=0)
    max_unavailable: int | None = Field(default=None, ge=1)
    max_unavailable_arg: str | None = None
    drain_timeout: int | None = Field(default=None, ge=0)
    force: bool = False
    audit_max_age: int | None = Field(default=None, ge=1)
    audit: str | None = None
    inventory: str | None = None
    blocked: list[dict[str, Any]] = Field(default_factory=list)
    done: list[str] = Field(default_factory=list)
    held: dict[str, str] = Field(default_factory=dict)
    accept_findings: list[str] = Field(default_factory=list)
    accepted_blocked: list[str] = Field(default_factory=list)
    hosts: dict[str, HostPlan] = Field(default_factory=dict)
    timeouts: dict[str, int] = Field(default_factory=dict)
    image: str | None = None
    # None: a night recorded before the choice was (it ran without the controller's smoke).
    smoke: SmokeChoice | None = None
    # The preflight's policy from the target (docs/change-night.md "Preflight"); empty in a night recorded
    # before it (its resume takes the target's defaults again).
    preflight: dict[str, Any] = Field(default_factory=dict)
    # The rollback kit staged before each host's first change (False: --no-rollback-kit); None: a night
    # recorded before the kit existed.
    rollback_kit: bool | None = None
    # What the verify proves beyond the driver (k3fleet.change.verifyplan, docs/change-night.md "Verify steps");
    # empty in a night recorded before it (its resume runs the driver checks and the smoke only).
    verify: dict[str, Any] = Field(default_factory=dict)


# What a change run writes after the manifest it takes before its play: the journal grows, the
# play's output and the summary appear. A run killed mid-play has them beside its manifest.
_PLAY_FILES = (layout.JOURNAL, layout.RUN, layout.CHECK)
_PLAY_PREFIXES = (layout.EVENTS_STEM, layout.ANSIBLE, f"{layout.SNAPSHOTS}/", layout.RESUME_PREFIX,
                  layout.gate_audit_dir(layout.RESUME_PREFIX))


def _written_by_play(rel: str) -> bool:
    return rel in _PLAY_FILES or rel.startswith(_PLAY_PREFIXES)


def _grew_from(path: Path, entry: dict[str, Any]) -> bool:
    """An append-only file is intact when its first ``bytes`` bytes still hash to the manifest's sha256."""
    size = entry.get("bytes")
    if not isinstance(size, int) or size < 0:
        return False
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            left = size
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    return False
                digest.update(chunk)
                left -= len(chunk)
    except OSError:
        return False
    return digest.hexdigest() == entry.get("sha256")


def verified(path: Path) -> RunDir:
    """The change run directory at ``path``, after checking it against its manifest.

    Every file the manifest lists must be unchanged, except the journal, which may only have grown
    (its first bytes still hash as listed). Files the night writes after that manifest (the
    journal, the play's output) may be there besides; anything else is refused (exit 3).
    """
    if not Path(path).is_dir():
        raise UsageError(f"run {path} is not a directory: give a change run directory")
    rd = RunDir.open(path)
    report = verify_run(rd.path)
    if not report.has_manifest:
        raise IncompleteError(f"run {rd.path} has no {layout.MANIFEST}: it stopped before its play started, so "
                              "no node was changed by it; plan a new night")
    if report.problem:
        raise IncompleteError(report.summary())
    listed = {e["path"]: e for e in RunReader(rd.path).object(layout.MANIFEST)["files"]}
    changed = [p for p in report.changed if not (p == layout.JOURNAL and _grew_from(rd.path / p, listed[p]))]
    extra = [p for p in report.extra if not _written_by_play(p)]
    bad = [f"{p}: missing" for p in report.missing] + [f"{p}: changed" for p in changed] + [
        f"{p}: not in the manifest" for p in extra]
    if bad:
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        raise IncompleteError(f"run {rd.path} does not match its manifest ({'; '.join(bad[:5])}{more}): refusing "
                              "to act on evidence that changed")
    return rd


def load_change(rd: RunDir) -> ChangeRecord:
    """change.json of a verified run (``verified``), through the run reader; a damaged record is exit 3."""
    p = rd.path / layout.CHANGE
    try:
        data = RunReader(rd.path).json(layout.CHANGE)
    except IncompleteError as exc:  # the reader's word for a missing or unreadable file
        if isinstance(exc.__cause__, FileNotFoundError):
            raise UsageError(f"run {rd.path} has no {layout.CHANGE}: it is not a change run") from exc
        raise
    except UsageError as exc:  # not JSON: the reader keeps the decoder's own words as the cause
        raise IncompleteError(f"{p} cannot be read as JSON ({exc.__cause__}): the run's record is damaged") from exc
    if not isinstance(data, dict):
        raise IncompleteError(f"{p} holds a JSON {type(data).__name__}, not a change record: the run's record is "
                              "damaged")
    try:
        return ChangeRecord.model_validate(data)
    except ValidationError as exc:
        raise IncompleteError(f"{p} is not a change record ({validation_line(exc)}): the run's record is "
                              "damaged") from exc
