"""Node health as deep as gpud and DCGM: memory used and reserved apart, NVLink links, counters sampled
twice, Xid history with actions. Parsers and rules run on recorded real outputs (tests/fixtures/gpu_health/
SOURCES.md names each source)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nodetree import fake_command, fixtures, node

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_counters as counters
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_driver as drv
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_smi as smi

HEALTH, health = fixtures("gpu_health")


@pytest.mark.parametrize(("name", "expected"), [
    # The real H200 in a VM has no NVLink: nvlink -s printed nothing, exit 0. That is no links.
    ("h200_r580/health-nvlink-s.txt", {}),
    ("nvlink_s_v100_inactive_azhpc73.txt", {3: {"links": 6, "active": [0, 1, 2, 4], "inactive": [3, 5]}}),
    ("nvlink_s_gb200_k8s_test_infra371.txt", {0: {"links": 18, "active": list(range(18)), "inactive": []}}),
])
def test_parse_nvlink_status(name: str, expected: dict[int, Any]) -> None:
    assert smi.parse_nvlink_status(health(name)) == expected


def test_parse_nvlink_status_rejects_text_before_any_gpu() -> None:
    with pytest.raises(ValueError, match="line before any GPU"):
        smi.parse_nvlink_status("Failed to initialize NVML: Driver/library version mismatch\n")


def test_smi_q_memory_reads_used_and_reserved_of_the_real_h200() -> None:
    # nvidia-smi -q -d MEMORY on the idle H200: Reserved 616 MiB, Used 0 MiB (NVML's v1 call said 615 used).
    block = next(iter(smi.parse_smi_q_blocks(health("h200_r580/health-q-mem.txt")).values()))
    assert smi.smi_q_memory(block) == {"memory_used_mib": 0, "memory_reserved_mib": 616,
                                       "memory_source": "nvidia-smi"}


def test_apply_smi_memory_replaces_only_the_v1_figures() -> None:
    gpus = [{"index": 0, "pci_bus_id": "00000000:00:06.0", "memory_used_mib": 615, "memory_reserved_mib": None,
             "memory_source": "nvml_v1"},
            {"index": 1, "pci_bus_id": "00000000:00:07.0", "memory_used_mib": 0, "memory_reserved_mib": 615,
             "memory_source": "nvml_v2"}]
    assert smi.apply_smi_memory(gpus, health("h200_r580/health-q-mem.txt")) is None
    assert [(g["memory_used_mib"], g["memory_reserved_mib"], g["memory_source"]) for g in gpus] == [
        (0, 616, "nvidia-smi"), (0, 615, "nvml_v2")]
    left = [{"index": 4, "pci_bus_id": "00000000:1B:00.0", "memory_used_mib": 615, "memory_source": "nvml_v1"}]
    assert smi.apply_smi_memory(left, health("h200_r580/health-q-mem.txt")) == (
        "GPU used memory includes the driver's reserved memory: GPU 4: not in nvidia-smi -q -d MEMORY")


# -- Xid history of earlier boots ------------------------------------------------------------------------


def test_parse_list_boots_of_systemd_246_and_253() -> None:
    boots = drv.parse_list_boots(health("journal_list_boots_systemd17326.txt"))
    assert [(b["offset"], b["boot_id"][:8]) for b in boots] == [(-2, "9ed94632"), (-1, "132fe52e"), (0, "bde6e48d")]
    # systemd 253 prints a column header (and the boot id with no dashes): the header is skipped.
    newer = "IDX BOOT ID                          FIRST ENTRY                 LAST ENTRY\n" + \
        health("journal_list_boots_systemd17326.txt")
    assert len(drv.parse_list_boots(newer)) == 3


def test_xid_history_reads_the_earlier_boots_kernel_logs(tmp_path: Path) -> None:
    # Boot -1 logged the Xid 79 of NVSentinel issue 155; boot -2 the Xid 94 of gpud pull request 1174.
    fake_command(tmp_path / "bin", "journalctl", [
        ("--list-boots*", health("journal_list_boots_systemd17326.txt"), "", 0),
        ("-k?-b?-1?*", health("xid79_line_nvsentinel155.txt"), "", 0),
        ("-k?-b?-2?*", health("xid94_line_gpud1174.txt"), "", 0),
    ])
    got = drv.collect_xid_history(node(tmp_path))
    assert (got["status"], got["boots_listed"]) == ("ok", 3)
    assert [(b["offset"], [x["code"] for x in b["xid"]]) for b in got["boots"]] == [(-1, [79]), (-2, [94])]


def test_xid_history_of_a_volatile_journal_is_nothing_earlier(tmp_path: Path) -> None:
    only_this = health("journal_list_boots_systemd17326.txt").splitlines()[-1] + "\n"
    fake_command(tmp_path / "bin", "journalctl", [("--list-boots*", only_this, "", 0)])
    got = drv.collect_xid_history(node(tmp_path))
    assert (got["status"], got["boots_listed"], got["boots"]) == ("ok", 1, [])


def test_xid_history_without_journalctl_is_unknown(tmp_path: Path) -> None:
    got = drv.collect_xid_history(node(tmp_path))
    assert got["status"] == "unknown" and "journalctl: command not found" in got["reason"]


def test_xid_history_reads_at_most_three_earlier_boots(tmp_path: Path) -> None:
    span = "Mon 2020-10-12 21:43:58 CEST—Mon 2020-10-12 21:45:42 CEST"
    many = "".join(f"{-n} {n:032x} {span}\n" for n in range(6, -1, -1))
    fake_command(tmp_path / "bin", "journalctl", [("--list-boots*", many, "", 0), ("-k?-b?*", "", "", 0)])
    reader = node(tmp_path)
    got = drv.collect_xid_history(reader)
    assert [b["offset"] for b in got["boots"]] == [-1, -2, -3]
    assert len([c for c in reader.commands if c["argv"][:2] == ["journalctl", "-k"]]) == 3


# -- counters sampled twice ----------------------------------------------------------------------------


def test_parse_nvlink_errors_of_an_h100_and_of_a_gpu_without_nvlink() -> None:
    # The H100 of stas00/ml-engineering: Replay, Recovery and CRC Errors per link (links 0, 1 and 17 shown).
    parsed = counters.parse_nvlink_errors(health("nvlink_e_h100_ml_engineering.txt"))
    assert sorted(parsed[0], key=int) == ["0", "1", "17"]
    assert parsed[0]["17"] == {"replay": 0, "recovery": 0, "crc": 0}
    # The real H200 in a VM printed nothing: no links, no counters.
    assert counters.parse_nvlink_errors(health("h200_r580/health-nvlink-e.txt")) == {}


def _ib_tree(root: Path, values: dict[str, int]) -> None:
    d = root / "sys/class/infiniband/mlx5_3/ports/1/counters"
    d.mkdir(parents=True, exist_ok=True)
    for name in counters.IB_COUNTERS:
        (d / name).write_text(f"{values.get(name, 0)}\n")


def test_ib_counters_sampled_twice_become_pairs(tmp_path: Path) -> None:
    reader = node(tmp_path)
    root = tmp_path / "root"
    _ib_tree(root, {"symbol_error": 41, "link_downed": 3})
    first = counters.sample_counters(reader, use_nvml=False)
    _ib_tree(root, {"symbol_error": 41, "link_downed": 4})
    second = counters.sample_counters(reader, use_nvml=False)
    driver, rdma = counters.counter_facts(first, second)
    # No nvidia-smi on this node: the GPU counters are unknown, with the reason.
    assert driver["gpus"] == {} and "nvidia-smi: command not found" in driver["reason"]
    assert rdma["ports"]["mlx5_3/1"]["link_downed"] == [3, 4]
    assert rdma["ports"]["mlx5_3/1"]["symbol_error"] == [41, 41]
    assert rdma["interval_s"] >= 1


class _Counting(types.ModuleType):
    """Just enough of pynvml for the counter sample: 2 GPUs with 18 links each (H100/H200 NVLink 4); GPU 1's
    link 7 adds one recovery and 700 CRC flit errors per session, its PCIe replay counter 60."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = 36

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.session = 0

    def nvmlInit(self) -> None:
        self.session += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= 18:
            raise pynvml.NVMLError_InvalidArgument()
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        if handle == 1 and link == 7:
            return {pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: self.session,
                    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 700 * self.session}.get(counter, 0)
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return 60 * self.session if handle == 1 else 0


