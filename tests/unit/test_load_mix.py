"""The profile's request mix under concurrency (k3fleet/accept/load/run.py): its tools, response schemas and
long conversations in their shares, and the retry policy on 429 / 503 / timeouts, on the simulator."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, load_options, run_load
from k3fleet.errors import UsageError
from k3fleet.lab.vllm_sim import start_simulator

MODEL = "moonshotai/Kimi-K3"
TOOL = {"type": "function", "function": {"name": "get_gpu_health", "description": "GPU health of a node.",
                                         "parameters": {"type": "object", "properties": {"node": {"type": "string"}},
                                                        "required": ["node"]}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
BASE: dict[str, Any] = {"phases": ["agent_ramp"], "ramp": [4], "step_s": 2.5, "system_prompt_tokens": 128,
                        "turn_output_tokens": 16, "sample_interval_s": 0.25, "ttft_p95_slo_s": 3600,
                        "itl_p95_slo_s": 3600}


def _run(sim_kw: dict[str, Any], **opts: Any) -> Any:
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.0, **sim_kw) as sim:
        return asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30),
                                    LoadOptions(**{**BASE, **opts})))


def test_the_mix_offers_the_profile_tools_schemas_and_long_contexts_in_their_shares() -> None:
    res = _run({}, tools=[TOOL], tools_share=0.5, response_schemas={"health": SCHEMA}, structured_share=0.3,
               long_share=0.5, long_context_tokens=1024)
    (row,) = res.data["curves"]
    n = row["requests"]
    assert n >= 20 and row["ok"] == n, res.data["failures"]
    mix = row["mix"]
    assert 0.25 * n <= mix["tools"] <= 0.75 * n and 0.1 * n <= mix["structured"] <= 0.5 * n, (mix, n)
    assert 0 < mix.get("long", 0) < n
    # Long conversations open at the profile's p99 context: the mean prompt is well above a short one's.
    assert row["prompt_tokens_mean"] > 300
    assert res.data["options"]["tools"][0]["function"]["name"] == "get_gpu_health"


def test_without_retries_an_overloaded_server_fails_and_with_them_it_is_counted() -> None:
    bare = _run({"overload_rate": 0.2, "seed": 3})
    assert bare.data["counts"]["errors"].get("http_5xx", 0) > 0 and bare.data["counts"]["retries"] == 0
    res = _run({"overload_rate": 0.2, "seed": 3}, retry_max=4, retry_backoff_s=0.01)
    counts = res.data["counts"]
    assert counts["retries"] > 0 and counts["retried"].get("http_5xx", 0) == counts["retries"]
    (row,) = res.data["curves"]
    assert row["retries"] == counts["retries"] and row["duplicate_tool_calls"] == 0
    # Retried 503s are answered in the end: far fewer failures than without the policy.
    assert counts["errors"].get("http_5xx", 0) < bare.data["counts"]["errors"]["http_5xx"]


def test_a_retry_after_a_timeout_mid_tool_call_is_a_duplicate_tool_call_finding() -> None:
    # Half the streams stop after their first tool-call delta; the client times out after 1 s and retries.
    res = _run({"stall_after_tool_call_rate": 0.5, "stall_s": 5.0, "seed": 1}, retry_max=2, retry_backoff_s=0.01,
               request_timeout_s=1.0, ramp=[2], step_s=3.0, turn_output_tokens=128)
    counts = res.data["counts"]
    assert counts["retried"].get("timeout", 0) > 0, counts
    assert counts["duplicate_tool_calls"] > 0
    assert any(f.check_id == "accept.load.retry_duplicate_tool_call" for f in res.findings)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"structured_share": 0.5}, "structured_share above 0 needs response_schemas"),
    ({"long_share": 0.5}, "long_share above 0 needs long_context_tokens"),
    ({"tools": [{"name": "bare"}]}, "tools must be OpenAI tools"),
    ({"retry_max": 11}, "less than or equal to 10"),
])
def test_bad_mix_options_are_one_usage_line(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError) as exc:
        load_options(overrides)
    assert words in str(exc.value)


def test_the_profile_sets_the_mix(tmp_path: Any) -> None:
    import json

    import yaml

    from k3fleet.accept.profile_cases import load_options_from_profile
    from k3fleet.models.profile import load_profile

    (tmp_path / "tools.json").write_text(json.dumps([TOOL]))
    (tmp_path / "health.json").write_text(json.dumps({"name": "health", "schema": SCHEMA}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "name": "t", "concurrency": 8, "context_tokens": {"typical": 512, "p99": 4096, "max": 8192},
        "mix": {"tools": 0.6, "structured_output": 0.2, "long": 0.1}, "sustained_s": 60,
        "slo": {"ttft_p95_s": 2, "itl_p95_s": 0.1}, "tools": ["tools.json"], "response_schemas": ["health.json"]}))
    opts = load_options_from_profile(load_profile(tmp_path / "p.yaml"))
    assert opts.tools is not None and opts.tools[0]["function"]["name"] == "get_gpu_health"
    assert (opts.tools_share, opts.structured_share, opts.long_share, opts.long_context_tokens) == (0.6, 0.2, 0.1, 4096)
    assert opts.response_schemas["health"] == SCHEMA
