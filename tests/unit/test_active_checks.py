"""Active checks (audit --active): parsers on recorded real outputs, the gate, and the lab hosts.

The outputs are k3fleet/lab/active_data (SOURCES.md names each one's public source); the lab hosts
print them through the replaying stand-ins and go through the real collectors and verdict
(docs/facts.md section 17).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from labfleet import lab_fleet_verdict

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import (
    collect_active,
    gpus_busy,
    parse_all_reduce_perf,
    parse_dcgmi_diag,
    parse_ib_write_bw,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.audit.run import active_spec
from k3fleet.targets import load_target

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "k3fleet" / "lab" / "active_data"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_dcgmi_pass_table() -> None:
    got = parse_dcgmi_diag(text("dcgmi_diag_r2_pass_excerpt.txt"))
    assert got["result"] == "pass"
    assert got["metadata"]["DCGM Version"] == "3.3.1"
    assert [t["name"] for t in got["tests"]][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert {t["section"] for t in got["tests"]} == {"Deployment"}


def test_dcgmi_gpu_memory_failure_names_the_gpu_and_the_warning() -> None:
    got = parse_dcgmi_diag(text("dcgmi_diag_r2_gpu_memory_fail_excerpt.txt"))
    assert got["result"] == "fail"
    (test,) = got["tests"]
    assert (test["section"], test["name"], test["result"], test["failed_gpus"]) == ("Hardware", "GPU Memory",
                                                                                     "fail", [0])
    # Wrapped mid-word at the column's width: joined back without a space.
    assert "Restart DCGM. Rerun diagnostics. Unable to create CUDA context" in test["details"][0]["text"]


@pytest.mark.parametrize("garbage", ["", "Error: unable to connect to host engine\n", "| a | b | c |\n"])
def test_dcgmi_without_rows_has_no_result(garbage: str) -> None:
    assert parse_dcgmi_diag(garbage)["result"] is None


def test_all_reduce_perf_peak_and_average() -> None:
    got = parse_all_reduce_perf(text("all_reduce_perf_h100_2nodes_16ranks.txt"))
    assert got == {"ranks": 16, "sizes": 31, "wrong": 0, "max_bytes": 8589934592, "peak_busbw_gbs": 338.82,
                   "avg_busbw_gbs": 70.742, "out_of_bounds": 0, "transport": None}


def test_all_reduce_perf_wrong_results_are_counted() -> None:
    row = ("  8589934592    2147483648     float     sum      -1    47535  180.71  338.82      3    47743  179.92  "
           "337.35      0\n")
    assert parse_all_reduce_perf(row)["wrong"] == 3


def test_ib_write_bw_average_in_gbps() -> None:
    assert parse_ib_write_bw(text("ib_write_bw_post_list_8B.txt")) == {"bytes": 8, "bw_avg_gbps": 0.48,
                                                                      "bw_peak_gbps": 0.0}
    mb = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
          " 65536  5000  46000.10  45800.00  0.73\n")
    assert parse_ib_write_bw(mb)["bw_avg_gbps"] == 366.4


def test_busy_gpus_gate_every_active_check(tmp_path: Path) -> None:
    driver = {"gpus": [{"index": 0, "processes": [{"pid": 7, "type": "C"}], "memory_used_mib": 1000,
                        "memory_total_mib": 80000}]}
    assert gpus_busy(driver, 0.9) is not None
    spec, _ = active_spec(load_target(None), "full")
    reader = NodeReader(root=str(tmp_path), path=str(tmp_path), timeout=5)
    out = collect_active(reader, "full", spec, driver, {})
    assert out["skipped"] and "gpu.in_use" in out["skipped"]
    assert out["dcgm"] is None and reader.commands == []


def test_budget_covers_every_timeout() -> None:
    t = load_target(None)
    _, quick = active_spec(t, "quick")
    _, full = active_spec(t, "full")
    a = t.active.timeouts
    assert quick == a.dcgm_quick_s
    assert full >= a.dcgm_full_s + a.nccl_s + a.ib_write_bw_s * t.rdma.rails_per_node


@pytest.fixture(scope="module")
def active_lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    target = load_target(None)
    active, _ = active_spec(target, "full")
    fleet = ("description: active\nhosts:\n"
             "  a01: {profile: h200-r580-diag-fail}\n"
             "  a02: {profile: h200-r580-low-busbw}\n"
             "  a03: {profile: h200-r580}\n"
             "  a04: {profile: h200-r575-busy}\n")
    return lab_fleet_verdict(tmp_path_factory.mktemp("active"), fleet, target, active="full", active_spec=active)


def _found(v: Any, host: str, prefix: str = "active.") -> dict[str, Any]:
    return {f.check_id: f for f in v.hosts[host].findings if f.check_id.startswith(prefix)}


def test_lab_diag_failure(active_lab: Any) -> None:
    found = _found(active_lab, "a01")
    f = found["active.dcgm_diag"]
    assert f.kind == "fail" and f.blocking
    assert "GPU Memory fails on GPU 0" in f.message
    # This host has no nccl-tests or perftest: unknown, never a pass.
    assert found["active.nccl_busbw"].kind == "unknown"
    assert "all_reduce_perf: command not found" in found["active.nccl_busbw"].message


def test_lab_low_bus_bandwidth_and_slow_rails(active_lab: Any) -> None:
    found = _found(active_lab, "a02")
    assert "active.dcgm_diag" not in found
    n = found["active.nccl_busbw"]
    assert n.kind == "fail" and "338.82 GB/s" in n.message and "400 GB/s" in n.message
    ib = found["active.ib_write_bw"]
    assert ib.kind == "fail" and "mlx5_0/1 0.48 Gb/s < 360" in ib.message
    # The run printed its NCCL_DEBUG=INFO channel lines: P2P inside the node, no transport finding.
    assert "active.nccl_transport" not in found


def test_lab_host_without_tools_is_unknown_everywhere(active_lab: Any) -> None:
    found = _found(active_lab, "a03")
    assert {k: f.kind for k, f in found.items()} == {"active.dcgm_diag": "unknown", "active.nccl_busbw": "unknown",
                                                     "active.ib_write_bw": "unknown"}


def test_lab_busy_host_is_skipped_with_the_reason(active_lab: Any) -> None:
    found = _found(active_lab, "a04")
    assert found and all(f.kind == "unknown" and "not run: GPU" in f.message and "gpu.in_use" in f.message
                         for f in found.values())


def test_lab_missing_ib_tool_is_one_finding(active_lab: Any) -> None:
    ib = [f for f in active_lab.hosts["a03"].findings if f.check_id == "active.ib_write_bw"]
    assert len(ib) == 1 and "mlx5_0/1, mlx5_1/1" in ib[0].message and "command not found" in ib[0].message


def test_scheduler_jobs_gate_the_checks_too(tmp_path: Path) -> None:
    driver = {"gpus": [{"index": 0, "processes": [], "memory_used_mib": 0, "memory_total_mib": 80000}]}
    spec, _ = active_spec(load_target(None), "quick")
    reader = NodeReader(root=str(tmp_path), path=str(tmp_path), timeout=5)
    out = collect_active(reader, "quick", spec, driver, {}, scheduler={"jobs_running": 2})
    assert out["skipped"].startswith("2 scheduler job(s) running") and reader.commands == []