def test_gpu_counters_sampled_twice_through_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _Counting())
    reader = node(tmp_path)
    first = counters.sample_counters(reader)
    second = counters.sample_counters(reader)
    driver, _rdma = counters.counter_facts(first, second)
    assert driver["source"] == "nvml" and len(driver["gpus"]["0"]["nvlink"]) == 18
    assert driver["gpus"]["1"]["nvlink"]["7"]["recovery"] == [1, 2]
    assert driver["gpus"]["1"]["nvlink"]["7"]["crc_flit"] == [700, 1400]
    assert driver["gpus"]["1"]["pcie_replay"] == [60, 120]


# -- the NCCL transport ----------------------------------------------------------------------------------

NCCL, nccl_text = fixtures("nccl_transport")


@pytest.mark.parametrize(("name", "network", "extra"), [
    ("socket_no_ib_device_nccl352.txt", "Socket", {"ib_no_device": True, "socket": True}),
    ("ib_gdr_disabled_nccl1537.txt", "IB", {"gdr_disabled": ["mlx5_0", "mlx5_1"], "gdr_enabled": []}),
    ("channels_socket_p2p_nccl952.txt", "Socket", {"channels": {"P2P/IPC": 3, "NET/Socket": 4}}),
    ("../../../k3fleet/lab/active_data/nccl_info_ib_hca_nccltests228.txt", "IB", {
        "ib_hca": "mlx5_2:1,mlx5_0:1", "ib_devices": "[0]mlx5_0:1/IB [1]mlx5_2:1/IB"}),
    ("../../../k3fleet/lab/active_data/nccl_info_p2p_direct_pointer_nccl892.txt", None, {
        "channels": {"P2P/direct pointer": 2}}),
    ("nvls_mnnvl_available_nccl1584.txt", "IBext_v8", {"nvls": True, "mnnvl_uuid": "0.0"}),
    ("nvls_not_available_awsofi715.txt", None, {"nvls": False}),
])
def test_parse_nccl_transport(name: str, network: str | None, extra: dict[str, Any]) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import parse_nccl_transport

    t = parse_nccl_transport(nccl_text(name))
    assert t is not None and t["network"] == network
    assert {k: t[k] for k in extra} == extra


