"""The container probe's real CUDA operation: a matmul per GPU checked against the CPU.

Markers are built the way PROBE_SCRIPT prints them (docs/facts.md section 8); a lab host whose GPU
computes a wrong product goes through the real collectors and verdict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from labfleet import lab_fleet_verdict

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_probe import parse_probe_output
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import PROBE_MARKER, PROBE_SCRIPT

TOL = 0.0068984375


def marker(matmul: Any, visible: int = 2) -> str:
    out = {"cuda_init": True, "visible_gpus": visible, "torch_cuda": "13.0", "error": None, "matmul": matmul}
    return f"{PROBE_MARKER} {json.dumps(out)}\n"


def good(gpu: int) -> dict[str, Any]:
    return {"gpu": gpu, "tolerance": TOL, "max_abs_err": 3.0517578125e-05, "ok": True}


def test_matching_products_on_every_gpu_pass() -> None:
    probe = parse_probe_output(0, marker([good(0), good(1)]), "")
    assert probe["ok"] is True and probe["kernel_ok"] is True
    assert "matched the CPU result on every GPU" in probe["message"]
    assert [k["gpu"] for k in probe["kernel"]] == [0, 1]


def test_a_wrong_product_fails_and_names_the_gpu() -> None:
    wrong = {"gpu": 1, "tolerance": TOL, "max_abs_err": 61.8125, "ok": False}
    probe = parse_probe_output(0, marker([good(0), wrong]), "")
    assert probe["ok"] is False and probe["kernel_ok"] is False
    assert probe["failure"] == "kernel_mismatch"
    assert "GPU 1 of 2" in probe["message"] and "61.8125" in probe["message"]


def test_a_kernel_error_fails_with_its_text() -> None:
    err = {"gpu": 0, "tolerance": TOL, "ok": False,
           "error": "RuntimeError: CUDA error: an illegal memory access was encountered"}
    probe = parse_probe_output(0, marker([err, good(1)]), "")
    assert probe["failure"] == "kernel_error"
    assert "illegal memory access" in probe["message"]


@pytest.mark.parametrize("matmul", [None, [], [good(0)]])
def test_missing_kernel_results_are_not_a_pass(matmul: Any) -> None:
    probe = parse_probe_output(0, marker(matmul), "")
    # CUDA initialised (the probe is ok), but nothing proves the GPUs compute: kernel_ok stays unknown.
    assert probe["ok"] is True and probe["kernel_ok"] is None
    assert "no kernel result" in probe["message"]


def test_the_script_asks_for_a_verified_matmul() -> None:
    # TF32 would round the product beyond the tolerance on a healthy GPU; the CPU reference is computed
    # from the same seeded inputs.
    assert "allow_tf32=False" in PROBE_SCRIPT and "ref=a@b" in PROBE_SCRIPT
    compile(PROBE_SCRIPT, "<probe>", "exec")


def _verdict(tmp: Path, set_yaml: str) -> Any:
    return lab_fleet_verdict(tmp, "description: probe\nhosts:\n  p01:\n    profile: h200-r580\n" + set_yaml)


def test_lab_gpu_that_computes_wrong_fails_the_probe(tmp_path: Path) -> None:
    v = _verdict(tmp_path, "    set:\n      container: {probe: {matmul_wrong_gpus: [5]}}\n")
    found = [f for f in v.hosts["p01"].findings if f.check_id == "container.probe"]
    assert len(found) == 1 and found[0].kind == "fail" and found[0].severity == "error"
    assert "GPU 5 of 8" in found[0].message


def test_lab_healthy_host_passes_the_probe(tmp_path: Path) -> None:
    v = _verdict(tmp_path, "")
    assert not [f for f in v.hosts["p01"].findings if f.check_id == "container.probe"]
