"""What a foreign OpenAI-compatible server showed (issue: no vllm:* metrics, no prefix cache, no
/tokenize, no max_model_len): each defect against a stdlib server on loopback (tests/unit/foreign_server.py)."""

from __future__ import annotations

import asyncio

import pytest

from k3fleet.accept.agent import AgentOptions, run_agent
from k3fleet.accept.client import Endpoint, EndpointError
from k3fleet.accept.load import SERVER_METRICS, LoadOptions, run_load
from k3fleet.accept.prefix_cache import PrefixOptions, run_prefix_cache
from k3fleet.accept.startup import analyse_startup
from k3fleet.cli import main
from tests.unit.foreign_server import MODEL, foreign_server

QUICK_LOAD = {"phases": ["agent_ramp"], "ramp": [1, 2], "step_s": 0.6, "session_turns": 1, "turn_output_tokens": 3,
              "system_prompt_tokens": 16, "sample_interval_s": 0.2, "request_timeout_s": 10}


def _ep(url: str, model: str = MODEL) -> Endpoint:
    return Endpoint(base_url=url, model=model, timeout_s=20)


def test_load_names_every_unread_server_metric_and_is_not_a_pass() -> None:
    with foreign_server() as srv:
        res = asyncio.run(run_load(_ep(srv.base_url), LoadOptions(**QUICK_LOAD)))
    assert res.data["counts"]["ok"] > 0  # the client side went well...
    assert res.status == "inconclusive" and res.exit_code == 3  # ...which is not stability
    assert "client figures only" in res.reason
    unread = {f.evidence.get("detail") for f in res.findings if f.check_id == "accept.load.metric_unread"}
    assert unread == set(SERVER_METRICS.values()) == set(res.data["unread_metrics"])


def test_load_refuses_a_model_the_server_does_not_list() -> None:
    with foreign_server() as srv, pytest.raises(EndpointError) as info:
        asyncio.run(run_load(_ep(srv.base_url, "moonshotai/Kimi-K3"), LoadOptions(**QUICK_LOAD)))
        assert not srv.chats
    assert info.value.kind == "not_found" and info.value.exit_code == 2
    assert "not served" in info.value.message


def test_prefix_cache_and_agent_refuse_an_unlisted_model_too() -> None:
    with foreign_server() as srv:
        for probe in (run_prefix_cache(_ep(srv.base_url, "other")), run_agent(_ep(srv.base_url, "other"))):
            with pytest.raises(EndpointError) as info:
                asyncio.run(probe)
            assert info.value.exit_code == 2
        assert not srv.chats


def test_prefix_cache_names_missing_counters_first_and_ttft_never_decides() -> None:
    with foreign_server() as srv:
        res = asyncio.run(run_prefix_cache(_ep(srv.base_url), PrefixOptions(repeats=3, match_unit=16)))
    # Warm TTFT is above cold here (the server sleeps on warm requests): not a failure on its own.
    assert res.data["ttft_s"]["warm_median"] > res.data["ttft_s"]["cold"]
    assert res.status == "inconclusive", res.reason
    assert res.reason.startswith("no prefix-cache counters (vllm:prefix_cache_queries, vllm:prefix_cache_hits, "
                                 "vllm:prompt_tokens_cached)")
    assert res.findings[0].check_id != "accept.prefix_cache.ttft_not_lower"
    assert not [f for f in res.findings if f.severity == "error"]
    assert {f.check_id for f in res.findings} >= {"accept.prefix_cache.counters_missing",
                                            "accept.prefix_cache.size_estimated"}


def test_agent_on_a_200_that_is_not_json_is_one_line_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    with foreign_server("nonjson") as srv:
        rc = main(["accept", "agent", "--base-url", srv.base_url, "--model", MODEL, "--repeats", "1",
                   "--case", "one_required_arg", "--case", "structured_output", "-q"])
    captured = capsys.readouterr()
    assert rc == 3
    assert "Traceback" not in captured.err + captured.out
    assert "no run reached the model" in captured.out


def test_agent_result_on_non_json_is_error_with_the_sdk_evidence() -> None:
    with foreign_server("nonjson") as srv:
        res = asyncio.run(run_agent(_ep(srv.base_url), AgentOptions(repeats=1, cases=["one_required_arg"],
                                                                    critical=["one_required_arg"])))
    assert res.status == "error" and res.exit_code == 3
    assert any(f.check_id == "accept.agent.reference_client" for f in res.findings)


@pytest.mark.parametrize("log", [
    "INFO:     Application startup complete.\n",
    "INFO:     Started server process [7]\nINFO:     Waiting for application startup.\n"
    "INFO:     Application startup complete.\nINFO:     Uvicorn running on http://0.0.0.0:8000\n",
])
def test_startup_without_vllm_evidence_does_not_pass(log: str) -> None:
    res = analyse_startup(log)
    assert res.status == "inconclusive" and res.exit_code == 3
    assert any(f.check_id == "accept.startup.no_vllm_evidence" for f in res.findings)


def test_startup_evidence_is_redacted_before_it_is_cut() -> None:
    # A secret straddling the 300-character cut: cut first, its start would survive unrecognised.
    message = "RuntimeError: " + "x" * 275 + " sk-EXAMPLEKEYVALUE0123456789abcdef and more"
    assert message.index("sk-") < 297 < message.index("sk-") + 20
    log = ("(APIServer pid=1) INFO 12-01 12:00:00 [api_server.py:1] vLLM API server version 0.32.0\n"
           f"(APIServer pid=1) ERROR 12-01 12:00:01 [api_server.py:2] {message}\n")
    res = analyse_startup(log)
    assert any(f.check_id == "accept.startup.crash" for f in res.findings)
    evidence = " ".join(f.evidence.get("detail", "") for f in res.findings)
    assert "sk-E" not in evidence and "EXAMPLEKEY" not in evidence
