"""Lab hosts that carry what an expert reads: unhealthy fabric health, a Jetson, busy GPUs, R610's header.

Each profile is rendered, replayed through the production NodeReader and read by the real collector;
the rendered layouts are held to real captures (tests/fixtures/driver/SOURCES.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from k3fleet.lab.fleet import default_image, generate_fleet, load_fleet
from k3fleet.lab.profile import LabProfileError, load_fleet_file
from k3fleet.models.facts import HostFacts
from k3fleet.paths import data_dir

DRIVER_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "driver"
PROFILES = data_dir("inventories/lab") / "profiles"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("truth")
    fleet_dir = root / "fleet"
    shutil.copytree(PROFILES, fleet_dir / "profiles")
    (fleet_dir / "fleet.yaml").write_text(yaml.safe_dump({"hosts": {
        "gpu-t01": "b200-r580-fabric-unhealthy", "gpu-t02": "jetson-orin-l4t35", "gpu-t03": "h200-r575-busy",
        "gpu-t04": "h200-r610-kmd"}}))
    generate_fleet(load_fleet(fleet_dir / "fleet.yaml"), root / "lab")
    return root / "lab" / "hosts"


def reader(lab: Path, host: str) -> NodeReader:
    return NodeReader(root=str(lab / host), path=str(lab / host / "bin"), timeout=10)


def facts_of(lab: Path, host: str) -> HostFacts:
    raw = collect_host(reader(lab, host), host, default_image(), use_nvml=False, probe=True)
    return HostFacts.model_validate(raw)


def keys(text: str) -> list[str]:
    return [line.split(":", 1)[0].strip() for line in text.splitlines() if line.strip()]


def test_unhealthy_fabric_health_reaches_the_facts(lab: Path) -> None:
    f = facts_of(lab, "gpu-t01")
    assert [g.fabric_state for g in f.driver.gpus] == ["completed"] * 8
    health = {g.index: g.fabric_health for g in f.driver.gpus}
    assert health[3] is not None and (health[3].summary, health[3].route_unhealthy) == ("unhealthy", True)
    assert all(h is not None and h.summary == "healthy" and h.bandwidth == "full" for i, h in health.items() if i != 3)


def test_r580_health_block_has_the_real_labels_in_order(lab: Path) -> None:
    text = reader(lab, "gpu-t01").run(sources.COMMANDS["nvidia_smi_q"]).stdout
    real = (DRIVER_FIX / "smi_q_580_fabric_in_progress_block.txt").read_text()
    real_health = keys(real[real.index("Health"):])
    block = text[text.index("GPU 00000000:5D:00.0"):]
    ours = keys(block[block.index("        Health"):block.index("    Processes")])
    assert ours == real_health


def test_jetson_is_tegra_with_its_l4t_release(lab: Path) -> None:
    f = facts_of(lab, "gpu-t02")
    assert (f.driver.kernel_module.version, f.driver.kernel_module.arch) == ("35.3.1", "aarch64")
    assert f.driver.platform.kind == "tegra" and f.driver.platform.l4t_release == "35.3.1"
    assert f.driver.platform.evidence == "/etc/nv_tegra_release: # R35 (release), REVISION: 3.1"
    assert f.driver.status == "unknown" and "nvidia-smi" in (f.driver.reason or "")
    # The real /proc line replays byte for byte.
    assert reader(lab, "gpu-t02").read(sources.FILES["proc_driver_version"]) == (
        DRIVER_FIX / "proc_version_open_aarch64.txt").read_text()


def test_busy_gpus_reach_the_facts_in_the_real_layout(lab: Path) -> None:
    f = facts_of(lab, "gpu-t03")
    assert f.scheduler.state == "idle" and f.scheduler.jobs_running == 0
    for gpu in f.driver.gpus:
        assert gpu.memory_used_mib == 131072
        assert gpu.processes is not None and [(p.pid, p.type, p.name, p.used_memory_mib) for p in gpu.processes] == [
            (48311, "C", "/usr/bin/python3", 131072)]
    text = reader(lab, "gpu-t03").run(sources.COMMANDS["nvidia_smi_q"]).stdout
    real = (DRIVER_FIX / "smi_q_535_rtx4090x8_fabric_na.txt").read_text()
    real_procs = real[real.index("    Processes\n"):]
    real_procs = real_procs[:real_procs.index("\nGPU ")]
    ours = text[text.index("    Processes\n"):]
    ours = ours[:ours.index("\n\n")]
    assert keys(ours) == keys(real_procs)
    assert [len(line) - len(line.lstrip()) for line in ours.splitlines()] == [
        len(line) - len(line.lstrip()) for line in real_procs.splitlines() if line.strip()]


def test_r610_prints_the_kmd_header_and_the_collector_reads_it(lab: Path) -> None:
    text = reader(lab, "gpu-t04").run(sources.COMMANDS["nvidia_smi_q"]).stdout
    real = (DRIVER_FIX / "smi_q_610_header_kmd.txt").read_text()
    header = text[:text.index("Attached GPUs")]
    assert keys(header) == keys(real[:real.index("Attached GPUs")])
    assert "610.43.02 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]" in header
    f = facts_of(lab, "gpu-t04")
    assert (f.driver.driver_version, f.driver.cuda_driver_version) == ("610.43.02", "13.3")


@pytest.mark.parametrize(("gpus", "detail"), [
    ({"processes": [{"pid": 1, "used_mib": 10, "gpus": [9]}]}, "GPU index 9 does not exist"),
    ({"processes": [{"pid": 1, "used_mib": 200000}]}, "would use 200000 MiB of 143771 MiB"),
    ({"fabric_health": {"summary": "Sick"}}, "fabric_health.summary"),
    ({"processes": [{"pid": 0, "used_mib": 10}]}, "processes.0.pid"),
])
def test_bad_usage_and_health_specs(tmp_path: Path, gpus: dict[str, object], detail: str) -> None:
    fleet_dir = tmp_path / "fleet"
    shutil.copytree(PROFILES, fleet_dir / "profiles")
    (fleet_dir / "fleet.yaml").write_text(yaml.safe_dump({"hosts": {"gpu-x01": {"profile": "h200-r575",
                                                                                 "set": {"gpus": gpus}}}}))
    with pytest.raises(LabProfileError, match="gpus") as info:
        load_fleet_file(fleet_dir / "fleet.yaml")
    assert detail in str(info.value) and "\n" not in str(info.value)


# -- GPU health and platforms: the audit and triage name the same finding on the same text -----------

HEALTH_HOSTS = {"gpu-h01": "h200-r575-ecc", "gpu-h02": "h200-r575-xid79", "gpu-h03": "h200-r580-power-brake",
                "gpu-h04": "h200-r580-pcie-x8", "gpu-h05": "jetson-orin-l4t36", "gpu-h06": "h200-r575-rhel9",
                "gpu-h07": "h200-r580-xid-recurring", "gpu-h08": "h200-r580-xid-app",
                "gpu-h09": "h200-r580-nvlink-down", "gpu-h10": "h200-r580-ib-flap",
                "gpu-h11": "h200-r580-nic-across-socket", "gpu-h12": "gb200-nvl72-r580-no-gdr-override",
                "gpu-h13": "gb200-nvl72-r580"}
# host -> (finding the audit names on it, the source whose rendered text triage reads)
HEALTH_CASES = {
    "gpu-h01": ({"gpu.ecc", "gpu.remapped_rows"}, "nvidia_smi_q"),
    "gpu-h02": ({"gpu.xid"}, "dmesg"),
    "gpu-h03": ({"gpu.throttle"}, "nvidia_smi_q"),
    "gpu-h04": ({"gpu.pcie_link"}, "nvidia_smi_q"),
    "gpu-h05": ({"driver.platform"}, "proc_driver_version"),
    "gpu-h08": ({"gpu.xid_application"}, "dmesg"),
}


def test_lab_hosts_show_the_node_health_cases(health_lab: Path) -> None:
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    def found(host: str) -> dict[str, Any]:
        return {f.check_id: f for f in evaluate_host(facts_of(health_lab, host), load_target(None))}

    # Xid 79 in this boot and the previous one: escalated, with the catalogue's action for this boot's line.
    recurring = found("gpu-h07")
    assert recurring["gpu.xid_recurring"].severity == "critical"
    assert "Xid 79 (GPU has fallen off the bus) in boots 0, -1" in recurring["gpu.xid_recurring"].message
    assert "RESTART_BM" in recurring["gpu.xid"].message
    log = facts_of(health_lab, "gpu-h07").driver.kernel_log
    assert log is not None and log.history is not None
    assert [(b.offset, [x.code for x in b.xid]) for b in log.history.boots] == [(-1, [79]), (-2, [])]
    # Application Xid 13 only: a warning apart from the node's faults; the node does not fail on it.
    app = found("gpu-h08")
    assert app["gpu.xid_application"].severity == "warning" and "gpu.xid" not in app
    assert "RESTART_APP" in app["gpu.xid_application"].message
    # Two inactive links on GPU 3.
    nvlink = found("gpu-h09")["gpu.nvlink"]
    assert nvlink.message == "NVLink links inactive: GPU 3 link 3, 5" and nvlink.severity == "error"
    # The default R580 HGX host: 18 links up on every GPU, the driver's reserved memory apart from used.
    f = facts_of(health_lab, "gpu-h04")
    assert all(g.nvlink is not None and g.nvlink.links == 18 and not g.nvlink.inactive for g in f.driver.gpus)
    assert all((g.memory_used_mib, g.memory_reserved_mib) == (0, 616) for g in f.driver.gpus)
    assert "gpu.nvlink" not in found("gpu-h04") and "gpu.xid_recurring" not in found("gpu-h04")
    # GB200 before R595: the module's parameters read as NVIDIA AICR's validator reads them, set on the
    # configured tray and absent on the other; on an RDMA fleet the other fails driver.gb200_gdr_override.
    assert facts_of(health_lab, "gpu-h13").driver.kernel_module.grdma_topo_override is True
    bare = facts_of(health_lab, "gpu-h12")
    assert bare.driver.kernel_module.grdma_topo_override is False
    from k3fleet.verdict.rules import driver as rules_driver

    assert "driver.gb200_gdr_override" in {c.id for c in rules_driver.CHECKS}
    # A flapping rail: three "ib3: lost carrier" lines since boot; the port's counters were sampled twice
    # (a replayed file reads the same twice: totals 3 and 41, no change, so no counter finding).
    flap = found("gpu-h10")
    assert flap["rdma.link_flap"].message == ("RDMA link flapping in the kernel log since boot: ib3 lost its "
                                              "carrier 3 times")
    assert "rdma.port_counters" not in flap
    rdma = facts_of(health_lab, "gpu-h10").rdma.counters
    assert rdma is not None and rdma.ports["mlx5_3/1"]["link_downed"] == [3, 3]
    drv = facts_of(health_lab, "gpu-h10").driver.counters
    assert drv is not None and drv.source == "nvidia-smi" and len(drv.gpus["0"].nvlink) == 18
    # GPU 5's own NIC across the socket: its nearest NIC is a neighbour's at NODE.
    topo = found("gpu-h11")["rdma.gpu_nic_topology"]
    assert topo.message.endswith("GPU 5 nearest mlx5_4 at NODE") and topo.evidence["gpus"]["5"]["numa"] == "1"
    default = facts_of(health_lab, "gpu-h04").driver.topology
    assert default is not None and {g.distance for g in default.gpus.values()} == {"PIX"}
    assert "rdma.gpu_nic_topology" not in found("gpu-h04")


@pytest.fixture(scope="module")
def health_lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("health")
    fleet_dir = root / "fleet"
    shutil.copytree(PROFILES, fleet_dir / "profiles")
    (fleet_dir / "fleet.yaml").write_text(yaml.safe_dump({"hosts": HEALTH_HOSTS}))
    generate_fleet(load_fleet(fleet_dir / "fleet.yaml"), root / "lab")
    return root / "lab" / "hosts"


@pytest.mark.parametrize("host", sorted(HEALTH_CASES))
def test_audit_and_triage_name_the_same_health_finding(health_lab: Path, host: str, tmp_path: Path) -> None:
    from k3fleet.targets import load_target
    from k3fleet.triage import triage
    from k3fleet.verdict import evaluate_host

    ids, source = HEALTH_CASES[host]
    audit = {f.check_id for f in evaluate_host(facts_of(health_lab, host), load_target(None))}
    assert ids <= audit, audit
    r = reader(health_lab, host)
    text = r.read(sources.FILES[source]) if source in sources.FILES else r.run(sources.COMMANDS[source]).stdout
    assert text
    capture = tmp_path / f"{source}.txt"
    capture.write_text(text)
    triaged = {f.check_id for f in triage([capture], host=host).findings}
    assert ids <= triaged, triaged


def test_lab_health_sections_parse_like_the_real_capture(health_lab: Path) -> None:
    f = facts_of(health_lab, "gpu-h01")
    bad = {g.index: g for g in f.driver.gpus}[3]
    assert bad.ecc is not None and (bad.ecc.volatile_uncorrected, bad.ecc.aggregate_uncorrected) == (4, 4)
    assert bad.remapped_rows is not None and bad.remapped_rows.pending is True
    good = {g.index: g for g in f.driver.gpus}[0]
    assert good.ecc is not None and good.ecc.volatile_uncorrected == 0
    assert good.pcie is not None and (good.pcie.gen_current, good.pcie.width_current) == (5, 16)
    assert f.driver.kernel_log is not None and f.driver.kernel_log.status == "ok" and f.driver.kernel_log.xid == []
    # The rendered section keys are the real H100 capture's, in its order.
    text = reader(health_lab, "gpu-h01").run(sources.COMMANDS["nvidia_smi_q"]).stdout
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "driver" / "smi_q_565_h100x8_fabric_completed.txt"
            ).read_text()
    first_real = real[real.index("    ECC Mode"):real.index("        Aggregate Uncorrectable SRAM Sources")]
    first_ours = text[text.index("    ECC Mode"):text.index("    Retired Pages")]
    assert keys(first_ours) == keys(first_real)
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    xid = next(f for f in evaluate_host(facts_of(health_lab, "gpu-h02"), load_target(None)) if f.check_id == "gpu.xid")
    assert xid.severity == "critical" and "Xid 79 (GPU has fallen off the bus)" in xid.message
    assert "(GPU 5)" in xid.message
    # dmesg refused (kernel.dmesg_restrict=1): the journal's kernel messages answer instead.
    log = facts_of(health_lab, "gpu-h06").driver.kernel_log
    assert log is not None and (log.status, log.source, log.xid) == ("ok", "journalctl", [])
