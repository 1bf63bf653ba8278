"""Merge audit slices into one run directory with one verdict over the whole fleet.

A fleet too large for one controller is audited in slices: several `k3fleet audit` runs, or an
AWX / Automation Controller sliced job (each slice an ansible-runner job). Inputs, any mix:

- a k3fleet audit run directory (facts/, run.json): verified against its manifest first; a
  slice that does not match is refused (exit 3), one without a manifest never finished (exit 3);
- an ansible-runner artifact directory (``artifacts/<ident>/`` with ``job_events/``, or the
  private data directory above it, or ``artifacts/``): the facts the audit play published with
  ``set_stats`` (``k3fleet_audit`` in the stats event's artifact data) or, failing that, the
  module results in the job events; unreachable and failed hosts from the events;
- a JSON file of job artifacts as AWX shows them (``{"k3fleet_audit": {...}}``).

A host seen in more than one slice: an observation from a slice verified against its manifest
outranks any from a slice that cannot be verified (runner artifacts, an artifacts file: anyone can
write one, with any date), whatever their timestamps; among equals the newest wins (the facts'
``collected_at``, else the slice's start), ties go to the later argument. Every such choice is
recorded in ``merge.json``, with why each other observation was ignored. A timestamp that is not
a finite, sane time (NaN, infinite, out of range, before 2000, or more than ``CLOCK_SKEW_S`` in
the future) refuses its slice (exit 2): it must never win by being large. The verdict is the same
pure function the audit uses, over the union (docs/scale.md).

The merge streams (docs/scale.md "Merging 100,000 hosts"): a run directory's facts stay on disk; a slice
is read as its host names (the facts files' names) and outcomes, a host seen in more than one slice
has its facts read for their time, and the chosen hosts' facts are then read one at a time into the
streaming verdict (:class:`k3fleet.verdict.FleetFold`, which keeps a node kind's facts once) and, in
a second pass once the checks have passed, into the merge's run directory. What is held per host is
its observation (names, time, where from) and its share of the verdict, not its facts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as _dt
import math
import multiprocessing
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3fleet.audit.run import AuditResult, verdict_document
from k3fleet.audit.runner import RESULT_KEY, PlayResult, module_result
from k3fleet.bounds import read_input, read_json
from k3fleet.contracts import EXIT_INCOMPLETE, EXIT_OK, combine
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import RunDir, layout, verify_run
from k3fleet.evidence.reader import RunReader
from k3fleet.models.evidence import MergeRunRecord, RunRecord
from k3fleet.models.facts import schema_mismatch
from k3fleet.models.findings import FleetVerdict
from k3fleet.models.target import Target
from k3fleet.report import markdown
from k3fleet.targets import load_target
from k3fleet.verdict import FleetFold
from k3fleet.verdict.intake import gc_paused

# What the audit play publishes with set_stats (playbooks/audit.yml).
ARTIFACT_KEY = "k3fleet_audit"
_RUNNER_OK = "runner_on_ok"
_RUNNER_FAILED = "runner_on_failed"
_RUNNER_UNREACHABLE = "runner_on_unreachable"
_STATS = "playbook_on_stats"
_EPOCH = "1970-01-01T00:00:00+00:00"
# How far ahead of the controller's clock a node's or a slice's time may be (NTP drift, a slow sync).
CLOCK_SKEW_S = 300.0
# Older than this is no audit of a GPU fleet for this tool: a zeroed clock or a made-up date.
_OLDEST = _dt.datetime(2000, 1, 1, tzinfo=_dt.UTC)


@dataclass(slots=True)
class Observation:
    """What one slice says about one host."""

    host: str
    kind: str  # facts | unreachable | invalid
    when: str  # ISO 8601, UTC
    source: str
    facts: dict[str, Any] | None = None
    reason: str | None = None
    # Whether it comes from a run directory that matched its manifest (and, through a merge run,
    # from a verified slice): a verified observation outranks any unverified one.
    verified: bool = False
    # A run directory's facts file, read when needed (never held for the whole fleet): until
    # :func:`settle` reads it, ``when`` is the slice's start and ``kind`` is "facts".
    run: RunReader | None = None
    settled: bool = True

    def raw_facts(self) -> Any:
        """The facts as the node returned them (read again from the slice for a run directory)."""
        return self.facts if self.run is None else self.run.raw_facts(self.host)


def settle(obs: Observation, started: str) -> Any:
    """Read a run directory's facts for ``obs``: its time (collected_at) and whether they are of this
    schema decide its kind and ``when``, as for facts read at once; returns the facts (not kept)."""
    data = obs.raw_facts()
    if not obs.settled:
        read = _facts_observation(obs.host, data, started, obs.source, verified=obs.verified)
        obs.kind, obs.when, obs.reason, obs.settled = read.kind, read.when, read.reason, True
    return data


@dataclass
class Slice:
    """One input: where it came from, whether it was verified, what it says per host."""

    source: str
    kind: str  # run | runner | artifacts
    verified: str  # "manifest ok" or why no manifest could be checked
    status: str
    started_at: str
    observations: list[Observation] = field(default_factory=list)
    target: Target | None = None  # the Target the slice was audited against (a run directory keeps it)
    wall_s: float | None = None

    @property
    def complete(self) -> bool:
        return self.status in ("successful", "failed")


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, float) else format(value, "g")
    return text if len(text) <= 60 else text[:57] + "..."


def _iso(value: Any, fallback: str, what: str, *, now: _dt.datetime | None = None) -> str:
    """A comparable UTC timestamp: ``fallback`` when ``value`` is absent; a UsageError naming
    ``what`` when it is there but not a finite, sane time (it would decide who wins)."""
    if value is None or value == "":
        return fallback
    now = now or _dt.datetime.now(_dt.UTC)
    why = None
    parsed: _dt.datetime | None = None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        why = f"a {type(value).__name__}, not a time"
    elif isinstance(value, int | float):
        if not math.isfinite(value):
            why = "not a finite number"
        else:
            try:
                parsed = _dt.datetime.fromtimestamp(value, _dt.UTC)
            except (OverflowError, OSError, ValueError):
                why = "out of the range of a date"
    else:
        try:
            parsed = _dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=_dt.UTC)
            parsed = parsed.astimezone(_dt.UTC)
        except (ValueError, OverflowError):
            why = "not an ISO 8601 time"
    if parsed is not None:
        if parsed < _OLDEST:
            why = "before 2000: a clock that was never set"
        elif (ahead := (parsed - now).total_seconds()) > CLOCK_SKEW_S:
            span = f"{ahead:.0f}s" if ahead < 2 * 86400 else f"{ahead / 86400:.0f} days"
            why = f"{span} ahead of this controller's clock (more than the {CLOCK_SKEW_S:.0f}s allowed for skew)"
    if why is not None or parsed is None:
        raise UsageError(f"{what} {_show(value)}: {why}: the slice is refused (a newer time would win the merge)")
    return parsed.isoformat(timespec="seconds")


def _facts_observation(host: str, data: Any, when: str, source: str, *, verified: bool = False) -> Observation:
    """Facts as the node returned them, or invalid evidence when the schema's major version differs."""
    if not isinstance(data, Mapping):
        return Observation(host, "invalid", when, source, verified=verified,
                           reason=f"host {host}: facts are {type(data).__name__}, not an object")
    stamp = _iso(data.get("collected_at"), when, f"slice {source}: host {host}: collected_at")
    mismatch = schema_mismatch(host, dict(data))
    if mismatch:
        return Observation(host, "invalid", stamp, source, verified=verified, reason=mismatch)
    return Observation(host, "facts", stamp, source, facts=dict(data), verified=verified)


