"""Repeated load runs (k3fleet/accept/load/repeats.py): the spread and 95% interval of each figure, warm-up and
cool-down left out of a step's figures, and the decision refusing an envelope whose interval crosses the
profile's limit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, load_options, run_load
from k3fleet.accept.load.repeats import combine, spread, t975
from k3fleet.accept.result import ProbeResult
from k3fleet.decide.envelope import repeat_intervals
from k3fleet.errors import UsageError
from k3fleet.lab.vllm_sim import start_simulator

MODEL = "moonshotai/Kimi-K3"


def test_spread_and_the_t_interval() -> None:
    s = spread([1.0, 2.0, 3.0])
    assert s is not None and (s["n"], s["mean"], s["stdev"], s["min"], s["max"]) == (3, 2.0, 1.0, 1.0, 3.0)
    half = 4.303 / 3 ** 0.5  # t(0.975, 2) from the NIST table
    assert s["ci95"] == [round(2 - half, 6), round(2 + half, 6)]
    assert spread([5.0]) == {"n": 1, "mean": 5.0, "stdev": None, "min": 5.0, "max": 5.0, "ci95": None}
    assert spread([]) is None
    assert (t975(1), t975(30), t975(31)) == (12.706, 2.042, 1.96)


def _result(status: str, outcome: str, ttft: float, ceiling: int | None, slo: float | None) -> ProbeResult:
    rows = [{"phase": "agent_ramp", "step": "4 sessions", "concurrency": 4, "verdict": "ok", "ttft_p95_s": ttft,
             "rps": 10.0},
            {"phase": "agent_ramp", "step": "8 sessions", "concurrency": 8, "verdict": "queued" if ceiling else "ok",
             "ttft_p95_s": ttft * 3},
            {"phase": "sustained", "step": "x", "concurrency": 4, "verdict": "ok", "partial": True}]
    data: dict[str, Any] = {"outcome": outcome, "ceiling": ceiling, "curves": rows, "counts": {"requests": 50}}
    if slo is not None:
        data["rate"] = {"held_rps": slo, "slo": {"rps": slo}}
    return ProbeResult(probe="load", status=status, reason=f"{outcome} run", data=data)  # type: ignore[arg-type]


def test_combined_runs_keep_each_run_and_the_worst_outcome() -> None:
    res = combine([_result("pass", "stable", 0.2, None, 10.0), _result("fail", "ceiling", 0.4, 4, 8.0),
                   _result("pass", "stable", 0.3, None, 9.0)])
    assert res.status == "fail" and res.data["outcome"] == "ceiling" and "disagree" in res.reason
    rep = res.data["repeats"]
    assert rep["n"] == 3 and [r["outcome"] for r in rep["runs"]] == ["stable", "ceiling", "stable"]
    step = rep["steps"]["agent_ramp: 4 sessions"]
    assert step["verdicts"] == ["ok"] * 3 and step["ttft_p95_s"]["mean"] == 0.3 and step["rps"]["stdev"] == 0.0
    assert "sustained: x" not in rep["steps"]  # a partial step is no sample
    assert rep["envelope"]["slo_rps"]["mean"] == 9.0 and rep["envelope"]["held_concurrency"]["n"] == 3
    iv = repeat_intervals(res.data)
    assert iv["repeats"] == 3 and iv["intervals"]["slo_rps"] == rep["envelope"]["slo_rps"]["ci95"]
    # The 8-session step did not hold in every run: it is not judged as part of the envelope.
    assert iv["intervals"]["ttft_p95_s"] == step["ttft_p95_s"]["ci95"]
    assert repeat_intervals({}) == {}


def test_warmup_and_cooldown_must_leave_part_of_a_step() -> None:
    with pytest.raises(UsageError, match="warmup_s \\+ cooldown_s must leave part"):
        load_options({"phases": ["agent_ramp"], "step_s": 2, "warmup_s": 1, "cooldown_s": 1})
    assert load_options({"phases": ["agent_ramp"], "step_s": 2, "warmup_s": 0.5, "repeat": 3}).repeat == 3


def test_repeated_runs_on_the_simulator_give_every_step_an_interval() -> None:
    opts = LoadOptions(phases=["agent_ramp"], ramp=[1, 2], step_s=1.5, system_prompt_tokens=256,
                       turn_output_tokens=16, sample_interval_s=0.25, ttft_p95_slo_s=3600, itl_p95_slo_s=3600,
                       repeat=3, warmup_s=0.4, cooldown_s=0.2)
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.005) as sim:
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30), opts))
    rep = res.data["repeats"]
    assert rep["n"] == 3 and len(rep["runs"]) == 3 and res.data["outcome"] == "stable"
    step = rep["steps"]["agent_ramp: 2 sessions"]
    assert step["verdicts"] == ["ok", "ok", "ok"] and step["ttft_p50_s"]["n"] == 3
    lo, hi = step["ttft_p50_s"]["ci95"]
    assert lo <= step["ttft_p50_s"]["mean"] <= hi
    assert rep["envelope"]["held_concurrency"]["mean"] == 2.0
    # Requests started in the warm-up and cool-down are left out of the figures, and counted.
    assert all(r.get("excluded", 0) > 0 for r in res.data["curves"]), res.data["curves"]
