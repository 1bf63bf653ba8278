"""accept startup against recorded real vLLM start-up logs (tests/fixtures/vllm_startup/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.accept.startup import analyse_startup, parse_launch_command, run_startup
from k3fleet.cli.base import main
from k3fleet.errors import UsageError
from k3fleet.targets import load_target

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_startup"
TARGET = load_target(None)


def _run(name: str, launch: str | None = None):
    return run_startup(FIX / name, FIX / launch if launch else None, target=TARGET)


def _ids(result) -> set[str]:
    return {f.check_id for f in result.findings}


# (fixture, status, finding that must be there, its layer)
FAILURES = [
    ("container_cli_requirement.log", "accept.startup.cuda_init.container_requirement", "cuda>=12.4"),
    ("error_803.log", "accept.startup.cuda_init.error_803", "Error 803"),
    ("driver_too_old.log", "accept.startup.cuda_init.driver_too_old", "found version 11040"),
    ("nccl_unhandled_system_error.log", "accept.startup.nccl", "unhandled system error"),
    ("no_kernel_image.log", "accept.startup.missing_kernel", "no kernel image"),
    ("unsupported_arch_sm120.log", "accept.startup.unsupported_arch", "sm_120"),
    ("oom_load_model.log", "accept.startup.load_oom", "CUDA out of memory"),
]


@pytest.mark.parametrize(("name", "fid", "evidence"), FAILURES)
def test_startup_failures_are_environment_findings(name: str, fid: str, evidence: str) -> None:
    result = _run(name)
    assert result.status == "fail"
    assert result.exit_code == 1
    found = {f.check_id: f for f in result.findings}
    assert fid in found, result.findings
    assert found[fid].severity == "error"
    assert found[fid].layer == "environment"
    assert evidence in found[fid].evidence.get("detail", "")


def test_load_oom_is_named_an_environment_problem_not_traffic() -> None:
    result = _run("oom_load_model.log")
    msg = next(f.message for f in result.findings if f.check_id == "accept.startup.load_oom")
    # The worker reports "while processing method load_model" after the OOM line: still a load OOM.
    assert "while loading the model weights" in msg
    assert "not a traffic one" in msg
    assert result.reason == msg


def test_driver_symbol_and_too_old_driver_both_reported_driver_first() -> None:
    result = _run("driver_too_old.log")
    assert {"accept.startup.cuda_init.driver_symbol", "accept.startup.cuda_init.driver_too_old"} <= _ids(result)
    assert "accept.startup.missing_kernel" not in _ids(result)  # cuTensorMapEncodeTiled is a driver API symbol
    assert result.data["torch_version"] == "2.4.0+cu121"
    assert result.data["cuda_version"] == "12.1"


def test_missing_kernel_log_keeps_the_version_it_printed() -> None:
    result = _run("no_kernel_image.log")
    assert result.data["vllm_version"] == "0.10.0"
    assert result.data["max_model_len"] == 40960
    assert result.reason.startswith("a GPU kernel this build needs is missing")


def test_truncated_start_is_inconclusive_with_fields() -> None:
    result = _run("tp2_start_truncated.log")
    assert result.status == "inconclusive"
    assert result.exit_code == 3
    assert "before the server reported ready" in result.reason
    d = result.data
    assert d["vllm_version"] == "0.10.2.dev378+g4d7fe40fc.d20250829"
    assert (d["tensor_parallel_size"], d["pipeline_parallel_size"], d["expert_parallel_size"]) == (2, 1, 1)
    assert d["max_model_len"] == 32768
    assert d["architecture"] == "Qwen2ForCausalLM"
    assert d["prefix_caching"] is None  # not printed: unknown, never assumed


def test_deepseek_expert_parallel_layout() -> None:
    result = _run("deepseek_v32_tp8_ep.log")
    d = result.data
    assert d["vllm_version"] == "0.13.0"
    assert d["tensor_parallel_size"] == 8
    assert d["expert_parallel_size"] == 8  # EP spans TP x DP with --enable-expert-parallel
    assert d["max_model_len"] == 512
    # Not the target's model: target mismatches are warnings, never a fail of this log.
    assert result.status == "inconclusive"
    sev = {f.check_id: f.severity for f in result.findings}
    assert sev["accept.startup.vllm_version"] == "warning"
    assert sev["accept.startup.tool_call_parser"] == "warning"


def test_engine_config_line_gives_prefix_caching() -> None:
    result = _run("engine_config_prefix_caching.log")
    assert result.data["prefix_caching"] is True
    assert result.data["max_model_len"] == 102400
    assert result.data["vllm_version"] == "0.8.3"


def test_fallback_is_a_warning() -> None:
    result = _run("fallback_v0_engine.log")
    f = next(f for f in result.findings if f.check_id == "accept.startup.fallback")
    assert f.severity == "warning"
    assert "Falling back to V0" in f.evidence.get("detail", "")
    assert result.status == "inconclusive"


def test_ready_log_passes() -> None:
    result = _run("ready_tool_choice.log")
    assert result.status == "pass"
    assert result.exit_code == 0
    assert result.data["ready"] is True
    assert result.data["auto_tool_choice"] is True
    # The excerpt does not print the server arguments: a parser it cannot see is not reported missing.
    assert "accept.startup.tool_call_parser" not in _ids(result)


def test_kimi_k3_start_with_launch_command() -> None:
    result = _run("synthetic_kimi_k3_ready.log", "synthetic_kimi_k3_launch.txt")
    assert result.status == "pass", result.findings
    d = result.data
    assert d["image"] == "vllm/vllm-openai:kimi-k3"
    assert d["image_digest"].startswith("sha256:4f6c3a9a")
    assert (d["tool_call_parser"], d["reasoning_parser"], d["prefix_caching"]) == ("kimi_k3", "kimi_k3", True)
    assert d["tensor_parallel_size"] == 8 and d["max_model_len"] == 262144
    assert "hf_exampleexampleexample" not in d["launch_command"]
    assert "HF_TOKEN=***" in d["launch_command"]


def test_kimi_k3_with_wrong_parsers_and_no_caching_fails() -> None:
    log = (FIX / "synthetic_kimi_k3_ready.log").read_text()
    launch = ("vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --tool-call-parser kimi_k2 "
              "--reasoning-parser kimi_k2 --no-enable-prefix-caching")
    log = (log.replace("'tool_call_parser': 'kimi_k3'", "'tool_call_parser': 'kimi_k2'")
              .replace("'reasoning_parser': 'kimi_k3'", "'reasoning_parser': 'kimi_k2'")
              .replace("'enable_prefix_caching': True", "'enable_prefix_caching': False")
              .replace("enable_prefix_caching=True", "enable_prefix_caching=False")
              .replace("version 0.27.1", "version 0.26.0").replace("(v0.27.1)", "(v0.26.0)"))
    result = analyse_startup(log, launch, target=TARGET)
    sev = {f.check_id: f.severity for f in result.findings}
    assert result.status == "fail"
    assert sev["accept.startup.tool_call_parser"] == "error"
    assert sev["accept.startup.reasoning_parser"] == "error"
    assert sev["accept.startup.vllm_version"] == "error"
    assert sev["accept.startup.prefix_caching_off"] == "warning"


def test_log_wins_over_launch_command_and_says_so() -> None:
    log = (FIX / "tp2_start_truncated.log").read_text()
    result = analyse_startup(log, "vllm serve x --tensor-parallel-size 4 --max-model-len 8192", target=TARGET)
    assert result.data["tensor_parallel_size"] == 2
    assert "accept.startup.launch_mismatch_tensor_parallel_size" in _ids(result)


def test_launch_commands_from_issues() -> None:
    k2 = parse_launch_command((FIX / "kimi_k2_thinking_launch.txt").read_text())
    assert (k2["model"], k2["tensor_parallel_size"], k2["max_model_len"]) == ("Kimi-K2-Thinking", 8, 262144)
    assert (k2["tool_call_parser"], k2["reasoning_parser"], k2["auto_tool_choice"]) == ("kimi_k2", "kimi_k2", True)
    r1 = parse_launch_command((FIX / "deepseek_r1_tp32_launch.txt").read_text())
    assert (r1["model"], r1["tensor_parallel_size"], r1["pipeline_parallel_size"]) == ("/app/DeepSeek-R1", 32, 1)
    assert r1["prefix_caching"] is True and r1["reasoning_parser"] == "deepseek_r1"


def test_launch_command_secrets_are_redacted() -> None:
    parsed = parse_launch_command("vllm serve m --api-key sk-verysecret --hf-token=hf_abc")
    joined = " ".join(parsed["argv"]) + " ".join(parsed["flags"])
    assert "sk-verysecret" not in joined and "hf_abc" not in joined


@pytest.mark.parametrize("content", [b"", b"hello world\nnothing here\n", b"\x00\x01\x02binary"])
def test_not_a_startup_log_is_usage_error(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "x.log"
    p.write_bytes(content)
    with pytest.raises(UsageError):
        run_startup(p)


def test_cli_exit_codes_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["accept", "startup", "--log", str(FIX / "synthetic_kimi_k3_ready.log")]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["accept", "startup", "--log", str(FIX / "error_803.log"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "fail" and data["exit_code"] == 1
    assert main(["accept", "startup", "--log", str(tmp_path / "missing.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "Traceback" not in err
    assert main(["accept", "startup", "--log", str(FIX / "tp2_start_truncated.log")]) == 3



@pytest.mark.parametrize("name,fid,layer,text", [
    ("cpu_0_32_kv_capacity.log", "accept.startup.kv_capacity", "environment", "max-model-len 2048"),
    ("cpu_0_32_unknown_tool_parser.log", "accept.startup.unknown_tool_call_parser", "config", "no-such-parser"),
])
def test_real_start_failures_of_the_cpu_build_are_classified(name: str, fid: str, layer: str, text: str) -> None:
    result = run_startup(FIX / name)
    assert result.status == "fail" and result.exit_code == 1
    first = result.findings[0]
    assert (first.check_id, first.layer) == (fid, layer) and text in result.reason
    assert result.data["vllm_version"] == "0.32.0"
    # The named cause is the only failure: no generic crash finding beside it.
    assert "accept.startup.crash" not in {f.check_id for f in result.findings}


@pytest.mark.parametrize(("name", "memory"), [
    ("model_loading_tp.log", {"weights_load_s": 24.84, "weights_gib": 12.66, "model_load_s": 31.657031}),
    ("model_loading_runner_v2.log", {"weights_load_s": 26.93, "weights_gib": 7.64, "model_load_s": 32.969258}),
    ("kv_cache_init_engine.log", {"kv_cache_gib": 100.43, "kv_cache_tokens": 2925232, "concurrency_tokens": 32768,
                                  "max_concurrency_x": 89.27, "init_s": 2.6}),
    # The lab's CPU vLLM sets its KV cache explicitly (0.0 of 9.46 GiB here) and loads no weights to speak of.
    ("cpu_0_32_kv_capacity.log", {"weights_load_s": 0.0, "kv_cache_gib": 0.0}),
    ("synthetic_kimi_k3_ready.log", {"kv_cache_tokens": 1587648, "init_s": 587.2}),
    # The lab's real CPU vLLM 0.32.0 up to ready: "CPU KV cache size" and the concurrency on one line, "took 2.31 s".
    ("cpu_0_32_ready.log", {"weights_load_s": 0.01, "kv_cache_gib": 1.0, "kv_cache_tokens": 2097152,
                            "concurrency_tokens": 2048, "max_concurrency_x": 1024.0, "init_s": 2.31}),
])
def test_startup_memory_and_init_time_are_read_from_the_log(name: str, memory: dict[str, float]) -> None:
    res = analyse_startup((FIX / name).read_text())
    assert res.data["memory"] == memory
    from k3fleet.accept.startup import summary_lines
    assert any(line.startswith("start-up memory: ") for line in summary_lines(res))
