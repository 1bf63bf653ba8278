"""A served image is recognised whatever its name: from ``docker run``'s positional image and from a log's
``image:`` line, beside the log's own vLLM version and CUDA lines (custom builds are rarely called
vllm-openai). The launch command is tests/fixtures/decide's, its image renamed (synthetic, derived)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3fleet.accept.startup import parse_launch_command, run_startup

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "decide"
CUSTOM = "registry.example.internal/ml/k3-serve:2026-11"
DIGEST = "sha256:4f6c3a9a1d0b8e2f7c5d9e1a3b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c"


@pytest.mark.parametrize("runner", ["docker", "podman", "/usr/bin/docker"])
def test_docker_run_names_its_image_whatever_it_is_called(runner: str) -> None:
    text = (FIX / "launch_kimi_k3_tp8_dp2.txt").read_text().replace("vllm/vllm-openai:kimi-k3", CUSTOM)
    text = text.replace("docker run", f"{runner} run", 1)
    got = parse_launch_command(text)
    assert (got["image"], got["image_digest"], got["model"]) == (CUSTOM, DIGEST, "moonshotai/Kimi-K3")
    assert "--tensor-parallel-size=8" in got["flags"]


def test_an_image_line_in_the_log_is_the_served_image(tmp_path: Path) -> None:
    log = tmp_path / "startup.log"
    log.write_text(f"image: {CUSTOM}@{DIGEST}\n" + (FIX / "startup_kimi_k3_tp8_dp2.log").read_text())
    result = run_startup(log, None)
    assert result.data["image"] == CUSTOM and result.data["image_digest"] == DIGEST
    assert result.data["vllm_version"] == "0.27.1"
