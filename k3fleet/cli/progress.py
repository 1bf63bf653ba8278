"""The one progress observer: what a running play prints on stderr.

Audit-style commands print one line per host as it finishes; change-night commands print one
line per journaled stage transition and every failure. Display stays here, the core only calls
the ``Observer`` interface (k3fleet.runner).
"""

from __future__ import annotations

import threading
from typing import Any

from rich.console import Console
from rich.text import Text

from k3fleet.interrupt import cancel_on_signals
from k3fleet.report.escapes import safe_text
from k3fleet.runner import HostOutcome, Observer, PlayResult

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


class ProgressObserver(Observer):
    """Progress lines on stderr.

    ``stages=False`` (audit): one line per finished host with a running count.
    ``stages=True`` (change night, rollback): one line per journaled stage, plus every failure.
    """

    def __init__(self, console: Console, *, quiet: bool = False, stages: bool = False,
                 total: int | None = None) -> None:
        self.console = console
        self.quiet = quiet
        self.stages = stages
        self.total = total
        self.done = 0
        self._counted: set[str] = set()

    def play_started(self, playbook: str, hosts: int | None) -> None:
        self.total = hosts or self.total
        if not self.quiet:
            n = f" on {self.total} hosts" if self.total and not self.stages else ""
            self.console.print(f"[bold]running {playbook}{n}[/bold]")

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
        count = f"[{self.done}/{self.total}] " if self.total and first else ""
        msg = safe_text(outcome.message) if outcome.message and outcome.status != "ok" else ""
        # Messages that name their host already (a refused host key) are printed as they are.
        shown = msg if msg.startswith(f"{host}: ") else f"{host} {msg}".rstrip()
        self.console.print(Text(count).append(f"{outcome.status:<11}", style=_STATUS_STYLE.get(outcome.status, "white"))
                           .append(f" {shown}"))

    def play_finished(self, result: PlayResult) -> None:
        if not self.quiet:
            self.console.print(f"{result.playbook}: {result.status} in {result.wall_s:.1f}s", markup=False)


def cancel_on_interrupt(console: Console, what_next: str) -> threading.Event:
    """First Ctrl-C (or SIGTERM) stops the play cleanly and says ``what_next``; the second aborts."""
    return cancel_on_signals(lambda: console.print(f"[yellow]interrupt: {what_next}[/yellow]"))