# -- a k3fleet audit run directory -------------------------------------------------------------


def read_run(path: Path) -> Slice:
    report = verify_run(path)
    # A tampered or unfinished slice must not vote in the fleet's verdict.
    report.raise_if_bad()
    run = RunReader(path)
    command = run.command
    if command.kind not in ("audit", "merge"):
        raise UsageError(f"{path} is a {command.kind} run, not an audit: only audit runs can be merged")
    record = run.model(layout.RUN, RunRecord)
    src = str(path)
    started = _iso(command.started_at, _EPOCH, f"slice {src}: {layout.COMMAND} started_at")
    wall = record.wall_s
    sl = Slice(source=src, kind="run", verified=f"{layout.MANIFEST} ok",
               status=record.status if record.status is not None else "unknown", started_at=started,
               wall_s=wall if wall is not None and math.isfinite(wall) else None)
    trusted = _verified_hosts(run) if command.kind == "merge" else None

    def verified(host: str) -> bool:
        return trusted is None or host in trusted

    for host in run.fact_hosts():
        # As the node returned them, read when needed (settle): a merge validates the union
        # (k3fleet.verdict), and facts of another schema are evidence that is invalid, not a broken slice.
        sl.observations.append(Observation(host, "facts", started, src, verified=verified(host), run=run,
                                           settled=False))
    for entries, kind in ((record.unreachable, "unreachable"), (record.invalid_evidence, "invalid")):
        for host, why in entries.items():
            sl.observations.append(Observation(host, kind, started, src, reason=why, verified=verified(host)))
    sl.target = run.target()
    return sl


