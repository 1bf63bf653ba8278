"""`k3fleet triage` against real captured outputs of each kind (tests/fixtures/triage/SOURCES.md and
the collectors' own fixtures, used by path), judged by the audit's parsers and rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from k3fleet.cli import app
from k3fleet.errors import UsageError
from k3fleet.triage import COVERS, KINDS, sniff, triage
from k3fleet.triage import adapters as ad

FIX = Path(__file__).resolve().parents[1] / "fixtures"
T = FIX / "triage"

# file -> (kind, finding ids that must be reported (exactly), exit code)
CASES: dict[str, tuple[str, set[str], int]] = {
    "triage/nvidia_smi_h100x8_565.txt": ("nvidia_smi", {"driver.branch", "container.cuda_runtime"}, 1),
    "triage/nvidia_smi_p4_550.txt": ("nvidia_smi", {"driver.branch", "container.cuda_runtime", "gpu.count",
                                                    "gpu.persistence_mode"}, 1),
    # R610's header: CUDA 13.3 runs the CUDA 13.0 image; the capture is cut after two of eight GPUs.
    "triage/nvidia_smi_b200_610_kmd.txt": ("nvidia_smi", {"gpu.count"}, 1),
    "driver/smi_q_565_h100x8_fabric_completed.txt": ("nvidia_smi_q", {"driver.branch", "container.cuda_runtime"}, 1),
    "driver/nvidia_smi_mismatch.txt": ("nvidia_smi_failure", {"driver.pending_reboot"}, 1),
    "driver/proc_version_proprietary_580.txt": ("proc_driver_version", set(), 0),
    "driver/proc_version_proprietary_550.txt": ("proc_driver_version", {"driver.branch", "container.cuda_runtime"}, 1),
    "triage/fm_journal_nothing_to_do.txt": ("fabricmanager_status", {"fabricmanager.active"}, 1),
    "triage/fm_journal_started.txt": ("fabricmanager_status", set(), 0),
    "triage/fm_status_active.txt": ("fabricmanager_status", set(), 0),
    "fabricmanager/systemctl_show_fm_failed.txt": ("fabricmanager_status", {"fabricmanager.active"}, 1),
    "triage/ibstat_roce_one_down.txt": ("ibstat", {"rdma.port_state", "rdma.rail_count"}, 1),
    "triage/ibstat_ethernet_100.txt": ("ibstat", {"rdma.rail_count"}, 1),
    "triage/ibv_devinfo_ib_active.txt": ("ibv_devinfo", {"rdma.rail_count"}, 1),
    "triage/ibv_devinfo_port_down.txt": ("ibv_devinfo", {"rdma.rail_count"}, 1),
    "container/docker_inspect_vllm_v0.23.0.json": ("docker_inspect", {"container.image_present",
                                                                      "container.vllm_version"}, 1),
    "container/probe_requirement_error_dashdot1226.stderr": ("container_error", {"container.probe"}, 1),
    "container/probe_driver_too_old_pytorch162531.stderr": ("container_error", {"container.probe"}, 1),
    "vllm_startup/oom_load_model.log": ("vllm_startup", {"accept.startup.load_oom"}, 1),
    "vllm_startup/nccl_unhandled_system_error.log": ("vllm_startup", {"accept.startup.nccl"}, 1),
    "vllm_startup/ready_tool_choice.log": ("vllm_startup", set(), 0),
    "metrics/vllm_design_cache_config_info.prom": ("metrics", {"accept.metrics.prefix_caching_off"}, 1),
    "metrics/vllm_v0_qwen25coder_old_names.prom": ("metrics", {"accept.metrics.old_server"}, 0),
    "metrics/not_metrics_html_404.txt": ("", set(), 2),
}


@pytest.mark.parametrize("rel", sorted(CASES))
def test_each_kind_of_real_capture(rel: str) -> None:
    kind, ids, code = CASES[rel]
    path = FIX / rel
    if code == 2:
        assert sniff(path.read_text(errors="replace")) is None
        with pytest.raises(UsageError, match="cannot tell what"):
            triage([path])
        return
    assert sniff(path.read_text(errors="replace")) == kind
    r = triage([path], host="gpu-x01")
    got = {f["id"] for f in r.findings if f["severity"] not in ("info",)}
    assert got == ids, [(f["id"], f["message"]) for f in r.findings]
    assert r.exit_code == code
    assert all(f["host"] == "gpu-x01" and f["file"].startswith("inputs/01-") for f in r.findings)
    # Only rules whose facts the capture holds speak: nothing is judged from text that was not given.
    audit_ids = {f["id"] for f in r.findings if not f["id"].startswith("accept.")}
    assert audit_ids <= COVERS.get(kind, frozenset())


def test_every_kind_has_a_real_capture() -> None:
    assert {kind for kind, _, code in CASES.values() if code != 2} == set(KINDS) - {"fabricmanager_version"}


def test_smi_table_through_the_collectors_bus_id_and_versions() -> None:
    drv = ad.driver_from_smi_table((T / "nvidia_smi_h100x8_565.txt").read_text())
    assert (drv["driver_version"], drv["cuda_driver_version"], drv["gpu_count"]) == ("565.57.01", "12.7", 8)
    first = drv["gpus"][0]
    assert first == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "persistence_mode": True,
                     "pci_bus_id": "00000000:18:00.0", "memory_total_mib": 81559}
    kmd = ad.driver_from_smi_table((T / "nvidia_smi_b200_610_kmd.txt").read_text())
    assert (kmd["driver_version"], kmd["cuda_driver_version"]) == ("610.43.02", "13.3")
    assert [g["memory_total_mib"] for g in kmd["gpus"]] == [183359, 183359]


def test_smi_q_gpu_blocks_and_fabric_state_match_the_table_of_the_same_node() -> None:
    q = ad.driver_from_smi_q((FIX / "driver" / "smi_q_565_h100x8_fabric_completed.txt").read_text())
    table = ad.driver_from_smi_table((T / "nvidia_smi_h100x8_565.txt").read_text())
    assert [g["pci_bus_id"] for g in q["gpus"]] == [g["pci_bus_id"] for g in table["gpus"]]
    assert {g["fabric_state"] for g in q["gpus"]} == {"completed"}
    assert q["gpus"][0]["memory_total_mib"] == 81559 and q["gpus"][0]["persistence_mode"] is True


def test_ibstat_and_ibv_devinfo_become_sysfs_ports() -> None:
    devs = ad.rdma_from_ibstat((T / "ibstat_roce_one_down.txt").read_text())
    ports = {d["name"]: d["ports"][0] for d in devs}
    assert (ports["mlx5_0"]["state_code"], ports["mlx5_0"]["phys_state"], ports["mlx5_0"]["rate_gbps"],
            ports["mlx5_0"]["link_layer"]) == (4, "LinkUp", 200.0, "Ethernet")
    assert (ports["mlx5_10"]["state"], ports["mlx5_10"]["phys_state_code"]) == ("DOWN", 3)
    ib = ad.rdma_from_ibv_devinfo((T / "ibv_devinfo_ib_active.txt").read_text())
    port = ib[0]["ports"][0]
    # The plain listing has no physical state: an ACTIVE logical state implies LinkUp.
    assert (ib[0]["name"], port["state_code"], port["phys_state_code"], port["link_layer"]) == (
        "mlx5_3", 4, 5, "InfiniBand")
    down = ad.rdma_from_ibv_devinfo((T / "ibv_devinfo_port_down.txt").read_text())[0]["ports"][0]
    assert (down["state_code"], down["phys_state_code"]) == (1, None)


def test_captures_of_one_node_are_judged_together() -> None:
    """The driver from one capture and the image from another: the chain check compares them."""
    r = triage([T / "nvidia_smi_h100x8_565.txt", FIX / "container" / "docker_inspect_cuda12_opticks.json",
                FIX / "driver" / "proc_version_proprietary_580.txt"], host="gpu-x01")
    # /proc says the loaded module is 580.173.02: it wins over the table's older version (as in the audit).
    assert r.to_json()["driver_version"] == "580.173.02"
    ids = {f["id"] for f in r.findings}
    assert "driver.branch" not in ids
    assert r.kinds == ["docker_inspect", "nvidia_smi", "proc_driver_version"]


def test_docker_inspect_alone_does_not_judge_the_host_driver() -> None:
    r = triage([FIX / "container" / "docker_inspect_vllm_v0.23.0.json"])
    assert "container.cuda_runtime" not in {f["id"] for f in r.findings}


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty"),
    (b"\x00\x01ELF binary", "is binary"),
    (b"hello world\n", "cannot tell what"),
    (b"NVRM version: something odd\n", "read as /proc/driver/nvidia/version but"),
    (b"CA 'mlx5_0'\n\tCA type: MT4129\n", None),
])
def test_bad_captures_are_one_line_usage_errors(tmp_path: Path, content: bytes, message: str | None) -> None:
    p = tmp_path / "capture.txt"
    p.write_bytes(content)
    if message is None:
        # A CA block without ports is a device with no port: judged, not refused.
        r = triage([p])
        assert {f["id"] for f in r.findings} == {"rdma.rail_count"}
        return
    with pytest.raises(UsageError, match=message):
        triage([p])


def test_cli_writes_a_verified_operator_supplied_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["triage", str(T / "nvidia_smi_p4_550.txt"), str(T / "fm_status_active.txt"),
                                   "--host", "gpu-x02", "--out", str(out), "--json"])
    assert res.exit_code == 1, res.output
    data = json.loads((out / "triage.json").read_text())
    assert data["operator_supplied"] is True and data["host"] == "gpu-x02"
    assert [f["kind"] for f in data["files"]] == ["nvidia_smi", "fabricmanager_status"]
    assert (out / "inputs" / "01-nvidia_smi_p4_550.txt").read_text() == (T / "nvidia_smi_p4_550.txt").read_text()
    command = json.loads((out / "command.json").read_text())
    assert command["kind"] == "triage" and command["operator_supplied"] is True
    from k3fleet.evidence import verify_run

    assert verify_run(out).ok


def test_cli_bad_input_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from k3fleet.cli import main

    assert main(["triage", str(tmp_path / "missing.txt"), "--runs-dir", str(tmp_path / "r")]) == 2
    assert "missing.txt does not exist" in capsys.readouterr().err
    assert main(["triage", str(T / "ibstat_ethernet_100.txt"), "--kind", "bogus"]) == 2
    assert "--kind 'bogus'" in capsys.readouterr().err
    assert main(["triage", str(T / "ibstat_ethernet_100.txt"), "--kind", "nvidia_smi",
                 "--runs-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "read as plain `nvidia-smi` table but" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
