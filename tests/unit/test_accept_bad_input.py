"""Bad input for every accept command: one line and the documented exit code, never a traceback."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from accept_servers import MODEL, bad_server, self_signed

from k3fleet.cli.base import main
from k3fleet.lab.vllm_sim.server import start_simulator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("k3fleet: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_unreachable_endpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    for cmd in (["prefix-cache"], ["agent", "-n", "1"]):
        assert main(["accept", *cmd, "--base-url", url, "--model", MODEL]) == 3
        assert "cannot connect to" in _one_line_error(capsys)
    out = tmp_path / "run"
    assert main(["accept", "all", "--base-url", url, "--model", MODEL, "--out", str(out), "-q"]) == 3
    line = _one_line_error(capsys)
    assert "cannot connect" in line
    # The evidence of the failed attempt is kept: command, accept.json with the error, manifest.
    summary = json.loads((out / "accept.json").read_text())
    assert summary["exit_code"] == 3 and "cannot connect" in summary["error"]
    assert (out / "manifest.json").is_file() and (out / "command.json").is_file()


def test_401(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEPT_TEST_KEY", "wrong-key-value")
    with bad_server("401") as url:
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL,
                     "--api-key-env", "ACCEPT_TEST_KEY"]) == 2
    line = _one_line_error(capsys)
    assert "401" in line and "ACCEPT_TEST_KEY" in line and "wrong-key-value" not in line


def test_simulator_with_a_key_answers_401_without_it(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_KEY", "sk-sim-key-0001")
    with start_simulator(api_key_env="SIM_KEY") as sim:
        assert main(["accept", "prefix-cache", "--base-url", sim.base_url, "--model", "moonshotai/Kimi-K3"]) == 2
        assert "pass --api-key-env" in _one_line_error(capsys)


def test_404_model(capsys: pytest.CaptureFixture[str]) -> None:
    with bad_server("ok") as url:
        assert main(["accept", "agent", "--base-url", url, "--model", "no-such-model"]) == 2
    assert "not served" in _one_line_error(capsys)


def test_5xx_is_an_error_result_not_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    with bad_server("500") as url:
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL, "--json"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert data["status"] == "error" and "500" in data["reason"] and "EngineCore died" in data["reason"]
        assert main(["accept", "agent", "--base-url", url, "--model", MODEL, "-n", "2", "--json", "--case",
                     "one_required_arg"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert data["status"] == "error"
        assert data["data"]["cases"]["one_required_arg"]["defects"] == {"http_error": 2}


def test_malformed_json(capsys: pytest.CaptureFixture[str]) -> None:
    with bad_server("garbage") as url:
        assert main(["accept", "agent", "--base-url", url, "--model", MODEL, "-n", "2", "--json", "--case",
                     "one_required_arg", "--case", "streaming_deltas"]) == 3
        cases = json.loads(capsys.readouterr().out)["data"]["cases"]
        assert cases["one_required_arg"]["defects"] == {"malformed_response": 2}
        assert cases["streaming_deltas"]["defects"] == {"malformed_response": 2}
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL, "--json"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert data["status"] == "error" and "not JSON" in data["reason"]


def test_metrics_that_are_not_prometheus_text(capsys: pytest.CaptureFixture[str]) -> None:
    # The stub's /metrics is HTML and its chat endpoint cuts streams: both are named, nothing crashes.
    with bad_server("cut") as url:
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL, "--json"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert "not Prometheus" in data["data"]["metrics_error"]


def test_stream_cut_half_way(capsys: pytest.CaptureFixture[str]) -> None:
    with bad_server("cut") as url:
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL, "--json"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert data["status"] == "error"
        assert "closed the connection mid-response" in data["reason"] or "cut half-way" in data["reason"]


def test_tls_error_and_insecure(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    cert = self_signed(tmp_path)
    with bad_server("ok", tls=cert) as url:
        assert main(["accept", "prefix-cache", "--base-url", url, "--model", MODEL]) == 3
        line = _one_line_error(capsys)
        assert "TLS verification failed" in line and "--insecure" in line
        # Verification off, explicitly: the TLS layer passes and the next problem (no such route) is named.
        out = tmp_path / "run"
        argv = ["accept", "all", "--base-url", url, "--model", MODEL, "--insecure", "--out", str(out), "-q",
                "--skip", "agent", "--skip", "load"]
        monkeypatch.setattr("sys.argv", ["k3fleet", *argv])  # command.json records the process's argv
        code = main(argv)
        assert code == 3
        summary = json.loads((out / "accept.json").read_text())
        assert summary["tls_verify"] is False
        assert "--insecure" in json.loads((out / "command.json").read_text())["argv"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--base-url", "ftp://x", "--model", "m"], "--base-url"),
    (["--base-url", "http://h:99999", "--model", "m"], "invalid port"),
    (["--base-url", "http://h", "--model", "m", "--api-key-env", "UNSET_ACCEPT_VAR_X"], "is not set"),
    (["--base-url", "http://h", "--model", "m", "--skip", "nope"], "not a probe"),
    (["--base-url", "http://h", "--model", "m", "--log", "/nonexistent.log"], "--log /nonexistent.log does not exist"),
])
def test_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert main(["accept", "all", *args]) == 2
    assert needle in _one_line_error(capsys)


def test_api_key_never_reaches_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    key = "sk-accept-redaction-7f3a9c1e"
    monkeypatch.setenv("ACCEPT_RUN_KEY", key)
    log = tmp_path / "startup.log"
    log.write_text((Path(__file__).resolve().parents[1] / "fixtures" / "vllm_startup" /
                    "synthetic_kimi_k3_ready.log").read_text()
                   + f"INFO curl -H 'Authorization: Bearer {key}' http://127.0.0.1:8000/v1/models\n"
                   + f"INFO args: --api-key {key}\nINFO the key was {key}\n")
    launch = tmp_path / "launch.txt"
    launch.write_text(f"VLLM_API_KEY={key} vllm serve moonshotai/Kimi-K3 --api-key {key} "
                      "--tool-call-parser kimi_k3 --reasoning-parser kimi_k3 --enable-prefix-caching\n")
    out = tmp_path / "run"
    with start_simulator(api_key_env="ACCEPT_RUN_KEY", itl_ms=0.2) as sim:
        # A key in the URL is refused without echoing it.
        assert main(["accept", "all", "--base-url", sim.base_url.replace("http://", f"http://user:{key}@"),
                     "--model", "m"]) == 2
        err = capsys.readouterr().err
        assert "must not carry credentials" in err and key not in err
        url = sim.base_url
        code = main(["accept", "all", "--base-url", url, "--model", "moonshotai/Kimi-K3", "--api-key-env",
                     "ACCEPT_RUN_KEY", "--out", str(out), "--log", str(log), "--launch-command", str(launch),
                     "--agent-repeats", "1", "--prefix-repeats", "2", "-q", "--skip", "load"])
    assert code == 3  # load skipped: evidence incomplete, never a pass
    captured = capsys.readouterr()
    assert key not in captured.out and key not in captured.err
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"accept.json", "startup.json", "prefix_cache.json", "agent.json", "command.json",
            "manifest.json"} <= {p.name for p in files}
    for p in files:
        assert key not in p.read_text(errors="replace"), p
    summary = json.loads((out / "accept.json").read_text())
    # The run-directory contract the decision reads (docs/acceptance.md, "Run directory").
    assert summary["schema_version"] == "1.0" and summary["model"] == "moonshotai/Kimi-K3"
    assert summary["base_url"] == url and summary["tls_verify"] is True and summary["exit_code"] == 3
    assert summary["started_at"] and summary["finished_at"] and summary["server"]["vllm_version"]
    assert set(summary["probes"]) == {"startup", "prefix_cache", "agent"}
    assert json.loads((out / "agent.json").read_text())["data"]["cases"]["one_required_arg"]["runs"] == 1
    assert (out / "requests" / "prefix_cache.jsonl").is_file() and (out / "requests" / "agent.jsonl").is_file()
    # before, after the cold request, after each of the two warm ones, after the replay, after the control
    assert sorted(p.name for p in (out / "metrics").glob("prefix_cache_*.txt")) == [
        "prefix_cache_0_before.txt", "prefix_cache_1_after_cold.txt", "prefix_cache_2_after_warm_1.txt",
        "prefix_cache_2_after_warm_2.txt", "prefix_cache_3_after_replay_1.txt", "prefix_cache_4_after_control.txt"]
    from k3fleet.evidence import RunDir

    assert RunDir.open(out).verify_manifest() == []
    assert summary["probes"]["startup"]["status"] == "pass"
    assert summary["not_run"] == {"load": "skipped (--skip)"}
    assert os.environ["ACCEPT_RUN_KEY"] == key


def test_interrupted_run_keeps_what_was_measured(tmp_path: Path) -> None:
    import asyncio
    import threading

    from k3fleet.accept.agent import AgentOptions
    from k3fleet.accept.client import Endpoint
    from k3fleet.accept.prefix_cache import PrefixOptions
    from k3fleet.accept.run import AllOptions, run_all

    # Ctrl-C as the CLI delivers it: its SIGINT handler sets the run's stop event (cancel_on_interrupt),
    # here as soon as the agent probe starts. Raising KeyboardInterrupt from a callback instead would
    # land in whichever asyncio task happens to be running and escape the event loop.
    stop = threading.Event()

    def ctrl_c_at_agent(msg: str) -> None:
        if msg.startswith("agent:"):
            stop.set()

    out = tmp_path / "run"
    with start_simulator(itl_ms=0.2) as sim:
        ep = Endpoint(base_url=sim.base_url, model="moonshotai/Kimi-K3")
        opts = AllOptions(out=out, prefix=PrefixOptions(repeats=2), agent=AgentOptions(repeats=3), stop=stop)
        res = asyncio.run(run_all(ep, opts, ["k3fleet", "accept", "all"], progress=ctrl_c_at_agent))
    assert res.exit_code == 3 and res.summary.interrupted is True
    # The prefix-cache probe had finished: its result and evidence are on disk, the manifest holds;
    # the agent probe ended with what it had sent, inconclusive.
    summary = json.loads((out / "accept.json").read_text())
    assert summary["probes"]["prefix_cache"]["status"] == "pass"
    assert summary["probes"].get("agent", {}).get("status", "inconclusive") == "inconclusive"
    assert "load" not in summary["probes"]
    assert (out / "requests" / "prefix_cache.jsonl").is_file()
    from k3fleet.evidence import RunDir

    assert RunDir.open(out).verify_manifest() == []
