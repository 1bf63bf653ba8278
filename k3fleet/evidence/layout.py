"""Every name in a run directory, once (docs/architecture.md "Contracts", "The run directory").

Writers name their files through these (``rd.write_json(layout.VERDICT, ...)``) and so does the one
reader (:mod:`k3fleet.evidence.reader`): a file name spelled out anywhere else is a second copy of
this contract. Per-host files are named by percent-encoding the host (``host_file_name``), so a
host name never leaves its folder.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from k3fleet.errors import UsageError

# -- every run ------------------------------------------------------------------------------------
COMMAND = "command.json"  # claimed first (O_EXCL): the run's kind, argv, user, start
MANIFEST = "manifest.json"  # sha256 of every other file, written last
RUN = "run.json"  # how the run ended: status, exit code, per-host outcomes
REPORT = "report.md"
EVENTS_STEM = "events"  # events.jsonl: the play's events, as k3fleet.audit.runner keeps them (events-<tag>.jsonl)
INPUTS = "inputs"
TARGET = f"{INPUTS}/target.json"  # the target judged against, validated
TARGET_SOURCE = f"{INPUTS}/target.yaml"  # the target file as given
ANSIBLE = "ansible"  # the play's redacted output (k3fleet.audit.runner; ansible-<tag> for a later play)
RUNNER_SUMMARY = "runner.json"  # inside the play's output folder
RUNNER_STDOUT = "stdout.txt"  # inside the play's output folder: the play's redacted stdout

# -- audit and merge ------------------------------------------------------------------------------
FACTS = "facts"  # facts/<host>.json: what each node returned
VERDICT = "verdict.json"
PAIRS = "pairs.json"  # audit --active full: the NCCL pair test's schedule and every pair's run
PAIRS_PLAY = "pairs"  # its rounds' plays: ansible-pairs-<round>/, events-pairs-<round>.jsonl
MERGE = "merge.json"  # which slice each host came from, and why the others were ignored
SOURCES = f"{INPUTS}/sources.json"  # the merged slices

# -- change night and rollback --------------------------------------------------------------------
CHANGE = "change.json"  # the night as planned
CHECK = "check.json"  # upgrade --check: what each host would go through
JOURNAL = "journal.jsonl"  # one fsync'd line per stage transition
ROLLBACK = "rollback.json"
SNAPSHOTS = "snapshots"  # snapshots/<host>.json: each host's state before the change
GATE_AUDIT = "audit"  # the fresh audit the gate runs, a run directory inside the change run
RESUME_PREFIX = "resume-"  # resume-<n>.json and the n-th resume's play, events and gate audit

# -- acceptance -----------------------------------------------------------------------------------
ACCEPT = "accept.json"  # the endpoint, which probes ran, the exit code
# The probes and the files each writes: k3fleet.accept.probes (probe_file and requests_file name them).
PROFILE = "profile.json"  # the production profile the run was held against
PROFILE_SOURCE = f"{INPUTS}/profile.yaml"  # the profile file as given (its files under profile-files/)
PROFILE_FILES = f"{INPUTS}/profile-files"
STARTUP_LOG = f"{INPUTS}/startup.log"
LAUNCH_COMMAND = f"{INPUTS}/launch_command.txt"
LOAD_ROWS = ("curves", "samples", "failures")

# -- triage ---------------------------------------------------------------------------------------
TRIAGE = "triage.json"

# -- decision -------------------------------------------------------------------------------------
DECISION = "decision.json"
SUMMARY = "summary.json"  # the evidence the decision was taken on
CHECKLIST = "checklist.json"
BASELINE = "baseline.json"  # what watch holds live traffic against
CURVES = "curves.json"  # the load curves the decision's charts draw
OWNERS_SOURCE = f"{INPUTS}/owners.yaml"  # decide --owners
BUILD_SOURCE = f"{INPUTS}/build.yaml"  # decide --build

# -- the evidence package (decide --archive) ------------------------------------------------------
PACKAGE_SUFFIX = ".tar.gz"  # <decision run>.tar.gz beside the decision's run directory
PACKAGE_MANIFEST = "PACKAGE.json"
PACKAGE_SIGNATURE = f"{PACKAGE_MANIFEST}.sig"
PACKAGE_DECISION = "decision"  # the decision's run directory inside the package
PACKAGE_RUNS = "runs"  # runs/<label>/: each evidence run inside the package

# -- watch ----------------------------------------------------------------------------------------
WATCH = "watch.json"  # the triggers and the rollback artifact
SAMPLES = "samples.jsonl"  # one line per sample, appended as the watch goes


def probe_file(probe: str) -> str:
    """``<probe>.json``: one acceptance probe's result."""
    return f"{probe}.json"


