"""The streaming verdict: hosts validated and judged one at a time give the per-host path's verdict,
and the stream is consumed as it comes, never held.

Timing and memory at fleet size are measured by scripts/bench_verdict.py (make bench-verdict).
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from verdict_fixtures import B200, GOOD, R575, TARGET, fleet_raw, host_raw

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import FleetVerdict
from k3fleet.verdict import FleetFold, evaluate_fleet, evaluate_stream, validate_facts
from k3fleet.verdict.intake import describe_invalid

UNREACHABLE = {"h002": "ssh: connect to host h002 port 22: Connection timed out",
               "gone": "ssh: connect to host gone port 22: No route to host"}
# Reasons the audit itself records (a collector of another major version, a failed module).
GIVEN_INVALID = {"old": "host old: facts schema '0.9' from the node, controller expects 1.1",
                 "h005": "host h005: FAILED: module failed without a message"}


def mixed_fleet() -> dict[str, Any]:
    """Node kinds with faults, plus facts the fast path cannot take and facts that do not validate."""
    raw: dict[str, Any] = fleet_raw(90)
    raw["bad-field"] = host_raw("bad-field", patch={"rdma.active_ports": "many"})
    raw["bad-gpu"] = host_raw("bad-gpu", R575, patch={"driver.gpus.0.index": "zero"})
    raw["bad-duration"] = host_raw("bad-duration", patch={"duration_s": "soon"})
    raw["bad-scheduler"] = host_raw("bad-scheduler", patch={"scheduler.jobs_running": "two"})
    raw["no-object"] = ["not", "an", "object"]
    # A UUID that is no string: the host's kind is known, only its own field is wrong.
    raw["bad-uuid"] = host_raw("bad-uuid", patch={"driver.gpus.2.uuid": 7})
    # A value no JSON has (ignored by the model): validated on its own, judged host by host.
    odd = host_raw("odd", B200)
    odd["container"]["image"]["labels"] = object()
    raw["odd"] = odd
    # A host of another schema minor version: its own kind.
    raw["minor"] = host_raw("minor", GOOD, patch={"schema_version": "1.0"})
    # Facts for a host that is also unreachable: it is listed as unreachable, never judged.
    raw["h002"]["scheduler"]["state"] = "down"
    return raw


def per_host_path(raw: dict[str, Any]) -> tuple[dict[str, HostFacts], dict[str, str]]:
    """The previous path: every host validated whole on its own, no shared section, no rule key."""
    facts: dict[str, HostFacts] = {}
    bad: dict[str, str] = {}
    for name, data in raw.items():
        if not isinstance(data, dict):
            bad[name] = f"host {name}: facts invalid: expected a JSON object, got {type(data).__name__}"
            continue
        try:
            facts[name] = HostFacts.model_validate(data)
        except ValidationError as exc:
            bad[name] = describe_invalid(name, exc)
    return facts, bad


def expected(raw: dict[str, Any], wave_size: int | None = None) -> FleetVerdict:
    facts, bad = per_host_path(raw)
    return evaluate_fleet(facts, TARGET, UNREACHABLE, invalid={**GIVEN_INVALID, **bad}, wave_size=wave_size)


def test_the_stream_gives_the_per_host_verdict_on_a_mixed_fleet() -> None:
    raw = mixed_fleet()
    want = expected(raw)
    order = list(raw.items())
    random.Random(5).shuffle(order)  # arrival order is not the verdict's order
    got = evaluate_stream(iter(order), TARGET, UNREACHABLE, invalid=GIVEN_INVALID, freeze=False)
    assert got.model_dump_json() == want.model_dump_json()
    # The mix reached every branch: invalid facts, unreachable hosts, hosts of no kind, kinds.
    assert {"bad-field", "bad-gpu", "bad-duration", "bad-scheduler", "no-object", "bad-uuid", "old"} <= {
        h for h, v in got.hosts.items() if [f.check_id for f in v.findings] == ["facts.schema"]}
    assert got.hosts["h002"].status == "unreachable" and got.hosts["gone"].status == "unreachable"
    assert "h005" not in [h for h, v in got.hosts.items() if v.status == "unreachable"]
    assert got.plan.canary is not None and got.plan.waves and got.plan.blocked
    # And the fast batch path agrees.
    facts, bad = validate_facts(raw, freeze=False)
    assert evaluate_fleet(facts, TARGET, UNREACHABLE, invalid={**GIVEN_INVALID, **bad}).model_dump_json() == (
        want.model_dump_json())


def test_the_stream_keeps_the_wave_size_and_says_which_facts_were_invalid() -> None:
    raw = mixed_fleet()
    fold = FleetFold(TARGET, UNREACHABLE, invalid=GIVEN_INVALID)
    for name, data in raw.items():
        fold.add(name, data)
    _, bad = per_host_path(raw)
    assert fold.invalid == {**GIVEN_INVALID, **bad}
    # Hosts with valid facts, less the unreachable one among them.
    assert fold.measured == len(raw) - len(bad) - 1
    assert fold.verdict(wave_size=7).model_dump_json() == expected(raw, wave_size=7).model_dump_json()
    assert fold.measured == len(raw) - len(bad) - 1
    # One fold, one verdict: a host added after it, or a second verdict, is refused.
    with pytest.raises(ValueError, match="host late: added after the fold gave its verdict"):
        fold.add("late", host_raw("late"))
    with pytest.raises(ValueError, match="already gave its verdict"):
        fold.verdict()


def test_a_host_named_twice_counts_with_its_later_facts() -> None:
    first = host_raw("a", patch={"duration_s": "soon"})
    later = host_raw("a", R575)
    b = host_raw("b", R575, patch={"rdma.nvidia_peermem_loaded": False})
    got = evaluate_stream(iter([("a", first), ("b", b), ("a", later)]), TARGET, freeze=False)
    facts, bad = per_host_path({"a": later, "b": b})
    assert bad == {}
    assert got.model_dump_json() == evaluate_fleet(facts, TARGET).model_dump_json()
    back = evaluate_stream(iter([("a", later), ("a", first)]), TARGET, freeze=False)
    assert [f.check_id for f in back.hosts["a"].findings] == ["facts.schema"]


def test_the_stream_leaves_the_raw_facts_as_they_were() -> None:
    raw = mixed_fleet()
    odd = raw.pop("odd")
    before = json.dumps(raw)
    odd_gpus = [(list(g), g.get("uuid")) for g in odd["driver"]["gpus"]]
    evaluate_stream(iter([*raw.items(), ("odd", odd)]), TARGET, freeze=False)
    # Same keys in the same order, same values: the GPUs' UUIDs are back, also where the key failed.
    assert json.dumps(raw) == before
    assert [(list(g), g.get("uuid")) for g in odd["driver"]["gpus"]] == odd_gpus


class _Facts(dict[str, Any]):
    """A host's facts object that a weak reference can watch (a plain dict cannot be)."""


