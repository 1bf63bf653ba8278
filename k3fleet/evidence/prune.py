"""``k3fleet prune``: run directories expire, the evidence of an accepted decision does not.

A run directory under ``--runs-dir`` older than ``--older-than`` (its ``command.json`` start time)
is removed, unless an accepted decision cites it: a decision run (under ``--runs-dir`` or named by
``--keep-cited-by``) whose ``decision.json`` is approved keeps itself and every run its
``summary.json`` names. Only k3fleet run directories are touched: a directory without a readable
``command.json``, a link, or a plain file (an evidence package ``.tar.gz``) is left alone and said
so (docs/safety.md "Evidence privacy").

Prune cannot escape its tree: a run is judged and removed through descriptors opened without following
links, never across a mount (another ``st_dev``, or a mount point of ``/proc/self/mountinfo``: a bind
mount of the same filesystem), and it is removed whole or not at all: renamed aside to a trash name in
the same directory first (one atomic step; a run that cannot be renamed is left whole and said so), then
deleted. A trash a deletion could not finish is said so and tried again by the next prune. The runs an
approved decision cites are found by their recorded identity (the sha256 of their manifest.json, as the
decision's ``summary.json`` records it), not by the path they had, so moving the runs tree keeps them.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3fleet.errors import K3FleetError, UsageError
from k3fleet.evidence.layout import COMMAND, DECISION, MANIFEST, SUMMARY
from k3fleet.evidence.reader import RunReader

REMOVE, KEEP = "remove", "keep"
# A run renamed aside for removal: ``.k3fleet-prune-<run>.<random>`` (hidden, never a run id).
TRASH_PREFIX = ".k3fleet-prune-"
_TRASH = re.compile(r"^\.k3fleet-prune-.+\.[0-9a-f]{12}$")


@dataclass
class Verdict:
    path: Path
    action: str
    why: str
    kind: str | None = None
    age_s: float | None = None
    # An old run left whole although the limit says remove it (it holds a mount point): the prune did
    # not do all it was asked, and says so (exit 3).
    held: bool = False


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


def _manifest_digest(run: Path) -> str | None:
    """sha256 of a run's manifest.json, read without following a link; None when it has none."""
    try:
        fd = os.open(run / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class Cited:
    """What an approved decision cites: the runs' identities (manifest digests) and, for a decision written
    before digests were recorded, their recorded paths."""

    name: str
    digests: set[str]
    paths: set[str]


def cited_by(decision: Path) -> Cited | None:
    """What an approved decision cites (itself included); ``None`` when not approved."""
    d = _json(decision / DECISION)
    if not isinstance(d, dict) or d.get("approved") is not True:
        return None
    own = _manifest_digest(decision)
    cited = Cited(decision.name, {own} if own else set(), {_real(decision)})
    summary = _json(decision / SUMMARY)
    command = _json(decision / COMMAND)
    cwd = command.get("cwd") if isinstance(command, dict) and isinstance(command.get("cwd"), str) else None
    for run in (summary.get("runs") if isinstance(summary, dict) else None) or []:
        if not isinstance(run, dict):
            continue
        digest = run.get("manifest_sha256")
        if isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest):
            cited.digests.add(digest)
        p = run.get("path")
        if isinstance(p, str) and p:
            cited.paths.add(_real(Path(cwd, p) if cwd and not os.path.isabs(p) else p))
    return cited