def load_rows(part: str) -> str:
    """``load/<part>.jsonl``: the load probe's curves, samples or failures, one row a line."""
    return f"load/{part}.jsonl"


LOAD_CURVES = load_rows("curves")


def requests_file(probe: str) -> str:
    """``requests/<probe>.jsonl``: every exchange a probe had with the endpoint."""
    return f"requests/{probe}.jsonl"


def metrics_file(window: str) -> str:
    """``metrics/<window>.txt``: one ``/metrics`` snapshot as the server sent it."""
    return f"metrics/{window}.txt"


def _tagged(stem: str, tag: str, suffix: str = "") -> str:
    return f"{stem}-{tag}{suffix}" if tag else f"{stem}{suffix}"


def events_file(tag: str = "") -> str:
    """``events.jsonl`` (``events-<tag>.jsonl`` for a run's later plays: a resume, a rollback's n-th)."""
    return _tagged(EVENTS_STEM, tag, ".jsonl")


EVENTS = events_file()


def ansible_dir(tag: str = "") -> str:
    """``ansible/`` (``ansible-<tag>/``): a play's redacted output."""
    return _tagged(ANSIBLE, tag)


def gate_audit_dir(tag: str = "") -> str:
    """``audit/`` (``audit-<tag>/``): the fresh audit a change night (or its resume) runs first."""
    return _tagged(GATE_AUDIT, tag)


def resume_tag(n: int) -> str:
    """``resume-<n>``: the tag of the n-th ``upgrade --resume`` of a night."""
    return f"{RESUME_PREFIX}{n}"


def resume_file(n: int) -> str:
    """``resume-<n>.json``: what the n-th ``upgrade --resume`` of a night did."""
    return f"{resume_tag(n)}.json"


def package_beside(run: Path) -> Path:
    """Where ``decide`` puts a decision's evidence package by default: ``<run>.tar.gz`` beside it."""
    return run.with_name(run.name + PACKAGE_SUFFIX)


def package_member(rel: str) -> str:
    """Where a file of the decision's run directory lies inside the evidence package."""
    return f"{PACKAGE_DECISION}/{rel}"


def host_file_name(host: str) -> str:
    """A file name for ``host`` that stays inside its directory, reversibly (percent-encoding).

    Letters, digits, ``_``, ``-``, ``.`` and ``~`` stay as they are; everything else (``/``,
    ``%``, spaces, control characters) becomes ``%XX``; a leading dot is encoded too, so ``.``,
    ``..`` and hidden names cannot appear. ``host_from_file_name`` maps it back.
    """
    if not host:
        raise UsageError("an empty host name cannot be stored in the run directory")
    name = urllib.parse.quote(host, safe="")
    if name.startswith("."):
        name = "%2E" + name[1:]
    return name


def host_from_file_name(name: str) -> str:
    """The host name ``host_file_name`` encoded into ``name`` (without its suffix)."""
    return urllib.parse.unquote(name)


def host_file(folder: str, host: str, suffix: str = ".json") -> str:
    """``folder/<encoded host><suffix>``: where a per-host file goes (``facts``, ``snapshots``)."""
    return f"{folder}/{host_file_name(host)}{suffix}"


def facts_file(host: str) -> str:
    """``facts/<encoded host>.json``: the facts a node returned."""
    return host_file(FACTS, host)
