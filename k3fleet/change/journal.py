"""The change journal: read it back, replay it per host, and decide what to resume or roll back.

The playbooks append one JSON line per stage transition of every host (module
``k3fleet_journal``, fsync'd): ``{ts, run, change_id, host, stage, detail, snapshot?}``.
The journal alone is enough to continue an interrupted night or to put every host back
where it was: the ``snapshot`` line carries the host's pre-change packages, holds,
services and scheduler state.

A line torn by a writer that died mid-line is reported with its byte offset and, when its
text still names one, the host it belonged to; the line after it is never lost (the format
rules are in ``k3fleet_journal_format``, shared with the writer; docs/change-night.md). A host
whose snapshot cannot be read is never taken for one that "changed nothing".
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_journal_format import (
    CHANGED_STAGES,
    STAGES,
    TOUCHED_STAGES,
    append_line,
    split_lines,
)
from k3fleet.bounds import read_input
from k3fleet.errors import validation_line

if TYPE_CHECKING:
    Stage = str
else:
    # The journal format's own list, so a line naming any other stage is not a journal line.
    Stage = Literal[STAGES]
Outcome = Literal["not_started", "in_progress", "upgraded", "failed", "rolled_back", "held"]


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    ts: str
    run: str
    change_id: str
    host: str
    stage: Stage
    detail: Any = None
    snapshot: dict[str, Any] | None = None
    # Set on the line the controller writes when a signal stopped the play: the host was at ``stage``
    # then (signal, the run that stopped, what to run next). Such a line changes nothing of the host's
    # history: replay keeps it apart (``HostHistory.interruptions``).
    interrupted: dict[str, Any] | None = None
    _offset: int = PrivateAttr(default=-1)

    @property
    def offset(self) -> int:
        """Byte offset of the line in its journal (-1 for a line that did not come from a file)."""
        return self._offset


@dataclass(frozen=True)
class Unreadable:
    """A line that could not be used: torn (not a whole JSON object) or not a journal line."""

    offset: int
    length: int
    why: str
    host: str | None = None
    stage: str | None = None
    change_id: str | None = None

    def describe(self) -> str:
        who = f", host {self.host}" if self.host else ""
        what = f", stage {self.stage}" if self.stage else ""
        return f"byte {self.offset}: {self.why} ({self.length} bytes{who}{what})"


@dataclass
class Journal:
    path: Path
    entries: list[JournalEntry] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [f"{self.path}: {u.describe()}" for u in self.unreadable]

    @property
    def change_ids(self) -> list[str]:
        return sorted({e.change_id for e in self.entries})

    @property
    def runs(self) -> list[str]:
        return sorted({e.run for e in self.entries})

    def unattributed(self) -> list[Unreadable]:
        """Unreadable lines that name no host: any host's line may be among them."""
        return [u for u in self.unreadable if u.host is None]

    def extend(self, lines: Iterable[dict[str, Any]]) -> None:
        """Lines a play reported writing (the module returns each line it appended): the journal
        as it is now, without reading the file again."""
        for data in lines:
            try:
                self.entries.append(JournalEntry.model_validate(data))
            except ValidationError as exc:
                self.unreadable.append(Unreadable(-1, 0, f"line reported by the play: {validation_line(exc)}",
                                                  host=str(data.get("host")) if data.get("host") else None))


def parse_journal(raw: bytes, path: Path) -> Journal:
    journal = Journal(path=path)
    for offset, kind, value in split_lines(raw):
        if kind == "torn":
            journal.unreadable.append(Unreadable(offset, int(value["length"]), str(value["why"]), value["host"],
                                                 value["stage"], value["change_id"]))
            continue
        try:
            entry = JournalEntry.model_validate(value)
        except ValidationError as exc:
            host = value.get("host") if isinstance(value.get("host"), str) else None
            stage = value.get("stage") if value.get("stage") in STAGES else None
            end = raw.find(b"\n", offset)
            length = (len(raw) if end < 0 else end) - offset
            journal.unreadable.append(Unreadable(offset, length, f"not a journal line: {validation_line(exc)}", host,
                                                 stage))
            continue
        entry._offset = offset
        journal.entries.append(entry)
    return journal


def read_journal(path: Path) -> Journal:
    """Every usable line of ``path``; unusable ones become ``unreadable`` (byte offset and why)."""
    return parse_journal(read_input(path, "journal", kind="a journal", limit="journal"), path)


