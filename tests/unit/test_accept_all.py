"""accept all on a healthy simulator: every probe passes, exit 0, the full run-directory layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.cli.base import main
from k3fleet.evidence import RunDir
from k3fleet.lab.vllm_sim.server import start_simulator
from k3fleet.models.evidence import AcceptRecord

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_startup"
# A short load schedule: the probe's own defaults run for minutes.
QUICK_LOAD = ["--load-option", "ramp=[1,2]", "--load-option", "step_s=1", "--load-option", "sustained_s=2",
              "--load-option", "ladder_tokens=[1024]", "--load-option", "ladder_repeats=1"]


def test_every_probe_passes_on_a_healthy_simulator(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with start_simulator(itl_ms=0.2) as sim:
        code = main(["accept", "all", "--base-url", sim.base_url, "--model", "moonshotai/Kimi-K3", "--out", str(out),
                     "--log", str(FIX / "synthetic_kimi_k3_ready.log"), "--agent-repeats", "2", "-q", *QUICK_LOAD])
    summary = json.loads((out / "accept.json").read_text())
    assert code == 0, {k: (v["status"], v["reason"]) for k, v in summary["probes"].items()}
    assert {k: v["status"] for k, v in summary["probes"].items()} == {
        "startup": "pass", "prefix_cache": "pass", "agent": "pass", "load": "pass"}
    assert summary["not_run"] == {} and summary["exit_code"] == 0
    # Written through its model: every key is one the model declares, and the model reads it back whole.
    assert set(summary) <= set(AcceptRecord.model_fields) and AcceptRecord.model_validate(summary).dump() == summary
    for rel in ("startup.json", "prefix_cache.json", "agent.json", "load.json", "load/curves.jsonl",
                "requests/prefix_cache.jsonl", "requests/agent.jsonl", "metrics/start.txt", "inputs/startup.log"):
        assert (out / rel).is_file(), rel
    assert RunDir.open(out).verify_manifest() == []


def test_bad_load_option_is_found_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--out", str(out),
                 "--load-option", "ramp=[4,2]"]) == 2
    err = capsys.readouterr().err
    assert "--load-option" in err and "Traceback" not in err
    assert not out.exists()


def test_unknown_load_option_names_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--out", str(out),
                 "--load-option", "step_seconds=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("k3fleet: error: --load-option step_seconds: not a load option (one of phases, ")
    assert "step_s" in err and len(err.splitlines()) == 1 and not out.exists()


def test_ctrl_c_ends_the_running_probe_and_writes_what_was_measured(tmp_path: Path) -> None:
    """The first Ctrl-C (the stop event the CLI's signal handler sets) cancels the agent mid-suite: its
    requests so far are kept, it is inconclusive, load does not start, the run directory is whole."""
    import asyncio
    import threading

    from k3fleet.accept.agent import AgentOptions
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.prefix_cache import PrefixOptions
    from k3fleet.accept.run import AllOptions, run_all
    from k3fleet.evidence import RunDir
    from k3fleet.lab.vllm_sim.server import start_simulator

    stop = threading.Event()
    lines: list[str] = []

    def progress(msg: str) -> None:
        lines.append(msg)
        if msg.startswith("agent: round 2/"):
            stop.set()

    out = tmp_path / "run"
    with start_simulator(itl_ms=0.2) as sim:
        ep = Endpoint(base_url=sim.base_url, model="moonshotai/Kimi-K3")
        opts = AllOptions(out=out, prefix=PrefixOptions(repeats=2), agent=AgentOptions(repeats=50), stop=stop,
                          budget_s=600)
        res = asyncio.run(run_all(ep, opts, ["k3fleet", "accept", "all"], progress=progress))
    assert res.exit_code == 3 and res.summary.interrupted is True
    assert any(line.startswith("plan (budget 600 s):") for line in lines)
    summary = json.loads((out / "accept.json").read_text())
    assert summary["probes"]["prefix_cache"]["status"] == "pass"
    agent = summary["probes"]["agent"]
    assert agent["status"] == "inconclusive" and agent["reason"].startswith("interrupted after ")
    assert "load" not in summary["probes"] and set(summary["budget"]["elapsed_s"]) == {"prefix_cache", "agent"}
    assert (out / "requests" / "agent.jsonl").is_file()
    assert RunDir.open(out).verify_manifest() == []


def test_a_probe_the_server_aborts_keeps_its_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The server goes away as the load probe starts: the run ends with the endpoint's error, and the
    summary still has a load row that says it aborted (it used to vanish from the table)."""
    import asyncio

    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.run import AllOptions, run_all
    from k3fleet.cli.accept import _print_summary

    out = tmp_path / "run"
    sim = start_simulator(itl_ms=0.2)
    try:
        def progress(msg: str) -> None:
            if msg.startswith("load:"):
                sim.stop()

        ep = Endpoint(base_url=sim.base_url, model="moonshotai/Kimi-K3")
        opts = AllOptions(out=out, skip=["prefix_cache", "agent"], load_overrides={"ramp": [1, 2], "step_s": 1,
                                                                                  "sustained_s": 1})
        res = asyncio.run(run_all(ep, opts, ["k3fleet", "accept", "all"], progress=progress))
    finally:
        sim.stop()
    assert res.summary.error and "load" in res.summary.aborted, res.summary
    capsys.readouterr()
    _print_summary(res.summary, res.results)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("load ")]
    assert len(rows) == 1 and "ABORTED" in rows[0], rows
