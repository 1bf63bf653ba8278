"""Where a host's time went during the night, keyed on its journal stages (docs/change-night.md "Timings").

Each stage line is written when the host enters the stage, so the time between two lines is the
time the stage took: ``upgrading`` -> ``rebooting`` is the package manager, ``rebooting`` ->
``verifying`` the reboot. The drain's own wait for running jobs is what the drain module
measured. What is left of the host's wall time is k3fleet itself: Ansible, SSH round trips,
collectors, the journal, and the verification (which waits for Fabric Manager to start). Every
stage's span is reported too (``stages_s``).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from k3fleet.audit.runner import HostOutcome, Observer, PlayResult
from k3fleet.change.journal import HostHistory

# External time per stage: (stage the span starts at, stage it ends at).
EXTERNAL_SPANS: dict[str, tuple[str, str]] = {
    "package_manager": ("upgrading", "rebooting"),
    "reboot": ("rebooting", "verifying"),
}


@dataclass
class ChangeRecorder(Observer):
    """Passes events on to the display observer; keeps, per host, the journal lines the play wrote,
    what the slot gate said, and the wall-clock span of its tasks."""

    inner: Observer = field(default_factory=Observer)
    # Called when the play is about to start (after the runner recorded its choices in command.json).
    started: Callable[[], object] | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    gate: dict[str, str] = field(default_factory=dict)
    torn: list[dict[str, Any]] = field(default_factory=list)
    # First task start to last task end per host (events arrive as tasks end).
    span: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Called with each journal line the play reports writing, as it arrives (the night's textfile).
    on_line: Callable[[dict[str, Any]], object] | None = None

    def play_started(self, playbook: str, hosts: int | None) -> None:
        if self.started is not None:
            self.started()
        self.inner.play_started(playbook, hosts)

    def host_done(self, outcome: HostOutcome) -> None:
        raw = (outcome.result or {}).get("k3fleet")
        k3: dict[str, Any] = raw if isinstance(raw, dict) else {}
        duration = float(outcome.duration_s or 0.0)
        now = time.time()
        first, _ = self.span.get(outcome.host, (now - duration, now))
        self.span[outcome.host] = (min(first, now - duration), now)
        line = k3.get("line") if isinstance(k3.get("line"), dict) else None
        if line is not None and k3.get("written"):
            self.lines.append(line)
            if self.on_line is not None:
                self.on_line(line)
        if line is not None and k3.get("granted") is False:
            self.gate[outcome.host] = str(k3.get("why") or "no slot")
        if isinstance(k3.get("torn_tail"), dict):
            self.torn.append(k3["torn_tail"])
        self.inner.host_done(outcome)

    @property
    def stages(self) -> list[tuple[str, str]]:
        return [(str(line.get("host")), str(line.get("stage"))) for line in self.lines]

    def play_finished(self, result: PlayResult) -> None:
        self.inner.play_finished(result)


def _ts(text: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def host_timings(history: HostHistory, span: tuple[float, float] | None = None) -> dict[str, Any]:
    """Wall time of one host (its first task's start to its last task's end, else first to last
    journal line) and how much of it went to waiting on others and how much to k3fleet itself."""
    times = [(e.stage, _ts(e.ts), e) for e in history.entries]
    if span is not None:
        wall = max(0.0, span[1] - span[0])
    else:
        stamps = [t for _, t, _ in times if t is not None]
        wall = (stamps[-1] - stamps[0]).total_seconds() if len(stamps) >= 2 else 0.0
    external: dict[str, float] = {"drain_wait": 0.0}
    for e in history.entries:
        if e.stage == "drained" and isinstance(e.detail, dict):
            external["drain_wait"] += float(e.detail.get("waited_s") or 0.0)
    for key, (start, end) in EXTERNAL_SPANS.items():
        total = 0.0
        for i, (stage, t0, _) in enumerate(times):
            if stage != start or t0 is None:
                continue
            t1 = next((t for s, t, _ in times[i + 1:] if s == end and t is not None), None)
            if t1 is not None:
                total += max(0.0, (t1 - t0).total_seconds())
        external[key] = round(total, 2)
    external["drain_wait"] = round(external["drain_wait"], 2)
    stages: dict[str, float] = {}
    for (stage, t0, _), (_, t1, _) in itertools.pairwise(times):
        if t0 is not None and t1 is not None:
            stages[stage] = round(stages.get(stage, 0.0) + max(0.0, (t1 - t0).total_seconds()), 2)
    outside = min(wall, sum(external.values()))
    tool = max(0.0, wall - outside)
    return {
        "wall_s": round(wall, 2),
        "external_s": external,
        "tool_s": round(tool, 2),
        "tool_share": round(tool / wall, 3) if wall > 0 else None,
        "stages_s": stages,
    }
