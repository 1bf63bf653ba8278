"""The one reader of run directories: checked against the manifest first, then each file as a typed record.

Every command that reads evidence back (decide, report, merge, watch, a change night's resume and
rollback) reads through here, by the names of :mod:`k3fleet.evidence.layout`. ``open_run`` refuses
what is not a run (exit 2), a run that does not match its manifest (exit 3) and a run of a kind the
command does not read (exit 2); a ``RunReader`` then turns each file into a validated model:
``command.json`` into :class:`CommandRecord`, ``run.json`` into ``k3fleet.models.evidence.RunRecord``, the verdict,
the target and each host's facts into the audit's own models (``k3fleet.models``), any other file
into the model its flow gives (``model``). A file that is missing or cannot be read is one line and
exit 3 (the evidence is incomplete); one that is not UTF-8, not JSON, not an object or not of its
model's shape is one line naming the run, the file and the field, exit 2 (docs/safety.md "Exit codes
of bad input"). ``RunReader`` is the one class that reads a run directory back: ``RunDir`` writes one.
"""

from __future__ import annotations

import builtins
import errno
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from k3fleet.bounds import loads_json, read_bounded
from k3fleet.errors import IncompleteError, UsageError, validation_line
from k3fleet.evidence import layout
from k3fleet.evidence.verify import verify_run
from k3fleet.models.evidence import RunRecord
from k3fleet.models.facts import HostFacts, readable_schema
from k3fleet.models.findings import FleetVerdict
from k3fleet.models.target import Target

M = TypeVar("M", bound=BaseModel)


class RunVerificationError(IncompleteError):
    """A run whose files do not match its manifest: tampered or incomplete evidence."""


class CommandRecord(BaseModel):
    """``command.json`` as ``RunDir.create`` writes it; a run adds the choices it started with."""

    model_config = ConfigDict(extra="allow")

    kind: str | None = None
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    k3fleet_version: str | None = None
    user: str | None = None
    controller: str | None = None
    started_at: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    operator: str | None = Field(default=None, description="an explicit --operator the run recorded")


