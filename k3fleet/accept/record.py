"""What the probes gather for the run directory: every exchange and every ``/metrics`` snapshot.

Probes append here as they go; ``accept all`` writes it through the run directory (and so through
the one redactor). A probe interrupted half-way still leaves what it gathered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from k3fleet.accept.client import Exchange


@dataclass
class Recorder:
    exchanges: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # window name -> raw /metrics text, in the order taken
    metrics: dict[str, str] = field(default_factory=dict)

    def exchange(self, ex: Exchange) -> Exchange:
        self.exchanges.setdefault(ex.probe or "misc", []).append(ex.model_dump(mode="json"))
        return ex

    def snapshot(self, window: str, raw: str) -> None:
        self.metrics[window] = raw
