"""The progress bar of `k3fleet accept load` (k3fleet/cli/accept_load.py): a ``LoadObserver`` drawing
on stderr. Its own module so that the load probe (aiohttp, the generator) loads only when the command
runs, never for `k3fleet --help` or another command."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.progress import Progress

from k3fleet.accept.load import LoadObserver
from k3fleet.report.escapes import safe_markup


class LoadBar(LoadObserver):
    """A rich progress bar on stderr: one bar per phase, a line per finished step."""

    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.task: Any = None
        self.counts = "0 requests"
        self.label = ""
        self._last = 0.0

    def phase_started(self, phase: str, steps: int) -> None:
        if self.task is not None:
            self.p.update(self.task, visible=False)
        self.task = self.p.add_task(phase, total=steps, status="")

    def step_started(self, phase: str, label: str, seconds: float | None) -> None:
        self.label = f"{phase}: {label}"
        self.p.update(self.task, description=self.label)

    def requests(self, done: int, errors: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.2:
            return
        self._last = now
        self.p.update(self.task, status=f"{done} requests, {errors} errors")

    def step_finished(self, row: Mapping[str, Any]) -> None:
        self.p.advance(self.task)
        ttft = row.get("ttft_p95_s")
        tt = f"TTFT p95 {ttft:.3f}s" if isinstance(ttft, float) else "TTFT -"
        wait = row.get("waiting_max")
        self.p.console.print(f"  {row['phase']:<11} {row['step']:<28} {row['ok']}/{row['requests']} ok  {tt}  "
                             f"waiting max {wait if wait is not None else '-'}  {row['verdict']}", markup=False,
                             highlight=False)

    def note(self, message: str) -> None:
        self.p.console.print(f"  [yellow]{safe_markup(message)}[/yellow]")
