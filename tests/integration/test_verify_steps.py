"""The change night's verify steps (roles/k3_verify/tasks/steps.yml, docs/change-night.md "Verify steps")
through real ansible-playbook on the lab's pair fleet (inventories/lab/pairs.yaml): the container CUDA
probe, all_reduce_perf within the node, IMEX read again and the canary's pair test, each journaled with
its result; a failed step fails the host with the step and the log lines that decided it.

The lab hosts answer with recorded runs (k3fleet/lab/active_data/SOURCES.md): a good pair is 338.82 GB/s,
gpu-p03's low link 44.27 GB/s (GitHub NVIDIA/nccl-tests issue 319). The floors are the test's own (300 GB/s,
as tests/integration/test_audit_pairs.py judges this fleet); the target's are for real rails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k3fleet.paths import data_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
K3FLEET = str(Path(sys.executable).parent / "k3fleet")
PLAY = """
- name: The verify of the change night's k3_night_verify, steps only (no smoke)
  hosts: "{{ verify_hosts }}"
  gather_facts: false
  module_defaults:
    k3fleet.gpu.k3fleet_journal:
      path: "{{ journal }}"
      run: r-verify
      change_id: CHG-verify
      host: "{{ inventory_hostname }}"
  tasks:
    - name: Verify the node as the night does
      ansible.builtin.include_role:
        name: k3fleet.gpu.k3_verify
      vars:
        k3_verify_driver_branch: "580"
        k3_verify_fm_timeout: 0
        k3_verify_command_timeout: 20
        k3_verify_smoke_journal: true
        k3_verify_steps: "{{ plan }}"
        k3_verify_steps_canary: "{{ inventory_hostname == canary }}"
