"""One real vLLM (prefix caching on, `--max-num-seqs 2`, a KV cache of 18 blocks of 128 tokens) and every
probe against it, in order; the watch test kills the server last."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import MODEL, k3fleet, lab_server

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, run_load
from k3fleet.lab import vllm
from k3fleet.lab.vllm import VllmState

pytestmark = pytest.mark.serving

REPO = Path(__file__).resolve().parents[2]
# 18 blocks x 128 tokens x 512 bytes a token (2 layers, K and V, 1 KV head of 64, bfloat16): room for one
# 2048-token request, not for two long sessions at once.
KV_BYTES = 18 * 128 * 512


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmState]:
    with lab_server(tmp_path_factory.mktemp("vllm-main"), "--max-num-seqs", "2", "--kv-cache-memory-bytes",
                    str(KV_BYTES)) as state:
        yield state


def _json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_startup_reads_the_real_log_and_passes(server: VllmState) -> None:
    proc = k3fleet("accept", "startup", "--log", str(server.log), "--launch-command",
                   str(server.workdir / "launch-command.txt"), "--json")
    res = _json(proc)
    assert proc.returncode == 0 and res["status"] == "pass", res
    d = res["data"]
    assert d["vllm_version"] == "0.32.0" and d["architecture"] == "LlamaForCausalLM"
    assert d["max_model_len"] == 2048 and d["prefix_caching"] is True and d["tool_call_parser"] == "hermes"


def _prefix(server: VllmState, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = k3fleet("accept", "prefix-cache", "--base-url", server.base_url, "--model", MODEL, "--repeats", "3",
                   "--json", *extra)
    return proc.returncode, _json(proc)


def test_prefix_cache_passes_on_real_counters(server: VllmState) -> None:
    rc, res = _prefix(server)
    assert rc == 0 and res["status"] == "pass", res["reason"]
    d = res["data"]
    assert d["max_model_len"] == 2048 and d["prompt_sizing"]["method"] == "tokenize"
    assert d["prompt_sizing"]["measured_tokens"] <= 2048
    # The server's own unit: whole 128-token blocks (prefix_match_unit is "None" on this build).
    assert (d["match_unit"], d["match_unit_source"]) == (128, "cache_config_info block_size")
    prefix = d["prefix_tokens"]["high"]
    # The counters moved by about the shared prefix: whole blocks of it per warm request, none for the control.
    assert d["windows"]["warm"]["vllm:prompt_tokens_cached"] == 3 * (prefix // 128) * 128
    assert d["windows"]["control"]["vllm:prompt_tokens_cached"] == 0


def test_prefix_cache_gives_the_same_outcome_run_after_run_with_json(server: VllmState) -> None:
    # The real server publishes a request's counters up to a second after its stream ends: the probe waits
    # for them after each request, so --json (no progress to slow it) never races them.
    outcomes = []
    for _ in range(3):
        rc, res = _prefix(server)
        d = res["data"]
        outcomes.append((rc, res["status"]))
        assert all(r["settled"] and r["counted"] for r in d["settle"]["reads"]), d["settle"]
        assert d["settle"]["reads"][0]["counted_by"] == "vllm:request_success"
        # The replay was served from the cache and gave the cold answer, token for token.
        assert d["answers"]["basis"] == "tokens" and d["answers"]["replay_hit_seen"] is True
        assert all(c["same"] or c["near_tie"] for c in d["answers"]["comparisons"]), d["answers"]
        assert d["server"]["vllm_version"] == "0.32.0" and d["server"]["max_model_len"] == 2048
    assert outcomes == [(0, "pass")] * 3, outcomes


def test_prefix_cache_is_inconclusive_when_the_context_cannot_hold_one_unit(server: VllmState) -> None:
    rc, res = _prefix(server, "--match-unit", "4096")
    assert rc == 3 and res["status"] == "inconclusive"
    assert [f["check_id"] for f in res["findings"]] == ["accept.prefix_cache.context_below_unit"]
    assert "2048 tokens" in res["reason"]


def test_agent_fails_at_the_http_layer_on_random_weights(server: VllmState) -> None:
    proc = k3fleet("accept", "agent", "--base-url", server.base_url, "--model", MODEL, "--repeats", "1",
                   "--max-tokens", "48", "--json")
    res = _json(proc)
    assert proc.returncode == 1 and res["status"] == "fail", res["reason"]
    cases = res["data"]["cases"]
    assert all(v["layer"] == "http" and v["passed"] == 0 for v in cases.values()), cases
    # Structured outputs force the shape: what came back is judged (never an http error), with room to close.
    for forced in ("invalid_args", "structured_output"):
        assert "http_error" not in cases[forced]["defects"] and cases[forced]["finish_reasons"], cases[forced]


def _load(server: VllmState, **opts: Any) -> Any:
    ep = Endpoint(base_url=server.base_url, model=MODEL, timeout_s=300)
    # exact_turn_tokens: the random-weight model would end a turn wherever greedy decoding meets its EOS,
    # which differs with every session's prompt; the queue and the KV cache must fill by design.
    # The latency SLOs out of reach (an hour, the most a load SLO may be): these tests prove what the server's
    # own queue and KV cache make of a step. On 2 busy cores the tiny model's ITL p95 alone was 0.4-0.8 s
    # (default SLO 0.25 s), which ended the ramp on "latency" before the step under test.
    return asyncio.run(run_load(ep, LoadOptions(phases=["agent_ramp"], session_turns=1, sample_interval_s=0.5,
                                                request_timeout_s=300, exact_turn_tokens=True,
                                                ttft_p95_slo_s=3600, itl_p95_slo_s=3600, **opts)))


def _trace(res: Any) -> str:
    """The failure message: each step's verdict and figures, and what every sample of it read from the server
    (running/waiting/preemptions), so a step that did not queue or preempt shows why."""
    def num(v: Any) -> str:
        return "-" if v is None else f"{v:g}"
    lines = [res.reason]
    for row in res.data["curves"]:
        a, b = row["t_start_s"], row["t_start_s"] + row["duration_s"]
        reads = " ".join(f"{num(s.get('running'))}/{num(s.get('waiting'))}/{num(s.get('preemptions'))}"
                         for s in res.data["samples"] if a <= s["t_s"] <= b)
        lines.append(f"{row['step']}: {row['verdict']}, {row['duration_s']} s, {row['requests']} requests, errors "
                     f"{row['errors']}, waiting p50 {row['waiting_p50']}; running/waiting/preemptions: {reads}")
    return "\n".join(lines)


def test_load_names_the_ceiling_from_the_real_queue(server: VllmState) -> None:
    # 8 sessions against --max-num-seqs 2: 6 requests beyond what the server runs. Between two requests a session
    # is outside the engine (the end of its stream, the client, the next request's chat template), on 2 shared
    # cores for as long as a request runs at times: with 4 sessions two of them outside at once emptied the queue
    # for half the step ("stable up to 4"). Here the queue reads empty only with 6 outside at once (and it is read
    # while the step offers its 8 sessions, not in the drain after).
    res = _load(server, ramp=[1, 2, 8], step_s=8, system_prompt_tokens=200, turn_output_tokens=64)
    assert [r["verdict"] for r in res.data["curves"]] == ["ok", "ok", "queued"], _trace(res)
    assert res.data["outcome"] == "ceiling" and res.data["ceiling"] == 2, _trace(res)
    ceiling = next(f for f in res.findings if f.check_id == "accept.load.ceiling")
    assert "vllm:num_requests_waiting" in ceiling.message and "limit traffic to 2" in ceiling.message
    assert res.data["unread_metrics"] == []
    assert res.status == "fail" and res.exit_code == 1


def test_load_judges_real_preemptions_as_load_pressure(server: VllmState) -> None:
    # Each turn generates exactly turn_output_tokens. A prompt is about 940 tokens (the 400-token system prompt
    # and the tool definitions the chat template renders), 7 of its 128-token blocks the same for every session:
    # alone a session ends near 1,940 tokens in 16 of the 17 blocks vLLM hands out (the 18th is its null block),
    # two at once need 7 + 2 x 9 = 25, so two running together must preempt once each has generated about 600
    # tokens. 3 sessions against --max-num-seqs 2: whenever one ends a waiting one takes its place, so two run
    # together even if one session's request came late or failed. (1,000 tokens: prompt and output fit the
    # 2,048-token context; 1,200 were cut by the server.)
    res = _load(server, ramp=[1, 3], step_s=4, system_prompt_tokens=400, turn_output_tokens=1000)
    assert res.data["counts"]["preemptions"], _trace(res)
    assert [r["verdict"] for r in res.data["curves"]] == ["ok", "preempted"], _trace(res)
    pre = next(f for f in res.findings if f.check_id == "accept.load.preemptions")
    assert pre.layer == "traffic" and "load pressure" in pre.message
    assert res.data["outcome"] == "ceiling" and res.data["ceiling"] == 1, _trace(res)


# -- watch: a real approved, signed decision as the baseline, then this server idle, then killed ----------

sys.path.insert(0, str(REPO / "tests" / "integration" / "decide"))


@pytest.fixture(scope="module")
def approved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(decision directory, allowed signers): audit, accept all on the simulator, decide, signed."""
    from decide_helpers import EvidenceKeys

    from k3fleet.lab.vllm_sim.server import start_simulator

    root = tmp_path_factory.mktemp("watch-baseline")
    keys = EvidenceKeys(root / "keys")
    digest = "4f6c3a9a1d0b8e2f7c5d9e1a3b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c"
    same = {"profile": "h200-r580", "set": {"container": {"image": {"digest": digest}}}}
    fleet = root / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"description": "two R580 nodes", "profiles_dir": str(REPO / "inventories" / "lab"
                                                                                          / "profiles"),
                                     "hosts": {"gpu-m01": same, "gpu-m02": same}}))
    audit = root / "audit"
    assert k3fleet("audit", "-i", str(fleet), "--lab", "--out", str(audit), "--quiet").returncode in (0, 1, 3)
    fix = REPO / "tests" / "fixtures" / "decide"
    quick = {"ladder_tokens": [256, 1024], "ladder_output_tokens": 8, "ladder_repeats": 1, "ramp": [1, 2, 4],
             "step_s": 1.5, "sustained_s": 1.5, "system_prompt_tokens": 2000, "turn_output_tokens": 24,
             "sample_interval_s": 0.25}
    run = root / "accept"
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.005) as sim:
        proc = k3fleet("accept", "all", "--base-url", sim.base_url, "--model", "moonshotai/Kimi-K3", "--log",
                       str(fix / "startup_kimi_k3_tp8_dp2.log"), "--launch-command",
                       str(fix / "launch_kimi_k3_tp8_dp2.txt"), "--agent-repeats", "6", "--prefix-repeats", "3",
                       "--out", str(run), "--quiet", "--profile", str(REPO / "k3fleet" / "targets" / "profiles"
                                                                      / "lab-small.yaml"),
                       *[x for k, v in quick.items() for x in ("--load-option", f"{k}={json.dumps(v)}")])
        assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    decision = root / "decision"
    proc = k3fleet("decide", str(audit), str(run), "--reviewer", "carol", "--out", str(decision), "--sign-key",
                   str(keys.key), "--profile", str(REPO / "k3fleet" / "targets" / "profiles" / "lab-small.yaml"),
                   "--rollback-owner", "erin")
    assert proc.returncode == 0 and (decision / "baseline.json").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return decision, keys.allowed


def _samples(out: Path) -> list[dict[str, Any]]:
    path = out / "samples.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_watch_is_quiet_when_idle_and_fires_when_the_server_is_killed(server: VllmState, approved: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    decision, allowed = approved
    out = tmp_path / "watch"
    bindir = Path(sys.executable).parent
    watch = subprocess.Popen([str(bindir / "k3fleet"), "watch", "--base-url", server.base_url, "--model", MODEL,
                              "--baseline", str(decision), "--allowed-signers", str(allowed), "--for", "10m",
                              "--interval", "2", "--agent-every", "0", "--json", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while len(_samples(out)) < 6 and watch.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        quiet = _samples(out)
        assert watch.poll() is None, watch.communicate()
        assert len(quiet) >= 6 and all(s.get("health") == 200 for s in quiet), quiet
        # Kill the real server (engine and API process) as an OOM killer would.
        for pid in vllm.alive_pids(server.workdir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stdout, stderr = watch.communicate(timeout=120)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 1, stderr[-2000:]
    result = json.loads(stdout)
    assert [t["id"] for t in result["triggers"]] == ["process_restart_or_oom"], result["triggers"]
