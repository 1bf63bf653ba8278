"""What an expert reads in a node's output: NVLink fabric health, R610 headers, GPUs in use, Jetson.

Parsers run on recorded outputs (tests/fixtures/driver/SOURCES.md names each source and says which
are adapted or synthetic); NVML runs through a fake pynvml that uses the real structures, error
classes and constants of nvidia-ml-py.
"""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nodetree import fake_command, fixtures, node, without_nvml

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_driver as drv
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml as nvml
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_smi as smi
from k3fleet.models.facts import DriverFacts

FIX, fixture = fixtures("driver")
_HEALTH, health_fixture = fixtures("gpu_health")
H100_Q = "smi_q_565_h100x8_fabric_completed.txt"


def with_block(q: str, bus: str, section: str, block: str) -> str:
    """Replace the ``section`` (e.g. "    Fabric") of GPU ``bus`` in a full -q text with ``block``."""
    lines = q.splitlines(keepends=True)
    start = lines.index(f"GPU {bus}\n")
    pos = start + 1
    while lines[pos].rstrip("\n") != section:
        pos += 1
    end = pos + 1
    while end < len(lines) and (lines[end].startswith(" " * (len(section) - len(section.lstrip()) + 1))):
        end += 1
    return "".join(lines[:pos]) + block + "".join(lines[end:])


# -- header: old and R610 layouts ---------------------------------------------------------------


@pytest.mark.parametrize(("name", "driver", "cuda"), [
    ("smi_q_580_header_wide.txt", "580.159.04", "13.0"),
    ("smi_q_610_header_kmd.txt", "610.43.02", "13.3"),
    ("smi_q_kmd_only_header.txt", "615.23", "13.4"),
])
def test_header_reads_old_and_new_layouts(name: str, driver: str, cuda: str) -> None:
    assert smi.parse_smi_q_cuda(fixture(name)) == {"driver_version": driver, "cuda_version": cuda}


def test_header_prefers_the_new_spelling_when_they_disagree() -> None:
    kmd = "KMD Version" + " " * 44 + ": "
    text = fixture("smi_q_610_header_kmd.txt").replace(kmd + "610.43.02", kmd + "610.57.04")
    assert smi.parse_smi_q_cuda(text)["driver_version"] == "610.57.04"


@pytest.mark.parametrize(("value", "stripped"), [
    ("610.43.02 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]", "610.43.02"),
    ("13.3 [Deprecated]", "13.3"),
    ("[N/A]", "[N/A]"),
    ("580.95.05", "580.95.05"),
])
def test_strip_annotation(value: str, stripped: str) -> None:
    assert smi.strip_annotation(value) == stripped


def test_csv_driver_version_with_a_deprecation_note() -> None:
    row = "0, NVIDIA B200, GPU-x, 610.43.02 [Deprecated], 183359, Enabled, 00000000:63:00.0, 10.0"
    assert smi.parse_smi_csv(row)[0]["driver_version"] == "610.43.02"


# -- fabric health ---------------------------------------------------------------------------------


def health_of(block_name: str) -> dict[str, Any]:
    q = with_block(fixture(H100_Q), "00000000:18:00.0", "    Fabric", fixture(block_name))
    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}]
    assert smi.apply_smi_q(gpus, q) == (None, None)
    return gpus[0]


def test_fabric_health_healthy_gb300() -> None:
    gpu = health_of("smi_q_gb300_580_fabric_health_healthy_block.txt")
    assert (gpu["fabric_state"], gpu["fabric_status"]) == ("completed", "success")
    assert gpu["fabric_health"] == {
        "summary": "healthy", "bandwidth": "full", "route_recovery_in_progress": False, "route_unhealthy": False,
        "access_timeout_recovery": False, "incorrect_configuration": "none", "partition_assigned": None,
        "gfm_state": None, "other": {}}


def test_fabric_health_route_unhealthy() -> None:
    health = health_of("smi_q_gb200_580_fabric_route_unhealthy_block.txt")["fabric_health"]
    assert (health["summary"], health["route_unhealthy"], health["bandwidth"]) == ("unhealthy", True, "full")
    assert health["partition_assigned"] is None  # 580.65.06 prints no such line


def test_fabric_health_degraded_bandwidth() -> None:
    health = health_of("smi_q_fabric_bandwidth_degraded_block.txt")["fabric_health"]
    assert (health["summary"], health["bandwidth"]) == ("limited_capacity", "degraded")