@dataclass
class HostHistory:
    """One host's transitions, oldest first, and what they add up to."""

    host: str
    entries: list[JournalEntry] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)
    # Lines saying a signal stopped the play while the host was at their stage (oldest first).
    interruptions: list[JournalEntry] = field(default_factory=list)

    @property
    def interrupted_at(self) -> JournalEntry | None:
        """The interruption that is the last thing the journal says of this host, if any."""
        if not self.interruptions:
            return None
        last = self.interruptions[-1]
        if self.entries and self.entries[-1].ts > last.ts:
            return None
        return last

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
        return (any(e.stage in TOUCHED_STAGES for e in self.entries)
                or any(u.stage in TOUCHED_STAGES for u in self.unreadable))

    @property
    def changed_something(self) -> bool:
        return any(e.stage in CHANGED_STAGES for e in self.entries) or bool(self.unreadable)

    @property
    def snapshot_problem(self) -> str | None:
        """Why this host's 'before' cannot be trusted: a change is recorded but no snapshot can be read."""
        if self.snapshot is not None or not self.changed_something:
            return None
        if not self.unreadable and all(e.stage == "failed" for e in self.entries):
            # It failed before its snapshot line (the node read, its rollback kit not made): the slot and
            # the drain come with that line, so nothing was changed on it.
            return None
        torn = "; ".join(u.describe() for u in self.unreadable)
        last = self.stage or (self.unreadable[-1].stage if self.unreadable else None) or "unknown"
        if torn:
            return f"its snapshot cannot be read (unreadable journal line at {torn}); last readable stage {last}"
        return f"no snapshot line, yet its last stage was {last}"

    @property
    def held_by(self) -> str | None:
        """The change that held the node when this change reached it (the last ``held`` line)."""
        held = self.last("held")
        if held is None or (self.entries and self.entries[-1].stage != "held"):
            return None
        return str(held.detail.get("holder") or "another change") if isinstance(held.detail, dict) else "another change"

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
            return "in_progress" if self.unreadable else "not_started"
        if "rolled_back" in stages:
            return "rolled_back"
        if "failed" in stages:
            return "failed"
        if self.unreadable and max(u.offset for u in self.unreadable) > self.entries[-1].offset >= 0:
            # The last thing the host did is the line that cannot be read.
            return "in_progress"
        if stages[-1] == "returned":
            return "upgraded"
        if stages[-1] == "held":
            return "held"
        return "in_progress"

    def last(self, stage: str) -> JournalEntry | None:
        for e in reversed(self.entries):
            if e.stage == stage:
                return e
        return None


def replay(entries: Iterable[JournalEntry], unreadable: Iterable[Unreadable] = ()) -> dict[str, HostHistory]:
    """Per host, in the order hosts first appear; unreadable lines go to the host they name."""
    out: dict[str, HostHistory] = {}
    for e in entries:
        h = out.setdefault(e.host, HostHistory(e.host))
        (h.interruptions if e.interrupted is not None else h.entries).append(e)
    for u in unreadable:
        if u.host is not None:
            out.setdefault(u.host, HostHistory(u.host)).unreadable.append(u)
    return out


def replay_journal(journal: Journal) -> dict[str, HostHistory]:
    return replay(journal.entries, journal.unreadable)


@dataclass
class ResumePlan:
    """What ``k3fleet upgrade --resume`` does with each planned host."""

    done: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def todo(self) -> list[str]:
        return self.resume + self.pending


def _hidden(journal: Journal | None) -> str | None:
    lost = journal.unattributed() if journal is not None else []
    if not lost:
        return None
    return "; ".join(u.describe() for u in lost)


def resume_plan(histories: dict[str, HostHistory], planned: Sequence[str], journal: Journal | None = None
                ) -> ResumePlan:
    """Hosts that returned are done and not touched again; hosts half-way continue from their
    first snapshot; hosts never reached are still to do; failed or rolled-back hosts stop the resume.
    A host whose snapshot cannot be read, or that may hide in a line naming no host, is refused."""
    plan = ResumePlan()
    hidden = _hidden(journal)
    for host in planned:
        h = histories.get(host)
        outcome = h.outcome if h else "not_started"
        if h is not None and outcome == "upgraded":
            plan.done.append(host)
        elif h is not None and outcome in ("failed", "rolled_back"):
            plan.failed[host] = h.failure or outcome.replace("_", " ")
        elif h is not None and h.snapshot_problem:
            plan.refused[host] = h.snapshot_problem
        elif h is not None and outcome == "in_progress" and h.snapshot is not None:
            plan.resume.append(host)
            plan.snapshots[host] = h.snapshot
        elif hidden and (h is None or not h.entries):
            plan.refused[host] = f"not in the readable journal, and a line naming no host cannot be read ({hidden})"
        else:
            # Never reached, stopped before its slot, or held by another change then: do it now.
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


