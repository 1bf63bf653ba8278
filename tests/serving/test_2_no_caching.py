"""A real vLLM with prefix caching off: the prefix-cache probe fails, on the server's own word; `accept all`
on it keeps to its time budget and says per probe what it sends and how long it took."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MODEL, k3fleet, lab_server

pytestmark = pytest.mark.serving


def test_prefix_cache_fails_with_caching_off_and_accept_all_keeps_its_budget(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    with lab_server(tmp_path_factory.mktemp("vllm-nocache"), "--no-enable-prefix-caching") as server:
        proc = k3fleet("accept", "prefix-cache", "--base-url", server.base_url, "--model", MODEL, "--repeats", "2",
                       "--json")
        run = tmp_path / "accept"
        every = k3fleet("accept", "all", "--base-url", server.base_url, "--model", MODEL, "--log", str(server.log),
                        "--budget", "4m", "--agent-max-tokens", "32", "--agent-repeats", "3", "--out", str(run))
    res = json.loads(proc.stdout)
    assert proc.returncode == 1 and res["status"] == "fail", res["reason"]
    assert res["data"]["cache_config"]["enable_prefix_caching"] == "False"
    assert "accept.prefix_cache.caching_off" in [f["check_id"] for f in res["findings"]]

    assert every.returncode == 1, every.stderr[-3000:]
    summary = json.loads((run / "accept.json").read_text())
    assert summary["budget"]["budget_s"] == 240
    assert set(summary["budget"]["elapsed_s"]) == {"prefix_cache", "agent", "load"}
    assert summary["probes"]["startup"]["status"] == "pass"
    assert summary["probes"]["prefix_cache"]["status"] == "fail"
    assert summary["probes"]["agent"]["status"] == "fail"
    plan = every.stderr[every.stderr.index("plan (budget 240 s):"):]
    assert "prefix_cache: 8 chat requests" in plan and "agent: up to 3 rounds of 17 requests" in plan
    assert "load: time-boxed" in plan
    assert "agent: FAIL in " in every.stderr and "load: " in every.stderr
