"""Fleet verdict: outcome precedence, exit codes, unreachable hosts, drift, capacity, strategy, change plan, schemas.

The default target derives multi_node_tp_dp for these H200 fleets (one node cannot hold
the weights): 16 GPUs and GPUDirect RDMA on every node. The R575 fixture host has
proprietary modules and no nvidia_peermem; ``host()`` loads peermem on R575 hosts, as on
the lab's healthy R575 nodes, unless a case says otherwise (NO_PEERMEM).
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from verdict_fixtures import B200, GOOD, R575, SINGLE, TARGET, fleet, host, host_raw, raw

from k3fleet.models.facts import host_facts_json_schema
from k3fleet.models.findings import FleetVerdict, fleet_verdict_json_schema
from k3fleet.models.target import Target
from k3fleet.verdict import CHECKS, catalogue, catalogue_markdown, catalogue_rows, evaluate_fleet, validate_facts
from k3fleet.verdict.catalogue import fixes_for
from k3fleet.verdict.check import check, registered, registered_ids
from k3fleet.verdict.rules import RULES
from k3fleet.verdict.rules import gpu as rules_gpu

MULTI = TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update={"strategy": "multi_node_tp_dp"})})
# Per-GPU memory (MiB) at which one 8-GPU node holds the target's 1561 GB of weights (the measured 1.42 TiB).
BIG = {"driver.gpus": lambda gs: [{**g, "memory_total_mib": 1561 * 1024 // 8} for g in gs]}
NO_PEERMEM = {"rdma.nvidia_peermem_loaded": False}
RAIL_DOWN = {"rdma.devices.3.ports.0": lambda p: {**p, "state": "DOWN", "state_code": 1, "phys_state": "Disabled",
                                                   "phys_state_code": 3}}
FM_82 = {"fabricmanager.version": "580.82.07", "packages.packages.4.version": "580.82.07-1"}
H100 = {"driver.gpus": lambda gs: [{**g, "name": "NVIDIA H100 80GB HBM3"} for g in gs]}
BUSY = {"scheduler.state": "mixed", "scheduler.jobs_running": 2}
FM_FAILED = {"fabricmanager.unit.active": "failed"}


def ids(v: FleetVerdict) -> set[str]:
    return {f.check_id for f in v.fleet_findings}


# -- outcomes and exit codes ------------------------------------------------------------------


def test_clean_fleet_goes_live() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2")), TARGET)
    assert v.outcome == "go_live"
    assert v.exit_code == 0 and not v.checks_failed
    assert v.summary.passed == 2 and v.summary.gpus_healthy == 16 and v.summary.gpus_required == 16
    assert v.all_findings() == []
    assert v.reasons[0] == "all 2 host(s) pass; 16 healthy GPUs, 16 required"
    assert v.strategy is not None and v.strategy.strategy == "multi_node_tp_dp" and v.strategy.derived
    assert v.plan.done == ["g1", "g2"] and v.plan.needs_upgrade == [] and v.plan.canary is None
    assert v.plan.canary_note == "no host needs the change"


def test_r575_fleet_needs_the_environment_rebuilt() -> None:
    v = evaluate_fleet(fleet(*(host(f"n{i}", R575) for i in range(3))), TARGET)
    assert v.outcome == "rebuild_environment"
    assert v.exit_code == 1
    assert "3 host(s) fail the image -> CUDA -> driver chain" in v.reasons[0]
    assert "driver.branch (3)" in v.reasons[0]
    assert "the change plan moves 3 host(s) to the target driver" in v.reasons
    assert v.summary.gpus_healthy == 0 and v.summary.gpus_after_plan == 24 and v.summary.gpus_required == 16
    cap = next(f for f in v.fleet_findings if f.check_id == "fleet.capacity")
    assert cap.chain and cap.evidence["gpus_after_plan"] == 24
    assert [u.host for u in v.plan.needs_upgrade] == ["n0", "n1", "n2"]
    assert v.plan.canary is not None and v.plan.canary.host == "n0"
    assert all(h.status == "fail" for h in v.hosts.values())


def test_capacity_short_even_after_the_change_wins_over_rebuild() -> None:
    # H100 needs 32 GPUs in any layout: two R575 H100 hosts (16) stay short after the upgrade.
    v = evaluate_fleet(fleet(host("h1", R575, H100), host("h2", R575, H100)), TARGET)
    assert v.outcome == "expand_capacity"
    assert v.reasons[0] == ("16 GPUs would be healthy after the planned driver change, 32 required "
                            "(H100 (any layout))")
    assert v.exit_code == 1
    assert not next(f for f in v.fleet_findings if f.check_id == "fleet.capacity").chain


def test_too_few_gpus_on_the_only_host_expands_capacity() -> None:
    v = evaluate_fleet(fleet(host("g1", GOOD, {"driver.gpus": lambda g: g[:4], "driver.gpu_count": 4})), TARGET)
    assert v.outcome == "expand_capacity"
    assert v.hosts["g1"].status == "fail"
    assert "fleet.capacity" in ids(v)


# (case, hosts, target, outcome, GPUs required, strategy): precedence under the derived strategy.
OUTCOMES: list[tuple[str, list[tuple[str, str, dict[str, Any] | None]], Any, str, int, str]] = [
    ("one clean H200 node cannot serve K3 alone", [("g1", GOOD, None)], TARGET, "expand_capacity", 16,
     "multi_node_tp_dp"),
    ("one clean node that holds the weights", [("g1", GOOD, BIG)], TARGET, "go_live", 8, "single_node_tp"),
    ("explicit single_node_tp on H200 is used, with a warning", [("g1", GOOD, None)], SINGLE,
     "observe_with_limits", 8, "single_node_tp"),
    ("two R575 H200 nodes: rebuild, the plan reaches 16", [("n1", R575, None), ("n2", R575, None)], TARGET,
     "rebuild_environment", 16, "multi_node_tp_dp"),
    ("two R575 nodes without GPUDirect: blocked, capacity short after the plan",
     [("n1", R575, NO_PEERMEM), ("n2", R575, NO_PEERMEM)], TARGET, "expand_capacity", 16, "multi_node_tp_dp"),
    ("a rail down blocks one of two: capacity short", [("n1", R575, RAIL_DOWN), ("n2", R575, None)], TARGET,
     "expand_capacity", 16, "multi_node_tp_dp"),
    ("a rail down on a big node only warns", [("g1", GOOD, {**BIG, **RAIL_DOWN})], TARGET, "observe_with_limits", 8,
     "single_node_tp"),
    ("three nodes, one rail down: left out, 16 healthy", [("g1", GOOD, None), ("g2", GOOD, None),
                                                          ("g3", GOOD, RAIL_DOWN)], TARGET,
     "observe_with_limits", 16, "multi_node_tp_dp"),
]


@pytest.mark.parametrize(("case", "spec", "target", "outcome", "need", "strategy"), OUTCOMES,
                         ids=[c[0] for c in OUTCOMES])
def test_outcome_under_the_strategy(case: str, spec: list[tuple[str, str, dict[str, Any] | None]], target: Target,
                                    outcome: str, need: int, strategy: str) -> None:
    v = evaluate_fleet(fleet(*(host(n, b, p) for n, b, p in spec)), target)
    assert (v.outcome, v.summary.gpus_required) == (outcome, need), (case, v.reasons)
    assert v.strategy is not None and v.strategy.strategy == strategy
    # The last reason always says which strategy was judged by, and why.
    assert v.reasons[-1].startswith(f"strategy {strategy} (")
    assert ("derived from GPU memory" in v.reasons[-1]) is (target is TARGET)


def test_derived_strategy_is_named_in_reasons_and_evidence() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2", GOOD, RAIL_DOWN)), TARGET)
    assert v.reasons[-1] == (
        "strategy multi_node_tp_dp (derived from GPU memory): one node of 8x NVIDIA H200 has 1123.2 GiB of GPU "
        "memory, below about 1561 GB that the MXFP4 weights need: each instance spans nodes (multi_node_tp_dp: at "
        "least 16 GPUs, RDMA on every node)")
    s = v.strategy
    assert s is not None and s.setting == "auto" and s.rdma_required and s.weights_confirmed is True
    assert [(n.gpu_model, n.hosts, n.holds_weights) for n in s.nodes] == [("NVIDIA H200", 2, False)]
    cap = next(f for f in v.fleet_findings if f.check_id == "fleet.capacity")
    assert cap.evidence["basis"] == "strategy multi_node_tp_dp, derived from GPU memory"
    assert cap.evidence["strategy"] == "multi_node_tp_dp"
    assert "fleet.strategy" not in ids(v)


def test_explicit_single_node_on_too_small_nodes_warns() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2")), SINGLE)
    f = next(f for f in v.fleet_findings if f.check_id == "fleet.strategy")
    assert (f.severity, f.kind) == ("warning", "fail")
    assert f.message == ("the target names single_node_tp, but one node of 8x NVIDIA H200 has 1123.2 GiB of GPU "
                         "memory, below the 1561 GB the weights need")
    assert f.evidence["short_models"] == ["NVIDIA H200"]
    assert v.summary.gpus_required == 8 and v.outcome == "observe_with_limits"
    # Explicit strategies that fit, and multi-node ones, say nothing.
    assert "fleet.strategy" not in ids(evaluate_fleet(fleet(host("g1", GOOD, BIG)), SINGLE))
    assert "fleet.strategy" not in ids(evaluate_fleet(fleet(host("g1"), host("g2")), MULTI))


def test_strategy_that_cannot_be_derived_is_unknown() -> None:
    no_memory = {"driver.gpus": lambda gs: [{**g, "memory_total_mib": None} for g in gs]}
    v = evaluate_fleet(fleet(host("g1", GOOD, no_memory), host("g2", GOOD, no_memory)), TARGET)
    f = next(f for f in v.fleet_findings if f.check_id == "fleet.strategy")
    assert (f.severity, f.kind) == ("warning", "unknown")
    assert "no host reported its GPU memory" in f.message
    assert v.strategy is not None and v.strategy.strategy == "multi_node_tp_dp" and v.strategy.hosts_unknown_memory == 2
    assert v.outcome == "observe_with_limits" and v.exit_code == 0


def test_warnings_only_observe_with_exit_0() -> None:
    debug = {"nccl.settings.NCCL_DEBUG": {"value": "INFO", "source": "env"}}
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, debug)), TARGET)
    assert v.outcome == "observe_with_limits"
    assert v.exit_code == 0
    assert v.hosts["g3"].status == "warn"
    assert any("warning(s) to observe" in r for r in v.reasons)


def test_failed_host_is_left_out_when_capacity_holds() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, FM_FAILED)), TARGET)
    assert v.outcome == "observe_with_limits"
    assert v.exit_code == 1
    assert v.reasons[0] == "1 host(s) fail checks and are left out; 16 healthy GPUs meet the 16 required"
    assert v.hosts["g3"].status == "fail"


def test_unreachable_hosts_are_listed_never_failed() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2")), TARGET, {"g9": "ssh: connect to host g9: Connection timed out"})
    assert v.exit_code == 3
    assert v.outcome == "observe_with_limits"
    g9 = v.hosts["g9"]
    assert g9.status == "unreachable" and g9.findings == []
    assert g9.reason == "ssh: connect to host g9: Connection timed out"
    assert v.summary.unreachable == 1 and v.summary.failed == 0
    assert all(f.host != "g9" and "g9" not in json.dumps(f.evidence) for f in v.all_findings())
    assert v.plan.unreachable == ["g9"]
    assert "1 host(s) unreachable: their GPUs are not counted" in v.reasons


def test_failed_checks_win_over_unreachable_in_the_exit_code() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, FM_FAILED)), TARGET, {"g9": "timeout"})
    assert v.exit_code == 1


def test_stale_facts_of_an_unreachable_host_are_ignored() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g9", R575)), TARGET, {"g9": "timeout"})
    assert v.hosts["g9"].status == "unreachable"
    assert v.outcome == "observe_with_limits"
    assert v.plan.needs_upgrade == []


def test_unknown_facts_make_evidence_incomplete() -> None:
    unreadable = {"driver.status": "unknown", "driver.kernel_module.loaded": None,
                  "driver.kernel_module.version": None, "driver.driver_version": None,
                  "driver.reason": "/proc/driver/nvidia/version: Permission denied"}
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, unreadable)), TARGET)
    assert v.summary.evidence_incomplete
    assert v.exit_code == 3
    assert v.hosts["g3"].status == "fail"
    assert v.outcome == "observe_with_limits"


def test_invalid_facts_become_a_finding_not_an_exception() -> None:
    bad = host_raw("g3")
    bad["driver"]["gpus"][0]["index"] = "first"
    valid, invalid = validate_facts({"g1": host_raw("g1"), "g2": host_raw("g2"), "g3": bad, "g4": [1, 2]})
    assert sorted(valid) == ["g1", "g2"]
    assert invalid["g3"].startswith("host g3: facts invalid at driver.gpus.0.index: ")
    assert "'first'" in invalid["g3"]
    assert invalid["g4"] == "host g4: facts invalid: expected a JSON object, got list"
    v = evaluate_fleet(valid, TARGET, invalid=invalid)
    assert v.hosts["g3"].status == "fail"
    f = v.hosts["g3"].findings[0]
    assert (f.check_id, f.kind, f.severity) == ("facts.schema", "unknown", "error")
    assert v.exit_code == 3
    assert [(b.host, b.check_ids) for b in v.plan.blocked] == [("g3", ["facts.schema"]), ("g4", ["facts.schema"])]
    assert list(v.hosts) == ["g1", "g2", "g3", "g4"]


def test_validate_facts_restores_the_collector_state() -> None:
    import gc

    before = gc.isenabled()
    validate_facts({"g1": host_raw("g1")}, freeze=False)
    assert gc.isenabled() == before
    gc.disable()
    try:
        validate_facts({"g1": host_raw("g1")}, freeze=False)
        assert not gc.isenabled()
    finally:
        if before:
            gc.enable()


# -- drift -------------------------------------------------------------------------------------


def test_driver_drift_names_the_outliers() -> None:
    v82 = {"driver.kernel_module.version": "580.82.07", "driver.driver_version": "580.82.07",
           "packages.driver_version": "580.82.07", "fabricmanager.version": "580.82.07"}
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3"), host("g4", GOOD, v82)), TARGET)
    d = next(f for f in v.fleet_findings if f.check_id == "fleet.driver_drift")
    assert d.severity == "warning" and d.host is None
    assert d.evidence["majority"] == "580.95.05"
    assert d.evidence["outliers"] == ["g4"] and d.evidence["values"] == {"580.95.05": 3, "580.82.07": 1}
    assert d.message == "2 driver versions across 4 hosts: 580.95.05 (3), 580.82.07 (1)"


def test_image_digest_drift_is_an_error() -> None:
    other = {"container.image.digest": "sha256:0c4d1e2f3a5b"}
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, other)), TARGET)
    d = next(f for f in v.fleet_findings if f.check_id == "fleet.image_digest_drift")
    assert d.severity == "error" and d.evidence["outliers"] == ["g3"]
    assert v.exit_code == 1 and v.outcome == "observe_with_limits"
    assert "fleet-wide errors: fleet.image_digest_drift" in v.reasons


def test_nccl_drift_lists_each_key() -> None:
    eth = {"nccl.settings.NCCL_SOCKET_IFNAME": {"value": "eth0", "source": "env"}}
    v = evaluate_fleet(fleet(host("g1"), host("g2"), host("g3", GOOD, eth)), TARGET)
    d = next(f for f in v.fleet_findings if f.check_id == "fleet.nccl_drift")
    assert list(d.evidence["keys"]) == ["NCCL_SOCKET_IFNAME"]
    assert d.evidence["keys"]["NCCL_SOCKET_IFNAME"]["outliers"] == ["g3"]
    assert "NCCL_SOCKET_IFNAME: bond0 (2), eth0 (1)" in d.message


def test_rail_drift_on_multi_node_targets_only() -> None:
    six = {"rdma.devices": lambda d: d[:6]}
    hosts = fleet(host("g1"), host("g2"), host("g3", GOOD, six))
    assert "fleet.rdma_rail_drift" in ids(evaluate_fleet(hosts, MULTI))
    assert "fleet.rdma_rail_drift" not in ids(evaluate_fleet(hosts, SINGLE))
    # The default target derives multi-node on H200: rail counts must agree.
    assert "fleet.rdma_rail_drift" in ids(evaluate_fleet(hosts, TARGET))


def test_drift_evidence_is_capped() -> None:
    v82 = {"driver.kernel_module.version": "580.82.07", "driver.driver_version": "580.82.07",
           "packages.driver_version": "580.82.07", "fabricmanager.version": "580.82.07"}
    hosts = [host(f"a{i:03d}") for i in range(70)] + [host(f"b{i:03d}", GOOD, v82) for i in range(60)]
    d = next(f for f in evaluate_fleet(fleet(*hosts), TARGET).fleet_findings if f.check_id == "fleet.driver_drift")
    assert len(d.evidence["outliers"]) == 50 and d.evidence["outlier_count"] == 60


def test_unconfirmed_matrix_rows_are_reported() -> None:
    v = evaluate_fleet(fleet(host("g1", GOOD, {"container.image.cuda_version": "13.3.0"}), host("g2")), TARGET)
    assert v.unconfirmed_matrix_rows == ["13.3"]
    note = next(f for f in v.fleet_findings if f.check_id == "target.unconfirmed")
    assert note.severity == "info" and note.kind == "note"


def test_verdict_is_deterministic_whatever_the_input_order() -> None:
    hosts = [host(f"n{i}", R575, BUSY if i % 3 else None) for i in range(12)] + [host("g1"), host("g2")]
    one = evaluate_fleet(fleet(*hosts), TARGET).model_dump_json()
    random.Random(3).shuffle(hosts)
    assert evaluate_fleet(fleet(*hosts), TARGET).model_dump_json() == one


# -- change plan -----------------------------------------------------------------------------


def test_plan_lists_package_changes() -> None:
    v = evaluate_fleet(fleet(host("n1", R575)), TARGET)
    item = v.plan.needs_upgrade[0]
    assert (item.current_version, item.current_branch, item.target_version, item.target_branch) == (
        "575.57.08", 575, "580.95.05", 580)
    changes = {c.name: c for c in item.packages}
    assert changes["nvidia-driver-575-server"].to_name == "nvidia-driver-580-server"
    assert changes["nvidia-driver-575-server"].from_version == "575.57.08-0ubuntu0.24.04.1"
    assert changes["nvidia-driver-575-server"].to_version == "580.95.05"
    assert changes["nvidia-fabricmanager-575"].to_name == "nvidia-fabricmanager-580"
    assert changes["nvidia-fabricmanager-575"].to_version == "580.95.05"
    kmod = changes["linux-modules-nvidia-575-server-6.8.0-60-generic"]
    assert kmod.to_name == "linux-modules-nvidia-580-server-6.8.0-60-generic" and kmod.to_version is None
    assert "nvidia-container-toolkit" not in changes


def test_plan_adds_fabric_manager_where_missing() -> None:
    no_fm = {"packages.packages": lambda ps: [p for p in ps if p["role"] != "fabricmanager"]}
    item = evaluate_fleet(fleet(host("n1", R575, no_fm)), TARGET).plan.needs_upgrade[0]
    added = [c for c in item.packages if c.name is None]
    assert [(c.to_name, c.to_version) for c in added] == [("nvidia-fabricmanager-580", "580.95.05")]
    assert item.notes


def test_plan_sorts_hosts_into_done_upgrade_blocked() -> None:
    pending = {"packages.driver_version": "580.95.05"}
    unattended = {"packages.unattended_upgrades_enabled": True, "packages.packages.0.held": False}
    unknown = {"driver.kernel_module.version": None, "driver.driver_version": None,
               "packages.driver_version": None}
    v = evaluate_fleet(fleet(
        host("done1"), host("up1", R575), host("up2", R575, unattended), host("fm", R575, FM_FAILED),
        host("reboot", R575, pending), host("what", R575, unknown),
    ), TARGET, {"gone": "timeout"})
    p = v.plan
    assert p.done == ["done1"]
    assert [u.host for u in p.needs_upgrade] == ["fm", "reboot", "up1", "up2"]
    blocked = {b.host: b for b in p.blocked}
    assert set(blocked) == {"fm", "reboot", "what"}
    assert blocked["fm"].check_ids == ["fabricmanager.active"]
    assert blocked["reboot"].check_ids == ["driver.pending_reboot"]
    assert blocked["what"].reasons == ["the current driver version is unknown"]
    planned = [p.canary.host if p.canary else None] + [h for w in p.waves for h in w]
    # Holding packages is part of the change, so unattended upgrades do not block it.
    assert sorted(planned) == ["up1", "up2"]
    assert p.unreachable == ["gone"]


def test_canary_is_idle_and_of_the_most_common_profile() -> None:
    v = evaluate_fleet(fleet(
        host("a1", R575, BUSY), host("a2", R575), host("a3", R575),
        host("b1", R575, H100), host("b2", R575, H100),
    ), TARGET)
    c = v.plan.canary
    assert c is not None and c.host == "a2"
    assert c.profile == "8x NVIDIA H200, driver 575.57.08, NVSwitch, proprietary modules"
    assert "idle per the scheduler" in c.reason and "shared by 3 of 5 hosts" in c.reason
    assert "has no host that is idle" not in c.reason


def test_canary_prefers_an_idle_host_and_says_why_not_the_common_profile() -> None:
    v = evaluate_fleet(fleet(
        host("a1", R575, BUSY), host("a2", R575, BUSY), host("a3", R575, BUSY),
        host("b1", R575, {**H100, "scheduler.state_flags": ["maint"]}), host("b2", R575, H100),
    ), TARGET)
    c = v.plan.canary
    assert c is not None and c.host == "b2"
    assert c.note is not None and "the most common profile '8x NVIDIA H200, driver 575.57.08" in c.note
    assert "has no host that is idle, unblocked and free of problem warnings" in c.note
    assert len(c.reason) < 120 and c.host not in c.reason


def test_canary_is_a_clean_host_before_one_with_its_own_trouble() -> None:
    # The lab's story: the common (proprietary) profile has only a host with NCCL debugging left on
    # (idle), a busy one, and blocked ones; the clean idle host of another flavour is the better canary.
    open_ = {"driver.kernel_module.flavour": "open"}
    debug = {"nccl.settings.NCCL_DEBUG": {"value": "INFO", "source": "/etc/nccl.conf"}}
    v = evaluate_fleet(fleet(
        host("a1", R575, BUSY), host("a2", R575, open_), host("a5", R575, RAIL_DOWN),
        host("a6", R575, {**NO_PEERMEM, **BUSY}), host("a7", R575, debug),
    ), TARGET)
    p = v.plan
    assert p.canary is not None and p.canary.host == "a2"
    assert {b.host for b in p.blocked} == {"a5", "a6"}
    assert {b.host: b.check_ids for b in p.blocked} == {"a5": ["rdma.port_state"], "a6": ["rdma.peermem"]}
    assert p.canary.note is not None and "free of problem warnings" in p.canary.note
    # The host with a warning still changes, in the first wave, ahead of the busy one.
    assert p.waves == [["a7"], ["a1"]]


def test_canary_with_a_problem_warning_says_so() -> None:
    debug = {"nccl.settings.NCCL_DEBUG": {"value": "INFO", "source": "/etc/nccl.conf"}}
    v = evaluate_fleet(fleet(host("a1", R575, debug), host("a2", R575, {**debug, **BUSY})), TARGET)
    assert v.plan.canary is not None and v.plan.canary.host == "a1"
    assert v.plan.canary.reason.startswith("no blocking findings (1 warning(s), 1 of them problems), idle")


def test_canary_among_clean_hosts_is_still_of_the_common_profile() -> None:
    open_ = {"driver.kernel_module.flavour": "open"}
    v = evaluate_fleet(fleet(host("a1", R575), host("a2", R575, open_), host("a3", R575)), TARGET)
    assert v.plan.canary is not None and v.plan.canary.host == "a1"
    assert "shared by 2 of 3 hosts" in v.plan.canary.reason


def test_canary_skips_blocked_hosts_and_notes_when_none_is_left() -> None:
    v = evaluate_fleet(fleet(host("a1", R575, FM_FAILED), host("a2", R575)), TARGET)
    assert v.plan.canary is not None and v.plan.canary.host == "a2"
    none = evaluate_fleet(fleet(host("a1", R575, FM_FAILED)), TARGET)
    assert none.plan.canary is None and none.plan.waves == []
    assert none.plan.canary_note == "all 1 hosts needing the change are blocked: fix their findings first"


# -- Fabric Manager only: the driver is at the target, its Fabric Manager is not ---------------------

CUDA_FM = {"name": "cuda-drivers-fabricmanager-580", "version": "580.82.07-1", "held": True, "role": "fabricmanager",
           "branch": "580", "flavour": None}
FM_DOWN = {**FM_82, "fabricmanager.unit.active": "failed", "scheduler.state": "drained",
           "scheduler.reason": "fabric manager failed after driver update",
           "container.probe": {"ran": True, "ok": False, "failure": "runtime_error", "cuda_init": False,
                               "visible_gpus": 0, "message": "CUDA did not initialise in the container "
                               "(torch.cuda.is_available() is False)"}}

# (case, patch on a clean R580 host, planned (needs_upgrade), blocked by, FM packages planned)
FM_CASES: list[tuple[str, dict[str, Any], bool, list[str], list[tuple[str | None, str, str | None]]]] = [
    ("clean host: nothing left to change", {}, False, [], []),
    ("FM 580.82.07 under driver 580.95.05", FM_82, True, [],
     [("nvidia-fabricmanager-580", "nvidia-fabricmanager-580", "580.95.05")]),
    ("with cuda-drivers-fabricmanager installed", {**FM_82, "packages.packages": lambda ps: [*ps, CUDA_FM]}, True, [],
     [("nvidia-fabricmanager-580", "nvidia-fabricmanager-580", "580.95.05"),
      ("cuda-drivers-fabricmanager-580", "cuda-drivers-fabricmanager-580", "580.95.05")]),
    # The lab's gpu-a04: FM refuses the other driver, the unit failed, CUDA cannot start: all settled by FM.
    ("FM unit failed and CUDA down because of it", FM_DOWN, True, [],
     [("nvidia-fabricmanager-580", "nvidia-fabricmanager-580", "580.95.05")]),
    ("a fault FM does not explain still blocks", {**FM_82, "packages.dkms_used": True,
                                                  "packages.dkms_built_for_running_kernel": False},
     True, ["packages.dkms_kernel"], [("nvidia-fabricmanager-580", "nvidia-fabricmanager-580", "580.95.05")]),
    ("probe failure with FM running is not FM's", {**FM_82, "container.probe": FM_DOWN["container.probe"]}, True,
     ["container.probe"], [("nvidia-fabricmanager-580", "nvidia-fabricmanager-580", "580.95.05")]),
    ("FM of the old branch left behind", {"fabricmanager.version": "575.57.08",
                                          "packages.packages.4": lambda p: {**p, "name": "nvidia-fabricmanager-575",
                                                                            "version": "575.57.08-1",
                                                                            "branch": "575"}},
     True, [], [("nvidia-fabricmanager-575", "nvidia-fabricmanager-580", "580.95.05")]),
    ("NVSwitch system without FM", {"fabricmanager.status": "absent", "fabricmanager.unit.installed": False,
                                    "fabricmanager.unit.active": "inactive", "fabricmanager.version": None,
                                    "packages.packages": lambda ps: [p for p in ps if p["role"] != "fabricmanager"]},
     True, [], [(None, "nvidia-fabricmanager-580", "580.95.05")]),
    ("FM version unreadable: not planned blind", {"fabricmanager.version": "garbage",
                                                  "fabricmanager.version_matches_driver": None}, False, [], []),
    ("no NVSwitch: FM is not needed", {"fabricmanager": {"status": "absent", "nvswitch_present": False,
                                                         "nvswitch_count": 0, "required": False}},
     False, [], []),
]


@pytest.mark.parametrize(("case", "patch", "planned", "blockers", "packages"), FM_CASES, ids=[c[0] for c in FM_CASES])
def test_fabric_manager_only_changes(case: str, patch: dict[str, Any], planned: bool, blockers: list[str],
                                     packages: list[tuple[str | None, str, str | None]]) -> None:
    v = evaluate_fleet(fleet(host("g1", GOOD, patch), host("g2")), TARGET)
    p = v.plan
    items = {u.host: u for u in p.needs_upgrade}
    assert ("g1" in items) is planned and ("g1" in p.done) is not planned, case
    assert p.done[-1] == "g2"
    blocked = {b.host: b.check_ids for b in p.blocked}
    assert blocked.get("g1", []) == blockers
    if planned:
        item = items["g1"]
        assert item.scope == "fabricmanager"
        assert (item.current_version, item.target_version, item.target_branch) == ("580.95.05", "580.95.05", 580)
        assert [(c.name, c.to_name, c.to_version) for c in item.packages] == packages
        assert any("only Fabric Manager changes" in n for n in item.notes)


def test_fm_only_host_changes_but_is_never_the_driver_canary() -> None:
    v = evaluate_fleet(fleet(host("a1", R575, BUSY), host("a4", GOOD, FM_82), host("a3")), TARGET)
    p = v.plan
    assert p.canary is not None and p.canary.host == "a1"
    assert p.waves == [["a4"]] and p.done == ["a3"]
    assert [(u.host, u.scope) for u in p.needs_upgrade] == [("a1", "driver"), ("a4", "fabricmanager")]
    assert "the change plan moves 1 host(s) to the target driver and 1 host(s) to the Fabric Manager of their " \
           "driver's version" in v.reasons
    # Alone, it is the first host to change, and the reason says it is an FM-only change.
    alone = evaluate_fleet(fleet(host("a4", GOOD, FM_DOWN), host("a3"), host("a5")), TARGET).plan
    assert alone.canary is not None and alone.canary.host == "a4"
    assert "only Fabric Manager changes on it" in alone.canary.reason


def test_fm_only_host_counts_after_the_plan() -> None:
    # Two healthy GPUs short of 16 until the FM-only host is fixed: the plan gets there, no expansion.
    v = evaluate_fleet(fleet(host("a3"), host("a4", GOOD, FM_DOWN)), TARGET)
    assert v.summary.gpus_healthy == 8 and v.summary.gpus_after_plan == 16
    assert v.outcome == "observe_with_limits"
    cap = next(f for f in v.fleet_findings if f.check_id == "fleet.capacity")
    assert cap.chain and cap.evidence["gpus_after_plan"] == 16


def test_waves_default_to_a_tenth_and_never_hold_blocked_hosts() -> None:
    hosts = [host(f"n{i:02d}", R575, BUSY if i % 2 else None) for i in range(21)]
    hosts.append(host("x", R575, FM_FAILED))
    v = evaluate_fleet(fleet(*hosts), TARGET)
    p = v.plan
    assert p.wave_size == 3
    assert [len(w) for w in p.waves] == [3, 3, 3, 3, 3, 3, 2]
    flat = [h for w in p.waves for h in w]
    assert p.canary is not None
    assert sorted([p.canary.host, *flat]) == sorted(f"n{i:02d}" for i in range(21))
    assert "x" not in flat and len(set(flat)) == len(flat)
    # Idle hosts go first, by name; busy ones after.
    idle = [f"n{i:02d}" for i in range(0, 21, 2)]
    assert [p.canary.host, *flat][: len(idle)] == idle


def test_wave_size_parameter() -> None:
    hosts = fleet(*(host(f"n{i:02d}", R575) for i in range(21)))
    assert [len(w) for w in evaluate_fleet(hosts, TARGET, wave_size=5).plan.waves] == [5, 5, 5, 5]
    assert evaluate_fleet(hosts, TARGET, wave_size=100).plan.waves[0][0] == "n01"
    with pytest.raises(ValueError, match="wave_size must be at least 1, got 0"):
        evaluate_fleet(hosts, TARGET, wave_size=0)


def test_target_wave_fraction_is_used() -> None:
    t: Target = TARGET.model_copy(update={"change": TARGET.change.model_copy(update={"wave_fraction": 0.5})})
    v = evaluate_fleet(fleet(*(host(f"n{i}", R575) for i in range(5))), t)
    assert v.plan.wave_size == 3 and [len(w) for w in v.plan.waves] == [3, 1]


# -- schemas and catalogue ------------------------------------------------------------------------


def test_host_facts_schema_accepts_the_fixtures() -> None:
    schema = host_facts_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    for name in (GOOD, R575, B200):
        jsonschema.validate(raw(name), schema)


def test_fleet_verdict_schema_matches_the_output() -> None:
    schema = fleet_verdict_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert {"exit_code", "checks_failed", "outcome", "plan"} <= set(schema["properties"])
    v = evaluate_fleet(fleet(host("n1", R575), host("g1"), host("b1", B200)), TARGET, {"x": "timeout"})
    data = json.loads(v.model_dump_json())
    jsonschema.validate(data, schema)
    assert data["exit_code"] == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "outcome": "ship_it"}, schema)


def test_fleet_verdict_round_trips_through_json() -> None:
    v = evaluate_fleet(fleet(host("n1", R575), host("g1")), TARGET, {"x": "timeout"})
    back = FleetVerdict.model_validate_json(v.model_dump_json())
    assert back == v and back.exit_code == v.exit_code


def test_every_check_defined_beside_a_rule_is_in_the_catalogue_once() -> None:
    # Entries are defined in the concern modules (rules/<concern>.py, fleet.py, pairs.py); the catalogue
    # lists them in report order. One defined where the catalogue does not look would be reported but
    # missing from docs/checks.md and `k3fleet checks`.
    assert set(CHECKS) == registered_ids()
    assert all(CHECKS[i] is registered(i) for i in CHECKS)
    with pytest.raises(ValueError, match="defined twice"):
        check("driver.loaded", "t", "w", "error", "f", source="s")
    # A concern module's entries are the checks its rules emit, in catalogue order.
    assert [c.id for c in rules_gpu.CHECKS][:2] == ["gpu.count", "gpu.persistence_mode"]
    assert rules_gpu.RULES[0] in RULES


def test_catalogue_ids_are_stable_and_documented() -> None:
    ids_ = [c.id for c in catalogue()]
    assert len(ids_) == len(set(ids_)) == len(CHECKS)
    for c in catalogue():
        assert c.id.count(".") == 1 and c.id == c.id.lower()
        assert (c.scope == "fleet") == c.id.startswith(("fleet.", "target."))
        assert c.title and c.why and c.fix
    md = catalogue_markdown(TARGET)
    assert all(f"`{i}`" in md for i in ids_)
    rows = catalogue_rows(TARGET)
    assert all("{" not in r["fix"] and "{" not in r["why"] for r in rows)
    assert "580.95.05" in fixes_for(TARGET)["driver.branch"]
    # Without a target the templates stay visible rather than failing.
    assert "{target_version}" in next(r for r in catalogue_rows() if r["id"] == "driver.branch")["fix"]