def _verified_hosts(run: RunReader) -> set[str]:
    """The hosts a merge run took from verified slices: a manifest over merged facts proves only that
    the merge wrote them, not where they came from, so the rest stay unverified."""
    record = run.json(layout.MERGE) if run.has(layout.MERGE) else None
    marks = record.get("verified_of") if isinstance(record, dict) else None
    if not isinstance(marks, dict):
        return set()  # an older merge run: it did not record where its hosts came from
    return {str(h) for h, v in marks.items() if v is True}


# -- ansible-runner artifacts ------------------------------------------------------------------


def _runner_job_dirs(path: Path) -> list[Path]:
    """The ``artifacts/<ident>`` directories under ``path`` (itself one, ``artifacts/``, or the private data dir)."""
    if (path / "job_events").is_dir():
        return [path]
    base = path / "artifacts" if (path / "artifacts").is_dir() else path
    return sorted(p for p in base.iterdir() if p.is_dir() and (p / "job_events").is_dir())


def _events(job: Path) -> list[dict[str, Any]]:
    events = []
    for p in (job / "job_events").glob("*.json"):
        data = read_json(p, f"runner artifacts {job}: event", kind="an ansible-runner job event")
        if not isinstance(data, dict):
            continue
        counter = data.get("counter", 0)
        if isinstance(counter, bool) or not isinstance(counter, int):
            raise UsageError(f"runner artifacts {job}: event {p.name}: counter {_show(counter)} is not an integer "
                             "(ansible-runner numbers its events)")
        event_data = data.get("event_data")
        if event_data is not None and not isinstance(event_data, dict):
            raise UsageError(f"runner artifacts {job}: event {p.name}: event_data is a {type(event_data).__name__}, "
                             "not an object")
        events.append(data)
    return sorted(events, key=lambda e: int(e.get("counter") or 0))


def _status(job: Path) -> str:
    """The job's ``status`` file (one word, ``successful``), or ``unknown`` when there is none."""
    status_file = job / "status"
    if not status_file.is_file():
        return "unknown"
    data = read_input(status_file, "runner artifacts", kind="an ansible-runner status file", max_bytes=4096,
                      text=True)
    try:
        return data.decode("utf-8").strip() or "unknown"
    except UnicodeDecodeError as exc:
        raise UsageError(f"runner artifacts {status_file} is not UTF-8 text (byte {exc.start}): not an "
                         "ansible-runner status file") from exc


def _artifact_observations(artifact: Any, when: str, src: str) -> list[Observation]:
    """Observations of a published artifact: from a file anyone can write, so never verified."""
    if not isinstance(artifact, Mapping) or not isinstance(artifact.get("facts"), Mapping):
        raise UsageError(f"{src}: {ARTIFACT_KEY} has no facts object (was it published by playbooks/audit.yml?)")
    return [_facts_observation(str(host), data, when, src) for host, data in artifact["facts"].items()]


