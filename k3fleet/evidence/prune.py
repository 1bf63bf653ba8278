"""``k3fleet prune``: run directories expire, the evidence of an accepted decision does not.

A run directory under ``--runs-dir`` older than ``--older-than`` (its ``command.json`` start time)
is removed, unless an accepted decision cites it: a decision run (under ``--runs-dir`` or named by
``--keep-cited-by``) whose ``decision.json`` is approved keeps itself and every run its
``summary.json`` names. Only k3fleet run directories are touched: a directory without a readable
``command.json``, a link, or a plain file (an evidence package ``.tar.gz``) is left alone and said
so (docs/safety.md "Evidence privacy").
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3fleet.errors import K3FleetError, UsageError
from k3fleet.evidence.layout import COMMAND, DECISION, SUMMARY
from k3fleet.evidence.reader import RunReader

REMOVE, KEEP = "remove", "keep"


@dataclass
class Verdict:
    path: Path
    action: str
    why: str
    kind: str | None = None
    age_s: float | None = None


def _json(p: Path) -> Any:
    """A run file through the run reader; None when it is missing or unreadable (prune judges what it can)."""
    try:
        return RunReader(p.parent).json(p.name)
    except K3FleetError:
        return None


def _started(path: Path, command: dict[str, Any]) -> _dt.datetime | None:
    value = command.get("started_at")
    if isinstance(value, str):
        try:
            when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)
        except ValueError:
            pass
    try:
        return _dt.datetime.fromtimestamp((path / COMMAND).stat().st_mtime, _dt.UTC)
    except OSError:
        return None


def _real(p: Path | str) -> str:
    return os.path.realpath(p)


def cited_by(decision: Path) -> set[str] | None:
    """The real paths an approved decision cites (itself included); ``None`` when not approved."""
    d = _json(decision / DECISION)
    if not isinstance(d, dict) or d.get("approved") is not True:
        return None
    out = {_real(decision)}
    summary = _json(decision / SUMMARY)
    command = _json(decision / COMMAND)
    cwd = command.get("cwd") if isinstance(command, dict) and isinstance(command.get("cwd"), str) else None
    for run in (summary.get("runs") if isinstance(summary, dict) else None) or []:
        p = run.get("path") if isinstance(run, dict) else None
        if isinstance(p, str) and p:
            out.add(_real(Path(cwd, p) if cwd and not os.path.isabs(p) else p))
    return out


def plan_prune(runs_dir: Path, older_than_s: float, now: _dt.datetime,
               decisions: Sequence[Path] = ()) -> list[Verdict]:
    """What prune does to each entry of ``runs_dir`` (nothing is removed here)."""
    if not runs_dir.is_dir():
        raise UsageError(f"--runs-dir {runs_dir}: not a directory")
    entries = sorted(runs_dir.iterdir())
    runs: dict[Path, dict[str, Any]] = {}
    out: list[Verdict] = []
    for p in entries:
        if p.is_symlink() or not p.is_dir():
            out.append(Verdict(p, KEEP, "not a run directory (a link or a file): never touched"))
            continue
        command = _json(p / COMMAND)
        if not isinstance(command, dict) or not isinstance(command.get("kind"), str):
            out.append(Verdict(p, KEEP, f"no readable {COMMAND}: not a k3fleet run directory, never touched"))
            continue
        runs[p] = command
    protected: dict[str, str] = {}
    for d in [*(p for p, c in runs.items() if c.get("kind") == "decision"), *decisions]:
        for real in cited_by(d) or ():
            protected.setdefault(real, d.name)
    for p, command in runs.items():
        kind = str(command["kind"])
        started = _started(p, command)
        age = (now - started).total_seconds() if started is not None else None
        if _real(p) in protected:
            by = protected[_real(p)]
            why = "an accepted decision" if by == p.name else f"cited by the accepted decision {by}"
            out.append(Verdict(p, KEEP, why, kind, age))
        elif age is None:
            out.append(Verdict(p, KEEP, "its age is unknown", kind, age))
        elif age < older_than_s:
            out.append(Verdict(p, KEEP, f"{_days(age)} old, newer than the limit", kind, age))
        else:
            out.append(Verdict(p, REMOVE, f"{_days(age)} old", kind, age))
    return sorted(out, key=lambda v: v.path.name)


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.0f}d" if seconds >= 86400 else f"{seconds / 3600:.0f}h"


def apply_prune(plan: Sequence[Verdict]) -> dict[Path, str]:
    """Remove what the plan says; what could not be removed, with why."""
    problems: dict[Path, str] = {}
    for v in plan:
        if v.action != REMOVE:
            continue
        try:
            shutil.rmtree(v.path)
        except OSError as exc:
            problems[v.path] = str(exc.strerror or exc)
    return problems


__all__ = ["KEEP", "REMOVE", "Verdict", "apply_prune", "cited_by", "plan_prune"]
