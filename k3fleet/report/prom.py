"""Prometheus textfile of a report view, for node_exporter's textfile collector.

Names follow the Prometheus conventions: the ``k3fleet_`` prefix, ``_info`` for metadata with
value 1, one series per check and host carrying its status as a label, and the decision's
outcome as a state set (every outcome, 1 for the current one). No timestamps: the collector
stamps the scrape. The text comes from prometheus-client's exposition writer; the file is
written to a temporary name in the same directory and renamed in place (docs/decision.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from k3fleet import __version__
from k3fleet.contracts import OUTCOMES
from k3fleet.report.escapes import safe_text
from k3fleet.report.view import ReportView

STATUSES = ("pass", "fail", "error", "skipped")


class _ViewCollector(Collector):
    def __init__(self, view: ReportView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        v = self.view
        info = InfoMetricFamily("k3fleet_run", "The run these metrics describe.",
                                labels=["kind", "run", "version"])
        info.add_metric([v.kind, v.run, __version__], {"title": safe_text(v.title)})
        yield info
        if v.exit_code is not None:
            g = GaugeMetricFamily("k3fleet_run_exit_code", "Exit code of the run (0 pass, 1 failed, 2 usage, "
                                  "3 evidence incomplete).", labels=["kind", "run"])
            g.add_metric([v.kind, v.run], float(v.exit_code))
            yield g
        checks = GaugeMetricFamily("k3fleet_check_status", "1 for the status of each check on each host (pass, "
                                   "fail, error: evidence missing, skipped: not measured).",
                                   labels=["kind", "host", "check", "status"])
        counts: Counter[str] = Counter()
        for row in v.checks:
            # Host names and checks come from the nodes: redacted, no control characters.
            checks.add_metric([v.kind, safe_text(row.group), safe_text(row.check), row.status], 1.0)
            counts[row.status] += 1
        yield checks
        summary = GaugeMetricFamily("k3fleet_checks", "Number of checks per status.", labels=["kind", "status"])
        for st in STATUSES:
            summary.add_metric([v.kind, st], float(counts[st]))
        yield summary
        if v.outcome is not None:
            outcome = GaugeMetricFamily("k3fleet_decision_outcome", "The outcome (state set: 1 for the current "
                                        "outcome).", labels=["kind", "outcome"])
            for o in OUTCOMES:
                outcome.add_metric([v.kind, o], 1.0 if o == v.outcome else 0.0)
            yield outcome
        if v.approved is not None:
            approved = GaugeMetricFamily("k3fleet_decision_approved", "1 when the decision approves serving "
                                         "(go_live or observe_with_limits with every item in place).")
            approved.add_metric([], 1.0 if v.approved else 0.0)
            yield approved
        if v.checklist:
            items = GaugeMetricFamily("k3fleet_checklist_item_status", "1 for the status of each sign-off "
                                      "checklist item (pass, fail, missing).", labels=["item", "status"])
            for i in v.checklist:
                items.add_metric([safe_text(i["id"]), i["status"]], 1.0)
            yield items
        if v.hosts:
            hosts = GaugeMetricFamily("k3fleet_hosts", "Hosts per audit status.", labels=["status"])
            by = Counter(h.status for h in v.hosts)
            for st in ("pass", "warn", "fail", "unreachable"):
                hosts.add_metric([st], float(by[st]))
            yield hosts


def render_prom(view: ReportView) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ViewCollector(view))
    return generate_latest(registry).decode("utf-8")