def read_runner_job(job: Path) -> Slice:
    src = str(job)
    events = _events(job)
    if not events:
        raise UsageError(f"runner artifacts {job}: no job events (ansible-runner wrote none, or they were removed)")
    status = _status(job)
    started = _iso(events[0].get("created"), _EPOCH, f"slice {src}: event created")
    sl = Slice(source=src, kind="runner", verified="no manifest: ansible-runner artifacts (not verifiable)",
               status=status, started_at=started)
    published: Any = None
    from_events: dict[str, Observation] = {}
    for event in events:
        name = event.get("event")
        data = event.get("event_data") or {}
        when = _iso(event.get("created"), started, f"slice {src}: event created")
        if name == _STATS:
            artifact_data = data.get("artifact_data") or {}
            if not isinstance(artifact_data, Mapping):
                raise UsageError(f"runner artifacts {job}: the stats event's artifact_data is a "
                                 f"{type(artifact_data).__name__}, not an object")
            artifact = artifact_data.get(ARTIFACT_KEY)
            if artifact is not None:
                published = artifact
            continue
        host = data.get("host")
        if not host:
            continue
        host = str(host)
        raw_res = data.get("res")
        res, unreadable = module_result(raw_res) if isinstance(raw_res, dict) else ({}, None)
        # ansible-core 2.19 prefixes task errors with this; the audit drops it too (k3fleet.audit.runner).
        msg = " ".join(str(res.get("msg") or "").split()).removeprefix("Task failed: ")[:400] or None
        if name == _RUNNER_OK and unreadable:
            from_events[host] = Observation(host, "invalid", when, src,
                                            reason=f"host {host}: the module's facts cannot be read: {unreadable}")
        elif name == _RUNNER_OK and RESULT_KEY in res:
            from_events[host] = _facts_observation(host, res[RESULT_KEY], when, src)
        elif name == _RUNNER_UNREACHABLE:
            from_events[host] = Observation(host, "unreachable", when, src, reason=msg or "unreachable")
        elif name == _RUNNER_FAILED and not data.get("ignore_errors"):
            kind = "unreachable" if msg and "timed out after" in msg.lower() else "invalid"
            reason = f"timed out: {msg}" if kind == "unreachable" else f"host {host}: failed: {msg or 'no message'}"
            from_events[host] = Observation(host, kind, when, src, reason=reason)
    if published is not None:
        observed = {o.host: o for o in _artifact_observations(published, started, src)}
        # Hosts without published facts keep what their events said (unreachable, failed).
        for host, obs in from_events.items():
            observed.setdefault(host, obs)
        sl.observations = list(observed.values())
    else:
        sl.observations = list(from_events.values())
    return sl


def read_artifacts_file(path: Path) -> Slice:
    """A JSON file of job artifacts, as AWX shows a job's `artifacts`."""
    data = read_json(path, "artifacts file", kind="a JSON file of job artifacts")
    if not isinstance(data, Mapping) or ARTIFACT_KEY not in data:
        raise UsageError(f"{path}: not k3fleet job artifacts (no {ARTIFACT_KEY} key)")
    artifact = data[ARTIFACT_KEY]
    src = str(path)
    started = _iso(artifact.get("published_at") if isinstance(artifact, Mapping) else None,
                   _iso(path.stat().st_mtime, _EPOCH, f"slice {src}: file time"), f"slice {src}: published_at")
    sl = Slice(source=src, kind="artifacts", verified="no manifest: job artifacts (not verifiable)",
               status="successful", started_at=started)
    sl.observations = _artifact_observations(artifact, started, src)
    return sl


