"""The change night's verify steps as the controller plans them (k3fleet.change.verifyplan, docs/change-night.md
"Verify steps"): the container probe on by default with the reason of any skip, the NCCL floors per host,
and after the canary the pair test with an unchanged node only where the fleet needs RDMA.

The playbook side (the steps run on lab hosts, journaled, a failed one naming its log lines) is
tests/integration/test_verify_steps.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from k3fleet.change.verifyplan import verify_plan
from k3fleet.models.findings import Finding, HostVerdict, StrategyDecision
from k3fleet.targets import load_target

TARGET = load_target(None)
H200 = "NVIDIA H200"


def _host(name: str, *, model: str = H200, gpus: int = 8, status: Any = "pass",
          findings: tuple[str, ...] = ()) -> HostVerdict:
    return HostVerdict(host=name, status=status, gpu_model=model, gpu_count=gpus,
                       findings=[Finding(check_id=c, severity="error", host=name, message=c) for c in findings])


def _strategy(name: str) -> StrategyDecision:
    return StrategyDecision(strategy=name, setting="auto", derived=True, reason="from the hosts' GPU memory",
                            rdma_required=name.startswith("multi_node"), tensor_parallel_size=8)


def _plan(hosts: list[HostVerdict], strategy: StrategyDecision | None, order: list[str],
          accept: tuple[str, ...] = ()) -> dict[str, Any]:
    return verify_plan(TARGET, {h.host: h for h in hosts}, strategy, order[0], order, list(accept), 20)


def test_the_probe_runs_by_default_and_the_nccl_floors_come_from_the_target() -> None:
    plan = _plan([_host("a"), _host("b")], _strategy("single_node_tp"), ["a", "b"])
    floor = TARGET.active.nccl_busbw_min_gbs[H200]
    assert plan["hosts"]["a"] == {"probe_skip": None, "gpus": 8, "gpu_model": H200, "nccl_min_busbw_gbs": floor}
    assert plan["probe_timeout"] == 20 and plan["nccl_timeout"] == TARGET.active.timeouts.nccl_s
    assert plan["active_spec"]["nccl_pair_launcher"][0] == "mpirun" and plan["active_spec"]["nccl_max_bytes"] == "8G"
    # One node holds a replica: nothing crosses nodes, and the journal says so.
    pair = plan["canary_pair"]
    assert pair["needed"] is False and "single_node_tp keeps each replica on one node" in pair["reason"]


def test_a_fleet_that_needs_rdma_pairs_the_canary_with_an_unchanged_node_of_its_gpus() -> None:
    hosts = [_host("a"), _host("x", model="NVIDIA H100"), _host("u", status="unreachable"), _host("b"), _host("c")]
    # The waves' hosts first (c), an H100 and an unreachable node never.
    plan = _plan(hosts, _strategy("multi_node_tp_dp"), ["a", "x", "u", "c"])
    pair = plan["canary_pair"]
    assert (pair["needed"], pair["run"], pair["peer"], pair["gpus"]) == (True, True, "c", 8)
    assert pair["min_busbw_gbs"] == TARGET.active.nccl_pair_busbw_min_gbs.get(H200)
    # A host outside the night with the canary's GPUs, when no wave has one.
    assert _plan(hosts, _strategy("multi_node_tp_dp"), ["a", "x"])["canary_pair"]["peer"] == "b"


def test_no_partner_is_a_planned_failure_not_a_skip() -> None:
    pair = _plan([_host("a"), _host("x", model="NVIDIA H100")], _strategy("multi_node_dep"), ["a", "x"])["canary_pair"]
    assert (pair["needed"], pair["run"], pair["accepted"], pair["peer"]) == (True, False, False, None)
    assert "no other node the audit saw has the canary's GPUs (8x NVIDIA H200)" in pair["reason"]


def test_accepted_findings_skip_a_step_with_the_finding_and_the_pattern_named() -> None:
    hosts = [_host("a", findings=("container.toolkit", "rdma.port_state", "driver.branch")), _host("b")]
    plan = _plan(hosts, _strategy("multi_node_tp_dp"), ["a", "b"], accept=("rdma.*", "container.*"))
    assert plan["hosts"]["a"]["probe_skip"] == ("the operator accepted the audit's container findings on this host "
                                                "with --accept-finding: container.toolkit (container.*)")
    # b has no container finding: its probe runs.
    assert plan["hosts"]["b"]["probe_skip"] is None
    pair = plan["canary_pair"]
    assert (pair["needed"], pair["run"], pair["accepted"]) == (True, False, True)
    assert pair["reason"].endswith("with --accept-finding: rdma.port_state (rdma.*)")


@pytest.mark.parametrize("strategy", [None])
def test_no_strategy_in_the_audit_says_why_no_pair(strategy: StrategyDecision | None) -> None:
    pair = _plan([_host("a"), _host("b")], strategy, ["a", "b"])["canary_pair"]
    assert pair["needed"] is False and "the audit chose no serving strategy" in pair["reason"]


def test_a_target_without_the_probe_says_so() -> None:
    target = TARGET.model_copy(update={"container": TARGET.container.model_copy(update={"require_probe": False})})
    plan = verify_plan(target, {"a": _host("a")}, None, "a", ["a"], [], 20)
    assert plan["hosts"]["a"]["probe_skip"] == "the target does not require it (container.require_probe: false)"