def test_a_pair_over_sockets_fails_whatever_its_bandwidth_and_says_why() -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import parse_nccl_transport
    from k3fleet.models.pairs import PairRun
    from k3fleet.targets import load_target
    from k3fleet.verdict.pairs import judge_pairs

    def run(name: str, busbw: float) -> PairRun:
        return PairRun(ran=True, rc=0, hosts=["a01", "a02"], round=1, gpus=8, ranks=16, max_bytes=8589934592,
                       peak_busbw_gbs=busbw, gpu_model="NVIDIA H200", transport=parse_nccl_transport(nccl_text(name)))

    target = load_target(None)
    # NET/IB found no device: the pair ran over sockets; even at 400 GB/s it fails, with the reason.
    found = judge_pairs([run("socket_no_ib_device_nccl352.txt", 400.0)], {}, target)
    socket = [f for f in found["a01"] if f.check_id == "active.nccl_pair_transport"]
    assert socket and socket[0].severity == "error"
    assert "ran over Socket, not RDMA" in socket[0].message and "NET/IB found no device" in socket[0].message
    # Over IB: no transport finding.
    ok = judge_pairs([run("../../../k3fleet/lab/active_data/nccl_info_ib_hca_nccltests228.txt", 400.0)], {}, target)
    assert not [f for fs in ok.values() for f in fs if f.check_id == "active.nccl_pair_transport"]


