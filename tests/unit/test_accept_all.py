"""accept all on a healthy simulator: every probe passes, exit 0, the full run-directory layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.cli.base import main
from k3fleet.evidence import RunDir
from k3fleet.lab.vllm_sim.server import start_simulator

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
