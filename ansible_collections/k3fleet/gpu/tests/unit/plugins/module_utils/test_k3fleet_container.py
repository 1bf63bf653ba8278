"""The CUDA probe container: removed when it times out, never started twice (docs/safety.md).

Killing the runtime client on timeout does not stop the container the daemon runs: it would keep
every GPU. The stand-in runtime here records each call; its `run` hangs like a container whose
CUDA initialisation never returns.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_container import collect_container
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import PROBE_CONTAINER, probe_argv
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import FIXTURES

FIX = FIXTURES / "container"
IMAGE = "vllm/vllm-openai:kimi-k3"


def _runtime(tmp_path: Path, run_body: str, rm_rc: int = 0) -> tuple[NodeReader, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    script = bin_dir / "docker"
    script.write_text(f"""#!/bin/sh
echo "$*" >> '{calls}'
case "$1" in
  --version) /bin/cat '{FIX / "docker_version.txt"}';;
  image) /bin/cat '{FIX / "docker_inspect_vllm_v0.23.0.json"}';;
  run) {run_body};;
  rm) exit {rm_rc};;
  *) exit 99;;
esac
""")
    script.chmod(0o755)
    root = tmp_path / "root"
    root.mkdir()
    return NodeReader(root=str(root), path=str(bin_dir), timeout=0.3, budget=1.0), calls


def test_probe_carries_a_fixed_name() -> None:
    argv = probe_argv("docker", IMAGE)
    assert argv[argv.index("--name") + 1] == PROBE_CONTAINER
    assert "--rm" in argv


def test_timed_out_probe_removes_its_container_even_with_the_budget_spent(tmp_path: Path) -> None:
    reader, calls = _runtime(tmp_path, "exec /bin/sleep 30")
    out = collect_container(reader, image=IMAGE, runtime="docker", probe=True)
    probe = out["probe"]
    assert probe["ran"] is True and probe["ok"] is False
    assert "did not finish" in probe["message"] and f"container {PROBE_CONTAINER} removed" in probe["message"]
    lines = calls.read_text().splitlines()
    assert lines[-1] == f"rm -f {PROBE_CONTAINER}"
    assert reader.deadline is not None  # the budget is back in force for whatever follows


def test_failed_removal_says_how_to_remove_it(tmp_path: Path) -> None:
    reader = _runtime(tmp_path, "exec /bin/sleep 30", rm_rc=1)[0]
    message = collect_container(reader, image=IMAGE, runtime="docker", probe=True)["probe"]["message"]
    assert f"removing container {PROBE_CONTAINER} failed" in message
    assert f"docker rm -f {PROBE_CONTAINER}" in message


def test_a_probe_already_running_is_not_a_probe_result(tmp_path: Path) -> None:
    conflict = (FIX / "docker_run_name_conflict_greenlight238.stderr").read_text().replace(
        "greenlight-v2", PROBE_CONTAINER)
    (tmp_path / "conflict").write_text(conflict)
    reader, calls = _runtime(tmp_path, f"/bin/cat '{tmp_path / 'conflict'}' >&2; exit 125")
    probe = collect_container(reader, image=IMAGE, runtime="docker", probe=True)["probe"]
    assert probe["ran"] is False and probe["ok"] is None
    assert probe["message"].startswith(f"not run: a container named {PROBE_CONTAINER} already exists")
    assert not any(line.startswith("rm ") for line in calls.read_text().splitlines())  # not ours to remove
