"""Trace replay (k3fleet/accept/load/trace.py, rate.py OpenLoop.replay): the documented JSON Lines format, bad
lines as one usage line, prompt text redacted at intake, time scaling, sessions as conversations, and a replay
on the simulator that keeps its arrival times and its request mix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load import LoadOptions, run_load
from k3fleet.accept.load.trace import load_trace
from k3fleet.errors import UsageError
from k3fleet.lab.vllm_sim import start_simulator

MODEL = "moonshotai/Kimi-K3"
TOOL = {"type": "function", "function": {"name": "node_status", "parameters": {
    "type": "object", "properties": {"node": {"type": "string"}}, "required": ["node"]}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "summary", "schema": {
    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}


def _write(tmp: Path, rows: list[Any], name: str = "trace.jsonl") -> Path:
    p = tmp / name
    p.write_text("# a production sample\n" + "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows)
                 + "\n\n")
    return p


def test_a_trace_reads_scaled_sorted_and_redacted(tmp_path: Path) -> None:
    rows = [{"arrival_s": 2.0, "prompt_tokens": 300, "output_tokens": 8, "session_id": "a"},
            {"arrival_s": 0.5, "prompt": "deploy with HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345 now",
             "output_tokens": 4, "tools": [TOOL], "response_format": SCHEMA}]
    trace = load_trace(_write(tmp_path, rows), speed=2.0)
    assert [r.arrival_s for r in trace.requests] == [0.25, 1.0]
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in (trace.requests[0].prompt or "")
    s = trace.summary()
    assert (s["requests"], s["sessions"], s["with_tools"], s["with_response_format"], s["redacted_prompts"],
            s["speed"], s["duration_s"]) == (2, 1, 1, 1, 1, 2.0, 1.0)
    assert len(s["sha256"]) == 64 and "deploy" not in json.dumps(s)  # the run keeps no prompt


@pytest.mark.parametrize(("rows", "words"), [
    (["{not json"], "line 2: not a JSON object"),
    ([[1, 2]], "line 2: not a JSON object"),
    ([{"arrival_s": 0, "output_tokens": 4}], "line 2: give prompt or prompt_tokens"),
    ([{"arrival_s": 0, "prompt": "x", "prompt_tokens": 3, "output_tokens": 4}], "give prompt or prompt_tokens"),
    ([{"arrival_s": -1, "prompt": "x", "output_tokens": 4}], "line 2: arrival_s:"),
    ([{"arrival_s": 0, "prompt": "x", "output_tokens": 4, "extra": 1}], "line 2: extra:"),
    ([], "no request in it"),
])
def test_a_bad_trace_is_one_usage_line(tmp_path: Path, rows: list[Any], words: str) -> None:
    with pytest.raises(UsageError) as exc:
        load_trace(_write(tmp_path, rows))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_trace_limits(tmp_path: Path) -> None:
    rows = [{"arrival_s": i / 10, "prompt_tokens": 20, "output_tokens": 2} for i in range(5)]
    with pytest.raises(UsageError, match="more than 3 requests"):
        load_trace(_write(tmp_path, rows), limit=3)
    with pytest.raises(UsageError, match="--trace-speed 0"):
        load_trace(_write(tmp_path, rows), speed=0)
    with pytest.raises(UsageError, match="--trace"):
        load_trace(tmp_path / "missing.jsonl")


def test_a_replay_keeps_its_arrivals_and_its_mix(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = []
    for i in range(30):
        row: dict[str, Any] = {"arrival_s": i * 0.05, "prompt_tokens": 64, "output_tokens": 4}
        if i % 3 == 0:
            row["tools"] = [TOOL]
        if i % 5 == 0:
            row["response_format"] = SCHEMA
        if i % 10 < 3:
            row["session_id"] = f"s{i // 10}"
        rows.append(row)
    path = _write(tmp_path, rows)
    opts = LoadOptions(phases=["trace"], trace_path=str(path), trace_speed=1.0, sample_interval_s=0.25,
                       ttft_p95_slo_s=3600, itl_p95_slo_s=3600)
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.0) as sim:
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30), opts))
    (row,) = res.data["curves"]
    assert row["phase"] == "trace" and row["requests"] == 30 and row["ok"] == 30, res.data["failures"]
    assert row["verdict"] == "ok" and res.data["outcome"] == "stable"
    # Arrival lag is measured (no timed bound here: scripts/bench_trace.py prints it at 200 requests/s).
    assert row["arrival_lag_p99_s"] is not None and row["arrival_lag_p50_s"] >= 0
    assert res.data["trace"]["requests"] == 30 and res.data["trace"]["sessions"] == 3
    assert res.data["trace"]["with_tools"] == 10 and res.data["trace"]["with_response_format"] == 6
    # A session's later turns carry the earlier ones: their prompts are longer than a first turn's.
    assert row["prompt_tokens_mean"] > 64


def test_the_cli_reads_the_trace_before_anything_is_written(tmp_path: Path) -> None:
    from k3fleet.cli.base import main

    bad = _write(tmp_path, ["{not json"])
    runs = tmp_path / "runs"
    code = main(["accept", "load", "--base-url", "http://127.0.0.1:9", "--model", MODEL, "--trace", str(bad),
                 "--runs-dir", str(runs), "--quiet"])
    assert code == 2 and not runs.exists()
