"""The change night's serving smoke (docs/change-night.md "Serving smoke") with a real container runtime.

On the testbed: podman in the booted guests starts the stand-in Kimi K3 image (the k3fleet vLLM simulator
behind `vllm serve`, k3fleet/lab/testbed/podman.py) with a one-node launch command, through the stand-in
GPUs' CDI spec, after the real driver change and reboot. The smoke is on by default (`k3fleet upgrade`
without --no-smoke), with the target's bounds (change.smoke_ready_timeout_s, smoke_request_timeout_s):
1. tb-node01 alone: a night with the audit's serve command is refused before the node is touched (the
   guests' strategy spans two nodes); with a one-node launch file the smoke passes, its start-up log and
   answer are journaled, no container is left.
2. tb-node02 (canary) and tb-node03 (wave), the smoke's command from a launch file (--launch-file): the
   canary's server is made to fail (the testbed's knob /etc/nvidia-sim/serve-fault: `exit`), so the
   canary is rolled back to R575, left drained under the change's lease, and the wave never starts.

On this machine's own podman (root, no guests): the role's smoke against every kind of server failure
(it exits, answers 500, never becomes ready within the bound), each one a failed host whose container is
removed and whose smoke is journaled.

Timings (how long each server took to be ready) are printed, not asserted.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nightkit import NEW, OLD, loaded, packages, put_on_575, smoke_launch, ssh

from k3fleet.audit.runner import ansible_env
from k3fleet.change import UpgradeOptions, run_upgrade
from k3fleet.change.journal import read_journal
from k3fleet.errors import UsageError
from k3fleet.lab import testbed
from k3fleet.lab.testbed import image, podman
from k3fleet.lab.testbed.state import Layout

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
# No InfiniBand in the guests, and a container runtime without NVIDIA's toolkit: real findings for serving
# Kimi K3 that do not stop a driver change (the operator accepts them, recorded in change.json).
ACCEPT = ["rdma.*", "container.*"]
KNOB = "/etc/nvidia-sim/serve-fault"
IMAGE = "vllm/vllm-openai:kimi-k3"


def containers(state: testbed.TestbedState, host: str) -> list[str]:
    return ssh(state, host, "podman ps --all --format '{{.Names}}'").split()


@pytest.fixture(scope="module")
def tb(testbed_state: testbed.TestbedState) -> testbed.TestbedState:
    return testbed_state


# The inventory (conftest) does not ask for the smoke: the controller does, for every night.


def entries(run_dir: Path, host: str) -> list[Any]:
    return [e for e in read_journal(run_dir / "journal.jsonl").entries if e.host == host]


def smoke_of(run_dir: Path, host: str) -> dict[str, Any]:
    found = [e.detail["smoke"] for e in entries(run_dir, host)
             if e.stage == "verifying" and isinstance(e.detail, dict) and "smoke" in e.detail]
    assert len(found) == 1, found
    smoke: dict[str, Any] = found[0]
    return smoke


# -- 1. a good guest -------------------------------------------------------------------------------


def test_smoke_passes_on_a_good_guest(tb: testbed.TestbedState, inventory: Path, tmp_path: Path,
                                      testbed_report: Callable[[str], None]) -> None:
    host = "tb-node01"
    put_on_575(tb, [host])
    before = packages(tb, host)
    # The guests are 8x H200 nodes: the audit derives a strategy over two nodes, whose serve command one
    # changed host cannot serve alone. Without a one-node launch file the night is refused after the
    # gate's audit, before the node is touched.
    with pytest.raises(UsageError, match=r"spans nodes.*--launch-file"):
        run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-SMOKE-0", operator="frank", canary=host,
                                   limit=host, runs_dir=tmp_path / "runs-refused", forks=2, accept_findings=ACCEPT),
                    ["k3fleet", "upgrade"])
    assert packages(tb, host) == before and loaded(tb, host) == OLD
    assert not list((tmp_path / "runs-refused").glob("*/journal.jsonl"))
    launch = smoke_launch(tmp_path)
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-SMOKE", operator="frank", canary=host,
                                        limit=host, runs_dir=tmp_path / "runs", forks=2, accept_findings=ACCEPT,
                                        launch_file=launch),
                         ["k3fleet", "upgrade"])
    assert result.exit_code == 0, (result.message, result.hosts)
    rd = result.run_dir.path
    assert [e.stage for e in entries(rd, host)] == ["snapshot", "draining", "drained", "upgrading", "rebooting",
                                                     "verifying", "verifying", "returned"]
    # The choice and the target's bounds, as recorded and as the play got them.
    change = json.loads((rd / "change.json").read_text())
    assert change["smoke"]["enabled"] is True and change["smoke"]["launch_file"] == str(launch.resolve())
    assert (change["timeouts"]["smoke_ready"], change["timeouts"]["smoke_request"]) == (5400, 120)
    assert json.loads((rd / "run.json").read_text())["warnings"] == []
    smoke = smoke_of(rd, host)
    assert smoke["ok"] is True and smoke["runtime"] == "podman" and smoke["image"] == IMAGE
    # The verify steps ride on the smoke's line (docs/change-night.md "Verify steps"). The stand-in image has no
    # PyTorch and the guests no nccl-tests, IMEX or InfiniBand: each step says why it did not run, never a pass.
    (records,) = [e.detail["steps"] for e in entries(rd, host)
                  if e.stage == "verifying" and isinstance(e.detail, dict) and "smoke" in e.detail]
    steps = {r["step"]: r for r in records}
    testbed_report("verify steps on the testbed: " + "; ".join(f"{k} {r['result']}: {r['reason']}"
                                                               for k, r in steps.items()))
    assert [r["result"] for r in records] == ["skipped"] * 4, records
    assert "accepted the audit's container findings" in steps["container_probe"]["reason"]
    assert steps["nccl_node"]["reason"].startswith("not run: ")
    assert steps["imex"]["reason"].startswith("not needed: IMEX not installed")
    assert "accepted the audit's RDMA findings on the canary" in steps["canary_pair"]["reason"]
    # The launch file's one-node command, the stand-in GPUs, the node's loopback.
    assert "--device nvidia.com/gpu=all" in smoke["command"] and "--max-model-len 4096" in smoke["command"]
    assert smoke["command"].endswith("--host 127.0.0.1 --port 18000")
    assert smoke["ready"]["ready"] is True and smoke["ready"]["last"] == "HTTP 200"
    assert smoke["models"] == ["moonshotai/Kimi-K3"]
    assert smoke["response"]["status"] == 200 and smoke["response"]["usage"]["completion_tokens"] > 0
    log = "\n".join(smoke["log_tail"])
    assert "vLLM API server version 0.27.1" in log and "Application startup complete." in log
    assert "--tensor-parallel-size" in smoke["command"] and "'tensor_parallel_size'" in log
    assert smoke["removed"] is True
    assert containers(tb, host) == []
    assert loaded(tb, host) == NEW
    assert not testbed.node_state(tb, tb.host(host).slurm_node).drained
    testbed_report(f"serving smoke on {host}: ready after {smoke['ready']['waited_s']}s")


# -- 2. the server made to fail: the canary rolled back, the night stopped ---------------------------


# A recorded all_reduce_perf within one 8-GPU node, 338.82 GB/s at 8 GiB (k3fleet/lab/active_data/SOURCES.md):
# below the Kimi K3 target's 400 GB/s floor for an H200 node (the guests' stand-in GPUs), so the night's
# within-node NCCL step must fail the canary on it.
NCCL_RECORDING = Path(__file__).resolve().parents[2] / "k3fleet" / "lab" / "active_data" / \
    "all_reduce_perf_h100_2nodes_16ranks.txt"
STANDIN_NCCL = "/usr/local/bin/all_reduce_perf"
STANDIN_DIR = "/usr/local/share/k3fleet"


@pytest.fixture
def slow_nccl(tb: testbed.TestbedState) -> Iterator[str]:
    """tb-node02 answers all_reduce_perf with the recorded run (kept across the night's reboots); removed after."""
    host = "tb-node02"
    data = base64.b64encode(NCCL_RECORDING.read_bytes()).decode()
    ssh(tb, host, f"mkdir -p {STANDIN_DIR} && echo {data} | base64 -d > {STANDIN_DIR}/nccl.txt && "
                  f"printf '#!/bin/sh\\ncat {STANDIN_DIR}/nccl.txt\\n' > {STANDIN_NCCL} && chmod 755 {STANDIN_NCCL}")
    try:
        yield host
    finally:
        ssh(tb, host, f"rm -rf {STANDIN_NCCL} {STANDIN_DIR}")


def test_a_failed_verify_step_names_its_log_lines_and_rolls_the_canary_back(
        tb: testbed.TestbedState, inventory: Path, tmp_path: Path, slow_nccl: str) -> None:
    canary = slow_nccl
    put_on_575(tb, [canary])
    before = packages(tb, canary)
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-STEP-FAIL", operator="heidi",
                                        canary=canary, limit=canary, runs_dir=tmp_path / "runs", forks=2,
                                        accept_findings=ACCEPT, smoke=False),
                         ["k3fleet", "upgrade", "--no-smoke"])
    assert result.exit_code == 1, (result.message, result.hosts)
    rd = result.run_dir.path
    # The steps' own verifying line (no smoke), then the rescue's failed and rolled_back.
    assert [e.stage for e in entries(rd, canary)] == ["snapshot", "draining", "drained", "upgrading", "rebooting",
                                                       "verifying", "verifying", "failed", "rolled_back"]
    (records,) = [e.detail["steps"] for e in entries(rd, canary)
                  if e.stage == "verifying" and isinstance(e.detail, dict) and "steps" in e.detail]
    nccl = {r["step"]: r for r in records}["nccl_node"]
    assert (nccl["result"], nccl["peak_busbw_gbs"], nccl["min_busbw_gbs"]) == ("failed", 338.82, 400), nccl
    assert any("Avg bus bandwidth" in line for line in nccl["log"]), nccl
    failed = next(e for e in entries(rd, canary) if e.stage == "failed")
    assert failed.detail["at"] == "verifying"
    assert "verify step nccl_node failed: nccl_node: peak bus bandwidth 338.82 GB/s is below the target floor " \
        "400" in failed.detail["msg"], failed.detail["msg"]
    assert "deciding log lines:" in failed.detail["msg"] and "Avg bus bandwidth" in failed.detail["msg"]
    # Rolled back exactly, the old driver loaded.
    assert packages(tb, canary) == before
    assert loaded(tb, canary) == OLD
    testbed.update_node(tb, tb.host(canary).slurm_node, "resume")


