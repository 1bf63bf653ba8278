"""The verdict on what an expert reads: fabric health, Jetson boards, GPUs already in use.

Facts are the synthetic fixtures of tests/fixtures/verdict with single fields patched (the
collectors' parsing of the real outputs is tested in test_collect_driver_truth.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from verdict_fixtures import B200, GOOD, R575, TARGET, fleet, host

from k3fleet.models.findings import Finding, FleetVerdict
from k3fleet.verdict import evaluate_fleet, evaluate_host

HEALTHY = {"summary": "healthy", "bandwidth": "full", "route_recovery_in_progress": False, "route_unhealthy": False,
           "access_timeout_recovery": False, "incorrect_configuration": "none"}


def health(index: int, **fields: Any) -> dict[str, Any]:
    """Every GPU healthy, GPU ``index`` with ``fields`` changed."""
    def patch(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**g, "fabric_health": {**HEALTHY, **(fields if g["index"] == index else {})}} for g in gpus]
    return {"driver.gpus": patch}


def found(findings: list[Finding], check_id: str) -> list[Finding]:
    return [f for f in findings if f.check_id == check_id]


# -- NVLink fabric health -------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"summary": "unhealthy", "route_unhealthy": True},
     "NVLink fabric health fails on GPU 3: Summary Unhealthy, Route Unhealthy True"),
    ({"summary": "limited_capacity", "bandwidth": "degraded"},
     "NVLink fabric health fails on GPU 3: Summary Limited Capacity, Bandwidth Degraded"),
    ({"bandwidth": "degraded", "summary": None},
     "NVLink fabric health fails on GPU 3: Bandwidth Degraded"),
    ({"route_recovery_in_progress": True, "access_timeout_recovery": True},
     "NVLink fabric health fails on GPU 3: Route Recovery in progress True, Access Timeout Recovery True"),
    ({"incorrect_configuration": "insufficient_nvlinks"},
     "NVLink fabric health fails on GPU 3: Incorrect Configuration insufficient_nvlinks"),
])
def test_unhealthy_fabric_fails_the_gpu_and_names_the_field(fields: dict[str, Any], message: str) -> None:
    # State Completed and Status Success: the old check passes; health does not.
    facts = host("b1", B200, health(3, **fields))
    findings = evaluate_host(facts, TARGET)
    (f,) = found(findings, "gpu.fabric_health")
    assert f.message == message
    assert f.severity == "error" and f.kind == "fail" and not f.chain
    assert list(f.evidence["gpus"]) == ["3"]
    assert not found(findings, "gpu.fabric_state")


def test_unhealthy_fabric_blocks_the_host_in_the_plan() -> None:
    v = evaluate_fleet(fleet(host("b1", B200, health(3, summary="unhealthy", route_unhealthy=True)),
                             host("b2", B200, health(0))), TARGET)
    assert v.hosts["b1"].status == "fail" and v.hosts["b2"].status == "pass"
    # On the target driver already: nothing to change, so it is done but fails; it is not counted healthy.
    assert v.summary.gpus_healthy == 8


def test_healthy_or_unreported_health_says_nothing() -> None:
    na = {k: None for k in HEALTHY}
    for patch in (health(0), health(0, **na), {}):
        assert not found(evaluate_host(host("b1", B200, patch), TARGET), "gpu.fabric_health")


def test_unknown_health_fields_never_fail_alone() -> None:
    facts = host("b1", B200, health(2, other={"Link Training Margin": "Nominal"}, gfm_state="connected",
                                    partition_assigned=True))
    assert not found(evaluate_host(facts, TARGET), "gpu.fabric_health")


def test_several_gpus_are_grouped_by_their_faults() -> None:
    def patch(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        bad = {"summary": "unhealthy", "route_unhealthy": True}
        return [{**g, "fabric_health": {**HEALTHY, **(bad if g["index"] in (1, 2, 6) else {})}} for g in gpus]
    (f,) = found(evaluate_host(host("b1", B200, {"driver.gpus": patch}), TARGET), "gpu.fabric_health")
    assert f.message == "NVLink fabric health fails on GPU 1,2,6: Summary Unhealthy, Route Unhealthy True"
    assert f.evidence["fields"] == ["Route Unhealthy", "Summary"]


# -- Jetson / L4T ---------------------------------------------------------------------------------------


def jetson(version: str, l4t: str | None, evidence: str) -> dict[str, Any]:
    # A Jetson has no NVSwitch and no Fabric Manager.
    return {"driver.kernel_module.version": version, "driver.kernel_module.arch": "aarch64",
            "driver.driver_version": None, "driver.platform": {"kind": "tegra", "l4t_release": l4t,
                                                                 "evidence": evidence},
            "fabricmanager.nvswitch_present": False, "fabricmanager.required": False}


@pytest.mark.parametrize(("version", "l4t"), [("35.3.1", "35.3.1"), ("540.4.0", "36.4.4")])
def test_jetson_is_an_unsupported_platform_never_a_branch(version: str, l4t: str) -> None:
    facts = host("j1", R575, jetson(version, l4t, "/etc/nv_tegra_release: # R..."))
    findings = evaluate_host(facts, TARGET)
    (f,) = found(findings, "driver.platform")
    assert f.severity == "critical" and not f.chain
    assert f.message.startswith(f"NVIDIA Jetson (Tegra, L4T {l4t}) board: the kernel module reports {version}, "
                                "which is no data-center driver branch (unsupported platform, unknown branch")
    for f in findings:
        # Never "R35" (or "R540"): no branch, no chain, no driver change.
        assert f"R{version.split('.')[0]}" not in f.message, f.message
        assert not f.chain, f.check_id
    assert not {f.check_id for f in findings} & {"driver.branch", "driver.version_min", "container.cuda_runtime",
                                                 "container.probe"}


def test_l4t_version_without_platform_evidence_is_still_no_branch() -> None:
    facts = host("j1", R575, {"driver.kernel_module.version": "35.3.1", "driver.driver_version": None})
    (f,) = found(evaluate_host(facts, TARGET), "driver.platform")
    assert f.message.startswith("driver version 35.3.1 is no data-center driver branch")


def test_jetson_is_blocked_not_planned() -> None:
    v = evaluate_fleet(fleet(host("j1", R575, jetson("35.3.1", "35.3.1", "kernel module version 35.3.1")),
                             *(host(f"n{i}", R575) for i in range(2))), TARGET)
    assert "j1" not in {u.host for u in v.plan.needs_upgrade}
    (blocked,) = [b for b in v.plan.blocked if b.host == "j1"]
    assert blocked.check_ids == ["driver.platform"] and blocked.current_version == "35.3.1"
    assert blocked.reasons[0].startswith("NVIDIA Jetson (Tegra, L4T 35.3.1) board")
    # The Jetson is not part of the image -> CUDA -> driver chain the night fixes.
    assert "(3)" not in v.reasons[0] and "2 host(s) fail the image -> CUDA -> driver chain" in v.reasons[0]


# -- GPUs already in use ------------------------------------------------------------------------------------


def procs(mib: int, *, kind: str = "C", on: tuple[int, ...] = tuple(range(8)), base: int = 0) -> dict[str, Any]:
    def patch(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for g in gpus:
            p = [{"pid": 48311, "type": kind, "name": "/usr/bin/python3", "used_memory_mib": mib}] if g["index"] in on \
                else []
            out.append({**g, "processes": p, "memory_used_mib": base + (mib if p else 0)})
        return out
    return {"driver.gpus": patch}


def test_gpus_holding_tens_of_gib_fail_vllms_start() -> None:
    (f,) = found(evaluate_host(host("g1", GOOD, procs(131072)), TARGET), "gpu.in_use")
    assert f.message == (
        "GPU 0,1,2,3,4,5,6,7 in use (131072 of 143771 MiB in use on GPU 0); 1 compute process(es): pid 48311 "
        "/usr/bin/python3: vLLM's start-up memory check (gpu_memory_utilization 0.9) would fail on GPU "
        "0,1,2,3,4,5,6,7; a drain or driver change would end this workload")
    assert f.severity == "warning" and f.kind == "fail"
    assert f.evidence["gpus"][0]["processes"][0]["pid"] == 48311


def test_a_small_compute_process_still_makes_the_gpu_busy() -> None:
    (f,) = found(evaluate_host(host("g1", GOOD, procs(600, on=(2,))), TARGET), "gpu.in_use")
    assert f.message.startswith("GPU 2 in use") and "would fail" not in f.message
    assert f.evidence["vllm_start_fails_on"] == []


def test_memory_held_without_a_listed_process_is_in_use() -> None:
    # Processes unknown (NVML without the call), memory in use known: judged by memory.
    def patch(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**g, "processes": None, "memory_used_mib": 20000 if g["index"] == 5 else 0} for g in gpus]
    (f,) = found(evaluate_host(host("g1", GOOD, {"driver.gpus": patch}), TARGET), "gpu.in_use")
    assert f.message.startswith("GPU 5 in use (20000 of 143771 MiB in use on GPU 5): vLLM's start-up memory check")


@pytest.mark.parametrize("patch", [procs(5, kind="G", on=(0,), base=1), procs(0, on=())])
def test_idle_gpus_and_graphics_only_say_nothing(patch: dict[str, Any]) -> None:
    assert not found(evaluate_host(host("g1", GOOD, patch), TARGET), "gpu.in_use")


def test_unknown_use_is_said() -> None:
    def patch(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**g, "processes": None, "memory_used_mib": None} for g in gpus]
    (f,) = found(evaluate_host(host("g1", GOOD, {"driver.gpus": patch}), TARGET), "gpu.in_use")
    assert f.kind == "unknown" and f.severity == "warning"


def busy_fleet(n_busy: int, n_free: int) -> FleetVerdict:
    hosts = [host(f"b{i}", R575, procs(131072)) for i in range(n_busy)]
    hosts += [host(f"f{i}", R575) for i in range(n_free)]
    return evaluate_fleet(fleet(*hosts), TARGET)


def test_busy_hosts_are_never_the_canary_and_not_idle() -> None:
    v = busy_fleet(3, 1)
    assert v.plan.canary is not None and v.plan.canary.host == "f0"
    items = {u.host: u for u in v.plan.needs_upgrade}
    assert all(items[f"b{i}"].idle is False for i in range(3)) and items["f0"].idle is True
    assert sorted(h for w in v.plan.waves for h in w) == ["b0", "b1", "b2"]


def test_no_canary_when_every_host_is_busy() -> None:
    v = busy_fleet(2, 0)
    assert v.plan.canary is None and v.plan.waves == []
    assert v.plan.canary_note == ("every one of the 2 unblocked hosts has GPUs in use by processes outside the "
                                  "scheduler: free one before the night, the canary must be idle")
    # They still count for capacity once changed.
    assert v.summary.gpus_after_plan == 16
