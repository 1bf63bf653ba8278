"""The one progress observer: what a running play prints on stderr.

Audit-style commands print one line per host as it finishes; change-night commands print one
line per journaled stage transition and every failure. Display stays here, the core only calls
the ``Observer`` interface (k3fleet.audit.runner).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from k3fleet.audit.runner import HostOutcome, Observer, PlayResult
from k3fleet.change.interrupt import cancel_on_signals
from k3fleet.report.escapes import safe_markup, safe_text

_STATUS_STYLE = {"ok": "green", "failed": "red", "unreachable": "magenta", "timeout": "magenta",
                 "skipped": "dim", "ignored": "yellow"}
_STAGE_STYLE = {"failed": "red", "rolled_back": "yellow"}
_FAILURES = ("failed", "unreachable", "timeout")


def _journal_line(outcome: HostOutcome) -> dict[str, Any] | None:
    """The journal line a k3fleet_journal task wrote, if this outcome is one."""
    res = outcome.result or {}
    k3 = res.get("k3fleet")
    if not isinstance(k3, dict) or not k3.get("written"):
        return None
    line = k3.get("line")
    return line if isinstance(line, dict) else None


# Hosts whose failure gets a line of its own; past it the bar's counts (and the summary) carry them.
_FAILURE_LINES = 20
# Without a terminal (a CI log) the running count is a line at most this often, and at the end.
_LOG_EVERY_S = 5.0


class ProgressObserver(Observer):
    """Progress on stderr.

    ``stages=False`` (audit): on a terminal a Rich progress bar from the first second (hosts
    answered of the total, unreachable so far, elapsed time and ETA); in a log a count line every
    few seconds. A host that did not answer gets a line of its own (the first 20). "answered" is
    all a play knows: whether a host passes is the verdict's, printed in the summary.
    ``stages=True`` (change night, rollback): one line per journaled stage, plus every failure.
    """

    def __init__(self, console: Console, *, quiet: bool = False, stages: bool = False,
                 total: int | None = None) -> None:
        self.console = console
        self.quiet = quiet
        self.stages = stages
        self.total = total
        self.done = 0
        self.failed = 0
        self._counted: set[str] = set()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_log = 0.0
        self._started = time.monotonic()

    def play_started(self, playbook: str, hosts: int | None) -> None:
        # Each play counts its own hosts (an audit with --active full runs its pair rounds after it).
        self.total = hosts or self.total
        self.done = self.failed = 0
        self._counted = set()
        self._started = time.monotonic()
        if self.quiet:
            return
        n = f" on {self.total} hosts" if self.total and not self.stages else ""
        self.console.print(f"[bold]running {safe_markup(playbook)}{n}[/bold]")
        if not self.stages and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]hosts"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.console, transient=False)
            self._task = self._progress.add_task("audit", total=self.total or None, counts="answered 0")
            self._progress.start()

    def _counts(self) -> str:
        answered = self.done - self.failed
        return f"answered {answered}" + (f", unreachable {self.failed}" if self.failed else "")

    def _eta(self) -> str:
        if not self.total or not self.done or self.done >= self.total:
            return ""
        left = (time.monotonic() - self._started) / self.done * (self.total - self.done)
        return f", ETA {int(left) // 60}:{int(left) % 60:02d}"

    def _tick(self, force: bool = False) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, counts=self._counts())
            return
        now = time.monotonic()
        if force or self.done == 1 or self.done == self.total or now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            self.console.print(f"[{self.done}/{self.total or '?'}] {self._counts()}{self._eta()}", markup=False)

    def _print(self, text: Text) -> None:
        (self._progress.console if self._progress is not None else self.console).print(text)

    def host_done(self, outcome: HostOutcome) -> None:
        # A host counts once, at its first finished task (the audit's one module call); a later
        # task on it (the run_once artifact publishing, skipped on the CLI) is shown only if it failed.
        first = outcome.host not in self._counted
        if not self.stages and first:
            self._counted.add(outcome.host)
            self.done += 1
        if self.quiet or (not self.stages and not first and outcome.status not in _FAILURES):
            return
        # Host names, task names and messages are node text: plain, without terminal escapes.
        host = safe_text(outcome.host)
        line = _journal_line(outcome)
        if line is not None:
            stage = safe_text(line.get("stage"))
            self.console.print(Text(f"  {host:<20} ").append(stage, style=_STAGE_STYLE.get(stage, "cyan")))
            return
        if self.stages:
            if outcome.status in _FAILURES:
                self.console.print(Text(f"  {host:<20} ").append(outcome.status, style="red").append(
                    f" {safe_text(outcome.task)}: {safe_text(outcome.message)}"))
            return
        if outcome.status in _FAILURES and first:
            self.failed += 1
        if outcome.status in _FAILURES and (self.failed <= _FAILURE_LINES or not first):
            msg = safe_text(outcome.message) if outcome.message else ""
            # Messages that name their host already (a refused host key) are printed as they are.
            shown = msg if msg.startswith(f"{host}: ") else f"{host} {msg}".rstrip()
            count = f"[{self.done}/{self.total}] " if self.total and first else ""
            self._print(Text(count).append(f"{outcome.status:<11}", style=_STATUS_STYLE.get(outcome.status, "white"))
                        .append(f" {shown}"))
            if first and self.failed == _FAILURE_LINES:
                self._print(Text("  (further hosts that do not answer are counted, not listed)", style="dim"))
        if first:
            self._tick()

    def play_finished(self, result: PlayResult) -> None:
        if self._progress is not None:
            self._tick(force=True)
            self._progress.stop()
            self._progress = None
        if not self.quiet:
            # The play's own word: "failed" means a host did not answer or a task broke, never a no-go
            # verdict (that is the summary's).
            if self.stages:
                self.console.print(f"{result.playbook}: {result.status} in {result.wall_s:.1f}s", markup=False)
            else:
                self.console.print(f"{result.playbook}: {self.done - self.failed} of {self.total or self.done} hosts "
                                   f"answered in {result.wall_s:.1f}s", markup=False)


def cancel_on_interrupt(console: Console, what_next: str) -> threading.Event:
    """First Ctrl-C (or SIGTERM) stops the play cleanly and says ``what_next``; the second aborts."""
    return cancel_on_signals(lambda: console.print(f"[yellow]interrupt: {what_next}[/yellow]"))