def rollback_targets(histories: dict[str, HostHistory], hosts: Sequence[str] | None = None,
                     journal: Journal | None = None
                     ) -> tuple[list[RollbackTarget], dict[str, str], dict[str, str]]:
    """Hosts that can be rolled back (they have a snapshot), those with nothing to roll back, and
    those refused: a change is recorded (or may hide in an unreadable line) but no snapshot can be read."""
    wanted = list(hosts) if hosts is not None else list(histories)
    hidden = _hidden(journal)
    targets: list[RollbackTarget] = []
    skipped: dict[str, str] = {}
    refused: dict[str, str] = {}
    for host in wanted:
        h = histories.get(host)
        if h is None or (not h.entries and not h.unreadable):
            if hidden:
                refused[host] = f"not in the readable journal, and a line naming no host cannot be read ({hidden})"
            else:
                skipped[host] = "not in the journal"
            continue
        if h.snapshot_problem:
            refused[host] = h.snapshot_problem
            continue
        snap = h.snapshot
        if snap is None:
            if h.held_by is not None:
                skipped[host] = f"held by change {h.held_by} when this change reached it: never changed by it"
            elif hidden:
                refused[host] = (f"no snapshot line (last stage {h.stage}), and a line naming no host cannot be "
                                 f"read ({hidden})")
            else:
                skipped[host] = f"no snapshot line (last stage {h.stage}): nothing was changed on it"
            continue
        if not h.changed_something:
            skipped[host] = f"snapshot only (last stage {h.stage}): the night stopped before touching it"
            continue
        if h.stage == "held" and not h.touched:
            skipped[host] = f"held by change {h.held_by} before anything changed on it"
            continue
        first = h.entries[0]
        targets.append(RollbackTarget(host=host, change_id=first.change_id, run=first.run, snapshot=snap,
                                      drained_by_us=h.drained_by_us, stage=h.stage))
    return targets, skipped, refused


def summarize(histories: dict[str, HostHistory]) -> dict[str, dict[str, Any]]:
    """A JSON-able per-host summary for run.json and the terminal."""
    out: dict[str, dict[str, Any]] = {}
    for host, h in histories.items():
        row: dict[str, Any] = {
            "outcome": h.outcome,
            "stage": h.stage,
            "drained_by_us": h.drained_by_us,
            "failure": h.failure,
            "stages": [e.stage for e in h.entries],
            "started": h.entries[0].ts if h.entries else None,
            "ended": h.entries[-1].ts if h.entries else None,
        }
        if h.unreadable:
            row["unreadable"] = [u.describe() for u in h.unreadable]
        stopped = h.interrupted_at
        if stopped is not None:
            row["interrupted"] = {"stage": stopped.stage, "ts": stopped.ts, **(stopped.interrupted or {})}
        if h.outcome == "held":
            row["failure"] = f"held by change {h.held_by}: not touched by this one"
        out[host] = row
    return out


def journal_now() -> str:
    """A journal line's time stamp, as the journal module writes it (UTC, milliseconds, ``Z``)."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# Where a host stands when a signal stops the play: anything but these is half-way through a change
# or a rollback (docs/change-night.md "Interrupted").
_AT_REST = ("returned", "rolled_back", "held")


def mark_interrupted(path: Path, histories: dict[str, HostHistory], hosts: Sequence[str], *, run: str,
                     signal: str | None, during: str, next_step: str, now: str) -> list[dict[str, Any]]:
    """Append, for every host of ``hosts`` that the journal shows half-way, one line at the stage it
    was in, saying the play was stopped there (by ``signal``, during ``during``) and what continues it.
    Returns the lines written (they go through the journal's one writer: lock, redactor, fsync)."""
    written: list[dict[str, Any]] = []
    for host in hosts:
        h = histories.get(host)
        if h is None or not h.entries or h.stage in _AT_REST:
            continue
        last = h.entries[-1]
        line = {"ts": now, "run": run, "change_id": last.change_id, "host": host, "stage": last.stage,
                "detail": None,
                "interrupted": {"signal": signal or "unknown", "during": during, "next": next_step}}
        append_line(str(path), line)
        written.append(line)
    return written