def read_slice(path: Path) -> list[Slice]:
    """Every slice found at ``path`` (an ansible-runner private data dir can hold several jobs)."""
    if not path.exists():
        raise UsageError(f"{path} does not exist: give audit run directories or ansible-runner artifact directories")
    if path.is_file():
        return [read_artifacts_file(path)]
    if (path / layout.COMMAND).is_file() or (path / layout.MANIFEST).is_file():
        return [read_run(path)]
    jobs = _runner_job_dirs(path)
    if jobs:
        return [read_runner_job(job) for job in jobs]
    raise UsageError(f"{path}: neither a k3fleet audit run directory (command.json) nor ansible-runner "
                     "artifacts (job_events/)")


# -- merging -----------------------------------------------------------------------------------


@dataclass
class Merged:
    slices: list[Slice]
    chosen: dict[str, Observation]
    duplicates: list[dict[str, Any]]
    # (host, ignored source, why): an unverified observation a verified one outranked, whatever its time.
    overruled: list[tuple[str, str, str]] = field(default_factory=list)


MERGE_RULE = ("an observation from a slice verified against its manifest outranks any unverified one; among "
              "equals the newest wins (facts collected_at, else the slice's start); ties: the later input")


def _why_dropped(o: Observation, kept: Observation, trust: Mapping[str, str]) -> str:
    if kept.verified and not o.verified:
        return f"not verifiable ({trust.get(o.source, 'no manifest')}); {kept.source} is verified"
    if o.when < kept.when:
        return f"older ({o.when}) than {kept.source} ({kept.when})"
    return f"same time as {kept.source}, which was listed later"


def _settle_repeated(slices: Sequence[Slice]) -> None:
    """Read the facts times of the hosts seen in more than one slice: only they need one to choose."""
    count: dict[str, int] = {}
    for sl in slices:
        for obs in sl.observations:
            count[obs.host] = count.get(obs.host, 0) + 1
    for sl in slices:
        for obs in sl.observations:
            if not obs.settled and count[obs.host] > 1:
                settle(obs, sl.started_at)


def merge_slices(slices: Sequence[Slice]) -> Merged:
    _settle_repeated(slices)
    chosen: dict[str, Observation] = {}
    seen: dict[str, list[Observation]] = {}
    for sl in slices:
        for obs in sl.observations:
            seen.setdefault(obs.host, []).append(obs)
            current = chosen.get(obs.host)
            # Verified first, then newer; on a tie the later input wins (the operator listed it last).
            if current is None or (obs.verified, obs.when) >= (current.verified, current.when):
                chosen[obs.host] = obs
    trust = {sl.source: sl.verified for sl in slices}
    duplicates = []
    overruled = []
    for host, all_obs in sorted(seen.items()):
        if len(all_obs) < 2:
            continue
        kept = chosen[host]
        dropped = []
        for o in all_obs:
            if o is kept:
                continue
            why = _why_dropped(o, kept, trust)
            dropped.append({"source": o.source, "kind": o.kind, "when": o.when, "verified": o.verified, "why": why})
            if kept.verified and not o.verified:
                overruled.append((host, o.source, why))
        duplicates.append({
            "host": host,
            "kept": {"source": kept.source, "kind": kept.kind, "when": kept.when, "verified": kept.verified},
            "dropped": dropped,
            "rule": MERGE_RULE,
        })
    return Merged(list(slices), chosen, duplicates, overruled)


def _target_of(slices: Sequence[Slice], target_path: Path | None) -> Any:
    recorded = [(sl.source, sl.target) for sl in slices if sl.target is not None]
    if target_path is not None or not recorded:
        # --target, or (no slice records one) the CLI's default, the packaged target.
        return load_target(target_path)
    first_src, first = recorded[0]
    for src, other in recorded[1:]:
        if other != first:
            raise UsageError(f"slices were audited against different targets ({first_src} and {src}): "
                             "give --target to judge them all by one")
    return first


@dataclass
class MergeResult:
    run_dir: RunDir
    verdict: FleetVerdict
    merged: Merged
    unreachable: dict[str, str]
    invalid: dict[str, str]
    exit_code: int


