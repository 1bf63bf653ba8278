"""One Finding, one severity scale (k3fleet/contracts.py): the audit, the acceptance probes, triage
and the decision all hold the same model, and run files written with acceptance's older scale
(fail / warn / info, the id under ``id``, evidence as text) read into it with the meanings every
reader gave them."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from k3fleet.accept.result import ProbeResult, combined_exit_code, finding, result_from_json
from k3fleet.contracts import (
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    FINDING_KINDS,
    SEVERITIES,
    SEVERITY_RANK,
    FindingKind,
    Severity,
    finding_status,
    is_blocking,
    is_failure,
)
from k3fleet.models.evidence import Fact, Ref, TriageRecord
from k3fleet.models.findings import Finding, FleetVerdict, HostVerdict


def test_one_scale_lowest_first() -> None:
    assert set(get_args(Severity)) == set(SEVERITIES) and set(get_args(FindingKind)) == set(FINDING_KINDS)
    assert [SEVERITY_RANK[s] for s in SEVERITIES] == [0, 1, 2, 3]
    assert [s for s in SEVERITIES if is_blocking(s)] == ["error", "critical"]


@pytest.mark.parametrize(("kind", "severity", "failure", "status"), [
    ("fail", "critical", True, "fail"),
    ("fail", "error", True, "fail"),
    ("fail", "warning", False, "warn"),
    ("fail", "info", False, "pass"),
    # A blocking fact that could not be read is missing evidence, not a definite failure.
    ("unknown", "error", False, "error"),
    ("unknown", "warning", False, "warn"),
    ("note", "info", False, "pass"),
])
def test_kind_and_severity_to_failure_and_status(kind: str, severity: str, failure: bool, status: str) -> None:
    assert is_failure(kind, severity) is failure
    assert finding_status(kind, severity) == status
    f = Finding(check_id="driver.branch", severity=severity, kind=kind, message="m")  # type: ignore[arg-type]
    assert f.failed is failure and f.blocking is is_blocking(severity)


def test_every_flow_holds_the_one_finding() -> None:
    assert ProbeResult.model_fields["findings"].annotation == list[Finding]
    assert TriageRecord.model_fields["findings"].annotation == list[Finding]
    assert HostVerdict.model_fields["findings"].annotation == list[Finding]
    assert FleetVerdict.model_fields["fleet_findings"].annotation == list[Finding]
    assert issubclass(Fact, Finding)


@pytest.mark.parametrize(("severity", "kind"), [("error", "fail"), ("warning", "note"), ("info", "note")])
def test_an_acceptance_finding_is_a_failure_only_when_blocking(severity: Severity, kind: str) -> None:
    f = finding("accept.load.collapse", severity, "the server failed under load", layer="environment",
                evidence="HTTP 500 at concurrency 16")
    assert (f.kind, f.failed) == (kind, severity == "error")
    assert f.evidence == {"detail": "HTTP 500 at concurrency 16"} and f.layer == "environment"
    assert finding("accept.load.bound", severity, "m").evidence == {}


@pytest.mark.parametrize("bad", ["driver.branch", "accept.load", "accept.Load.x"])
def test_an_acceptance_id_is_accept_probe_what(bad: str) -> None:
    with pytest.raises(ValueError, match="not an acceptance finding id"):
        finding(bad, "info", "m")


# A probe result as acceptance wrote it before the one Finding (docs/acceptance.md shape of that time).
EARLIER_RESULT: dict[str, Any] = {
    "probe": "startup", "status": "fail", "reason": "the driver is too old", "data": {}, "exit_code": 1,
    "findings": [
        {"id": "accept.startup.cuda_init.driver_too_old", "severity": "fail", "message": "driver too old",
         "layer": "environment", "evidence": "found version 11040"},
        {"id": "accept.startup.fallback", "severity": "warn", "message": "fell back", "layer": "config",
         "evidence": None},
        {"id": "accept.startup.no_vllm_evidence", "severity": "info", "message": "note", "layer": None},
    ],
}


def test_an_earlier_result_file_reads_with_its_meanings() -> None:
    r = result_from_json(EARLIER_RESULT)
    got = [(f.check_id, f.severity, f.kind, f.failed, f.evidence) for f in r.findings]
    assert got == [
        ("accept.startup.cuda_init.driver_too_old", "error", "fail", True, {"detail": "found version 11040"}),
        ("accept.startup.fallback", "warning", "note", False, {}),
        ("accept.startup.no_vllm_evidence", "info", "note", False, {}),
    ]
    assert [f.check_id for f in r.failing()] == ["accept.startup.cuda_init.driver_too_old"]
    # The exit code is the status's, as before.
    assert r.exit_code == EXIT_FAILED and combined_exit_code([r]) == EXIT_FAILED


def test_todays_result_file_reads_back_equal() -> None:
    r = ProbeResult(probe="load", status="inconclusive", reason="r",
                    findings=[finding("accept.load.metric_unread", "warning", "m", layer="http", evidence="vllm:x")])
    again = result_from_json(r.model_dump(mode="json"))
    assert again == r and again.exit_code == EXIT_INCOMPLETE
    assert ProbeResult(probe="load", status="pass", reason="r").exit_code == EXIT_OK


def test_an_earlier_triage_record_keeps_the_capture_file() -> None:
    rec = TriageRecord.model_validate({"findings": [
        {"id": "gpu.xid", "severity": "critical", "kind": "fail", "message": "Xid 79", "host": "gpu-7",
         "file": "inputs/01-dmesg.txt", "chain": False, "layer": None, "fix": "drain the node"},
        {"id": "accept.agent.empty_tool_calls", "severity": "fail", "kind": "fail", "message": "no calls",
         "host": "gpu-7", "file": "inputs/02-chat.json", "chain": False, "layer": "http", "fix": None}]})
    assert [(f.check_id, f.severity, f.failed, f.evidence) for f in rec.findings] == [
        ("gpu.xid", "critical", True, {"file": "inputs/01-dmesg.txt"}),
        ("accept.agent.empty_tool_calls", "error", True, {"file": "inputs/02-chat.json"})]


def test_an_earlier_decision_summary_fact_reads() -> None:
    ref = {"run": "accept-1", "file": "startup.json"}
    fact = Fact.model_validate({"id": "accept.startup.load_oom", "severity": "fail", "kind": "fail",
                                "message": "OOM while loading", "layer": "environment", "ref": ref})
    assert (fact.check_id, fact.severity, fact.failed, fact.ref) == ("accept.startup.load_oom", "error", True,
                                                                     Ref(**ref))
    note = Fact.model_validate({"id": "accept.startup.fallback", "severity": "warn", "kind": "note",
                                "message": "fell back", "ref": ref})
    assert (note.severity, note.kind, note.failed) == ("warning", "note", False)
