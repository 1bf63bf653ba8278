"""Open-loop arrivals, goodput and the SLO search (k3fleet/accept/load/arrivals.py, rate.py), on the simulator as
a real server on loopback."""

from __future__ import annotations

import asyncio
import itertools
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, Shot, load_options, run_load
from k3fleet.accept.load.arrivals import arrival_offsets, goodput, meets_slo
from k3fleet.decide.envelope import held_envelope, slo_rate
from k3fleet.errors import UsageError
from k3fleet.lab.vllm_sim import start_simulator

MODEL = "moonshotai/Kimi-K3"
# A small server with a capacity set by its knobs: 4 sequences at a time, 100 ms per engine step, no prefill
# cost; a request of 5 output tokens takes 5 steps, so it serves 4 / (5 * 0.100) = 8 requests/s. Steps this
# long keep the simulator's own overhead on a busy machine (load average 20 on 2 cores) a small share of each.
SIM = {"max_num_seqs": 4, "itl_ms": 100.0, "prefill_ms_per_token": 0.0}
CAPACITY_RPS = 4 / (5 * 0.100)
SHAPE = {"rate_output_tokens": 5, "rate_prompt_tokens": 64, "sample_interval_s": 0.25, "itl_p95_slo_s": 1.0}


def ep(url: str) -> Endpoint:
    return Endpoint(base_url=url, model=MODEL, timeout_s=30)


def test_poisson_offsets_keep_the_rate_and_are_seeded() -> None:
    offs = arrival_offsets(50.0, 40.0, seed=3)
    assert offs == sorted(offs) and all(0 < t < 40 for t in offs)
    assert abs(len(offs) / 40.0 - 50.0) < 50.0 * 0.1
    assert offs == arrival_offsets(50.0, 40.0, seed=3) != arrival_offsets(50.0, 40.0, seed=4)
    assert len(arrival_offsets(50.0, 40.0, seed=3, limit=7)) == 7
    assert arrival_offsets(0.0, 10.0) == [] == arrival_offsets(5.0, 0.0)


def test_burstiness_shapes_the_gaps() -> None:
    # Exponential gaps have a coefficient of variation of 1; gamma of shape k has 1/sqrt(k).
    def cv(burstiness: float) -> float:
        offs = arrival_offsets(100.0, 60.0, burstiness=burstiness, seed=1)
        gaps = [b - a for a, b in itertools.pairwise(offs)]
        return statistics.pstdev(gaps) / statistics.mean(gaps)
    assert 0.9 < cv(1.0) < 1.1
    assert 0.2 < cv(16.0) < 0.3
    assert cv(0.25) > 1.6


def _shot(ok: bool = True, ttft: float | None = 0.1, gaps: list[float] | None = None, e2e: float = 1.0) -> Shot:
    s = Shot("rate_ramp", "1 req/s", 0, None, 0.0, ok=ok, ttft=ttft, e2e=e2e)
    s.gaps = gaps if gaps is not None else [0.02, 0.03]
    return s


def test_goodput_counts_requests_within_every_limit() -> None:
    assert meets_slo(_shot(), 0.5, 0.05, None)
    assert not meets_slo(_shot(ttft=0.6), 0.5, 0.05, None)
    assert not meets_slo(_shot(gaps=[0.01, 0.2]), 0.5, 0.05, None)   # mean gap 0.105
    assert meets_slo(_shot(gaps=[0.01, 0.08]), 0.5, 0.05, None)      # one slow gap, mean 0.045
    assert not meets_slo(_shot(e2e=3.0), 0.5, 0.05, 2.0)
    assert not meets_slo(_shot(ok=False), 0.5, 0.05, None)
    assert goodput([_shot(), _shot(ttft=2.0), _shot(ok=False), _shot()], 0.5, 0.05, None) == 0.5
    assert goodput([], 0.5, 0.05, None) is None