"""
SPANS = "the audit's serving strategy multi_node_tp_dp spans nodes (rdma_required)"
ONE_NODE = "the audit's serving strategy single_node_tp keeps each replica on one node"
PLAYBOOK_BIN = str(Path(sys.executable).parent / "ansible-playbook")
LAUNCHER = ["mpirun", "-H", "{hosts}", "-np", "{ranks}", "--bind-to", "none", "-x", "NCCL_ALGO=Ring",
            "-x", "PATH", "-x", "LD_LIBRARY_PATH"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("verify-steps")
    proc = subprocess.run([K3FLEET, "lab", "generate", "--fleet", str(data_dir("inventories/lab") / "pairs.yaml"),
                           str(work / "lab")], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (work / "play.yml").write_text(PLAY)
    return work


def _plan(peer: str | None, *, needed: bool = True, probe_skip: str | None = None) -> dict[str, Any]:
    host = {"probe_skip": probe_skip, "gpus": 8, "gpu_model": "NVIDIA H200", "nccl_min_busbw_gbs": 300}
    return {"probe_timeout": 20, "nccl_timeout": 600,
            "active_spec": {"nccl_max_bytes": "8G", "nccl_timeout_s": 600, "nccl_pair_launcher": LAUNCHER},
            "rdma_networks": ["IB", "IBext"], "hosts": {f"gpu-p0{i}": host for i in range(1, 6)},
            "canary_pair": {"needed": needed, "run": peer is not None and needed, "accepted": False, "peer": peer,
                            "gpus": 8, "gpu_model": "NVIDIA H200", "min_busbw_gbs": 300,
                            "reason": SPANS if needed else ONE_NODE}}


def _run(work: Path, name: str, hosts: list[str], plan: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str],
                                                                                 dict[str, list[dict[str, Any]]]]:
    journal = work / f"{name}.jsonl"
    extra = {"verify_hosts": hosts, "canary": "gpu-p01", "plan": plan, "journal": str(journal)}
    (work / f"{name}.json").write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", str(work / "lab" / "inventory.yml"),
                           str(work / "play.yml"), "-e", f"@{work / f'{name}.json'}"],
                          capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env)
    steps: dict[str, list[dict[str, Any]]] = {}
    for line in journal.read_text().splitlines() if journal.exists() else []:
        entry = json.loads(line)
        assert entry["stage"] == "verifying"
        steps[entry["host"]] = entry["detail"]["steps"]
    return proc, steps


def _by_step(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["step"]: r for r in records}


def test_a_good_canary_proves_cuda_nccl_and_the_fabric_and_journals_each_step(lab: Path) -> None:
    proc, steps = _run(lab, "good", ["gpu-p01"], _plan("gpu-p02"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = _by_step(steps["gpu-p01"])
    assert [r["step"] for r in steps["gpu-p01"]] == ["container_probe", "nccl_node", "imex", "canary_pair"]
    assert got["container_probe"]["result"] == "passed" and got["container_probe"]["visible_gpus"] == 8
    assert got["container_probe"]["runtime"] == "docker"
    assert (got["nccl_node"]["result"], got["nccl_node"]["peak_busbw_gbs"], got["nccl_node"]["wrong"]) == (
        "passed", 338.82, 0)
    assert got["imex"]["result"] == "skipped" and got["imex"]["reason"].startswith("not needed: IMEX not installed")
    pair = got["canary_pair"]
    assert (pair["result"], pair["peer"], pair["network"], pair["ranks"]) == ("passed", "gpu-p02", "IB", 16)
    assert any("Using network IB" in line for line in pair["log"])


def test_a_low_link_stops_the_canary_naming_the_test_and_its_log_lines(lab: Path) -> None:
    proc, steps = _run(lab, "low", ["gpu-p01"], _plan("gpu-p03"))
    assert proc.returncode == 2, proc.stdout[-3000:]
    pair = _by_step(steps["gpu-p01"])["canary_pair"]
    assert pair["result"] == "failed" and pair["peak_busbw_gbs"] == 44.27
    assert pair["reason"] == "peak bus bandwidth 44.27 GB/s is below the pair floor 300 GB/s"
    # The failure message (what the night's rescue journals as `failed` before the rollback) names the step, the
    # reason and the lines of the run that decided it.
    assert "verify step canary_pair failed: canary_pair: peak bus bandwidth 44.27 GB/s is below the pair floor" \
        in proc.stdout
    assert "deciding log lines:" in proc.stdout and "44.27" in proc.stdout.split("deciding log lines:")[1]


def test_a_wave_host_and_a_fleet_without_rdma_say_why_a_step_did_not_run(lab: Path) -> None:
    skip = "the operator accepted the audit's container findings on this host with --accept-finding: x (y)"
    proc, steps = _run(lab, "wave", ["gpu-p04", "gpu-p01"], _plan(None, needed=False, probe_skip=skip))
    assert proc.returncode == 0, proc.stdout[-3000:]
    wave, canary = _by_step(steps["gpu-p04"]), _by_step(steps["gpu-p01"])
    assert wave["container_probe"] == {"step": "container_probe", "result": "skipped", "reason": "not run: " + skip}
    assert wave["canary_pair"]["reason"] == "not run here: the pair test runs once, on the canary, before the waves"
    assert canary["canary_pair"] == {"step": "canary_pair", "result": "skipped",
                                     "reason": "not needed: the audit's serving strategy single_node_tp keeps each "
                                               "replica on one node"}
    assert wave["nccl_node"]["result"] == "passed"


def test_a_fleet_that_needs_rdma_with_no_partner_fails_the_canary(lab: Path) -> None:
    plan = _plan(None)
    plan["canary_pair"]["reason"] += "; no other node the audit saw has the canary's GPUs (8x NVIDIA H200) to pair with"
    proc, steps = _run(lab, "alone", ["gpu-p01"], plan)
    assert proc.returncode == 2
    pair = _by_step(steps["gpu-p01"])["canary_pair"]
    assert pair["result"] == "failed" and "no other node the audit saw has the canary's GPUs" in pair["reason"]
