"""GPU telemetry during a load run (k3fleet/accept/gpu_telemetry.py): a recorded dcgm-exporter page, the
simulator's DCGM-shaped page, the per-phase curves and the OOM record's GPU curve."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from k3fleet.accept.client import Endpoint
from k3fleet.accept.gpu_telemetry import gpus_of, peaks, phase_curves
from k3fleet.accept.load import LoadOptions, load_options, run_load
from k3fleet.accept.metrics import parse_metrics
from k3fleet.errors import UsageError
from k3fleet.lab.vllm_sim import start_simulator

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
MODEL = "moonshotai/Kimi-K3"
QUICK = {"ramp": [1, 2, 4, 16], "step_s": 1.5, "system_prompt_tokens": 256, "turn_output_tokens": 64,
         "sample_interval_s": 0.25, "ttft_p95_slo_s": 3600, "itl_p95_slo_s": 3600}


def test_a_recorded_dcgm_exporter_page_reads_per_gpu() -> None:
    # NVIDIA's published exporter output (tests/fixtures/dcgm/SOURCES.md): one A100 and one MIG instance of it.
    snap = parse_metrics((FIX / "dcgm_exporter_a100_mig.prom").read_text())
    gpus = gpus_of(snap)
    # The MIG instance's series (GPU_I_ID) are not the whole GPU; utilisation comes from the profiling counter.
    assert gpus == {"ub20-a100-k8s/0": {"used_mib": 4845.0, "free_mib": 35690.0, "power_w": 409.692,
                                         "util_pct": 99.563}}


def test_a_page_without_gpus_reads_empty() -> None:
    assert gpus_of(parse_metrics("vllm:num_requests_running{model_name=\"m\"} 1\n")) == {}


def test_curves_are_kept_per_phase_and_gpu() -> None:
    samples = [{"t_s": 0.0, "phase": "agent_ramp", "gpus": {"0": {"used_mib": 10.0, "free_mib": 90.0,
                                                                  "power_w": 100.0, "util_pct": 5.0}}},
               {"t_s": 1.0, "phase": "agent_ramp", "gpus": {"0": {"used_mib": 30.0, "free_mib": 70.0}}},
               {"t_s": 2.0, "phase": "sustained"}]
    curves = phase_curves(samples)
    assert curves == {"agent_ramp": {"0": [[0.0, 10.0, 90.0, 100.0, 5.0], [1.0, 30.0, 70.0, None, None]]}}
    assert peaks(curves) == {"agent_ramp": {"0": {"used_mib_max": 30.0, "free_mib_min": 70.0, "power_w_max": 100.0}}}


def test_a_telemetry_url_must_be_http() -> None:
    with pytest.raises(UsageError, match="telemetry_url"):
        load_options({"telemetry_url": "file:///etc/passwd"})


def test_an_oom_on_the_simulator_carries_the_gpu_curve_that_led_to_it() -> None:
    # KV pressure kills the engine at 16 sessions (as tests/unit/test_accept_load.py's collapse); the simulator's
    # GPU memory grows with the KV blocks in use, and the DCGM page is sampled with every /metrics sample.
    with start_simulator(itl_ms=3.0, prefill_ms_per_token=0.005, kv_blocks=512, max_model_len=4096,
                         crash_above_kv=0.5, gpu_count=2) as sim:
        opts = LoadOptions(**{**QUICK, "ramp": [1, 4, 16], "session_turns": 2}, phases=["agent_ramp"],
                           telemetry_url=sim.base_url + "/dcgm/metrics")
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30), opts))
    d = res.data
    assert d["outcome"] == "collapse" and d["oom_records"], d["curves"]
    rec = d["oom_records"][0]
    curve = rec["gpu_curve"]
    assert curve and all(p["t_s"] <= rec["t_s"] for p in curve)
    assert set(curve[-1]["gpus"]) == {"vllm-sim/0", "vllm-sim/1"}
    used = [p["gpus"]["vllm-sim/0"]["used_mib"] for p in curve]
    assert max(used) > used[0], used  # memory rose with the KV cache before the engine died
    assert rec["request"]["context_tokens"] is not None or rec["request"]["prompt_tokens"] is None
    assert rec["concurrency"] == 16 and isinstance(rec["gpu_memory"], dict)
    gpu = d["gpu"]
    assert gpu["source"].endswith("/dcgm/metrics") and gpu["errors"] == []
    assert set(gpu["curves"]["agent_ramp"]) == {"vllm-sim/0", "vllm-sim/1"}
    assert gpu["peaks"]["agent_ramp"]["vllm-sim/0"]["power_w_max"] > 91


def test_without_a_source_the_run_says_gpu_figures_are_unknown() -> None:
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.005) as sim:
        opts = LoadOptions(**{**QUICK, "ramp": [1]}, phases=["agent_ramp"])
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30), opts))
    assert res.data["gpu"]["curves"] == {} and "unknown" in res.data["gpu"]["note"]


def test_an_unreadable_telemetry_page_is_a_finding() -> None:
    with start_simulator(itl_ms=2.0, prefill_ms_per_token=0.005) as sim:
        opts = LoadOptions(**{**QUICK, "ramp": [1]}, phases=["agent_ramp"],
                           telemetry_url=sim.base_url + "/no-such-page")
        res = asyncio.run(run_load(Endpoint(base_url=sim.base_url, model=MODEL, timeout_s=30), opts))
    assert any(f.check_id == "accept.load.telemetry_unavailable" for f in res.findings)
    assert res.data["gpu"]["errors"]
