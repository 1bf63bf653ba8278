"""The night as node_exporter's textfile collector sees it (docs/change-night.md "Watching a night").

``upgrade --textfile PATH.prom`` rewrites ``PATH`` at every journal line the play reports (every stage
of every host), at the start and at the end: how many of the night's hosts are at each stage, each
host's stage, the failures so far and the failure budget left, the wave (batch) the night is in. The
file is replaced atomically through the project's writer and its text passes the redactor, so a
scrape never reads half a file. No timestamps on samples (the collector stamps the scrape);
``k3fleet_change_updated_timestamp_seconds`` says when the night last moved.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_journal_format import STAGES
from k3fleet.errors import K3FleetError, UsageError
from k3fleet.evidence.redact import redact_text
from k3fleet.evidence.writer import check_output, write_output

FLAG = "--textfile"
# What node_exporter's textfile collector reads: *.prom files of its directory.
SUFFIX = ".prom"
NOT_STARTED = "not_started"
HOST_STAGES = (NOT_STARTED, *STAGES)
# World-readable: node_exporter usually runs as a user of its own.
MODE = 0o644


def check_textfile(path: Path | None) -> None:
    """Refuse a textfile the collector would never read, or that cannot be written (one line, exit 2)."""
    if path is None:
        return
    if Path(path).suffix != SUFFIX:
        raise UsageError(f"{FLAG} {path}: node_exporter's textfile collector reads only *{SUFFIX} files")
    # Replacing it is the point: each night (and each of its stages) writes it again.
    check_output(Path(path), FLAG, force=True)


class NightTextfile:
    """The gauges of one night, from the journal lines it has seen so far."""

    def __init__(self, path: Path, *, change_id: str, run: str, batches: Sequence[Sequence[str]],
                 failure_budget: int) -> None:
        self.path = Path(path)
        self.change_id, self.run = change_id, run
        self.batches = [list(b) for b in batches]
        self.hosts = [h for b in self.batches for h in b]
        self.failure_budget = int(failure_budget)
        self.stage: dict[str, str] = {h: NOT_STARTED for h in self.hosts}
        self.failed: set[str] = set()
        self.wave = 0
        self.updated = time.time()
        self.problem: str | None = None

    def add(self, lines: Iterable[Mapping[str, Any]]) -> None:
        """Take journal lines (as the journal module returns them) into the gauges, then rewrite the file."""
        for line in lines:
            host, stage = line.get("host"), line.get("stage")
            if host not in self.stage or line.get("change_id") != self.change_id or line.get("interrupted"):
                continue
            if stage not in STAGES:
                continue
            self.stage[str(host)] = str(stage)
            if stage == "failed":
                self.failed.add(str(host))
            if stage == "snapshot":
                self.wave = max(self.wave, next(i for i, b in enumerate(self.batches) if host in b))
        self.updated = time.time()
        self.write()

    def text(self) -> str:
        # lazy: prometheus-client is only needed by a night that writes a textfile
        from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, InfoMetricFamily
        from prometheus_client.exposition import generate_latest
        from prometheus_client.registry import Collector

        def night_gauge(name: str, documentation: str, cid: list[str], value: float) -> GaugeMetricFamily:
            """One gauge of the night with its one ``change_id`` label."""
            gauge = GaugeMetricFamily(name, documentation, labels=["change_id"])
            gauge.add_metric(cid, value)
            return gauge

        night = self

        class _Night(Collector):
            def collect(self) -> Iterator[Any]:
                cid = [night.change_id]
                info = InfoMetricFamily("k3fleet_change", "The change night these gauges describe.",
                                        labels=["change_id"])
                info.add_metric(cid, {"run": night.run})
                yield info
                by = GaugeMetricFamily("k3fleet_change_hosts", "The night's hosts by their last journal stage "
                                       "(not_started: no line yet).", labels=["change_id", "stage"])
                for stage in HOST_STAGES:
                    by.add_metric([night.change_id, stage], float(sum(1 for s in night.stage.values()
                                                                      if s == stage)))
                yield by
                per = GaugeMetricFamily("k3fleet_change_host_stage", "1 for each host's last journal stage.",
                                        labels=["change_id", "host", "stage"])
                for host in night.hosts:
                    per.add_metric([night.change_id, host, night.stage[host]], 1.0)
                yield per
                yield night_gauge("k3fleet_change_failures", "Hosts that failed in this night.", cid,
                                  float(len(night.failed)))
                yield night_gauge("k3fleet_change_failure_budget_left", "Failures the night still tolerates before "
                                  "it stops every drain not yet started (--failure-budget minus failures, at least "
                                  "0).", cid, float(max(0, night.failure_budget - len(night.failed))))
                yield night_gauge("k3fleet_change_wave", "The batch the night is in: 0 the canary, then the waves.",
                                  cid, float(night.wave))
                yield night_gauge("k3fleet_change_waves", "Batches of the night, the canary's included.", cid,
                                  float(len(night.batches)))
                yield night_gauge("k3fleet_change_updated_timestamp_seconds", "When the night last moved (Unix "
                                  "time).", cid, night.updated)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Night())
        return generate_latest(registry).decode("utf-8")

    def write(self) -> None:
        """Replace the file; a failure is kept as one line (the night goes on: the journal is the record)."""
        try:
            write_output(self.path, redact_text(self.text()).encode("utf-8"), FLAG, force=True, mode=MODE)
        except K3FleetError as exc:
            self.problem = self.problem or str(exc)