def run_merge(inputs: Sequence[Path], argv: Sequence[str], *, out: Path | None = None,
              runs_dir: Path = Path("runs"), target: Path | None = None) -> MergeResult:
    """Read, verify and merge the slices; write one run directory with one verdict."""
    if not inputs:
        raise UsageError("give at least one audit run directory or ansible-runner artifact directory")
    slices = [sl for path in inputs for sl in read_slice(Path(path))]
    tgt = _target_of(slices, target)
    merged = merge_slices(slices)
    started = {sl.source: sl.started_at for sl in slices}
    unreachable = {h: o.reason or "unreachable" for h, o in merged.chosen.items() if o.kind == "unreachable"}
    invalid = {h: o.reason or "invalid evidence" for h, o in merged.chosen.items() if o.kind == "invalid"}
    # First pass, before anything is written (a refused time writes nothing): each chosen host's facts
    # read, checked and folded into the verdict, one at a time. A run directory's facts of another
    # schema turn out invalid here; the fold reads ``invalid`` when it gives its verdict.
    fold = FleetFold(tgt, unreachable, invalid=invalid)
    with gc_paused(freeze=True):
        for host in sorted(merged.chosen):
            obs = merged.chosen[host]
            if obs.kind != "facts":
                continue
            data = settle(obs, started[obs.source])
            if obs.kind == "invalid":
                invalid[host] = obs.reason or "invalid evidence"
                continue
            fold.add(host, {**data, "host": host})
            del data
        verdict = fold.verdict()
    invalid = fold.invalid

    rd = RunDir.create(runs_dir, "merge", argv, out=out)
    sources = [{"source": sl.source, "kind": sl.kind, "verified": sl.verified, "status": sl.status,
                "started_at": sl.started_at, "hosts": len(sl.observations),
                "facts": sum(1 for o in sl.observations if o.kind == "facts")} for sl in slices]
    rd.write_json(layout.SOURCES, sources)
    rd.write_json(layout.TARGET, tgt.model_dump(mode="json"))
    # Second pass: the facts into the run directory, one host at a time, beside the verdict and the report
    # (by forked writers for a large merge); synced once, before the manifest, not file by file.
    with facts_written(rd, merged.chosen):
        _write_records(rd, slices, merged, verdict, fold, tgt, unreachable, invalid, sources)
    rd.write_manifest()
    incomplete = [sl.source for sl in slices if not sl.complete]
    code = combine(int(verdict.exit_code), EXIT_INCOMPLETE if invalid or incomplete else EXIT_OK)
    return MergeResult(rd, verdict, merged, unreachable, invalid, code)


def _write_records(rd: RunDir, slices: Sequence[Slice], merged: Merged, verdict: FleetVerdict, fold: FleetFold,
                   tgt: Target, unreachable: dict[str, str], invalid: dict[str, str],
                   sources: list[dict[str, Any]]) -> None:
    """merge.json, verdict.json, run.json and report.md of a merge."""
    rd.write_json(layout.MERGE, {
        "slices": len(slices),
        "hosts": len(merged.chosen),
        "duplicates": merged.duplicates,
        "source_of": {h: o.source for h, o in sorted(merged.chosen.items())},
        # Read back when this run is merged again: only these hosts keep their verified rank.
        "verified_of": {h: o.verified for h, o in sorted(merged.chosen.items())},
    })
    incomplete = [sl.source for sl in slices if not sl.complete]
    code = combine(int(verdict.exit_code), EXIT_INCOMPLETE if invalid or incomplete else EXIT_OK)
    wall = sum(sl.wall_s for sl in slices if sl.wall_s is not None)
    play = PlayResult(playbook="audit.yml", status="merged", rc=None, wall_s=wall, interrupted=bool(incomplete))
    result = AuditResult(rd, verdict, fold.measured, unreachable, invalid, play)
    rd.write_json(layout.VERDICT, verdict_document(verdict))
    rd.write_json(layout.RUN, MergeRunRecord(
        status="merged",
        slices=sources,
        incomplete_slices=incomplete,
        hosts_total=len(merged.chosen),
        hosts_with_facts=fold.measured,
        unreachable=unreachable,
        invalid_evidence=invalid,
        duplicates=len(merged.duplicates),
        slices_wall_s=round(wall, 3),
        exit_code=code,
    ).dump())
    rd.write_text(layout.REPORT, markdown.render_audit(result, tgt))


