"""The vLLM-compatible simulator as a real HTTP server on loopback: cache, scheduler, faults, API shape."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import jsonschema
import pytest

from k3fleet.accept.metrics import parse_metrics
from k3fleet.lab.vllm_sim import SimConfig, parse_defects, start_simulator
from k3fleet.lab.vllm_sim.generate import render_prompt
from k3fleet.lab.vllm_sim.kv_cache import KVCache
from k3fleet.lab.vllm_sim.tokenizer import encode

MODEL = "moonshotai/Kimi-K3"
SYSTEM = "You are the fleet's operations assistant. Answer with care and cite the runbook. " * 120
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}, "tags": {
            "type": "array", "items": {"type": "string"}, "minItems": 2}}, "required": ["lat"]}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]


def chat(user: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            **extra}


def stream(client: httpx.Client, body: dict[str, Any]) -> tuple[float | None, list[Any]]:
    """TTFT (first chunk with a token) and the parsed chunks."""
    t0 = time.perf_counter()
    ttft = None
    chunks: list[Any] = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                chunks.append(data)
                break
            obj = json.loads(data)
            delta = (obj.get("choices") or [{}])[0].get("delta") or {}
            if ttft is None and any(delta.get(k) for k in ("content", "reasoning", "tool_calls")):
                ttft = time.perf_counter() - t0
            chunks.append(obj)
    return ttft, chunks


def assemble(chunks: list[Any]) -> dict[str, Any]:
    calls: dict[int, dict[str, Any]] = {}
    out: dict[str, Any] = {"content": "", "reasoning": "", "finish": None, "usage": None}
    for c in chunks:
        if c == "[DONE]":
            continue
        if c.get("usage"):
            out["usage"] = c["usage"]
        for ch in c.get("choices") or []:
            d = ch.get("delta") or {}
            out["content"] += d.get("content") or ""
            out["reasoning"] += d.get("reasoning") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"name": "", "arguments": "", "ids": set()})
                if tc.get("id"):
                    slot["ids"].add(tc["id"])
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            out["finish"] = ch.get("finish_reason") or out["finish"]
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def metrics(client: httpx.Client) -> Any:
    r = client.get("/metrics")
    return parse_metrics(r.text, r.headers.get("content-type"))


@pytest.fixture
def sim() -> Iterator[Any]:
    with start_simulator(itl_ms=1.0, prefill_ms_per_token=0.1, prefix_match_unit=256,
                         enable_prompt_tokens_details=True) as handle:
        yield handle


def client_for(handle: Any, **kw: Any) -> httpx.Client:
    return httpx.Client(base_url=handle.base_url, timeout=30, **kw)


@pytest.fixture
def slow_prefill() -> Iterator[Any]:
    # 1 ms per uncached token: about 2.9 s of prefill cold against a quarter second warm, a gap no busy
    # machine's scheduling delay closes (the difference is by design, not by luck).
    with start_simulator(itl_ms=1.0, prefill_ms_per_token=1.0, prefix_match_unit=256,
                         enable_prompt_tokens_details=True) as handle:
        yield handle


def test_cache_hit_shortens_ttft_and_counts_on_unit_boundaries(slow_prefill: Any) -> None:
    sim = slow_prefill
    with client_for(sim) as c:
        before = metrics(c)
        cold, chunks = stream(c, chat("first question", max_tokens=4, stream_options={"include_usage": True}))
        usage_cold = assemble(chunks)["usage"]
        warm, chunks = stream(c, chat("second question", max_tokens=4, stream_options={"include_usage": True}))
        usage = assemble(chunks)["usage"]
        after = metrics(c)
    assert cold is not None and warm is not None
    # About 2,900 uncached prompt tokens at 1 ms each (sleeps never end early: cold is at least that),
    # against one unit's remainder (under 272 tokens).
    assert cold > 2.5 and warm < cold / 3, (cold, warm)
    n = usage["prompt_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert usage_cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached > 0 and cached % 256 == 0 and n - cached < 256 + 16
    assert after.counter("vllm:prefix_cache_hits") - (before.counter("vllm:prefix_cache_hits") or 0) == cached
    assert after.counter("vllm:prefix_cache_queries") >= before.counter("vllm:prefix_cache_queries") + 2 * n - 10
    cfg = after.cache_config()
    assert cfg is not None and cfg["enable_prefix_caching"] == "True" and cfg["prefix_match_unit"] == "256"


def _body_of_exact_length(tokens: int) -> dict[str, Any]:
    """A request whose rendered prompt is exactly ``tokens`` long (padded in the user turn)."""
    body = chat("pad")
    base = len(encode(render_prompt(body)))
    body["messages"][1]["content"] = "pad" + " x" * (tokens - base)
    assert len(encode(render_prompt(body))) == tokens
    return body


def test_exact_multiple_of_the_match_unit_misses() -> None:
    with start_simulator(itl_ms=1.0, prefill_ms_per_token=0.0, prefix_match_unit=256,
                         enable_prompt_tokens_details=True) as handle, client_for(handle) as c:
        exact = _body_of_exact_length(256 * 12)
        for _ in range(2):
            r = c.post("/v1/chat/completions", json={**exact, "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens"] == 256 * 12
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        off = _body_of_exact_length(256 * 12 + 7)
        for _ in range(2):
            r = c.post("/v1/chat/completions", json={**off, "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 256 * 12


def test_kv_cache_block_rules() -> None:
    kv = KVCache(64, 16, prefix_caching=True, match_unit=0)
    ids = list(range(100))
    hashes = kv.block_hashes(ids)
    assert len(hashes) == 6
    hold = kv.admit(hashes, kv.lookup(hashes, 100), 101)
    assert hold is not None and kv.used == 7
    kv.commit(hold, hashes)
    assert kv.cached_blocks == 6 and hold.private == 1
    kv.release(hold)
    assert kv.used == 0 and kv.free == 64
    # Same first 50 tokens, different tail: only the three whole shared blocks hit.
    other = ids[:50] + [999] * 50
    assert kv.lookup(kv.block_hashes(other), 100) == 48
    # A changed first token breaks the chain: nothing hits.
    assert kv.lookup(kv.block_hashes([7, *ids[1:]]), 100) == 0
    # Evictable blocks are reclaimed least recently used first when space runs out.
    big = kv.admit(kv.block_hashes(list(range(5000, 5000 + 60 * 16))), 0, 60 * 16)
    assert big is not None and kv.cached_blocks <= 4


def test_no_prefix_caching_never_hits() -> None:
    with start_simulator(itl_ms=1.0, prefill_ms_per_token=0.0, prefix_caching=False,
                         enable_prompt_tokens_details=True) as handle, client_for(handle) as c:
        for _ in range(2):
            r = c.post("/v1/chat/completions", json=chat("same", max_tokens=2))
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        m = metrics(c)
    assert m.counter("vllm:prefix_cache_hits") == 0 and m.counter("vllm:prefix_cache_queries") > 0
    assert m.prefix_caching_enabled() is False


async def _concurrent(base_url: str, bodies: list[dict[str, Any]]) -> list[tuple[int, float | None, Any]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        async def one(body: dict[str, Any]) -> tuple[int, float | None, Any]:
            t0 = time.perf_counter()
            ttft = None
            async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
                lines = []
                async for line in resp.aiter_lines():
                    token = '"content":"' in line and '"content":""' not in line
                    if line.startswith("data: ") and ttft is None and token:
                        ttft = time.perf_counter() - t0
                    if line:
                        lines.append(line)
                return resp.status_code, ttft, lines
        return await asyncio.gather(*(one(b) for b in bodies))


def test_load_queues_behind_max_num_seqs() -> None:
    # 20 ms steps: the queue lasts over a second, far longer than a loaded machine delays the sampler.
    with start_simulator(itl_ms=20.0, prefill_ms_per_token=0.0, max_num_seqs=1) as handle:
        bodies = [{"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 20,
                   "ignore_eos": True, "chat_template_kwargs": {"thinking": False}} for i in range(4)]
        seen_waiting: list[float] = []

        async def run() -> list[tuple[int, float | None, Any]]:
            task = asyncio.ensure_future(_concurrent(handle.base_url, bodies))
            async with httpx.AsyncClient(base_url=handle.base_url) as c:
                for _ in range(10):
                    await asyncio.sleep(0.03)
                    r = await c.get("/metrics")
                    seen_waiting.append(parse_metrics(r.text).gauge("vllm:num_requests_waiting") or 0)
            return await task

        results = asyncio.run(run())
    ttfts = sorted(t for s, t, _ in results if s == 200 and t is not None)
    assert len(ttfts) == 4
    assert max(seen_waiting) >= 2
    # Each request runs 20 steps of 20 ms alone; the last waits for the three before it (1.2 s by design:
    # the engine's sleeps never end early). Two requests' worth is asserted, leaving room for a late send.
    assert ttfts[-1] >= 0.8, ttfts


def test_preemption_under_kv_pressure_then_everyone_finishes() -> None:
    cfg = SimConfig(itl_ms=1.0, prefill_ms_per_token=0.0, kv_blocks=24, block_size=16, max_num_seqs=4,
                    prefix_caching=False, max_model_len=384)
    with start_simulator(cfg) as handle:
        bodies = [{"model": MODEL, "messages": [{"role": "user", "content": f"job {i} " + "word " * 20}],
                   "max_tokens": 120, "ignore_eos": True} for i in range(4)]
        results = asyncio.run(_concurrent(handle.base_url, bodies))
        with client_for(handle) as c:
            m = metrics(c)
    assert all(s == 200 and lines[-1] == "data: [DONE]" for s, _, lines in results)
    assert (m.counter("vllm:num_preemptions") or 0) > 0
    assert m.counter("vllm:generation_tokens") >= 4 * 120


def test_crash_above_kv_pressure_then_restart() -> None:
    cfg = SimConfig(itl_ms=2.0, prefill_ms_per_token=0.0, kv_blocks=24, block_size=16, max_num_seqs=4,
                    prefix_caching=False, max_model_len=384, crash_above_kv=0.6, restart_after_s=0.5)
    with start_simulator(cfg) as handle, client_for(handle) as c:
        started = metrics(c).process_start_time()
        bodies = [{"model": MODEL, "messages": [{"role": "user", "content": f"job {i} " + "word " * 20}],
                   "max_tokens": 120, "ignore_eos": True} for i in range(4)]
        results = asyncio.run(_concurrent(handle.base_url, bodies))
        errors = [lines for _, _, lines in results if any('"error"' in line for line in lines)]
        assert errors, "every stream finished although the engine died"
        assert c.get("/health").status_code == 503
        short = {"model": MODEL, "messages": [{"role": "user", "content": "after the crash"}], "max_tokens": 2}
        r = c.post("/v1/chat/completions", json=short)
        assert r.status_code == 500 and "EngineCore" in r.json()["error"]["message"]
        time.sleep(0.8)
        assert c.get("/health").status_code == 200
        assert metrics(c).process_start_time() > started
        assert c.post("/v1/chat/completions", json=short).status_code == 200


def test_tool_call_streamed_deltas_and_non_stream(sim: Any) -> None:
    body = chat("What is the weather? use get_weather with city=Oslo", tools=TOOLS)
    with client_for(sim) as c:
        msg = c.post("/v1/chat/completions", json=body).json()
        _, chunks = stream(c, body)
    choice = msg["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["city"] == "Oslo"
    jsonschema.validate(args, TOOLS[0]["function"]["parameters"])
    assert choice["message"]["reasoning"]
    got = assemble(chunks)
    assert got["finish"] == "tool_calls" and len(got["tool_calls"]) == 1
    assert json.loads(got["tool_calls"][0]["arguments"]) == args


def test_tool_choice_rules(sim: Any) -> None:
    with client_for(sim) as c:
        none = c.post("/v1/chat/completions", json=chat("use get_weather", tools=TOOLS, tool_choice="none")).json()
        forced = c.post("/v1/chat/completions", json=chat("hello", tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "get_time"}})).json()
        unnamed = c.post("/v1/chat/completions", json=chat("just chat", tools=TOOLS)).json()
        two = c.post("/v1/chat/completions", json=chat("get_time then get_weather", tools=TOOLS)).json()
        after_tool = c.post("/v1/chat/completions", json={"model": MODEL, "tools": TOOLS, "messages": [
            {"role": "user", "content": "use get_time"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_time", "arguments": "{\"zone\": \"UTC\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]}).json()
        bad = c.post("/v1/chat/completions", json=chat("x", tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}}))
    assert none["choices"][0]["message"]["tool_calls"] == []
    assert [t["function"]["name"] for t in forced["choices"][0]["message"]["tool_calls"]] == ["get_time"]
    assert unnamed["choices"][0]["finish_reason"] == "stop" and unnamed["choices"][0]["message"]["content"]
    assert [t["function"]["name"] for t in two["choices"][0]["message"]["tool_calls"]] == ["get_time", "get_weather"]
    assert after_tool["choices"][0]["message"]["tool_calls"] == [] and after_tool["choices"][0]["message"]["content"]
    assert bad.status_code == 400


def test_response_format_json_schema_is_valid(sim: Any) -> None:
    schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["go", "no-go"]},
                                               "hosts": {"type": "array", "items": {"type": "integer"}},
                                               "when": {"type": "string", "format": "date"}},
              "required": ["verdict", "hosts"], "additionalProperties": False}
    with client_for(sim) as c:
        r = c.post("/v1/chat/completions", json=chat("decide", response_format={
            "type": "json_schema", "json_schema": {"name": "d", "schema": schema}})).json()
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("defect", ["empty_tool_calls", "marker_in_reasoning", "invalid_arguments"])
def test_defect_rates(defect: str) -> None:
    runs, rate = 160, 0.25

    async def ask_all(base_url: str) -> list[dict[str, Any]]:
        # aiohttp's client: opening 160 connections at once through httpx's pool takes seconds here.
        async with aiohttp.ClientSession(base_url) as c:
            async def one(i: int) -> dict[str, Any]:
                async with c.post("/v1/chat/completions", json={
                        "model": MODEL, "tools": TOOLS, "max_tokens": 200,
                        "messages": [{"role": "user", "content": f"case {i}: call get_weather"}]}) as r:
                    choice: dict[str, Any] = (await r.json())["choices"][0]
                    return choice
            return await asyncio.gather(*(one(i) for i in range(runs)))

    with start_simulator(itl_ms=0.5, prefill_ms_per_token=0.0, defects={defect: rate}, seed=7) as handle:
        choices = asyncio.run(ask_all(handle.base_url))
    hits = 0
    for m in choices:
        msg = m["message"]
        if defect == "empty_tool_calls":
            hit = msg["tool_calls"] == [] and m["finish_reason"] == "stop" and "get_weather" in msg["reasoning"]
        elif defect == "marker_in_reasoning":
            hit = "<|tool_call_begin|>" in msg["reasoning"] and bool(msg["tool_calls"])
        else:
            try:
                jsonschema.validate(json.loads(msg["tool_calls"][0]["function"]["arguments"]),
                                    TOOLS[0]["function"]["parameters"])
                hit = False
            except (ValueError, jsonschema.ValidationError):
                hit = True
        hits += hit
    # Binomial(160, 0.25): 40 expected, sd 5.5; 4 sd either side.
    assert 18 <= hits <= 62, hits


def test_merged_stream_calls_defect() -> None:
    with start_simulator(itl_ms=0.1, prefill_ms_per_token=0.0, defects={"merged_stream_calls": 1.0}) as handle, \
            client_for(handle) as c:
        _, chunks = stream(c, chat("get_time and get_weather", tools=TOOLS))
        plain = c.post("/v1/chat/completions", json=chat("get_time and get_weather", tools=TOOLS)).json()
    got = assemble(chunks)
    assert len(got["tool_calls"]) == 1
    with pytest.raises(ValueError):
        json.loads(got["tool_calls"][0]["arguments"])
    assert len(plain["choices"][0]["message"]["tool_calls"]) == 2


def test_api_key_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_TEST_KEY", "s3cret-value")
    with start_simulator(api_key_env="SIM_TEST_KEY", itl_ms=1.0) as handle:
        with client_for(handle) as c:
            assert c.get("/v1/models").status_code == 401
            assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        with client_for(handle, headers={"Authorization": "Bearer s3cret-value"}) as c:
            assert c.get("/v1/models").json()["data"][0]["id"] == MODEL
    assert os.environ["SIM_TEST_KEY"] == "s3cret-value"


@pytest.mark.parametrize("fmt", ["prometheus", "openmetrics"])
def test_old_names_and_formats(fmt: str) -> None:
    with start_simulator(itl_ms=1.0, old_metric_names=True, metrics_format=fmt) as handle, client_for(handle) as c:
        c.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
        r = c.get("/metrics")
    snap = parse_metrics(r.text, r.headers["content-type"])
    assert snap.exposition == fmt
    assert snap.is_old_server and "vllm:gpu_cache_usage_perc" in snap.old_names()
    assert snap.counter("vllm:prefix_cache_queries") is None and snap.counter("vllm:gpu_prefix_cache_queries") > 0


def test_openmetrics_current_names() -> None:
    with start_simulator(itl_ms=1.0, metrics_format="openmetrics") as handle, client_for(handle) as c:
        c.post("/v1/chat/completions", json=chat("hi", max_tokens=3))
        r = c.get("/metrics")
    assert r.headers["content-type"].startswith("application/openmetrics-text") and r.text.endswith("# EOF\n")
    assert "# TYPE vllm:prompt_tokens counter" in r.text
    snap = parse_metrics(r.text, r.headers["content-type"])
    assert snap.counter("vllm:generation_tokens") == 3.0 and not snap.is_old_server
    h = snap.histogram("vllm:time_to_first_token_seconds")
    assert h is not None and h.count == 1.0


def test_bad_requests(sim: Any) -> None:
    with client_for(sim) as c:
        assert c.post("/v1/chat/completions", content=b"{not json").status_code == 400
        assert c.post("/v1/chat/completions", json={"model": MODEL, "messages": []}).status_code == 400
        wrong = c.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]})
        assert wrong.status_code == 404 and "does not exist" in wrong.json()["error"]["message"]
        too_long = c.post("/v1/chat/completions", json=chat("x", max_tokens=262144))
        assert too_long.status_code == 400
        assert "maximum context length is 262144 tokens" in too_long.json()["error"]["message"]
        assert c.post("/v1/chat/completions", json=chat("x", max_tokens=-1)).status_code == 400


def test_parse_defects() -> None:
    assert parse_defects(["empty_tool_calls=0.05"]) == {"empty_tool_calls": 0.05}
    with pytest.raises(ValueError, match="NAME=RATE"):
        parse_defects(["empty_tool_calls"])
    with pytest.raises(ValueError):
        SimConfig(defects={"nope": 0.1})
