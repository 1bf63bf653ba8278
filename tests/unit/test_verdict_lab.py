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

from k3fleet.ansible.module_utils.k3fleet_cmd import NodeReader
from k3fleet.ansible.module_utils.k3fleet_host import collect_host
from k3fleet.lab.fleet import DEFAULT_IMAGE, expand_hosts, generate_fleet, load_fleet
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
        raw[name] = collect_host(reader, name, DEFAULT_IMAGE, use_nvml=False, probe=True)
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


def test_lab_r580_host_serves(lab_verdict: tuple[FleetVerdict, dict[str, str]]) -> None:
    v, profiles = lab_verdict
    for name in _by_profile(v, profiles, "h200-r580"):
        assert v.hosts[name].status in ("pass", "warn")
        assert name in v.plan.done
    assert v.summary.gpus_healthy >= 8


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
    v, _ = lab_verdict
    p = v.plan
    assert p.canary is not None
    canary = next(u for u in p.needs_upgrade if u.host == p.canary.host)
    assert canary.idle is True
    assert canary.current_branch == 575 and canary.target_version == "580.95.05"
    assert any(c.to_name.startswith("nvidia-fabricmanager-580") for c in canary.packages)
    planned = {p.canary.host, *(h for w in p.waves for h in w)}
    assert planned.isdisjoint({b.host for b in p.blocked})
    assert planned.isdisjoint(p.unreachable)