def test_the_stream_is_consumed_as_it_comes_and_no_host_is_held() -> None:
    hosts = fleet_raw(60)
    refs: list[weakref.ref[_Facts]] = []

    def produce() -> Iterator[tuple[str, _Facts]]:
        for i, (name, data) in enumerate(hosts.items()):
            # By the time host i is asked for, host i-2 is gone: the caller's loop variable may still
            # hold host i-1; nothing else holds any earlier host (no list of the stream, no raw kept).
            if i >= 2:
                assert refs[i - 2]() is None, f"host {i - 2} is still held when host {i} is asked for"
            facts = _Facts(data)
            refs.append(weakref.ref(facts))
            yield name, facts
            del facts
        hosts.clear()

    raw = dict(fleet_raw(60))
    verdict = evaluate_stream(produce(), TARGET, freeze=False)
    assert len(refs) == 60 and all(r() is None for r in refs)
    facts, _ = per_host_path(raw)
    assert verdict.model_dump_json() == evaluate_fleet(facts, TARGET).model_dump_json()


def _retained(n: int, keep: str) -> int:
    """Bytes still allocated after ``n`` hosts went in: the fold's state, or the validated facts."""
    raw = fleet_raw(n, seed=11)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        held: Any
        if keep == "fold":
            held = FleetFold(TARGET)
            for name in list(raw):
                held.add(name, raw.pop(name))
        else:
            held = validate_facts(raw, freeze=False)[0]
            raw.clear()
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del held
    return size


def test_what_the_fold_keeps_per_host_is_small_and_grows_linearly() -> None:
    fold_small, fold_large = _retained(100, "fold"), _retained(1000, "fold")
    facts_small, facts_large = _retained(100, "facts"), _retained(1000, "facts")
    per_host_fold = (fold_large - fold_small) / 900
    per_host_facts = (facts_large - facts_small) / 900
    # A host of a known kind leaves its scheduler section and a reference to its kind's facts; the
    # validated facts of a host hold its driver section with every GPU (and, shared or not, the rest).
    assert per_host_fold * 4 < per_host_facts, (per_host_fold, per_host_facts)
    # Ten times the hosts: about ten times the growth, not more (nothing quadratic is kept).
    assert fold_large < 10.5 * fold_small + 50_000, (fold_small, fold_large)