def test_fabric_health_newer_fields_and_unknown_ones() -> None:
    block = fixture("smi_q_615_fabric_health_gfm_block.txt") + (
        "            Link Training Margin                       : Nominal\n"
        "            Route Unhealthy Count                      : 3\n")
    health = health_of_text(block)
    assert (health["partition_assigned"], health["gfm_state"], health["summary"]) == (True, "connected", "healthy")
    # Fields this parser does not know are kept as printed, never an error.
    assert health["other"] == {"Link Training Margin": "Nominal", "Route Unhealthy Count": "3"}


def health_of_text(block: str) -> dict[str, Any]:
    q = with_block(fixture(H100_Q), "00000000:18:00.0", "    Fabric", block)
    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}]
    smi.apply_smi_q(gpus, q)
    health: dict[str, Any] = gpus[0]["fabric_health"]
    return health


def test_fabric_health_value_it_cannot_read_is_kept() -> None:
    block = fixture("smi_q_gb200_580_fabric_route_unhealthy_block.txt").replace(
        "Route Unhealthy                            : True", "Route Unhealthy                            : Pending")
    health = health_of_text(block)
    assert health["route_unhealthy"] is None
    assert health["other"] == {"Route Unhealthy": "Pending"}


def test_fabric_health_r565_prints_only_bandwidth() -> None:
    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}]
    smi.apply_smi_q(gpus, fixture(H100_Q))
    health = gpus[0]["fabric_health"]
    assert health is not None and all(v is None for k, v in health.items() if k != "other")


def test_fabric_health_na_block_of_580_h100() -> None:
    # A single-node HGX on 580.159 prints every health field N/A (gpu-operator#2511).
    block = fixture("smi_q_580_fabric_in_progress_block.txt")
    health = smi.parse_fabric_health(smi.parse_smi_q_blocks("GPU 00000000:18:00.0\n" + block)
                                     ["00000000:18:00.0"][0][2][4][2])
    assert health == {field: None for field, _ in smi.SMI_FABRIC_HEALTH_FIELDS.values()} | {"other": {}}


# -- memory in use and processes ----------------------------------------------------------------


def test_memory_and_processes_from_a_real_busy_node() -> None:
    blocks = smi.parse_smi_q_blocks(fixture("smi_q_535_rtx4090x8_fabric_na.txt"))
    gpus = [{"index": i, "pci_bus_id": bus} for i, bus in enumerate(blocks)]
    fabric_note, usage_note = smi.apply_smi_q(gpus, fixture("smi_q_535_rtx4090x8_fabric_na.txt"))
    assert usage_note is None
    assert [g["memory_used_mib"] for g in gpus] == [0, 21608, 0, 0, 23638, 0, 0, 0]
    busy = {g["index"]: g["processes"] for g in gpus if g["processes"]}
    assert busy == {1: [{"pid": 1285135, "type": "C", "name": "/usr/bin/python", "used_memory_mib": 21602}],
                    4: [{"pid": 1292330, "type": "C", "name": "/usr/bin/python", "used_memory_mib": 23632}]}
    assert all(g["processes"] == [] for g in gpus if g["index"] not in busy)
    assert fabric_note == "GPU fabric state unknown: GPU 0-7: State N/A"


def test_several_processes_and_a_missing_section() -> None:
    text = ("GPU 00000000:18:00.0\n"
            "    FB Memory Usage\n"
            "        Total                             : 143771 MiB\n"
            "        Used                              : N/A\n"
            "    Processes\n"
            "        GPU instance ID                   : N/A\n"
            "        Compute instance ID               : N/A\n"
            "        Process ID                        : 4101\n"
            "            Type                          : C\n"
            "            Name                          : python3\n"
            "            Used GPU Memory               : 70000 MiB\n"
            "        GPU instance ID                   : N/A\n"
            "        Compute instance ID               : N/A\n"
            "        Process ID                        : 4102\n"
            "            Type                          : C+G\n"
            "            Name                          : /usr/bin/Xorg\n"
            "            Used GPU Memory               : N/A\n"
            "GPU 00000000:2A:00.0\n"
            "    Product Name                          : NVIDIA H200\n")
    gpus = [{"index": 0, "pci_bus_id": "00000000:18:00.0"}, {"index": 1, "pci_bus_id": "00000000:2A:00.0"}]
    _, note = smi.apply_smi_q(gpus, text)
    assert gpus[0]["memory_used_mib"] is None
    assert [(p["pid"], p["type"], p["used_memory_mib"]) for p in gpus[0]["processes"]] == [
        (4101, "C", 70000), (4102, "C+G", None)]
    # A block cut before its memory and process sections says so: unknown, never "idle".
    assert (gpus[1]["memory_used_mib"], gpus[1]["processes"]) == (None, None)
    assert note == "GPU memory use and processes unknown: GPU 1: no FB Memory Usage or Processes section"


