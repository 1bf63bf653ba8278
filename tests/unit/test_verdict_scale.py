"""The verdict at fleet size: sections validated once per content, host rules once per node kind,
and the same verdict as judging every host on its own.

Timing is measured by scripts/bench_verdict.py (make bench-verdict), never asserted here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from verdict_fixtures import R575, TARGET, fleet_raw, host_raw

from k3fleet.models.facts import HostFacts
from k3fleet.verdict import evaluate_fleet, validate_facts
from k3fleet.verdict.rules import rule_key


def test_the_fast_path_gives_the_per_host_verdict() -> None:
    raw = fleet_raw(120)
    fast, bad = validate_facts(raw, freeze=False)
    assert bad == {}
    plain = {k: HostFacts.model_validate(v) for k, v in raw.items()}
    assert all(rule_key(f) is not None for f in fast.values())
    assert all(rule_key(f) is None for f in plain.values())
    unreachable = {"h999": "ssh: connect to host: Connection timed out"}
    assert (evaluate_fleet(fast, TARGET, unreachable).model_dump_json()
            == evaluate_fleet(plain, TARGET, unreachable).model_dump_json())
    # The facts themselves are the same data, host by host.
    for name in raw:
        assert fast[name].model_dump() == plain[name].model_dump(), name


def test_equal_sections_are_one_object_and_uuids_stay_each_hosts_own() -> None:
    raw = {f"h{i}": host_raw(f"h{i}") for i in range(3)}
    for i, data in enumerate(raw.values()):
        for g in data["driver"]["gpus"]:
            g["uuid"] = f"GPU-{i}-{g['index']}"
    raw["h2"]["rdma"]["nvidia_peermem_loaded"] = True
    facts, _ = validate_facts(raw, freeze=False)
    assert facts["h0"].packages is facts["h1"].packages is facts["h2"].packages
    assert facts["h0"].rdma is facts["h1"].rdma and facts["h2"].rdma is not facts["h0"].rdma
    for i in range(3):
        assert [g.uuid for g in facts[f"h{i}"].driver.gpus] == [f"GPU-{i}-{j}" for j in range(8)]
    # Only the UUIDs differ between h0 and h1: one node kind; h2's RDMA differs: another.
    assert rule_key(facts["h0"]) == rule_key(facts["h1"]) != rule_key(facts["h2"])


def test_scheduler_state_is_judged_per_host_within_a_kind() -> None:
    raw = {"a": host_raw("a"), "b": host_raw("b", patch={"scheduler.state": "drained", "scheduler.reason": "x"})}
    facts, _ = validate_facts(raw, freeze=False)
    assert rule_key(facts["a"]) == rule_key(facts["b"])
    v = evaluate_fleet(facts, TARGET)
    assert [f.check_id for f in v.hosts["a"].findings] == []
    (f,) = v.hosts["b"].findings
    assert (f.check_id, f.host, f.evidence["node"]) == ("scheduler.state", "b", "b")


def test_findings_of_a_kind_carry_each_hosts_name() -> None:
    raw = {n: host_raw(n, R575) for n in ("r1", "r2", "r3")}
    facts, _ = validate_facts(raw, freeze=False)
    v = evaluate_fleet(facts, TARGET)
    for n in raw:
        assert v.hosts[n].findings and {f.host for f in v.hosts[n].findings} == {n}
    assert [f.message for f in v.hosts["r1"].findings] == [f.message for f in v.hosts["r3"].findings]


@pytest.mark.parametrize(("path", "value", "where"), [
    ("rdma.active_ports", "many", "rdma.active_ports"),
    ("driver.gpus.0.index", "zero", "driver.gpus.0.index"),
    ("packages.packages.0", {"version": "1"}, "packages.packages.0.name"),
])
def test_invalid_facts_report_the_full_field_path(path: str, value: Any, where: str) -> None:
    data = host_raw("x", patch={path: value})
    facts, bad = validate_facts({"x": data, "y": host_raw("y")}, freeze=False)
    assert list(facts) == ["y"]
    assert bad["x"].startswith(f"host x: facts invalid at {where}: ")


def test_values_that_are_not_json_take_the_plain_path() -> None:
    data = host_raw("x")
    data["nccl"]["settings"]["NCCL_DEBUG"] = {"value": "WARN", "source": "env"}
    # An unknown field's value that is no JSON data: the model ignores it, the section cache cannot key it.
    data["container"]["image"]["labels"] = object()
    facts, bad = validate_facts({"x": data}, freeze=False)
    assert bad == {} and rule_key(facts["x"]) is None
    assert facts["x"].nccl.settings["NCCL_DEBUG"].value == "WARN"


def test_the_raw_facts_are_not_changed() -> None:
    raw = {n: host_raw(n) for n in ("a", "b")}
    before = json.dumps(raw, sort_keys=False)
    validate_facts(raw, freeze=False)
    assert json.dumps(raw, sort_keys=False) == before