@pytest.fixture
def failing_server(tb: testbed.TestbedState) -> Iterator[str]:
    host = "tb-node02"
    yield host
    ssh(tb, host, f"rm -f {KNOB}")


def test_failing_server_rolls_the_canary_back_and_stops_the_night(
        tb: testbed.TestbedState, inventory: Path, tmp_path: Path, failing_server: str) -> None:
    canary, wave = failing_server, "tb-node03"
    put_on_575(tb, [canary, wave])
    before = packages(tb, canary)
    # Kept across the night's reboots (the guest's own disk), read by the server through the CDI spec.
    ssh(tb, canary, f"echo exit > {KNOB}")
    launch = tmp_path / "launch.sh"
    launch.write_text("# one node of the recipe, a shorter context for the smoke\n"
                      "VLLM_LOGGING_LEVEL=DEBUG vllm serve moonshotai/Kimi-K3 \\\n"
                      "    --tensor-parallel-size 8 --max-model-len 4096\n")
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-SMOKE-FAIL", operator="grace",
                                        canary=canary, waves=True, limit=f"{canary},{wave}",
                                        runs_dir=tmp_path / "runs", forks=2, accept_findings=ACCEPT,
                                        launch_file=launch),
                         ["k3fleet", "upgrade"])
    assert result.exit_code == 1, (result.message, result.hosts)
    rd = result.run_dir.path
    assert json.loads((rd / "change.json").read_text())["smoke"]["launch_file"] == str(launch.resolve())
    assert [e.stage for e in entries(rd, canary)] == ["snapshot", "draining", "drained", "upgrading", "rebooting",
                                                       "verifying", "verifying", "failed", "rolled_back"]
    assert entries(rd, wave) == [], "the wave started after a failed canary"
    assert result.hosts[wave]["outcome"] == "not_started"
    smoke = smoke_of(rd, canary)
    assert smoke["ok"] is False and smoke["started"] is True and smoke["removed"] is True
    # The launch file's command ran, its NAME=VALUE prefix as the server's environment.
    assert "--env VLLM_LOGGING_LEVEL=DEBUG" in smoke["command"] and "--max-model-len 4096" in smoke["command"]
    assert "--enable-prefix-caching" not in smoke["command"]
    assert smoke["ready"]["ready"] is False and smoke["ready"]["state"] == "exited (exit code 1)"
    assert smoke["ready"]["timed_out"] is False, "an exited server must end the wait, not the bound"
    assert any("testbed fault knob exit" in line for line in smoke["log_tail"]), smoke["log_tail"]
    failed = next(e for e in entries(rd, canary) if e.stage == "failed")
    assert failed.detail["at"] == "verifying"
    assert "serving smoke" in failed.detail["msg"] and "testbed fault knob exit" in failed.detail["msg"]
    # Rolled back exactly, the old driver loaded, nothing of the smoke left, drained under the lease.
    assert packages(tb, canary) == before
    assert loaded(tb, canary) == OLD
    assert containers(tb, canary) == []
    status = testbed.node_state(tb, tb.host(canary).slurm_node)
    assert status.drained and status.reason.startswith("k3fleet:CHG-SMOKE-FAIL "), status
    testbed.update_node(tb, tb.host(canary).slurm_node, "resume")


