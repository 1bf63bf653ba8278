"""Other tools' health output judged with the audit's check ids: gpud's states and events, and
``dcgmi health -c -j`` (k3fleet/verdict/foreign.py; fixtures and their sources in
tests/fixtures/foreign/SOURCES.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from k3fleet.targets import load_target
from k3fleet.triage import triage
from k3fleet.verdict.catalogue import CHECKS
from k3fleet.verdict.foreign import DCGM_SYSTEMS, GPUD_COMPONENTS, ForeignError, foreign_findings, sniff_foreign

FIX = Path(__file__).resolve().parents[1] / "fixtures"
F = FIX / "foreign"
TARGET = load_target(None)


def load(name: str) -> Any:
    return json.loads((F / name).read_text())


def test_every_mapped_check_is_in_the_catalogue() -> None:
    assert set(GPUD_COMPONENTS.values()) | set(DCGM_SYSTEMS.values()) | {"external.health"} <= set(CHECKS)


def test_gpud_unhealthy_xid_is_the_audits_xid_with_gpuds_action() -> None:
    data = load("gpud_states_xid74.json")
    assert sniff_foreign(data) == "gpud_states"
    (f,) = foreign_findings("gpud_states", data, "gpu-x01", TARGET)
    assert (f.check_id, f.kind, f.host) == ("gpu.xid", "fail", "gpu-x01")
    # A failure carries the severity of the audit's own check, and its fix.
    assert f.severity == CHECKS["gpu.xid"].severity and f.fix
    assert f.message == ("gpud accelerator-nvidia-error-xid: Unhealthy: XID 74 (NVLINK Error) detected on "
                         "PCI:0000:04:00 (gpud suggests REBOOT_SYSTEM)")
    assert f.evidence["repair_actions"] == ["REBOOT_SYSTEM"] and f.evidence["source"] == "gpud"


def test_gpud_xid_that_asks_to_check_the_application_is_the_application_xid() -> None:
    data = load("gpud_states_xid74.json")
    data[0]["states"][0]["suggested_actions"]["repair_actions"] = ["CHECK_USER_APP_AND_GPU"]
    (f,) = foreign_findings("gpud_states", data, "h", TARGET)
    assert f.check_id == "gpu.xid_application"


def test_gpud_degraded_is_a_warning_healthy_and_initializing_say_nothing() -> None:
    data = load("gpud_states_xid74.json")
    degraded = copy.deepcopy(data)
    degraded[0]["component"] = "accelerator-nvidia-infiniband"
    degraded[0]["states"][0].update(health="Degraded", reason="ib port mlx5_3 down", suggested_actions=None)
    (f,) = foreign_findings("gpud_states", degraded, "h", TARGET)
    assert (f.check_id, f.severity) == ("rdma.port_state", "warning")
    for health in ("Healthy", "Initializing"):
        quiet = copy.deepcopy(data)
        quiet[0]["states"][0]["health"] = health
        assert foreign_findings("gpud_states", quiet, "h", TARGET) == []


def test_gpud_component_without_an_audit_check_is_external_health() -> None:
    data = load("gpud_states_xid74.json")
    data[0]["component"] = "accelerator-nvidia-nccl"
    (f,) = foreign_findings("gpud_states", data, "h", TARGET)
    assert f.check_id == "external.health" and "accelerator-nvidia-nccl" in f.message


def test_gpud_fatal_events_are_xids_with_their_time() -> None:
    data = load("gpud_events_xid.json")
    assert sniff_foreign(data) == "gpud_events"
    found = foreign_findings("gpud_events", data, "h", TARGET)
    assert [f.check_id for f in found] == ["gpu.xid", "gpu.xid"]
    assert "at 2025-06-01T16:59:04Z: Fatal: XID 79(GPU has fallen off the bus)" in found[1].message


def test_dcgm_incidents_per_system() -> None:
    data = load("dcgm_health_pcie_dbe_inforom.json")
    assert sniff_foreign(data) == "dcgm_health"
    found = {(f.check_id, f.severity) for f in foreign_findings("dcgm_health", data, "h", TARGET)}
    assert found == {("gpu.pcie_replay", "warning"), ("gpu.ecc", CHECKS["gpu.ecc"].severity),
                     ("external.health", "warning")}
    ecc = next(f for f in foreign_findings("dcgm_health", data, "h", TARGET) if f.check_id == "gpu.ecc")
    assert ecc.message == ("DCGM health GPU 3 Memory system: Failure: Detected 2 volatile double-bit ECC error(s) "
                           "in GPU 3.")
    assert ecc.evidence["overall"] == "Failure"
    assert foreign_findings("dcgm_health", load("dcgm_health_healthy.json"), "h", TARGET) == []


def test_dcgm_overall_failure_without_an_incident_is_said() -> None:
    data = {"header": ["Health Monitor Report"], "body": {"Overall Health": {"value": "Failure"}}}
    (f,) = foreign_findings("dcgm_health", data, "h", TARGET)
    assert f.check_id == "external.health" and "overall Failure" in f.message


@pytest.mark.parametrize(("data", "kind"), [
    ({"hosts": []}, None), ([], None), ([{"component": "x"}], None), ("text", None),
    ([{"component": "x", "states": []}], "gpud_states"), ({"body": {"Overall Health": {"value": "Healthy"}}},
                                                          "dcgm_health"),
])
def test_sniff_only_the_tools_shapes(data: Any, kind: str | None) -> None:
    assert sniff_foreign(data) == kind


def test_malformed_tool_output_is_one_line() -> None:
    with pytest.raises(ForeignError, match="no 'body' object"):
        foreign_findings("dcgm_health", {"header": ["Health Monitor Report"]}, "h", TARGET)
    with pytest.raises(ForeignError, match="a JSON list of components"):
        foreign_findings("gpud_states", {"component": "x"}, "h", TARGET)


def test_triage_of_gpud_and_a_kernel_log_name_the_same_xid_check() -> None:
    # The same fault as the audit reads it from the kernel log and as gpud reports it: one check id.
    own = triage([FIX / "gpu_health/xid79_line_nvsentinel155.txt"], host="h")
    theirs = triage([F / "gpud_events_xid.json"], host="h")
    assert {f.check_id for f in own.findings} == {"gpu.xid"} <= {f.check_id for f in theirs.findings}
    assert all(f.evidence["file"].startswith("inputs/01-") for f in theirs.findings)
