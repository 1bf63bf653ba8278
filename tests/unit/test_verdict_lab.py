"""The verdict on facts the real collectors gather from the default simulated lab fleet.

The rule tables pin each rule on synthetic facts; this test holds the contract between
the collectors' output and the rules: the lab's stories (inventories/lab/fleet.yaml) must
come out as the findings an operator expects, with nothing read as unknown that the
collectors do know.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from k3fleet.lab.fleet import default_image, expand_hosts, generate_fleet, load_fleet
from k3fleet.models.findings import FleetVerdict
from k3fleet.targets import load_target
from k3fleet.verdict import evaluate_fleet, validate_facts


@pytest.fixture(scope="module")
def lab_verdict(tmp_path_factory: pytest.TempPathFactory) -> tuple[FleetVerdict, dict[str, str]]:
    spec = load_fleet(None)
    lab = tmp_path_factory.mktemp("lab")
    generate_fleet(spec, lab / "fleet")
    raw: dict[str, Any] = {}
    unreachable: dict[str, str] = {}
    profiles: dict[str, str] = {}
    for name, host in expand_hosts(spec, None):
        profiles[name] = host.profile_name
        if not host.profile.reachable:
            unreachable[name] = "lab profile is unreachable"
            continue
        root = Path(lab / "fleet" / "hosts" / name)
        reader = NodeReader(root=str(root), path=str(root / "bin"), timeout=10)
        raw[name] = collect_host(reader, name, default_image(), use_nvml=False, probe=True)
    facts, invalid = validate_facts(raw, freeze=False)
    assert invalid == {}
    return evaluate_fleet(facts, load_target(None), unreachable), profiles


def _by_profile(v: FleetVerdict, profiles: dict[str, str], profile: str) -> list[str]:
    return [h for h, p in profiles.items() if p == profile and v.hosts[h].status != "unreachable"]


def test_lab_night_before_the_change(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    assert v.outcome == "rebuild_environment"
    assert v.exit_code == 1
    for name, hv in v.hosts.items():
        if profiles[name].startswith("h200-r575") and hv.status != "unreachable":
            found = {f.check_id for f in hv.findings if f.kind == "fail"}
            assert {"driver.branch", "container.cuda_runtime"} <= found, name
        for f in hv.findings:
            # Facts the collectors do gather must never come back as "could not be read" errors.
            assert not (f.kind == "unknown" and f.blocking and f.check_id != "gpu.count"), (name, f.message)


def test_lab_strategy_is_derived_from_the_h200s(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, _ = lab_verdict
    # One 8x H200 node (about 1.1 TB) cannot hold the ~1561 GB (1.42 TiB) of MXFP4 weights: multi-node, RDMA.
    s = v.strategy
    assert s is not None and s.setting == "auto" and s.derived
    assert s.strategy == "multi_node_tp_dp" and s.rdma_required
    assert [(n.gpu_model, n.holds_weights) for n in s.nodes] == [("NVIDIA H200", False)]
    assert v.summary.gpus_required == 16
    assert v.reasons[-1].startswith("strategy multi_node_tp_dp (derived from GPU memory): one node of 8x NVIDIA H200")


def test_lab_r580_host_serves(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    for name in _by_profile(v, profiles, "h200-r580"):
        assert v.hosts[name].status in ("pass", "warn")
        assert name in v.plan.done
    assert v.summary.gpus_healthy >= 8
    # Done means nothing left to change: only the clean R580 host.
    assert v.plan.done == _by_profile(v, profiles, "h200-r580")


def test_lab_outcome_and_capacity(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, _ = lab_verdict
    # Too few healthy GPUs today, enough once the plan is through: rebuild, not expand.
    assert v.summary.gpus_healthy < v.summary.gpus_required <= v.summary.gpus_after_plan
    assert v.outcome == "rebuild_environment"
    cap = next(f for f in v.fleet_findings if f.check_id == "fleet.capacity")
    assert cap.chain


def test_lab_rail_and_gpudirect_faults_block(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    blocked = {b.host: b.check_ids for b in v.plan.blocked}
    for name in _by_profile(v, profiles, "h200-r575-ib-down"):
        f = next(f for f in v.hosts[name].findings if f.check_id == "rdma.port_state")
        assert f.severity == "error" and "mlx5_3" in f.message
        # The demo fleet's gpu-a05 also carries a GPU with ECC errors and a pending remap
        # (inventories/lab/fleet.yaml): those block it too, and nothing else does.
        assert "rdma.port_state" in blocked[name]
        assert set(blocked[name]) - {"rdma.port_state"} <= {"gpu.ecc", "gpu.remapped_rows"}, blocked[name]
    for name in _by_profile(v, profiles, "h200-r575-no-peermem"):
        f = next(f for f in v.hosts[name].findings if f.check_id == "rdma.peermem")
        assert "nvidia_peermem is not loaded" in f.message and "proprietary" in f.message
        # gpu-a06 also logged Xid 79 (inventories/lab/fleet.yaml).
        assert "rdma.peermem" in blocked[name]
        assert set(blocked[name]) - {"rdma.peermem"} <= {"gpu.xid"}, blocked[name]
    for name, hv in v.hosts.items():
        if not profiles[name].startswith(("h200-r575-ib-down", "h200-r575-no-peermem")):
            assert not any(f.check_id.startswith("rdma.") for f in hv.findings), name


def test_lab_fabric_manager_only_host(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    names = _by_profile(v, profiles, "h200-r580-fm-mismatch")
    assert names
    items = {u.host: u for u in v.plan.needs_upgrade}
    for name in names:
        assert "fabricmanager.version_match" in {f.check_id for f in v.hosts[name].findings}
        assert name not in v.plan.done
        item = items[name]
        assert item.scope == "fabricmanager" and item.current_version == item.target_version == "580.95.05"
        assert {c.to_name for c in item.packages} <= {"nvidia-fabricmanager-580", "cuda-drivers-fabricmanager-580"}
        assert "nvidia-fabricmanager-580" in {c.to_name for c in item.packages}
        assert all(c.to_version == "580.95.05" and c.from_version and c.from_version.startswith("580.82.07")
                   for c in item.packages)
        # The failed unit and CUDA start follow from the mismatch: the FM change is not blocked by them.
        assert name not in {b.host for b in v.plan.blocked}


def test_lab_problem_hosts(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    for name in _by_profile(v, profiles, "h200-r580-fm-mismatch"):
        assert "fabricmanager.version_match" in {f.check_id for f in v.hosts[name].findings}
    for name in _by_profile(v, profiles, "h200-r580-pending-reboot"):
        assert "driver.pending_reboot" in {f.check_id for f in v.hosts[name].findings}
        assert name in {b.host for b in v.plan.blocked}
    for name in _by_profile(v, profiles, "h200-r575-nccl-debug"):
        assert "nccl.debug" in {f.check_id for f in v.hosts[name].findings}
    assert {h for h, p in profiles.items() if p == "h200-unreachable"} == set(v.plan.unreachable)


def test_lab_plan_starts_on_an_idle_host(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    p = v.plan
    assert p.canary is not None
    canary = next(u for u in p.needs_upgrade if u.host == p.canary.host)
    assert canary.idle is True
    assert canary.scope == "driver"
    assert canary.current_branch == 575 and canary.target_version == "580.95.05"
    # A plain R575 host: no fault of its own (gpu-a01/a02 style), not a host with a rail, GPUDirect,
    # NCCL or Fabric Manager story.
    assert profiles[p.canary.host] in ("h200-r575", "h200-r575-open")
    own = [f for f in v.hosts[p.canary.host].findings if not f.chain and f.kind == "fail"]
    assert own == [], own
    assert any(c.to_name.startswith("nvidia-fabricmanager-580") for c in canary.packages)
    planned = {p.canary.host, *(h for w in p.waves for h in w)}
    assert planned.isdisjoint({b.host for b in p.blocked})
    assert planned.isdisjoint(p.unreachable)


def test_lab_busy_host_is_in_use_never_canary_never_idle(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    (name,) = _by_profile(v, profiles, "h200-r575-busy")
    f = next(f for f in v.hosts[name].findings if f.check_id == "gpu.in_use")
    # Slurm calls the node idle; the GPUs say otherwise.
    assert f.kind == "fail" and f.severity == "warning"
    assert f.message.startswith("GPU 0,1,2,3,4,5,6,7 in use (131072 of 143771 MiB in use on GPU 0); "
                                "1 compute process(es): pid 48311 /usr/bin/python3")
    assert "vLLM's start-up memory check (gpu_memory_utilization 0.9) would fail" in f.message
    assert f.evidence["vllm_start_fails_on"] == list(range(8))
    item = next(u for u in v.plan.needs_upgrade if u.host == name)
    assert item.idle is False
    assert any("not a scheduler job the drain waits for" in n for n in item.notes)
    assert v.plan.canary is not None and v.plan.canary.host != name
    assert name in {h for w in v.plan.waves for h in w}
    # Every other reachable lab host reports its GPUs free.
    for other, hv in v.hosts.items():
        if other != name:
            assert "gpu.in_use" not in {x.check_id for x in hv.findings}, other