def mount_points() -> set[str]:
    """Every mount point of this process's view (``/proc/self/mountinfo``, octal escapes decoded): a bind
    mount of the same filesystem has the same ``st_dev`` and only shows here."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return set()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return points


def _crossing(run: Path, mounts: set[str]) -> str | None:
    """The first place inside ``run`` that is on another filesystem or a mount point (never entered)."""
    try:
        top = os.lstat(run)
    except OSError as exc:
        return f"{run}: {exc.strerror or exc}"
    if _real(run) in mounts:
        return str(run)
    for dirpath, dirnames, _files in os.walk(run, followlinks=False):
        for name in list(dirnames):
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and (st.st_dev != top.st_dev or _real(p) in mounts):
                return p
    return None


def plan_prune(runs_dir: Path, older_than_s: float, now: _dt.datetime,
               decisions: Sequence[Path] = ()) -> list[Verdict]:
    """What prune does to each entry of ``runs_dir`` (nothing is removed here)."""
    if not runs_dir.is_dir():
        raise UsageError(f"--runs-dir {runs_dir}: not a directory")
    entries = sorted(runs_dir.iterdir())
    runs: dict[Path, dict[str, Any]] = {}
    out: list[Verdict] = []
    base_dev = os.stat(runs_dir).st_dev
    mounts = mount_points()
    for p in entries:
        if _TRASH.match(p.name) and not p.is_symlink() and p.is_dir():
            out.append(Verdict(p, REMOVE, "a run an earlier prune renamed aside but could not finish removing",
                               "trash"))
            continue
        if p.is_symlink() or not p.is_dir():
            out.append(Verdict(p, KEEP, "not a run directory (a link or a file): never touched"))
            continue
        if os.lstat(p).st_dev != base_dev or _real(p) in mounts:
            out.append(Verdict(p, KEEP, "a mount point (another filesystem or a bind mount): never touched"))
            continue
        command = _json(p / COMMAND)
        if not isinstance(command, dict) or not isinstance(command.get("kind"), str):
            out.append(Verdict(p, KEEP, f"no readable {COMMAND}: not a k3fleet run directory, never touched"))
            continue
        runs[p] = command
    by_digest: dict[str, str] = {}
    by_path: dict[str, str] = {}
    for d in [*(p for p, c in runs.items() if c.get("kind") == "decision"), *decisions]:
        cited = cited_by(d)
        if cited is None:
            continue
        for digest in cited.digests:
            by_digest.setdefault(digest, cited.name)
        for real in cited.paths:
            by_path.setdefault(real, cited.name)
    for p, command in runs.items():
        kind = str(command["kind"])
        started = _started(p, command)
        age = (now - started).total_seconds() if started is not None else None
        own = _manifest_digest(p)
        by: str | None = by_digest.get(own) if own else None
        by = by or by_path.get(_real(p))
        if by is not None:
            why = "an accepted decision" if by == p.name else f"cited by the accepted decision {by}"
            out.append(Verdict(p, KEEP, why, kind, age))
        elif age is None:
            out.append(Verdict(p, KEEP, "its age is unknown", kind, age))
        elif age < older_than_s:
            out.append(Verdict(p, KEEP, f"{_days(age)} old, newer than the limit", kind, age))
        else:
            crossing = _crossing(p, mounts)
            if crossing is not None:
                out.append(Verdict(p, KEEP, f"{_days(age)} old, but it holds a mount point ({crossing}): never "
                                            "removed, left whole", kind, age, held=True))
            else:
                out.append(Verdict(p, REMOVE, f"{_days(age)} old", kind, age))
    return sorted(out, key=lambda v: v.path.name)


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.0f}d" if seconds >= 86400 else f"{seconds / 3600:.0f}h"


def _remove_tree(dir_fd: int, dev: int) -> None:
    """Delete everything under the open directory ``dir_fd``: no link followed, no other filesystem entered
    (``st_dev`` compared at every folder)."""
    for entry in os.scandir(dir_fd):
        st = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev != dev:
                raise OSError(f"{entry.name} is on another filesystem: not entered")
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                if os.fstat(sub).st_dev != dev:
                    raise OSError(f"{entry.name} is on another filesystem: not entered")
                _remove_tree(sub, dev)
            finally:
                os.close(sub)
            os.rmdir(entry.name, dir_fd=dir_fd)
        else:
            os.unlink(entry.name, dir_fd=dir_fd)


def _delete(path: Path) -> None:
    """Delete a directory renamed aside (a trash name): its contents through descriptors, then itself."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            if os.fstat(fd).st_dev != os.fstat(parent).st_dev:
                raise OSError("on another filesystem (a mount): not entered")
            _remove_tree(fd, os.fstat(fd).st_dev)
        finally:
            os.close(fd)
        os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def trash_name(run: Path) -> Path:
    return run.with_name(f"{TRASH_PREFIX}{run.name}.{secrets.token_hex(6)}")


def apply_prune(plan: Sequence[Verdict]) -> dict[Path, str]:
    """Remove what the plan says, each run whole or not at all; what could not be removed, with why.

    A run is renamed aside to a trash name in its own directory first (atomic: the run is under its name,
    whole, or gone from it); a run that cannot be renamed is left whole. The trash is then deleted; what
    a deletion cannot finish stays under the trash name, said so, for the next prune."""
    problems: dict[Path, str] = {}
    for v in plan:
        if v.action != REMOVE:
            continue
        if v.kind == "trash":
            trash = v.path
        else:
            trash = trash_name(v.path)
            try:
                os.rename(v.path, trash)
            except OSError as exc:
                problems[v.path] = f"cannot rename it aside ({exc.strerror or exc}): left whole"
                continue
        try:
            _delete(trash)
        except OSError as exc:
            problems[v.path] = (f"renamed aside to {trash.name} but not all of it could be deleted "
                                f"({exc.strerror or exc}): the next prune tries again")
    return problems


__all__ = ["KEEP", "REMOVE", "TRASH_PREFIX", "Cited", "Verdict", "apply_prune", "cited_by", "mount_points",
           "plan_prune"]
