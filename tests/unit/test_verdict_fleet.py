"""Fleet verdict: outcome precedence, exit codes, unreachable hosts, drift, capacity, change plan, schemas."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from k3fleet.models.facts import HostFacts, host_facts_json_schema
from k3fleet.models.findings import FleetVerdict, fleet_verdict_json_schema
from k3fleet.models.target import Target
from k3fleet.targets import load_target
from k3fleet.verdict import CHECKS, catalogue, catalogue_markdown, catalogue_rows, evaluate_fleet, validate_facts
from k3fleet.verdict.catalogue import fixes_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
GOOD, R575, B200 = "r580_h200_hgx", "r575_h200_hgx", "r580_b200_hgx"
TARGET = load_target(None)
MULTI = TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update={"strategy": "multi_node_tp_dp"})})
H100 = {"driver.gpus": lambda gs: [{**g, "name": "NVIDIA H100 80GB HBM3"} for g in gs]}
BUSY = {"scheduler.state": "mixed", "scheduler.jobs_running": 2}
FM_FAILED = {"fabricmanager.unit.active": "failed"}


def raw(base: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"host_{base}.json").read_text())
    return data


def set_path(data: Any, path: str, value: Any) -> None:
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last: Any = int(keys[-1]) if isinstance(node, list) else keys[-1]
    node[last] = value(node[last]) if callable(value) else value


def host_raw(name: str, base: str = GOOD, patch: dict[str, Any] | None = None) -> dict[str, Any]:
    data = raw(base)
    data["host"] = data["hostname"] = data["scheduler"]["node"] = name
    for path, value in (patch or {}).items():
        set_path(data, path, value)
    return data


def host(name: str, base: str = GOOD, patch: dict[str, Any] | None = None) -> HostFacts:
    return HostFacts.model_validate(host_raw(name, base, patch))


def fleet(*hosts: HostFacts) -> dict[str, HostFacts]:
    return {h.host: h for h in hosts}


def ids(v: FleetVerdict) -> set[str]:
    return {f.check_id for f in v.fleet_findings}


# -- outcomes and exit codes ------------------------------------------------------------------


def test_clean_fleet_goes_live() -> None:
    v = evaluate_fleet(fleet(host("g1"), host("g2")), TARGET)
    assert v.outcome == "go_live"
    assert v.exit_code == 0 and not v.checks_failed
    assert v.summary.passed == 2 and v.summary.gpus_healthy == 16 and v.summary.gpus_required == 8
    assert v.all_findings() == []
    assert v.plan.done == ["g1", "g2"] and v.plan.needs_upgrade == [] and v.plan.canary is None
    assert v.plan.canary_note == "no host needs the change"


def test_r575_fleet_needs_the_environment_rebuilt() -> None:
    v = evaluate_fleet(fleet(*(host(f"n{i}", R575) for i in range(3))), TARGET)
    assert v.outcome == "rebuild_environment"
    assert v.exit_code == 1
    assert "3 host(s) fail the image -> CUDA -> driver chain" in v.reasons[0]
    assert "driver.branch (3)" in v.reasons[0]
    assert v.summary.gpus_healthy == 0 and v.summary.gpus_after_plan == 24
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
    assert v.reasons[0] == "1 host(s) fail checks and are left out; 16 healthy GPUs meet the 8 required"
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
    assert "fleet.rdma_rail_drift" not in ids(evaluate_fleet(hosts, TARGET))


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
    assert "the most common profile '8x NVIDIA H200, driver 575.57.08" in c.reason
    assert "has no host that is idle and unblocked" in c.reason


def test_canary_skips_blocked_hosts_and_notes_when_none_is_left() -> None:
    v = evaluate_fleet(fleet(host("a1", R575, FM_FAILED), host("a2", R575)), TARGET)
    assert v.plan.canary is not None and v.plan.canary.host == "a2"
    none = evaluate_fleet(fleet(host("a1", R575, FM_FAILED)), TARGET)
    assert none.plan.canary is None and none.plan.waves == []
    assert none.plan.canary_note == "all 1 hosts needing the change are blocked: fix their findings first"


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
