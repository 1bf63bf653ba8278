"""accept agent against the simulator: clean on a healthy server, each injected defect at its rate.

Tolerance: a defect injected at rate p over n tool turns is counted k times; the test accepts
|k - n p| <= 3 sqrt(n p (1 - p)) (binomial, three standard deviations: a false alarm about 3 in 1000).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from k3fleet.accept.agent import BFCL_CASES, AgentOptions, run_agent
from k3fleet.accept.client import Endpoint
from k3fleet.accept.record import Recorder
from k3fleet.lab.vllm_sim.server import start_simulator

MODEL = "moonshotai/Kimi-K3"
# Cases whose every run has exactly one tool-calling turn that the simulator's defects can hit.
ONE_CALL_CASES = ["one_required_arg", "nested_args", "invalid_args", "multi_turn", "reasoning_contract"]


def run(sim_kw: dict[str, Any], **opts: Any):
    rec = Recorder()
    with start_simulator(itl_ms=0.2, **sim_kw) as sim:
        ep = Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=60)
        result = asyncio.run(run_agent(ep, AgentOptions(concurrency=8, **opts), recorder=rec))
    return result, rec


def within_3_sigma(k: int, n: int, p: float) -> bool:
    return abs(k - n * p) <= 3 * math.sqrt(n * p * (1 - p))


def test_healthy_simulator_passes_every_case() -> None:
    result, rec = run({}, repeats=3)
    assert result.status == "pass", (result.reason, result.findings)
    cases = result.data["cases"]
    assert set(cases) == {"one_required_arg", "nested_args", "call_then_result", "no_tool_turn", "invalid_args",
                          "structured_output", "timeout_retry", "multi_turn", "streaming_deltas",
                          "reasoning_contract", *BFCL_CASES}
    for name, c in cases.items():
        assert (c["runs"], c["passed"], c["defects"], c["layer"]) == (3, 3, {}, None), name
        assert c["critical"] is (name not in ("structured_output", *BFCL_CASES))
    labels = [e["label"] for e in rec.exchanges["agent"]]
    assert "reference_client" in labels and "timeout_retry/abandoned" in labels
    ref = next(e for e in rec.exchanges["agent"] if e["label"] == "reference_client")
    assert ref["error"] is None and ref["response"]["choices"][0]["message"]["tool_calls"]


@pytest.mark.parametrize("defect", ["empty_tool_calls", "marker_in_reasoning", "invalid_arguments"])
def test_injected_defect_reported_at_its_rate_and_layer(defect: str) -> None:
    rate, repeats = 0.25, 24
    result, _ = run({"defects": {defect: rate}}, repeats=repeats, cases=ONE_CALL_CASES)
    cases = result.data["cases"]
    n = repeats * len(ONE_CALL_CASES)
    k = sum(c["defects"].get(defect, 0) for c in cases.values())
    assert within_3_sigma(k, n, rate), (k, n)
    others = {d for c in cases.values() for d in c["defects"]} - {defect}
    assert not others, others
    assert all(c["defect_layers"].get(defect, "http") == "http" for c in cases.values())
    assert result.status == "fail"
    assert any(f.check_id == f"accept.agent.{defect}" and f.layer == "http" for f in result.findings)


def test_merged_stream_calls_only_in_the_streamed_multi_call_case() -> None:
    rate, repeats = 0.3, 60
    result, _ = run({"defects": {"merged_stream_calls": rate}}, repeats=repeats,
                    cases=["streaming_deltas", "one_required_arg"])
    cases = result.data["cases"]
    k = cases["streaming_deltas"]["defects"].get("merged_stream_calls", 0)
    assert within_3_sigma(k, repeats, rate), k
    assert cases["streaming_deltas"]["layer"] == "http"
    # A single non-streamed call cannot be merged.
    assert cases["one_required_arg"]["defects"] == {}


def test_critical_cases_and_threshold_are_data() -> None:
    result, _ = run({"defects": {"empty_tool_calls": 0.5}}, repeats=6, cases=["one_required_arg", "no_tool_turn"],
                    critical=["no_tool_turn"])
    # The failing case is not critical: reported as a warning, the suite passes.
    assert result.status == "pass"
    assert result.data["cases"]["one_required_arg"]["critical"] is False
    assert all(f.severity == "warning" for f in result.findings)


# Each BFCL-style case against the simulator fault made for it: the case fails with its own defect at its layer.
BFCL_FAULTS = {
    "parallel_calls": ("parallel_collapsed", "stream", {"wrong_call_count", "wrong_argument_value"}, "model"),
    "many_functions": ("wrong_function", "", {"wrong_tool"}, "model"),
    "irrelevance": ("irrelevant_call", "", {"unexpected_tool_call"}, "model"),
    "missing_param": ("invent_argument", "", {"invented_argument"}, "model"),
    "long_multi_turn": ("stale_turn", "", {"wrong_tool", "wrong_argument_value"}, "model"),
}


@pytest.mark.parametrize("case", sorted(BFCL_FAULTS))
def test_each_bfcl_case_fails_on_its_own_fault(case: str) -> None:
    fault, _, defects, seat = BFCL_FAULTS[case]
    result, _ = run({"defects": {fault: 1.0}}, repeats=2, cases=[case])
    c = result.data["cases"][case]
    assert c["passed"] == 0, c
    assert set(c["defects"]) & defects, c["defects"]
    assert {c["defect_seats"][d] for d in set(c["defects"]) & defects} == {seat}


@pytest.mark.parametrize("fault,defect", [("kimi_marker_leak", "kimi_marker_leak"),
                                          ("call_text_in_content", "tool_call_text_in_content")])
def test_dropped_calls_left_as_text_are_named_streamed_and_not(fault: str, defect: str) -> None:
    # one_required_arg is answered whole, streaming_deltas streamed: both must name the parser defect.
    result, _ = run({"defects": {fault: 1.0}}, repeats=2, cases=["one_required_arg", "streaming_deltas"])
    for name in ("one_required_arg", "streaming_deltas"):
        c = result.data["cases"][name]
        assert c["defects"] == {defect: 2}, (name, c["defects"])
        assert c["defect_seats"] == {defect: "parser"}
    assert result.status == "fail"