@pytest.mark.parametrize(("overrides", "words"), [
    ({"arrival": "poisson", "burstiness": 2}, "burstiness other than 1 needs arrival gamma"),
    ({"arrival": "closed"}, "arrival closed needs max_concurrency"),
    ({"rates": [4, 2]}, "rates must be ascending"),
    ({"rates": [0]}, "rates must be ascending"),
    ({"search_low_rps": 5, "search_high_rps": 5}, "search_low_rps must be below"),
    ({"goodput_target": 0}, "greater than 0"),
    ({"phases": ["rate_ramp", "rate_ramp"]}, "named twice"),
])
def test_bad_open_loop_options_are_one_usage_line(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError) as exc:
        load_options(overrides)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_open_loop_past_capacity_queues_where_a_closed_loop_does_not() -> None:
    rate = CAPACITY_RPS * 1.5
    common = {**SHAPE, "phases": ["rate_ramp"], "rates": [rate], "rate_step_s": 4.0, "ttft_p95_slo_s": 0.6}
    with start_simulator(**SIM) as sim:
        open_loop = asyncio.run(run_load(ep(sim.base_url), LoadOptions(**common)))
        # The same mean rate offered by 8 sessions that each wait for their answer (paced to 1/8 of the rate).
        closed = asyncio.run(run_load(ep(sim.base_url), LoadOptions(**common, arrival="closed", max_concurrency=8)))
    (o,), (c,) = open_loop.data["curves"], closed.data["curves"]
    # Open: arrivals keep coming, the server's own queue grows past what 8 sessions can leave waiting
    # (8 sessions on 4 sequences: at most 4 waiting). About 16 wait by the step's end on an idle machine;
    # the bound leaves room for a busy one, whose sampler and arrivals run late (7 seen under CI load).
    assert o["waiting_max"] is not None and o["waiting_max"] >= 6, o
    assert o["verdict"] == "queued" and o["goodput"] < 0.95
    assert o["offered_rps"] > CAPACITY_RPS * 1.2
    assert c["waiting_max"] is not None and c["waiting_max"] <= 4, c
    # The closed loop slowed down with the server instead: it never offered the rate, only the capacity and
    # its 8 sessions' first requests over the 4 s step.
    assert c["offered_rps"] <= CAPACITY_RPS + 8 / 4.0 < rate and c["in_flight_max"] <= 8
    assert open_loop.data["outcome"] == "collapse" and open_loop.status == "fail"
    assert open_loop.data["rate"]["failed_rps"] == rate


def test_slo_search_finds_the_configured_capacity() -> None:
    # Even arrivals (gamma of shape 8): below capacity nothing waits, above it the queue grows with every
    # second, so the search brackets the capacity; a TTFT limit of 0.6 s is a request's own 0.5 s and a little.
    opts = LoadOptions(**SHAPE, phases=["rate_ramp", "slo_search"], rates=[CAPACITY_RPS * 0.5, CAPACITY_RPS * 1.5],
                       rate_step_s=5.0, arrival="gamma", burstiness=8, ttft_p95_slo_s=0.6, search_steps=4,
                       target_rps=6.0)
    with start_simulator(**SIM) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    rate = res.data["rate"]
    slo = rate["slo"]
    rows = [(r["phase"], r["rate_rps"], r["verdict"], r["goodput"]) for r in res.data["curves"]]
    assert slo["rps"] is not None and abs(slo["rps"] - CAPACITY_RPS) <= 0.15 * CAPACITY_RPS, rows
    assert slo["upper_rps"] is not None and slo["upper_rps"] > slo["rps"]
    assert slo["goodput"] >= 0.95 and slo["steps"] == 4
    assert slo["margin"] == round(slo["rps"] / 6.0 - 1, 4)
    assert rate["held_rps"] == slo["rps"] and res.data["envelope"]["max_rate_rps"] == CAPACITY_RPS * 1.5
    # The ramp went past capacity: the outcome names the rate it held.
    assert res.data["outcome"] == "ceiling" and "4 requests/s" in res.reason


def test_the_profile_rate_sets_the_ramp_target_and_e2e_limit(tmp_path: Path) -> None:
    from k3fleet.accept.profile_cases import load_options_from_profile
    from k3fleet.models.profile import load_profile

    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "name": "t", "concurrency": 8, "context_tokens": {"typical": 512, "p99": 4096, "max": 8192},
        "sustained_s": 60, "slo": {"ttft_p95_s": 2, "itl_p95_s": 0.1, "e2e_p95_s": 30}, "request_rate_rps": 12}))
    opts = load_options_from_profile(load_profile(tmp_path / "p.yaml"))
    assert opts.rates == [3.0, 6.0, 12.0, 18.0, 24.0] and opts.target_rps == 12 and opts.e2e_p95_slo_s == 30
    # The bounds leave room for the ramp and the search at the highest rate.
    assert opts.max_duration_s >= (5 + opts.search_steps) * opts.rate_step_s
    assert opts.max_requests >= 24 * (5 + opts.search_steps) * opts.rate_step_s


def test_the_decision_reads_the_rate_envelope() -> None:
    rows = [{"phase": "rate_ramp", "rate_rps": 5.0, "verdict": "ok"},
            {"phase": "rate_ramp", "rate_rps": 10.0, "verdict": "queued"},
            {"phase": "slo_search", "rate_rps": 7.5, "verdict": "ok"},
            {"phase": "slo_search", "rate_rps": 8.75, "verdict": "latency"},
            {"phase": "slo_search", "rate_rps": 8.0, "verdict": "ok", "partial": True}]
    held = held_envelope(rows, {"e2e_p95_slo_s": 30})
    assert (held["held_rps"], held["failed_rps"], held["slo"]["e2e_p95_s"]) == (7.5, 8.75, 30.0)
    data = {"rate": {"slo": {"rps": 7.5, "upper_rps": 8.75, "margin": -0.25}}}
    assert slo_rate(data) == {"slo_rps": 7.5, "slo_rps_upper": 8.75, "rate_margin": -0.25}
    assert slo_rate({}) == {} == slo_rate({"rate": {"slo": None}})