class RunReader:
    """One run directory, read through typed records (``open_run`` checks it first)."""

    def __init__(self, path: Path, label: str | None = None) -> None:
        self.path = Path(path)
        self.label = label or self.path.name

    # -- files ------------------------------------------------------------------------------------

    def has(self, rel: str) -> bool:
        return (self.path / rel).is_file()

    def bytes(self, rel: str) -> bytes:
        """``rel`` as bytes, read under the run-file cap. The one exit for a file that is missing or
        cannot be read: exit 3, the run directory is incomplete. One that is there but is no run file
        (a directory, a device or FIFO, above the cap) is bad input: exit 2."""
        try:
            return read_bounded(self.path / rel, "run_json")
        except FileNotFoundError as exc:
            raise IncompleteError(f"run {self.label}: {rel} is missing: the run directory is incomplete") from exc
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno in (errno.EISDIR, errno.EINVAL, errno.EFBIG):
                raise UsageError(f"run {self.label}: {rel} is not a run file: {why}") from exc
            raise IncompleteError(f"run {self.label}: {rel} cannot be read ({why}): the run directory is "
                                  "incomplete") from exc

    def json(self, rel: str) -> Any:
        """``rel`` parsed as JSON (exit 2 when it is not UTF-8 or not JSON)."""
        return self.json_read(rel)[1]

    def json_read(self, rel: str) -> tuple[builtins.bytes, Any]:
        """``rel`` as read (its bytes) and parsed as JSON (exit 2 when it is not UTF-8 or not JSON)."""
        raw = self.bytes(rel)
        return raw, self._parsed(rel, raw)

    def _parsed(self, rel: str, raw: builtins.bytes) -> Any:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"run {self.label}: {rel} is not UTF-8 text (byte {exc.start}): not a k3fleet "
                             "file") from exc
        try:
            return loads_json(text)
        except ValueError as exc:
            raise UsageError(f"run {self.label}: {rel} is not valid JSON ({exc})") from exc

    def object(self, rel: str) -> dict[str, Any]:
        """``json`` for a file that must hold a JSON object."""
        data = self.json(rel)
        if not isinstance(data, dict):
            raise UsageError(f"run {self.label}: {rel} holds a JSON {type(data).__name__}, expected an object")
        return data

    def invalid(self, rel: str, exc: ValidationError) -> UsageError:
        """The one line for a file (or a part of one) that does not have its model's shape."""
        return UsageError(f"run {self.label}: {rel}: {validation_line(exc)}")

    def model(self, rel: str, model: type[M], **extra: Any) -> M:
        """``rel`` validated as ``model`` (``extra``: fields the file leaves to its place, such as a
        facts file's host)."""
        data = self.object(rel)
        try:
            return model.model_validate({**data, **extra} if extra else data)
        except ValidationError as exc:
            raise self.invalid(rel, exc) from exc

    def rows(self, rel: str) -> list[dict[str, Any]]:
        """The JSON objects of a JSON-lines file; a line that is not one (a torn last line) is left out."""
        rows: list[dict[str, Any]] = []
        for line in self.bytes(rel).decode("utf-8", errors="replace").splitlines():
            try:
                row = loads_json(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def file_count(self) -> int:
        return sum(1 for p in self.path.rglob("*") if p.is_file())

    # -- the records every kind shares ----------------------------------------------------------

    @cached_property
    def command(self) -> CommandRecord:
        return self.model(layout.COMMAND, CommandRecord)

    @property
    def kind(self) -> str | None:
        return self.command.kind

    def run_record(self) -> RunRecord | None:
        """``run.json``, or None for a run that has none (it stopped before it ended, or writes none)."""
        return self.model(layout.RUN, RunRecord) if self.has(layout.RUN) else None

    # -- audit ------------------------------------------------------------------------------------

    def verdict(self) -> FleetVerdict:
        return self.model(layout.VERDICT, FleetVerdict)

    def target(self) -> Target | None:
        """The target the run judged against (``inputs/target.json``), when it kept one."""
        return self.model(layout.TARGET, Target) if self.has(layout.TARGET) else None

    def fact_hosts(self) -> list[str]:
        """The hosts with a facts file, by name (decoded from the file names)."""
        folder = self.path / layout.FACTS
        if not folder.is_dir():
            return []
        return [layout.host_from_file_name(p.stem) for p in sorted(folder.glob("*.json"))]

    def raw_facts(self, host: str) -> Any:
        """A host's facts file as the node returned it, before validation (a merge re-judges it)."""
        return self.json(layout.facts_file(host))

    def raw_facts_read(self, host: str) -> tuple[builtins.bytes, Any]:
        """``raw_facts`` with the file's bytes as read (a merge writes them again when the redactor
        leaves them as they are, ``RunDir.write_json(..., read_as=)``)."""
        return self.json_read(layout.facts_file(host))

    def facts(self, host: str) -> HostFacts | None:
        """A host's facts validated as the audit validates them; None when the run has no facts file
        for it, or when its facts are of another schema or do not validate (the verdict already
        counts such a host as evidence incomplete)."""
        rel = layout.facts_file(host)
        if not self.has(rel):
            return None
        data = self.object(rel)
        if not readable_schema(data):
            return None
        try:
            return HostFacts.model_validate({**data, "host": host})
        except ValidationError:
            return None


def verify(path: Path) -> list[str]:
    """Differences between a run directory and its manifest (empty: intact)."""
    return verify_run(path).problems


def open_run(path: Path, kinds: Sequence[str] | None, reads: str, *, label: str | None = None) -> RunReader:
    """A run directory checked against its manifest, of one of ``kinds`` (``reads``: who reads it,
    for the refusal: "decide reads", "report renders"; ``kinds`` None: any kind, the caller asks)."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory")
    if not (path / layout.COMMAND).is_file():
        raise UsageError(f"{path} is not a k3fleet run directory (no {layout.COMMAND})")
    run = RunReader(path, label)
    problems = verify(path)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise RunVerificationError(f"run {run.label} does not match its manifest: {'; '.join(problems[:3])}{more}")
    if kinds is not None and run.kind not in kinds:
        raise UsageError(f"run {run.label} is of kind {run.kind!r}; {reads} {', '.join(kinds)} runs")
    return run
