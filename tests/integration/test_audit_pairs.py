"""`k3fleet audit --lab --active full` over the lab's pair fleet (inventories/lab/pairs.yaml) through
real ansible-playbook: the per-host play, then the NCCL pair test's rounds (docs/facts.md section 17).

gpu-p03's link is low: every pair with it prints the recorded 44.27 GB/s two-node run (GitHub
NVIDIA/nccl-tests issue 319), the others the recorded 338.82 GB/s run (GitHub
lessizzmore/create-a3mega-ztan-fork); k3fleet/lab/active_data/SOURCES.md. The target is the default
with the lab's floors of 300 GB/s between them, as the fleet file says.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3fleet.paths import data_dir

pytestmark = pytest.mark.integration

K3FLEET = str(Path(sys.executable).parent / "k3fleet")
TARGET = Path(__file__).resolve().parents[2] / "k3fleet" / "targets" / "kimi-k3.yaml"


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    work = tmp_path_factory.mktemp("pairs")
    target = yaml.safe_load(TARGET.read_text())
    target["active"]["nccl_pair_busbw_min_gbs"] = {"NVIDIA H200": 300}
    target["active"]["nccl_busbw_min_gbs"] = {"NVIDIA H200": 300}
    (work / "target.yaml").write_text(yaml.safe_dump(target))
    out = work / "run"
    proc = subprocess.run([K3FLEET, "audit", "--lab", "-i", str(data_dir("inventories/lab") / "pairs.yaml"),
                           "--active", "full", "--target", str(work / "target.yaml"), "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    return proc, out


def _pair_findings(verdict: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return [f for f in verdict["hosts"][host]["findings"] if f["check_id"] == "active.nccl_pair_busbw"]


def test_the_low_link_node_fails_and_the_rest_of_the_ring_stands(
        audit: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, _ = audit
    assert "Traceback" not in proc.stderr
    verdict = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (p03,) = _pair_findings(verdict, "gpu-p03")
    assert (p03["severity"], p03["kind"]) == ("error", "fail")
    assert "2 of the node's pairs are below 300 GB/s (gpu-p04 44.27 GB/s; gpu-p02 44.27 GB/s)" in p03["message"]
    assert verdict["hosts"]["gpu-p03"]["status"] == "fail"
    # Its partners are explained by it: a note, and their status is what their own checks give.
    for host in ("gpu-p02", "gpu-p04"):
        (note,) = _pair_findings(verdict, host)
        assert (note["severity"], note["kind"]) == ("info", "note")
        assert "gpu-p03 is in 2 low pairs and is judged the cause" in note["message"]
        assert verdict["hosts"][host]["status"] == "warn"
    assert _pair_findings(verdict, "gpu-p01") == [] and _pair_findings(verdict, "gpu-p05") == []
    # The serving node is never loaded: not paired, unknown.
    (busy,) = _pair_findings(verdict, "gpu-p06")
    assert busy["kind"] == "unknown" and "not paired: active checks did not run: GPU" in busy["message"]


def test_the_rounds_and_each_pair_are_in_the_run_directory(
        audit: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = audit
    pairs = json.loads((out / "pairs.json").read_text())
    assert pairs["rounds"] == [[["gpu-p01", "gpu-p02"], ["gpu-p03", "gpu-p04"]],
                               [["gpu-p02", "gpu-p03"], ["gpu-p04", "gpu-p05"]], [["gpu-p05", "gpu-p01"]]]
    assert pairs["bound_s"] == 3 * (600 + 60) and pairs["interrupted"] is False
    busbw = {tuple(r["hosts"]): r["peak_busbw_gbs"] for r in pairs["runs"]}
    assert busbw == {("gpu-p01", "gpu-p02"): 338.82, ("gpu-p03", "gpu-p04"): 44.27, ("gpu-p02", "gpu-p03"): 44.27,
                     ("gpu-p04", "gpu-p05"): 338.82, ("gpu-p05", "gpu-p01"): 338.82}
    assert all(r["ran"] and r["rc"] == 0 for r in pairs["runs"])
    for k in (1, 2, 3):
        assert (out / f"events-pairs-{k}.jsonl").is_file() and (out / f"ansible-pairs-{k}").is_dir()
    verify = subprocess.run([K3FLEET, "verify", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