# -- the role on this machine's podman: every kind of failing server ---------------------------------


ROLE_PLAY = """
- name: The serving smoke against this machine's podman
  hosts: localhost
  connection: local
  gather_facts: false
  environment: "{{ podman_env }}"
  module_defaults:
    k3fleet.gpu.k3fleet_journal: {path: "{{ journal }}", run: smoke-test, change_id: CHG-ROLE, host: localhost}
  tasks:
    - name: Run the smoke
      ansible.builtin.include_role:
        name: k3fleet.gpu.k3_verify
        tasks_from: smoke
      vars:
        k3_verify_image: vllm/vllm-openai:kimi-k3
        k3_verify_smoke_command: [vllm, serve, moonshotai/Kimi-K3, --tensor-parallel-size, "8"]
        k3_verify_smoke_runtime: podman
        k3_verify_smoke_ready_timeout: "{{ ready_timeout }}"
        k3_verify_smoke_timeout: 30
        k3_verify_smoke_port: "{{ port }}"
        k3_verify_smoke_journal: true
        k3_verify_command_timeout: 20
        # No CDI spec on this machine: the stand-in driver's state mounted by hand.
        k3_verify_smoke_gpus: false
        k3_verify_smoke_run_options:
          [--volume, "{{ sim }}/run:/run/nvidia-sim:ro", --volume, "{{ sim }}/etc:/etc/nvidia-sim:ro"]
        k3_verify_smoke_container: k3fleet-smoke-test
"""


