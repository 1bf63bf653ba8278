"""accept prefix-cache against the vLLM-compatible simulator as a real server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache, system_prompt
from k3fleet.accept.record import Recorder
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
    assert labels[:5] == ["cold", "warm_1", "warm_2", "warm_3", "control"]
    assert list(rec.metrics) == ["prefix_cache_0_before", "prefix_cache_1_after_cold", "prefix_cache_2_after_warm",
                                 "prefix_cache_3_after_control"]


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