# -- NVML: health mask, v3 -> v2 fallback, processes ----------------------------------------------


def mask(**fields: int) -> int:
    shifts = {"bw": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
              "recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
              "route": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
              "timeout": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
              "config": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION,
              "partition": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_PARTITION_ASSIGNED,
              "gfm": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE}
    return sum(value << shifts[name] for name, value in fields.items())


def test_decode_fabric_health_uses_the_bindings_bit_layout() -> None:
    healthy = mask(bw=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE,
                   recovery=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE,
                   route=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE,
                   timeout=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE,
                   config=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE,
                   gfm=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED)
    got = nvml.decode_fabric_health(healthy, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
    assert got == {"summary": "healthy", "bandwidth": "full", "route_recovery_in_progress": False,
                   "route_unhealthy": False, "access_timeout_recovery": False, "incorrect_configuration": "none",
                   "partition_assigned": None, "gfm_state": "connected", "other": {}, "mask": healthy}
    bad = mask(bw=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE,
               route=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE,
               config=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS)
    got = nvml.decode_fabric_health(bad, pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
    assert (got["summary"], got["bandwidth"], got["route_unhealthy"], got["incorrect_configuration"]) == (
        "unhealthy", "degraded", True, "insufficient_nvlinks")
    # A value newer than this table is reported, not guessed.
    odd = nvml.decode_fabric_health(mask(config=13), 7)
    assert odd["incorrect_configuration"] is None and odd["summary"] is None
    assert odd["other"] == {"incorrect_configuration": "unknown value 13", "summary": "unknown value 7"}


class FabricNvml(types.ModuleType):
    """pynvml's fabric and process calls over one GPU, with the real structures and errors."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
    c_nvmlGpuFabricInfo_v3_t = pynvml.c_nvmlGpuFabricInfo_v3_t

    def __init__(self, *, knows_v3: bool = True, health_mask: int = 0, summary: int = 0,
                 processes: list[Any] | BaseException | None = None, names: dict[int, Any] | None = None,
                 used: int = 0) -> None:
        super().__init__("pynvml")
        self.knows_v3 = knows_v3
        self.health_mask = health_mask
        self.summary = summary
        self.processes = processes
        self.names = names or {}
        self.used = used
        self.versions: list[int] = []

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.173.02"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA GB300"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-00000001-0000-0000-0000-000000000001"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        total = 284208 * 1024 * 1024
        return types.SimpleNamespace(total=total, used=self.used, free=total - self.used)

    def nvmlDeviceGetPersistenceMode(self, handle: int) -> int:
        return 1

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return (10, 3)

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(busId="00000008:01:00.0")

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, ref: Any) -> int:
        info = ref._obj
        self.versions.append(int(info.version))
        if info.version == pynvml.nvmlGpuFabricInfo_v3 and not self.knows_v3:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        info.status = pynvml.NVML_SUCCESS
        info.healthMask = self.health_mask
        if hasattr(info, "healthSummary"):
            info.healthSummary = self.summary
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if isinstance(self.processes, BaseException):
            raise self.processes
        return list(self.processes or [])

    def nvmlSystemGetProcessName(self, pid: int) -> Any:
        name = self.names.get(pid)
        if isinstance(name, BaseException):
            raise name
        return name


def proc(pid: int, mib: int | None) -> Any:
    return types.SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * 1024 * 1024,
                                 gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def test_nvml_v3_health_summary() -> None:
    route = mask(route=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE)
    nv = FabricNvml(health_mask=route, summary=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY, processes=[])
    (gpu,) = nvml.collect_nvml(nv)["gpus"]
    assert nv.versions == [pynvml.nvmlGpuFabricInfo_v3]
    assert (gpu["fabric_health"]["summary"], gpu["fabric_health"]["route_unhealthy"]) == ("unhealthy", True)


def test_nvml_falls_back_to_v2_on_an_older_driver() -> None:
    degraded = mask(bw=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE)
    nv = FabricNvml(knows_v3=False, health_mask=degraded, processes=[])
    (gpu,) = nvml.collect_nvml(nv)["gpus"]
    assert nv.versions == [pynvml.nvmlGpuFabricInfo_v3, pynvml.nvmlGpuFabricInfo_v2]
    # v2 carries the mask but no summary: the summary stays unknown, the fields are read.
    assert (gpu["fabric_health"]["summary"], gpu["fabric_health"]["bandwidth"]) == (None, "degraded")
    assert gpu["fabric_state"] == "completed"


def test_nvml_running_processes_and_memory_in_use() -> None:
    nv = FabricNvml(processes=[proc(4101, 131072), proc(4102, None)], names={4101: b"python3",
                    4102: pynvml.NVMLError_NotFound()}, used=131584 * 1024 * 1024)
    got = nvml.collect_nvml(nv)
    (gpu,) = got["gpus"]
    assert gpu["memory_used_mib"] == 131584
    assert gpu["processes"] == [{"pid": 4101, "type": "C", "name": "python3", "used_memory_mib": 131072},
                                {"pid": 4102, "type": "C", "name": None, "used_memory_mib": None}]
    assert got["note"] is None


@pytest.mark.parametrize("error", [pynvml.NVMLError_NotSupported(), pynvml.NVMLError_FunctionNotFound(),
                                   pynvml.NVMLError_NoPermission()])
def test_nvml_processes_that_cannot_be_listed_stay_unknown(error: BaseException) -> None:
    got = nvml.collect_nvml(FabricNvml(processes=error))
    assert got["nvml"]["status"] == "ok"
    assert got["gpus"][0]["processes"] is None
    assert got["note"].startswith(f"GPU compute processes unknown: GPU 0: {type(error).__name__}")


def test_nvml_struct_sizes_match_the_bindings() -> None:
    # The versions nvidia-ml-py stamps into the structures the collector passes by reference.
    assert ctypes.sizeof(pynvml.c_nvmlGpuFabricInfo_v3_t) == pynvml.nvmlGpuFabricInfo_v3 & 0xFFFFFF
    assert ctypes.sizeof(pynvml.c_nvmlGpuFabricInfoV_t) == pynvml.nvmlGpuFabricInfo_v2 & 0xFFFFFF


def test_collect_driver_carries_health_and_use_through_the_model(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FabricNvml(
        health_mask=mask(bw=pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE),
        summary=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY, processes=[proc(7, 100000)],
        names={7: "vllm"}, used=100500 * 1024 * 1024))
    facts = DriverFacts.model_validate(drv.collect_driver(node(tmp_path, {
        "/proc/driver/nvidia/version": fixture("proc_version_proprietary_580.txt")})))
    gpu = facts.gpus[0]
    assert gpu.fabric_health is not None and gpu.fabric_health.summary == "limited_capacity"
    assert gpu.memory_used_mib == 100500 and gpu.processes is not None and gpu.processes[0].name == "vllm"


# -- Jetson / L4T ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "release"), [
    ("nv_tegra_release_r32_7_6.txt", "32.7.6"),
    ("nv_tegra_release_r32_5_1.txt", "32.5.1"),
])
def test_parse_nv_tegra_release(name: str, release: str) -> None:
    assert drv.parse_nv_tegra_release(fixture(name)) == release


def test_parse_nv_tegra_release_rejects_other_text() -> None:
    assert drv.parse_nv_tegra_release("R35.3.1\n") is None
    assert drv.parse_nv_tegra_release("") is None


def test_jetpack5_module_version_is_an_l4t_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvml(monkeypatch)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_aarch64.txt")})
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    assert facts["kernel_module"]["version"] == "35.3.1" and facts["kernel_module"]["arch"] == "aarch64"
    assert facts["platform"]["kind"] == "tegra" and facts["platform"]["l4t_release"] == "35.3.1"
    assert "is an L4T release, not a driver branch" in facts["platform"]["evidence"]


def test_jetpack6_is_tegra_by_its_release_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvml(monkeypatch)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_aarch64_540_jetpack6.txt"),
                             "/etc/nv_tegra_release": "# R36 (release), REVISION: 4.4\n"})
    facts = drv.collect_driver(reader)
    # 540 looks like a branch: only the platform evidence tells it is a Tegra driver.
    assert facts["kernel_module"]["version"] == "540.4.0"
    assert facts["platform"] == {"kind": "tegra", "l4t_release": "36.4.4",
                                 "evidence": "/etc/nv_tegra_release: # R36 (release), REVISION: 4.4"}


def test_tegra_by_device_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc" / "device-tree").mkdir(parents=True)
    (root / "proc" / "device-tree" / "compatible").write_bytes((FIX / "device_tree_compatible_orin_nano.bin")
                                                                .read_bytes())
    reader = node(tmp_path)
    got = drv.platform_facts(reader, {"version": "540.4.0", "arch": "aarch64"})
    assert got == {"kind": "tegra", "l4t_release": None, "evidence": "device tree compatible: nvidia,tegra234"}


def test_grace_hopper_aarch64_is_not_tegra(tmp_path: Path) -> None:
    # GH200 runs data-center drivers on aarch64: architecture alone never makes a Jetson.
    got = drv.platform_facts(node(tmp_path), {"version": "580.95.05", "arch": "aarch64"})
    assert got == {"kind": "discrete", "l4t_release": None, "evidence": None}


def test_no_module_no_platform(tmp_path: Path) -> None:
    assert drv.platform_facts(node(tmp_path), {"version": None})["kind"] is None


def test_smi_path_reads_r610_header_and_usage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_nvml(monkeypatch)
    # The R610 header over the GPU blocks of a real full -q.
    h100 = fixture(H100_Q)
    q = fixture("smi_q_610_header_kmd.txt") + h100[h100.index("GPU 00000000:"):]
    fake_command(tmp_path / "bin", "nvidia-smi", [("*--query-gpu*", fixture("smi_query_h100x8.csv"), "", 0),
                                                  ("-q*", q, "", 0)])
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")})
    facts = DriverFacts.model_validate(drv.collect_driver(reader))
    assert facts.cuda_driver_version == "13.3"
    assert [g.processes for g in facts.gpus] == [[]] * 8
    assert all(g.memory_used_mib == 1 for g in facts.gpus)  # an idle H100 shows 1 MiB in use


# -- a recorded H200 node, idle and with a process holding 100 GiB ---------------------------------------


@pytest.mark.parametrize(("name", "used", "procs"), [
    ("smi_q_580_h200_idle.txt", 0, []),
    ("smi_q_580_h200_busy_100gib.txt", 103019, [{"pid": 443, "type": "C", "name": "python3",
                                                 "used_memory_mib": 103010}]),
])
def test_recorded_h200_idle_and_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, used: int,
                                     procs: list[dict[str, Any]]) -> None:
    without_nvml(monkeypatch)
    # `nvidia-smi nvlink -s` of the same H200 (no NVLink in that VM) printed nothing at all, exit 0
    # (tests/fixtures/gpu_health/h200_r580/health-nvlink-s.txt).
    fake_command(tmp_path / "bin", "nvidia-smi", [("*--query-gpu*", fixture("smi_query_h200_580.csv"), "", 0),
                                                  ("-q*", fixture(name), "", 0),
                                                  ("nvlink*", health_fixture("h200_r580/health-nvlink-s.txt"), "", 0)])
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")})
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    assert (facts["driver_version"], facts["cuda_driver_version"]) == ("580.159.04", "13.0")
    (gpu,) = facts["gpus"]
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"], gpu["processes"]) == (143771, used, procs)
    # nvidia-smi's Used leaves out the driver's 616 MiB reserved memory.
    assert (gpu["memory_reserved_mib"], gpu["memory_source"]) == (616, "nvidia-smi")
    # An empty `nvlink -s` is "no links", not "every link healthy".
    assert (gpu["nvlink"]["links"], gpu["nvlink"]["source"]) == (0, "nvidia-smi")
    # A GPU without an NVLink fabric: State N/A and the whole R580.159 Health block N/A.
    assert gpu["fabric_state"] is None
    assert gpu["fabric_health"] == {field: None for field, _ in smi.SMI_FABRIC_HEALTH_FIELDS.values()} | {"other": {}}
    assert facts["reason"] == "GPU fabric state unknown: GPU 0: State N/A"


def test_recorded_busy_h200_is_judged_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict import evaluate_host

    without_nvml(monkeypatch)
    fake_command(tmp_path / "bin", "nvidia-smi", [("*--query-gpu*", fixture("smi_query_h200_580.csv"), "", 0),
                                                  ("-q*", fixture("smi_q_580_h200_busy_100gib.txt"), "", 0)])
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")})
    facts = HostFacts.model_validate({"host": "h200-1", "driver": drv.collect_driver(reader)})
    (f,) = [f for f in evaluate_host(facts, load_target(None)) if f.check_id == "gpu.in_use"]
    assert f.message == (
        "GPU 0 in use (103019 of 143771 MiB in use on GPU 0); 1 compute process(es): pid 443 python3: vLLM's "
        "start-up memory check (gpu_memory_utilization 0.9) would fail on GPU 0; a drain or driver change would "
        "end this workload")
