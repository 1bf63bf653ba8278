"""`accept load` against the simulator as a real server on loopback, and against broken servers."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from k3fleet.accept.client import Endpoint, EndpointError
from k3fleet.accept.load import LoadObserver, LoadOptions, filler, percentile, run_load
from k3fleet.accept.metrics import parse_metrics
from k3fleet.accept.record import Recorder
from k3fleet.cli.base import main
from k3fleet.evidence import RunDir
from k3fleet.lab.vllm_sim import SimConfig, start_simulator

MODEL = "moonshotai/Kimi-K3"
FAST = {"itl_ms": 2.0, "prefill_ms_per_token": 0.005}
# A short schedule: two ladder rungs, three ramp steps of 1.5 s, a 1.5 s sustained run.
QUICK = {"ladder_tokens": [256, 1024], "ladder_output_tokens": 8, "ladder_repeats": 1, "ramp": [1, 2, 4],
         "step_s": 1.5, "sustained_s": 1.5, "system_prompt_tokens": 256, "turn_output_tokens": 24,
         "sample_interval_s": 0.25}
# Latency SLOs out of reach, for the tests about something else: on a busy machine (load average 15-20 on the 2
# cores) the simulator's 1-session TTFT p95 read 0.5 s and its ITL p95 0.26-0.31 s, above the 0.25 s default.
NO_SLO = {"ttft_p95_slo_s": 3600, "itl_p95_slo_s": 3600}


def ep(url: str, **kw: Any) -> Endpoint:
    return Endpoint(base_url=url, model=MODEL, timeout_s=30, **kw)


class Rows(LoadObserver):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.phases: list[str] = []

    def phase_started(self, phase: str, steps: int) -> None:
        self.phases.append(phase)

    def step_finished(self, row: Any) -> None:
        self.rows.append(dict(row))


def test_healthy_simulator_is_stable_with_curves_and_samples() -> None:
    obs = Rows()
    rec = Recorder()
    with start_simulator(**FAST) as sim:
        # A shared prefix longer than one match unit (1536), so the ramp's sessions can hit.
        opts = LoadOptions(**{**QUICK, **NO_SLO, "system_prompt_tokens": 2000})
        res = asyncio.run(run_load(ep(sim.base_url), opts, obs, recorder=rec))
    d = res.data
    assert res.status == "pass" and d["outcome"] == "stable", (res.reason, d["curves"])
    assert d["phases"] == ["long_input", "agent_ramp", "sustained"] == obs.phases
    assert d["envelope"] == {"max_context_tokens": 1024, "max_concurrency": 4, "duration_s": 1.5}
    ladder = [r for r in d["curves"] if r["phase"] == "long_input"]
    assert [r["context_tokens"] for r in ladder] == [256, 1024]
    # The calibrated prompt lands near the asked context (the simulator counts its own tokens).
    assert all(abs(r["prompt_tokens_mean"] - r["context_tokens"]) < 0.1 * r["context_tokens"] for r in ladder)
    ramp = [r for r in d["curves"] if r["phase"] == "agent_ramp"]
    assert [r["concurrency"] for r in ramp] == [1, 2, 4] and all(r["verdict"] == "ok" for r in ramp)
    assert all(r["ttft_p50_s"] is not None and r["itl_p95_s"] is not None for r in ramp)
    # Sessions share a system prompt: the server's prefix cache hits during the ramp.
    assert any((r["prefix_cache_hits_delta"] or 0) > 0 for r in ramp)
    assert d["counts"]["errors"] == {} and d["counts"]["health_failures"] == 0 and d["counts"]["restarts"] == 0
    assert d["samples"] and all(s["health"] == 200 for s in d["samples"])
    assert {"load-start", "load-end", "load-agent_ramp"} <= set(rec.metrics)
    assert obs.rows == d["curves"]
    json.dumps(res.model_dump(mode="json"))  # the result is evidence: it serialises


def test_small_server_names_a_ceiling() -> None:
    # The server's own queue names the ceiling, by design on any machine: the latency SLOs are out of reach (a busy
    # machine put 1 session's TTFT p95 at 0.49 s, which ended a 0.25 s SLO's ramp at its first step),
    # and the step past the ceiling offers 8 sessions against --max-num-seqs 2. Its queue reads empty only with 6
    # sessions between requests at once, and with 2 running at most 2 finish a request in one request's time
    # (about 0.26 s): the client would have to stall for 3 of them, half the step (with 4 sessions, 2 late to
    # send again emptied it). At 2 sessions no request can wait: two sequence slots, and the simulator counts
    # the queue as its last engine step left it. The rule needs 3 samples while the step offers its sessions: 5 s
    # steps sampled every 0.1 s have them unless one /health and /metrics read takes over 1.6 s (a machine at load
    # average 15 on 2 cores read 1 or 2 in a 1.5 s step).
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp", "sustained"], "ramp": [2, 8], "step_s": 5.0,
                          "sample_interval_s": 0.1, **NO_SLO, "turn_output_tokens": 32})
    with start_simulator(itl_ms=8.0, prefill_ms_per_token=0.005, max_num_seqs=2) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    d = res.data
    steps = [(r["step"], r["verdict"], r["waiting_p50"], r["waiting_samples"], r["running_max"]) for r in d["curves"]]
    assert d["outcome"] == "ceiling", (res.reason, steps)
    assert d["ceiling"] == 2 and res.status == "fail" and res.exit_code == 1
    bad = next(r for r in d["curves"] if r["verdict"] != "ok")
    assert (bad["concurrency"], bad["verdict"], bad["running_max"]) == (8, "queued", 2.0), steps
    # The sustained run confirms the ceiling holds.
    sustained = [r for r in d["curves"] if r["phase"] == "sustained"]
    assert sustained and all(r["concurrency"] == 2 and r["verdict"] == "ok" for r in sustained)
    assert any(f.check_id == "accept.load.ceiling" and "2" in f.message for f in res.findings)


def test_preemptions_published_late_are_read_at_the_step_end() -> None:
    # The simulator, as vLLM, counts a preemption with the preempted request's next output, not when it happens:
    # the step's count arrives with its last tokens. Two sessions of 400 output tokens run together in 64 blocks
    # of 16 (1,024 tokens, room for one) and one must be preempted; the step's closing sample, read once the
    # counters agree twice, holds every preemption the server counted by the end of the run.
    opts = LoadOptions(**{**QUICK, **NO_SLO, "phases": ["agent_ramp"], "ramp": [1, 3], "step_s": 0.5,
                          "sample_interval_s": 0.5, "session_turns": 1, "system_prompt_tokens": 16,
                          "turn_output_tokens": 400, "exact_turn_tokens": True})
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.0, kv_blocks=64, block_size=16, max_num_seqs=2,
                         max_model_len=1024) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
        page = httpx.get(sim.base_url + "/metrics", timeout=10)
        server_count = parse_metrics(page.text, page.headers.get("content-type")).counter("vllm:num_preemptions")
    d = res.data
    assert server_count > 0 and d["counts"]["preemptions"] == server_count, (server_count, d["counts"])
    assert [r["verdict"] for r in d["curves"]] == ["ok", "preempted"], d["curves"]
    last = max((s for s in d["samples"] if s.get("step") == "3 sessions"), key=lambda s: s["t_s"])
    assert last["settled"] is True and last["preemptions"] == server_count


def test_crash_under_pressure_is_collapse() -> None:
    opts = LoadOptions(**{**QUICK, **NO_SLO, "phases": ["agent_ramp", "sustained"], "ramp": [1, 4, 16],
                          "turn_output_tokens": 64, "session_turns": 2})
    # 512 blocks of 16: four two-turn sessions (at most about 660 tokens each) stay under half the
    # cache; sixteen first turns (about 450 tokens each) do not.
    with start_simulator(itl_ms=3.0, prefill_ms_per_token=0.005, kv_blocks=512, max_model_len=4096,
                         crash_above_kv=0.5) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    d = res.data
    assert [r["verdict"] for r in d["curves"]] == ["ok", "ok", "server"], d["curves"]
    assert d["outcome"] == "collapse" and res.status == "fail", res.reason
    assert d["counts"]["health_failures"] >= 1 and d["counts"]["oom_events"] >= 1
    assert any(f["kind"] in ("http_5xx", "stream_error") and f["concurrency"] == 16 for f in d["failures"])
    # Each OOM is a complete record: node, engine, the answers around it, the last success, memory either side.
    rec = d["oom_records"][0]
    assert len(d["oom_records"]) <= d["counts"]["oom_events"] and rec["concurrency"] == 16
    assert rec["node"] == "127.0.0.1" and rec["engine"] == "0" and rec["topology"] is False
    assert "out of memory" in rec["message"] and any("out of memory" in line for line in rec["excerpt"])
    assert rec["last_success"]["t_s"] <= rec["t_s"] + 30 and rec["last_success"]["id"]
    assert rec["memory_before"]["kv_by_engine"] == {"0": rec["memory_before"]["kv_usage"]}
    assert rec["memory_after"] is not None and "gpu_memory" in rec
    assert not any(r["phase"] == "sustained" for r in d["curves"])  # never sustain a collapsed server
    assert any(f.check_id == "accept.load.collapse" for f in res.findings)


def test_restart_is_counted() -> None:
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [16], "step_s": 3.0, "turn_output_tokens": 64})
    with start_simulator(itl_ms=3.0, prefill_ms_per_token=0.005, kv_blocks=256, max_model_len=4096,
                         crash_above_kv=0.5, restart_after_s=0.6) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    assert res.data["counts"]["restarts"] >= 1 and res.data["outcome"] == "collapse"


def test_context_refused_inside_the_envelope_is_adjust_config() -> None:
    opts = LoadOptions(**{**QUICK, "phases": ["long_input"], "ladder_tokens": [512, 4096]})
    with start_simulator(**FAST, max_model_len=2048) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    d = res.data
    assert d["outcome"] == "adjust_config" and res.status == "fail"
    assert d["failures"][0]["kind"] == "context_length" and d["failures"][0]["context_tokens"] == 4096
    assert "maximum context length is 2048" in d["failures"][0]["message"]


class _StopAfter(LoadObserver):
    """Sets ``stop`` once ``n`` requests have finished: an operator's Ctrl-C mid-step, at a point of the
    run rather than of the clock (a busy machine may not have finished one request in a fixed time)."""

    def __init__(self, stop: threading.Event, n: int) -> None:
        self.stop, self.n = stop, n

    def requests(self, done: int, errors: int) -> None:
        if done >= self.n:
            self.stop.set()


def test_stop_event_keeps_what_was_measured() -> None:
    stop = threading.Event()
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [2], "step_s": 30.0})
    with start_simulator(**FAST) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts, _StopAfter(stop, 2), stop=stop))
    assert res.status == "inconclusive" and res.data["interrupted"] is True
    assert res.data["counts"]["requests"] > 0
    assert res.data["curves"][0]["partial"] is True and res.data["elapsed_s"] < 15


def test_request_bound_stops_the_run() -> None:
    opts = LoadOptions(**{**QUICK, "max_requests": 5})
    with start_simulator(**FAST) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    assert res.data["counts"]["requests"] == 5 and res.status == "inconclusive"
    assert any(f.check_id == "accept.load.bound" for f in res.findings)


def test_the_request_bound_counts_requests_sent_not_finished() -> None:
    """Sessions in flight when the bound is reached must not take the run past it: each request is
    admitted (and counted) before it is sent."""
    from k3fleet.accept.load.shots import Budget, Tally

    tally = Tally(LoadOptions(**{**QUICK, "max_requests": 3}), LoadObserver(), None)
    for _ in range(3):
        tally.admit()  # three sessions send at once, none has finished
    assert tally.shots == [] and tally.started == 3
    with pytest.raises(Budget, match=r"request bound reached \(3 requests\)"):
        tally.admit()
    assert tally.started == 3 and tally.budget_hit == "request bound reached (3 requests)"


def test_old_server_metrics_are_a_finding() -> None:
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [1], "step_s": 1.0})
    with start_simulator(**FAST, old_metric_names=True, metrics_format="openmetrics") as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    assert "vllm:gpu_cache_usage_perc" in res.data["old_metric_names"]
    assert any(f.check_id == "accept.load.old_metric_names" for f in res.findings)
    assert res.data["curves"][0]["kv_usage_max"] is None  # never read the old name as the new one


# -- broken servers ------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FaultServer:
    """A tiny OpenAI-shaped server that answers the first ``good`` chats properly, then misbehaves."""

    def __init__(self, mode: str, good: int = 2) -> None:
        self.mode = mode
        self.good = good
        self.seen = 0
        self.port = _free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        await request.read()
        if self.mode == "status500" or (self.mode == "late500" and self.seen > self.good):
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if self.mode == "auth":
            return web.json_response({"error": "Unauthorized"}, status=401)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.mode == "garbage":
            await resp.write(b"data: {this is not json\n\n")
            await resp.write_eof()
            return resp
        usage = {"prompt_tokens": 10 + self.seen, "completion_tokens": 3, "total_tokens": 13 + self.seen}
        for word in ("a", "b", "c"):
            await resp.write(f'data: {{"choices":[{{"index":0,"delta":{{"content":"{word}"}},'
                             f'"finish_reason":null}}]}}\n\n'.encode())
            if self.mode == "cut" and self.seen > self.good:
                request.transport.close()  # type: ignore[union-attr]
                return resp
        await resp.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n')
        await resp.write(f'data: {{"choices":[],"usage":{json.dumps(usage)}}}\n\ndata: [DONE]\n\n'.encode())
        await resp.write_eof()
        return resp

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.mode == "html_metrics":
            return web.Response(text="<html><body>metrics live elsewhere</body></html>", content_type="text/html")
        return web.Response(text='vllm:num_requests_running{model_name="m"} 0.0\n', content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        # Every probe checks the model is served before it sends traffic.
        if self.mode == "auth":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.runner = runner
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def fault(request: pytest.FixtureRequest) -> Iterator[FaultServer]:
    srv = FaultServer(request.param)
    yield srv
    srv.close()


@pytest.mark.parametrize("fault,kind,exit_code", [("status500", "server", 3), ("auth", "auth", 2),
                                                  ("garbage", "bad_response", 3)], indirect=["fault"])
def test_first_request_failure_is_one_line(fault: FaultServer, kind: str, exit_code: int) -> None:
    with pytest.raises(EndpointError) as info:
        asyncio.run(run_load(ep(fault.url), LoadOptions(**QUICK)))
    assert info.value.kind == kind and info.value.exit_code == exit_code
    assert "\n" not in str(info.value)


def test_unreachable_is_one_line() -> None:
    with pytest.raises(EndpointError) as info:
        asyncio.run(run_load(ep(f"http://127.0.0.1:{_free_port()}"), LoadOptions(**QUICK)))
    assert info.value.kind == "unreachable" and info.value.exit_code == 3
    assert "cannot connect" in str(info.value)


@pytest.mark.parametrize("fault,kind", [("cut", "stream_cut"), ("late500", "http_5xx")], indirect=["fault"])
def test_server_failures_under_load_are_collapse(fault: FaultServer, kind: str) -> None:
    # The first step must reach the fault server's third chat (2 good ones first): 2 s leaves a busy
    # machine time for it (at 0.5 s a load average of 23 reached it only in the second step).
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [1, 2], "step_s": 2.0})
    res = asyncio.run(run_load(ep(fault.url), opts))
    assert res.data["outcome"] == "collapse"
    first = res.data["failures"][0]
    assert first["kind"] == kind and first["phase"] == "agent_ramp" and first["concurrency"] == 1


@pytest.mark.parametrize("fault", ["html_metrics"], indirect=True)
def test_metrics_not_prometheus_text_is_a_finding(fault: FaultServer) -> None:
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [1], "step_s": 0.5})
    res = asyncio.run(run_load(ep(fault.url), opts))
    found = [f for f in res.findings if f.check_id == "accept.load.metrics_unavailable"]
    assert found and "not Prometheus or OpenMetrics text" in found[0].message
    assert res.data["outcome"] == "stable"


def test_helpers() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert filler(5, 3) == filler(5, 3) and len(filler(40, 1).split()) == 40
    with pytest.raises(ValueError):
        LoadOptions(ramp=[4, 2])
    with pytest.raises(ValueError):
        LoadOptions(ramp=[1, 10000])


def test_cli_writes_a_verifiable_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "run"
    try:
        with start_simulator(SimConfig(**FAST)) as sim:
            rc = main(["accept", "load", "--base-url", sim.base_url + "/v1", "--model", MODEL, "--ladder", "256",
                       "--ladder-output", "8", "--ramp", "1,2", "--step-seconds", "1", "--sustained-seconds", "1.5",
                       "--system-tokens", "128", "--turn-output", "16", "-q", "--json", "--out", str(out)])
        bad = main(["accept", "load", "--base-url", sim.base_url, "--model", MODEL, "--ramp", "x", "-q"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    printed = json.loads(capsys.readouterr().out)
    assert rc == 0 and printed["status"] == "pass"
    assert bad == 2
    rd = RunDir.open(out)
    assert rd.verify() == []
    head = json.loads((out / "accept.json").read_text())
    assert head["probes"]["load"]["data"]["outcome"] == "stable" and head["exit_code"] == 0
    curves = [json.loads(line) for line in (out / "load" / "curves.jsonl").read_text().splitlines()]
    assert {c["phase"] for c in curves} == {"long_input", "agent_ramp", "sustained"}
    assert (out / "metrics" / "load-start.txt").read_text().startswith("# HELP")


def test_cli_key_from_environment_never_in_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOAD_TEST_KEY", "sk-load-test-secret-1234")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "run"
    try:
        with start_simulator(SimConfig(**FAST, api_key_env="LOAD_TEST_KEY")) as sim:
            rc = main(["accept", "load", "--base-url", sim.base_url, "--model", MODEL, "--api-key-env",
                       "LOAD_TEST_KEY", "--phases", "agent_ramp", "--ramp", "1", "--step-seconds", "1",
                       "--system-tokens", "64", "--turn-output", "8", "-q", "--out", str(out)])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert rc == 0
    for f in out.rglob("*"):
        if f.is_file():
            assert "sk-load-test-secret-1234" not in f.read_text(errors="replace"), f


def test_a_stable_result_says_its_figures() -> None:
    # "stable" alone tells an SRE nothing: the line carries the concurrency tested, the requests, the worst
    # step's TTFT p95 against its SLO, the errors and that no ceiling was found, each from the result's data. The
    # TTFT SLO is the default 5 s the line names (10 times the busiest machine's), the ITL SLO out of reach.
    opts = LoadOptions(**{**QUICK, "phases": ["agent_ramp"], "ramp": [1, 2], "itl_p95_slo_s": NO_SLO["itl_p95_slo_s"]})
    with start_simulator(**FAST) as sim:
        res = asyncio.run(run_load(ep(sim.base_url), opts))
    assert res.status == "pass", res.reason
    d = res.data
    worst = max(r["ttft_p95_s"] for r in d["curves"] if r["phase"] == "agent_ramp")
    assert res.reason == (f"stable up to 2 concurrent sessions (the most tested): {d['counts']['requests']} requests, "
                          f"TTFT p95 {worst:.2f} s (worst step; SLO 5 s), 0 errors, no ceiling found")
