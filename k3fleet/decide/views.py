"""The view of any run for ``k3fleet report`` (docs/decision.md "Reports").

The run is checked against its manifest and read through decide's readers (the one reader of run
directories beneath them), so a report says exactly what ``decide`` would read from the same run;
``k3fleet.report.view`` shapes what they return, and the renderers draw it. The reading lives here,
not in ``k3fleet.report``: the flows that write a report.md (decide, triage) use the renderers, so
the renderers read nothing and import none of them.
"""

from __future__ import annotations

from pathlib import Path

from k3fleet.accept.probes import PROBES
from k3fleet.accept.result import ProbeResult
from k3fleet.decide.readers import (
    AcceptRecord,
    audit_facts,
    curve_points,
    probe_result,
    read_accept,
    read_audit,
    read_change,
    read_decision,
    triage_record,
)
from k3fleet.evidence import layout
from k3fleet.evidence.reader import RunReader, open_run
from k3fleet.models.evidence import RunInfo, RunRecord
from k3fleet.report.view import (
    ReportView,
    accept_view,
    audit_view,
    change_view,
    decision_view,
    triage_view,
    with_run,
)

REPORT_KINDS = ("audit", "change", "accept", "triage", "decision")


def load_view(path: Path) -> ReportView:
    """Verify ``path`` against its manifest, then build its view."""
    run = open_run(path, REPORT_KINDS, "report renders")
    kind = run.kind
    view = {"audit": _audit, "change": _change, "accept": _accept, "triage": _triage, "decision": _decision}[
        str(kind)](run)
    return with_run(view, run.label, run.command.started_at)


def _info(run: RunReader) -> RunInfo:
    return RunInfo(label=run.label, kind=run.kind, path=str(run.path),  # type: ignore[arg-type]
                   started_at=run.command.started_at)


def _audit(run: RunReader) -> ReportView:
    a = read_audit(run.path, _info(run))
    record = run.model(layout.RUN, RunRecord)
    return audit_view(a, run.label, record.exit_code,
                      audit_facts(run, [h.host for h in a.hosts if h.status != "unreachable"]))


def _change(run: RunReader) -> ReportView:
    return change_view(read_change(run.path, _info(run)), run.label)


def _accept(run: RunReader) -> ReportView:
    acc = read_accept(run.path, _info(run))
    head = run.model(layout.ACCEPT, AcceptRecord) if run.has(layout.ACCEPT) else AcceptRecord()
    results: dict[str, ProbeResult] = {}
    for name in PROBES:
        got = probe_result(run, name)
        if got is not None:
            results[name] = got[0]
    load = results.get("load")
    curves = curve_points(run, load.data) if acc.load is not None and load is not None else []
    return accept_view(acc, run.label, head.exit_code, results, curves)


def _triage(run: RunReader) -> ReportView:
    return triage_view(triage_record(run), run.label)


def _decision(run: RunReader) -> ReportView:
    d, s, curves = read_decision(run)
    return decision_view(d, s, run.label, curves=curves)