def test_socket_reasons_name_the_cause() -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import parse_nccl_transport
    from k3fleet.models.facts import NcclTransport
    from k3fleet.verdict.pairs import socket_reason

    gdr = NcclTransport.model_validate(parse_nccl_transport(nccl_text("ib_gdr_disabled_nccl1537.txt")))
    assert socket_reason(gdr).startswith("GPU Direct RDMA disabled for mlx5_0, mlx5_1: no nvidia_peermem")
    wrong_hca = NcclTransport(ib_no_device=True, ib_hca="mlx5_9:1", socket=True)
    assert "NCCL_IB_HCA=mlx5_9:1 matches none" in socket_reason(wrong_hca)


def test_within_node_channels_not_over_p2p_fail_on_an_nvswitch_node() -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import parse_nccl_transport
    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    base = (Path(__file__).resolve().parents[1] / "fixtures/verdict/host_r580_h200_hgx.json").read_text()

    def judged(transport: dict[str, Any] | None) -> dict[str, Any]:
        import json

        data = json.loads(base)
        data["active"] = {"status": "ok", "level": "full", "nccl": {"ran": True, "rc": 0, "gpus": 8, "ranks": 8,
                                                                     "peak_busbw_gbs": 450.0, "transport": transport}}
        found = evaluate_host(HostFacts.model_validate(data), load_target(None))
        return {f.check_id: f for f in found if f.check_id == "active.nccl_transport"}

    # nccl issue 952's channels: P2P/IPC and NET/Socket, with P2P present: passes.
    assert judged(parse_nccl_transport(nccl_text("channels_socket_p2p_nccl952.txt"))) == {}
    # Only sockets between the GPUs of an NVSwitch node: fails.
    only_socket = parse_nccl_transport("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n")
    assert only_socket is not None and only_socket["channels"] == {"SHM": 1}
    f = judged(only_socket)["active.nccl_transport"]
    assert "channels go over SHM, none over P2P (NVLink)" in f.message
    # No INFO line at all: unknown, never a pass.
    assert judged(None)["active.nccl_transport"].kind == "unknown"


# -- dcgmi diag -j -------------------------------------------------------------------------------------

ACTIVE_DATA = Path(__file__).resolve().parents[2] / "k3fleet" / "lab" / "active_data"


def _dcgm_found(dcgm: dict[str, Any]) -> Any:
    import json

    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    data = json.loads((Path(__file__).resolve().parents[1] / "fixtures/verdict/host_r580_h200_hgx.json").read_text())
    data["active"] = {"status": "ok", "level": "full", "dcgm": {"ran": True, "rc": 0, "level": 3, **dcgm}}
    return next((f for f in evaluate_host(HostFacts.model_validate(data), load_target(None))
                 if f.check_id == "active.dcgm_diag"), None)


def test_dcgmi_json_gives_codes_and_the_failure_names_them() -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import parse_dcgmi_diag

    parsed = parse_dcgmi_diag((ACTIVE_DATA / "dcgmi_diag_r2_gpu_memory_fail_excerpt.json").read_text())
    assert (parsed["format"], parsed["result"]) == ("json", "fail")
    (memory,) = parsed["tests"]
    assert (memory["name"], memory["failed_gpus"], memory["codes"]) == (
        "GPU Memory", [0], [{"id": 66, "severity": 4, "category": 6, "gpu": 0}])
    f = _dcgm_found(parsed)
    assert f.kind == "fail" and "GPU Memory fails on GPU 0: DCGM_FR_CUDA_CONTEXT" in f.message
    assert "TRIAGE: triage: run a field diagnostic" in f.message


def _one(name: str, status: str, codes: list[dict[str, Any]], text: str = "") -> dict[str, Any]:
    return {"result": "fail" if status == "fail" else "pass", "format": "json", "tests": [
        {"section": "Hardware", "name": name, "result": status, "failed_gpus": [0] if status == "fail" else [],
         "details": [{"kind": "warning", "text": text}] if text else [], "codes": codes}]}


