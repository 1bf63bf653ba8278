"""accept prefix-cache against the vLLM-compatible simulator as a real server on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache, system_prompt
from k3fleet.accept.record import Recorder
from k3fleet.cli.base import main
from k3fleet.lab.vllm_sim.server import SimHandle, start_simulator

MODEL = "moonshotai/Kimi-K3"


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> Iterator[SimHandle]:
    with start_simulator(**getattr(request, "param", {})) as handle:
        yield handle


def _run(sim: SimHandle, opts: PrefixOptions | None = None, rec: Recorder | None = None):
    ep = Endpoint(base_url=sim.base_url, model=MODEL)
    return asyncio.run(run_prefix_cache(ep, opts or PrefixOptions(repeats=3), recorder=rec))


def _ids(result) -> set[str]:
    return {f.check_id for f in result.findings}


# 0.5 ms per uncached token: the cold prefix (over 3 units of 1536) costs over 2.3 s, a warm one under one unit
# (0.8 s): warm is faster by design, by more than a loaded machine's scheduling delay.
@pytest.mark.parametrize("sim", [{"prefill_ms_per_token": 0.5}], indirect=True)
def test_healthy_server_passes_with_cached_tokens_rounded_to_the_unit(sim: SimHandle) -> None:
    rec = Recorder()
    result = _run(sim, rec=rec)
    assert result.status == "pass", (result.reason, result.findings)
    d = result.data
    unit = d["match_unit"]
    assert (unit, d["match_unit_source"]) == (1536, "cache_config_info")
    # The probe's prefix crosses several units and is not an exact multiple of one.
    assert d["prefix_tokens"]["low"] >= 3 * unit
    assert d["prefix_tokens"]["high"] % unit != 0
    assert all(c >= d["expected_cached_tokens"]["low"] for c in d["cached_tokens"]["warm"])
    assert all(c % unit == 0 for c in d["cached_tokens"]["warm"])  # K3 hits land on unit boundaries
    assert d["windows"]["warm"]["vllm:prefix_cache_hits"] > 0
    assert d["windows"]["control"]["vllm:prefix_cache_hits"] == 0
    assert d["ttft_s"]["warm_median"] < d["ttft_s"]["cold"]
    # Evidence: every request and a snapshot around each window.
    # The sizing requests (/tokenize, absent on the simulator) come first.
    labels = [e["label"] for e in rec.exchanges["prefix_cache"] if not e["label"].startswith("size_")]
    assert labels[:6] == ["cold", "warm_1", "warm_2", "warm_3", "replay_1", "control"]
    # One settled snapshot after each request: counters are attributed per request.
    assert list(rec.metrics) == ["prefix_cache_0_before", "prefix_cache_1_after_cold", "prefix_cache_2_after_warm_1",
                                 "prefix_cache_2_after_warm_2", "prefix_cache_2_after_warm_3",
                                 "prefix_cache_3_after_replay_1", "prefix_cache_4_after_control"]
    assert d["cached_tokens"]["source"] == "metrics per request" and len(d["cached_tokens"]["warm"]) == 3
    assert all(s["settled"] and s["counted"] for s in d["settle"]["reads"])
    # The replay of the cold request was served from the cache and gave the cold answer (text: no logprobs here).
    assert d["answers"]["replay_hit_seen"] is True
    assert [(c["basis"], c["same"]) for c in d["answers"]["comparisons"]] == [("text", True)]


@pytest.mark.parametrize("sim", [{"prefix_caching": False}], indirect=True)
def test_caching_off_fails_with_its_own_finding(sim: SimHandle) -> None:
    result = _run(sim)
    assert result.status == "fail" and result.exit_code == 1
    assert "accept.prefix_cache.caching_off" in _ids(result)


def test_prefix_shorter_than_one_unit_is_inconclusive(sim: SimHandle) -> None:
    result = _run(sim, PrefixOptions(repeats=2, prefix_tokens=600))
    assert result.status == "inconclusive" and result.exit_code == 3
    assert "accept.prefix_cache.prefix_below_unit" in _ids(result)
    assert "shorter than one match unit" in result.reason


@pytest.mark.parametrize("sim", [{"old_metric_names": True}], indirect=True)
def test_old_name_only_server_is_inconclusive(sim: SimHandle) -> None:
    result = _run(sim)
    assert result.status == "inconclusive"
    assert "accept.prefix_cache.old_server" in _ids(result)


@pytest.mark.parametrize("sim", [{"enable_prompt_tokens_details": True}], indirect=True)
def test_usage_cached_tokens_are_used_when_reported(sim: SimHandle) -> None:
    result = _run(sim)
    assert result.status == "pass", result.reason
    ct = result.data["cached_tokens"]
    assert ct["source"] == "usage" and len(ct["warm"]) == 3
    assert ct["cold"] == 0 and ct["control"] == 0


@pytest.mark.parametrize("sim", [{"prefix_match_unit": 128}], indirect=True)
def test_match_unit_from_cache_config(sim: SimHandle) -> None:
    result = _run(sim, PrefixOptions(repeats=2, prefix_tokens=1000))
    assert result.status == "pass", result.reason
    assert result.data["match_unit"] == 128


def test_wrong_match_unit_option_shows_in_the_judgement(sim: SimHandle) -> None:
    # An operator claiming a 16-token unit expects more reuse than K3's 1536-token unit gives.
    result = _run(sim, PrefixOptions(repeats=2, match_unit=16))
    assert result.status == "fail"
    assert "accept.prefix_cache.cached_below_prefix" in _ids(result)


def test_no_metrics_endpoint_is_inconclusive(sim: SimHandle) -> None:
    class NoMetrics(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/metrics":
                return httpx.Response(404, text="Not Found")
            return await self.inner.handle_async_request(request)

    ep = Endpoint(base_url=sim.base_url, model=MODEL)

    async def go():
        async with httpx.AsyncClient(transport=NoMetrics(), timeout=60) as client:
            return await run_prefix_cache(ep, PrefixOptions(repeats=2), client=client)

    result = asyncio.run(go())
    assert result.status == "inconclusive"
    assert "accept.prefix_cache.metrics_unavailable" in _ids(result)
    assert "404" in result.reason


def test_system_prompt_is_byte_stable_and_opened_by_the_nonce() -> None:
    a, b = system_prompt("abc123", 3000), system_prompt("abc123", 3000)
    assert a == b and a.startswith("Run abc123.")
    assert system_prompt("zzz999", 3000)[len("Run zzz999."):] == a[len("Run abc123."):]


# The server publishes its counters 0.4 s late (vLLM records a step's stats after handing out its outputs): a
# probe that scraped at once would attribute nothing to the request it just made.
@pytest.mark.parametrize("sim", [{"metrics_lag_s": 0.4, "prefill_ms_per_token": 0.5}], indirect=True)
def test_counters_published_late_are_waited_for_and_the_wait_recorded(sim: SimHandle) -> None:
    outcomes = []
    for _ in range(3):
        result = _run(sim, PrefixOptions(repeats=2))
        outcomes.append((result.status, sorted(_ids(result))))
        settle = result.data["settle"]
        assert all(s["settled"] and s["counted"] for s in settle["reads"]), settle
        assert settle["max_waited_s"] >= 0.3 and settle["bound_s"] == 10.0
    assert outcomes == [("pass", ["accept.prefix_cache.size_estimated"])] * 3, outcomes


@pytest.mark.parametrize("sim", [{"metrics_lag_s": 0.4}], indirect=True)
def test_outcome_is_the_same_with_json_quiet_and_progress(sim: SimHandle, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["accept", "prefix-cache", "--base-url", sim.base_url, "--model", MODEL, "--repeats", "2"]
    codes = []
    for extra in (["--json"], ["--quiet"], [], ["--json"]):
        codes.append(main([*base, *extra]))
        out = capsys.readouterr().out
        if extra == ["--json"]:
            assert json.loads(out)["status"] == "pass"
    assert codes == [0, 0, 0, 0]


def test_counters_that_never_move_are_inconclusive_with_the_reason(sim: SimHandle) -> None:
    class FrozenMetrics(httpx.AsyncBaseTransport):
        """Serves the first /metrics page it read for ever: a cached or stale exporter."""

        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()
            self.page: bytes | None = None

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/metrics" and self.page is not None:
                return httpx.Response(200, content=self.page, headers={"content-type": "text/plain"})
            resp = await self.inner.handle_async_request(request)
            if request.url.path == "/metrics":
                self.page = await resp.aread()
                return httpx.Response(200, content=self.page, headers={"content-type": "text/plain"})
            return resp

    ep = Endpoint(base_url=sim.base_url, model=MODEL)

    async def go():
        async with httpx.AsyncClient(transport=FrozenMetrics(), timeout=60) as client:
            return await run_prefix_cache(ep, PrefixOptions(repeats=2, settle_s=0.5), client=client)

    result = asyncio.run(go())
    assert result.status == "inconclusive", result.reason
    assert "vllm:request_success did not move within 0.5 s after 1_after_cold" in result.reason
    assert "accept.prefix_cache.counter_never_moved" in _ids(result)
    assert not result.data["settle"]["reads"][0]["counted"]


@pytest.mark.parametrize("sim", [{"defects": {"warm_answer_changed": 1.0}}], indirect=True)
def test_a_cache_hit_that_changes_the_answer_fails(sim: SimHandle) -> None:
    result = _run(sim, PrefixOptions(repeats=2, replays=2))
    assert result.status == "fail" and result.exit_code == 1
    assert result.reason.startswith("a cache hit changed the answer (2 of 2 warm replays")
    assert "accept.prefix_cache.answer_changed" in _ids(result)
    first = result.data["answers"]["comparisons"][0]
    assert first["same"] is False and first["basis"] == "text" and "stale" in first["warm_excerpt"]


@pytest.mark.parametrize("sim", [{"prefill_ms_per_token": 0.0}], indirect=True)
def test_a_pass_without_a_latency_benefit_says_so(sim: SimHandle) -> None:
    # No prefill cost: warm and cold TTFT are alike, never below 1% of the cold one.
    result = _run(sim, PrefixOptions(repeats=2, ttft_ratio=0.01))
    assert result.status == "pass", result.reason
    assert "no latency benefit seen" in result.reason
    assert "accept.prefix_cache.ttft_not_lower" in _ids(result)