@pytest.fixture(scope="module")
def machine_podman() -> dict[str, str]:
    """This machine's podman over the testbed's image store, the stand-in images built in it."""
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.skip("the role's smoke on this machine needs root and podman (scripts/testbed-deps.sh)")
    workdir = testbed.default_workdir()
    layout = Layout(workdir)
    tarball, _ = image.ensure_image(layout.cache, log=layout.workdir / "debootstrap.log")
    podman.ensure_images(workdir, tarball, image.cache_key())
    return {k: v for k, v in testbed.podman_env(workdir).items() if k.startswith("CONTAINERS_")}


@pytest.mark.parametrize(("fault", "ready_timeout", "says"), [
    (None, 120, None),
    ("exit", 120, "container exited (exit code 1)"),
    ("http500", 120, "the chat completion with HTTP 500"),
    ("unready", 6, "/health HTTP 503"),
])
def test_role_smoke_on_this_machine(machine_podman: dict[str, str], tmp_path: Path, fault: str | None,
                                    ready_timeout: int, says: str | None,
                                    testbed_report: Callable[[str], None]) -> None:
    sim = tmp_path / "sim"
    (sim / "run" / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (sim / "run" / "proc" / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:51:11 UTC 2025\n")
    (sim / "etc").mkdir()
    if fault is not None:
        (sim / "etc" / "serve-fault").write_text(fault + "\n")
    play = tmp_path / "play.yml"
    play.write_text(ROLE_PLAY)
    journal = tmp_path / "journal.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = {"podman_env": machine_podman, "journal": str(journal), "sim": str(sim), "port": port,
             "ready_timeout": ready_timeout}
    env = dict(os.environ, **ansible_env())
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(extra), str(play)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    assert len(lines) == 1, done.stdout[-3000:]
    smoke = lines[0]["detail"]["smoke"]
    assert smoke["removed"] is True and smoke["started"] is True
    left = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=dict(os.environ, **machine_podman),
                          capture_output=True, text=True, check=True).stdout.split()
    assert "k3fleet-smoke-test" not in left
    if says is None:
        assert done.returncode == 0, done.stdout[-3000:]
        assert smoke["ok"] is True and smoke["response"]["status"] == 200
        testbed_report(f"serving smoke on this machine: ready after {smoke['ready']['waited_s']}s")
        return
    assert done.returncode != 0 and smoke["ok"] is False
    assert says in done.stdout, done.stdout[-3000:]
    if fault == "unready":
        assert smoke["ready"]["timed_out"] is True and smoke["ready"]["waited_s"] >= ready_timeout