def test_a_test_that_could_not_run_is_unknown_not_a_fail() -> None:
    # DCGM_FR_TEST_DISABLED (48): the test did not run on this GPU.
    f = _dcgm_found(_one("Targeted Stress", "fail", [{"id": 48, "severity": 5, "gpu": 0}]))
    assert f.kind == "unknown" and "Targeted Stress could not run: DCGM_FR_TEST_DISABLED" in f.message


def test_documented_false_results_are_recognised() -> None:
    # NVIDIA/DCGM 272: nvbandwidth's "MCUTIL > 10%" right after the level-3 burn.
    f = _dcgm_found(_one("nvbandwidth", "fail", [{"id": 34, "gpu": 0}], "MCUTIL > 10% on GPU 0"))
    assert f.kind == "unknown" and "issue 272" in f.message
    # NVIDIA/DCGM 284: a memory test that passes with DCGM_FR_MEMORY_ALLOC.
    f = _dcgm_found(_one("memory", "pass", [{"id": 56, "gpu": 0}]))
    assert f.kind == "unknown" and "issue 284" in f.message


def test_exit_226_is_the_diagnostics_own_failure() -> None:
    f = _dcgm_found({"rc": 226, "result": None, "tests": []})
    assert f.kind == "unknown" and "DCGM_ST_NVVS_ERROR" in f.message


def test_dcgmi_runs_with_json_and_the_expected_gpu_count() -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import dcgmi_diag_argv

    assert dcgmi_diag_argv(3, 8) == ["dcgmi", "diag", "-r", "3", "-j", "--expectedNumEntities", "gpu:8"]


# -- GPU / NIC topology ------------------------------------------------------------------------------------


def test_topology_of_four_h100_with_their_own_nics() -> None:
    topo = smi.parse_topo_matrix(health("topo_h100x4_nv6_pix_nccl1617.txt"))
    assert topo["nics"] == ["NIC0", "NIC1", "NIC2", "NIC3"]
    assert topo["gpus"]["0"] == {"nearest_nic": "NIC0", "distance": "PIX", "cpu_affinity": "6,14,22,30", "numa": "3"}
    assert [g["distance"] for g in topo["gpus"].values()] == ["PIX"] * 4


def test_topology_of_the_real_h200_without_a_nic() -> None:
    topo = smi.parse_topo_matrix(health("h200_r580/nvidia-smi-topo.txt"))
    assert topo == {"nics": [], "gpus": {"0": {"nearest_nic": None, "distance": None, "cpu_affinity": "0-15",
                                               "numa": "0"}}}


def test_a_gpu_whose_nearest_nic_is_across_the_socket_fails() -> None:
    import json

    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    def found(name: str) -> list[Any]:
        host = Path(__file__).resolve().parents[1] / "fixtures/verdict/host_r580_h200_hgx.json"
        data = json.loads(host.read_text())
        data["driver"]["topology"] = dict(smi.parse_topo_matrix(health(name)), status="ok")
        return [f for f in evaluate_host(HostFacts.model_validate(data), load_target(None))
                if f.check_id == "rdma.gpu_nic_topology"]

    assert found("topo_h100x4_nv6_pix_nccl1617.txt") == []
    (f,) = found("topo_h100x4_gpu3_nic_across_socket.txt")
    assert f.kind == "fail" and "GPU 3 nearest NIC0 at SYS" in f.message
    assert f.evidence["gpus"]["3"]["numa"] == "5"


def test_grdma_override_read_as_aicr_reads_it() -> None:
    # NVIDIA/aicr's validator test: "GrdmaPciTopoCheckOverride: 1" set, absent, explicitly 0; and the key
    # inside the RegistryDwords string.
    assert drv.parse_grdma_override("ModifyDeviceFiles: 1\nGrdmaPciTopoCheckOverride: 1\nEnablePCIeGen3: 0\n")
    assert not drv.parse_grdma_override("ModifyDeviceFiles: 1\nEnablePCIeGen3: 0\n")
    assert not drv.parse_grdma_override("GrdmaPciTopoCheckOverride: 0\n")
    assert drv.parse_grdma_override('RegistryDwords: "ForceP2P=0x11;GrdmaPciTopoCheckOverride=1"\n')
