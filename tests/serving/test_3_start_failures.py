"""Real start failures made on purpose, classified from the real start-up log by `accept startup`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import k3fleet, lab_server

from k3fleet.lab import vllm
from k3fleet.lab.vllm import VllmLabError

pytestmark = pytest.mark.serving


def _failed_start(workdir: Path, *extra: str) -> dict[str, object]:
    with pytest.raises(VllmLabError) as info, lab_server(workdir, *extra):
        pass
    assert "k3fleet accept startup --log" in str(info.value)
    assert vllm.alive_pids(workdir) == []  # nothing left of the failed start
    proc = k3fleet("accept", "startup", "--log", str(workdir / "vllm.log"), "--json")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_max_model_len_the_kv_cache_cannot_hold_is_an_environment_capacity_failure(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # 512 KiB of KV cache holds 1024 tokens of this model; one request at 2048 does not fit.
    res = _failed_start(tmp_path_factory.mktemp("vllm-kv"), "--kv-cache-memory-bytes", str(512 * 1024))
    first = res["findings"][0]
    assert first["check_id"] == "accept.startup.kv_capacity" and first["layer"] == "environment", res
    assert "max-model-len 2048" in res["reason"]


def test_an_unknown_tool_call_parser_is_a_config_failure(tmp_path_factory: pytest.TempPathFactory) -> None:
    res = _failed_start(tmp_path_factory.mktemp("vllm-parser"), "--tool-call-parser", "no-such-parser")
    first = res["findings"][0]
    assert first["check_id"] == "accept.startup.unknown_tool_call_parser" and first["layer"] == "config", res
    assert "no-such-parser" in res["reason"]