# A merge of fewer hosts writes their facts in this process: starting writers costs more than it saves.
POOL_MIN_HOSTS = 4000
# Hosts a writer is given at a time: what is queued for the writers is names and paths, never facts.
_POOL_CHUNK = 200
# The run directory the writers write into: set in this process before they are forked from it.
_WRITING: RunDir | None = None


def _write_run_facts(items: Sequence[tuple[str, str]]) -> int:
    """Write these (host, slice run directory) facts into ``_WRITING``: read, redacted, written."""
    rd = _WRITING
    assert rd is not None  # set before the writers are forked
    readers: dict[str, RunReader] = {}
    for host, path in items:
        run = readers.get(path) or readers.setdefault(path, RunReader(Path(path)))
        raw, data = run.raw_facts_read(host)
        # A slice's file the redactor leaves as it is is written as read, not encoded again (write_json read_as).
        rd.write_json(layout.facts_file(host), data, durable=False, read_as=raw)
    return len(items)


def _chunks(items: Sequence[tuple[str, str]], size: int) -> Iterator[Sequence[tuple[str, str]]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _writers() -> int:
    """Processes that write a merge's facts: one per CPU this process may run on, at most 4 (each is a
    fork of this process), and none where fork is not available (then this process writes them)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def write_facts(rd: RunDir, chosen: Mapping[str, Observation], *, writers: int | None = None) -> None:
    """:func:`facts_written` with nothing else to do meanwhile."""
    with facts_written(rd, chosen, writers=writers):
        pass


@contextlib.contextmanager
def facts_written(rd: RunDir, chosen: Mapping[str, Observation], *, writers: int | None = None) -> Iterator[None]:
    """The chosen hosts' facts into the merge's run directory, each through the redactor (RunDir.write_json),
    without an fsync per file (the manifest syncs them once), all written when the block ends.

    A run directory's facts are read and written by ``writers`` processes forked on entry when there are
    many (each holds one host's facts at a time, and what is queued for them is names and paths), so the
    block (the verdict and report files) runs beside them; facts read from runner artifacts are in memory
    already and are written here. A writer's error is raised when the block ends."""
    global _WRITING
    in_runs = [(h, str(o.run.path)) for h, o in sorted(chosen.items()) if o.kind == "facts" and o.run is not None]
    for host, obs in sorted(chosen.items()):
        if obs.kind == "facts" and obs.run is None:
            rd.write_json(layout.facts_file(host), obs.facts, durable=False)
    n = _writers() if writers is None else writers
    _WRITING = rd
    try:
        if n < 2 or (len(in_runs) < POOL_MIN_HOSTS and writers is None):
            _write_run_facts(in_runs)
            yield
            return
        with concurrent.futures.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
            done = [pool.submit(_write_run_facts, chunk) for chunk in _chunks(in_runs, _POOL_CHUNK)]
            try:
                yield
                for future in done:
                    future.result()
            except concurrent.futures.process.BrokenProcessPool as exc:
                # A writer killed (out of memory, a signal): its hosts' facts may be missing.
                raise IncompleteError(f"a process writing the merged facts into {rd.path} ended before it was "
                                      "done (killed?): the merged run is incomplete") from exc
            finally:
                for future in done:
                    future.cancel()
        rd.note_unsynced()
    finally:
        _WRITING = None


def check_inputs_exist(inputs: Sequence[Path]) -> None:
    missing = [str(p) for p in inputs if not Path(p).exists()]
    if missing:
        raise UsageError(f"no such slice: {', '.join(missing)}")


__all__ = ["ARTIFACT_KEY", "IncompleteError", "MergeResult", "Observation", "Slice", "check_inputs_exist",
           "merge_slices", "read_slice", "run_merge", "write_facts"]
