"""The change journal: read it back, replay it per host, and decide what to resume or roll back.

The playbooks append one JSON line per stage transition of every host (module
``k3fleet_journal``, fsync'd): ``{ts, run, change_id, host, stage, detail, snapshot?}``.
The journal alone is enough to continue an interrupted night or to put every host back
where it was: the ``snapshot`` line carries the host's pre-change packages, holds,
services and scheduler state.

A controller killed mid-write leaves at most one truncated last line; it is reported
as a problem, never an exception, and everything before it still counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from k3fleet.errors import UsageError

JOURNAL_FILE = "journal.jsonl"
Stage = Literal["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned", "failed",
                "rolled_back"]
STAGES: tuple[str, ...] = ("snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned",
                           "failed", "rolled_back")
# Stages after which the host's packages or loaded driver may differ from the snapshot.
_TOUCHED = ("upgrading", "rebooting", "verifying")
Outcome = Literal["not_started", "in_progress", "upgraded", "failed", "rolled_back"]


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    ts: str
    run: str
    change_id: str
    host: str
    stage: Stage
    detail: Any = None
    snapshot: dict[str, Any] | None = None


@dataclass
class Journal:
    path: Path
    entries: list[JournalEntry] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def change_ids(self) -> list[str]:
        return sorted({e.change_id for e in self.entries})

    @property
    def runs(self) -> list[str]:
        return sorted({e.run for e in self.entries})


def read_journal(path: Path) -> Journal:
    """Every well-formed line of ``path``; malformed ones become ``problems`` (line number and why)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise UsageError(f"journal {path} does not exist") from exc
    except OSError as exc:
        raise UsageError(f"journal {path} cannot be read: {exc.strerror or exc}") from exc
    journal = Journal(path=path)
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last_unterminated = number == len(lines) and not raw.endswith(b"\n")
        try:
            data = json.loads(line.decode("utf-8"))
            journal.entries.append(JournalEntry.model_validate(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            why = "truncated last line (the writer was killed mid-line)" if last_unterminated else f"not JSON: {exc}"
            journal.problems.append(f"{path}:{number}: {why}")
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "(line)"
            journal.problems.append(f"{path}:{number}: {loc}: {err['msg']}")
    return journal


@dataclass
class HostHistory:
    """One host's transitions, oldest first, and what they add up to."""

    host: str
    entries: list[JournalEntry] = field(default_factory=list)

    @property
    def stage(self) -> str | None:
        return self.entries[-1].stage if self.entries else None

    @property
    def snapshot(self) -> dict[str, Any] | None:
        """The FIRST snapshot: a resumed night must never take a half-changed host as its 'before'."""
        for e in self.entries:
            if e.stage == "snapshot" and e.snapshot is not None:
                return e.snapshot
        return None

    @property
    def change_id(self) -> str | None:
        return self.entries[-1].change_id if self.entries else None

    @property
    def drained_by_us(self) -> bool | None:
        """From the last ``drained`` line; None when the host never got that far."""
        for e in reversed(self.entries):
            if e.stage == "drained" and isinstance(e.detail, dict) and "drained_by_us" in e.detail:
                return bool(e.detail["drained_by_us"])
        return None

    @property
    def touched(self) -> bool:
        """Packages or the loaded driver may have changed since the snapshot."""
        return any(e.stage in _TOUCHED for e in self.entries)

    @property
    def failure(self) -> str | None:
        for e in reversed(self.entries):
            if e.stage == "failed":
                d = e.detail if isinstance(e.detail, dict) else {"msg": e.detail}
                task = d.get("task")
                msg = d.get("msg") or "no message"
                return f"{task}: {msg}" if task else str(msg)
        return None

    @property
    def outcome(self) -> Outcome:
        stages = [e.stage for e in self.entries]
        if not stages:
            return "not_started"
        if "rolled_back" in stages:
            return "rolled_back"
        if "failed" in stages:
            return "failed"
        if stages[-1] == "returned":
            return "upgraded"
        return "in_progress"

    def last(self, stage: str) -> JournalEntry | None:
        for e in reversed(self.entries):
            if e.stage == stage:
                return e
        return None


def replay(entries: Iterable[JournalEntry]) -> dict[str, HostHistory]:
    """Per host, in the order hosts first appear."""
    out: dict[str, HostHistory] = {}
    for e in entries:
        out.setdefault(e.host, HostHistory(e.host)).entries.append(e)
    return out


@dataclass
class ResumePlan:
    """What ``k3fleet upgrade --resume`` does with each planned host."""

    done: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def todo(self) -> list[str]:
        return self.resume + self.pending


def resume_plan(histories: dict[str, HostHistory], planned: Sequence[str]) -> ResumePlan:
    """Hosts that returned are done and not touched again; hosts half-way continue from their
    first snapshot; hosts never reached are still to do; failed or rolled-back hosts stop the resume."""
    plan = ResumePlan()
    for host in planned:
        h = histories.get(host)
        outcome = h.outcome if h else "not_started"
        if h is not None and outcome == "upgraded":
            plan.done.append(host)
        elif h is not None and outcome in ("failed", "rolled_back"):
            plan.failed[host] = h.failure or outcome.replace("_", " ")
        elif h is not None and outcome == "in_progress":
            plan.resume.append(host)
            snap = h.snapshot
            if snap is not None:
                plan.snapshots[host] = snap
        else:
            plan.pending.append(host)
    return plan


@dataclass
class RollbackTarget:
    host: str
    change_id: str
    run: str
    snapshot: dict[str, Any]
    drained_by_us: bool | None
    stage: str | None


def rollback_targets(histories: dict[str, HostHistory], hosts: Sequence[str] | None = None
                     ) -> tuple[list[RollbackTarget], dict[str, str]]:
    """Hosts that can be rolled back (they have a snapshot), and why the others cannot."""
    wanted = list(hosts) if hosts is not None else list(histories)
    targets: list[RollbackTarget] = []
    skipped: dict[str, str] = {}
    for host in wanted:
        h = histories.get(host)
        if h is None or not h.entries:
            skipped[host] = "not in the journal"
            continue
        snap = h.snapshot
        if snap is None:
            skipped[host] = f"no snapshot line (last stage {h.stage}): nothing was changed on it"
            continue
        first = h.entries[0]
        targets.append(RollbackTarget(host=host, change_id=first.change_id, run=first.run, snapshot=snap,
                                      drained_by_us=h.drained_by_us, stage=h.stage))
    return targets, skipped


def summarize(histories: dict[str, HostHistory]) -> dict[str, dict[str, Any]]:
    """A JSON-able per-host summary for run.json and the terminal."""
    return {
        host: {
            "outcome": h.outcome,
            "stage": h.stage,
            "drained_by_us": h.drained_by_us,
            "failure": h.failure,
            "stages": [e.stage for e in h.entries],
            "started": h.entries[0].ts if h.entries else None,
            "ended": h.entries[-1].ts if h.entries else None,
        }
        for host, h in histories.items()
    }
