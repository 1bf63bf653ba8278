"""Driver/GPU collector: parsers on recorded real output, NVML through a fake pynvml, nvidia-smi fallback.

Fixture sources: tests/fixtures/driver/SOURCES.md.
"""

from __future__ import annotations

import ctypes
import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nodetree import NO_NVML_LIBRARY, fake_command, fixtures, node, without_nvml

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_driver as drv
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_gpu_common as gpu_common
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml as nvml
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_smi as smi_src
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.models.facts import DriverFacts

FIX, fixture = fixtures("driver")


def smi(tmp_path: Path, csv: str, q: str, rc: int = 0, stderr: str = "") -> None:
    fake_command(tmp_path / "bin", "nvidia-smi", [
        ("*--query-gpu*", csv, stderr, rc),
        ("-q*", q, stderr, rc),
    ])


# -- /proc/driver/nvidia/version ---------------------------------------------------


@pytest.mark.parametrize(("name", "version", "flavour", "arch"), [
    ("proc_version_open_x86_64.txt", "565.57.01", "open", "x86_64"),
    ("proc_version_open_x86_64_nodate.txt", "525.60.11", "open", "x86_64"),
    ("proc_version_open_aarch64.txt", "35.3.1", "open", "aarch64"),
    ("proc_version_proprietary_580.txt", "580.173.02", "proprietary", "x86_64"),
    ("proc_version_proprietary_510.txt", "510.60.02", "proprietary", "x86_64"),
    ("proc_version_proprietary_550.txt", "550.90.07", "proprietary", "x86_64"),
])
def test_parse_proc_version_both_flavours(name: str, version: str, flavour: str, arch: str) -> None:
    parsed = drv.parse_proc_version(fixture(name))
    assert (parsed["version"], parsed["flavour"], parsed["arch"]) == (version, flavour, arch)
    assert parsed["raw"] == fixture(name).splitlines()[0].strip()


@pytest.mark.parametrize(("text", "message"), [
    (fixture("proc_version_truncated.txt"), "no driver version"),
    ("", "empty"),
    ("GCC version:  gcc version 12.2.0 (GCC)\n", "not 'NVRM version:'"),
    (fixture("nvidia_smi_mismatch.txt"), "not 'NVRM version:'"),
])
def test_parse_proc_version_rejects_short_or_foreign_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        drv.parse_proc_version(text)


def test_parse_proc_modules_talos() -> None:
    modules = drv.parse_proc_modules(fixture("proc_modules_talos.txt"))
    assert set(modules) == {"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}
    assert modules["nvidia"] == {"size": 39047168, "refcount": None, "state": "Live"}


def test_parse_proc_modules_skips_a_half_line() -> None:
    text = fixture("proc_modules_talos.txt")
    cut = text[: text.index("nvidia 39047168") + len("nvidia 3904")]
    assert "nvidia" not in drv.parse_proc_modules(cut)
    assert "nvidia_modeset" in drv.parse_proc_modules(cut)


# -- nvidia-smi CSV ---------------------------------------------------------------------


def test_parse_smi_csv_query_fields() -> None:
    rows = smi_src.parse_smi_csv(fixture("smi_query_quadro_rtx4000.csv"))
    assert rows == [
        {"index": 0, "name": "Quadro RTX 4000", "uuid": "GPU-c7b57be0-94ff-d352-a59b-d0ee00aeed43",
         "driver_version": "535.129.03", "memory.total": 8192, "persistence_mode": False,
         "pci.bus_id": "00000000:06:00.0", "compute_cap": "7.5"},
        {"index": 1, "name": "Quadro RTX 4000", "uuid": "GPU-d6de6afc-bdfe-75c4-5273-0544439153fc",
         "driver_version": "535.129.03", "memory.total": 8192, "persistence_mode": False,
         "pci.bus_id": "00000000:07:00.0", "compute_cap": "7.5"},
    ]


def test_query_fields_are_the_command_line_fields() -> None:
    assert smi_src.SMI_QUERY_FIELDS == ("index", "name", "uuid", "driver_version", "memory.total",
                                    "persistence_mode", "pci.bus_id", "compute_cap")


@pytest.mark.parametrize(("name", "fields", "expected_first"), [
    ("smi_csv_l40s_header_units.csv", ("name", "driver_version", "memory.total", "pci.bus_id", "pci.device_id"),
     {"name": "NVIDIA L40S", "driver_version": "595.71.05", "memory.total": 46068,
      "pci.bus_id": "00000000:01:00.0", "pci.device_id": "0x26B910DE"}),
    ("smi_csv_titanv_rtx5880_header.csv", ("compute_cap", "compute_mode", "driver_version", "name", "index"),
     {"compute_cap": "7.0", "compute_mode": "Default", "driver_version": "570.86.15", "name": "NVIDIA TITAN V",
      "index": 0}),
    ("smi_csv_quadro_rtx6000_units.csv", ("name", "memory.total", "driver_version", "pci.device_id"),
     {"name": "Quadro RTX 6000", "memory.total": 24576, "driver_version": "570.211.01",
      "pci.device_id": "0x1E3010DE"}),
])
def test_parse_smi_csv_headers_and_units(name: str, fields: tuple[str, ...], expected_first: dict[str, Any]) -> None:
    rows = smi_src.parse_smi_csv(fixture(name), fields)
    assert len(rows) == 2
    assert rows[0] == expected_first


def test_parse_smi_csv_names_with_spaces_and_na() -> None:
    # The issue this comes from split the row on blanks and shifted every field after the name.
    fields = ("power.limit", "power.min_limit", "power.max_limit", "memory.total", "vbios_version",
              "driver_version", "name", "gpu_uuid", "power.draw", "temperature.gpu", "temperature.memory",
              "clocks.current.graphics", "clocks.sm", "clocks.mem", "utilization.gpu", "utilization.memory",
              "fan.speed", "pcie.link.width.current", "pstate")
    (row,) = smi_src.parse_smi_csv(fixture("smi_csv_rtx2080_na.csv"), fields)
    assert row["name"] == "GeForce RTX 2080"
    assert row["gpu_uuid"] == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"
    assert row["memory.total"] == 7979
    assert row["temperature.memory"] is None
    assert row["pstate"] == "P2"


@pytest.mark.parametrize(("text", "message"), [
    (fixture("smi_query_truncated.csv"), "line 2 has 3 fields, expected 8"),
    ("", "no GPU rows"),
    (fixture("nvidia_smi_mismatch.txt"), "has 1 fields"),
    (fixture("smi_query_quadro_rtx4000.csv").replace(", 8192,", ", 8192 x,", 1), "memory.total is not a number"),
    (fixture("smi_query_quadro_rtx4000.csv").replace("Disabled", "Maybe", 1), "not Enabled/Disabled"),
    (fixture("smi_query_quadro_rtx4000.csv").replace(", 7.5", ", sm75", 1), "compute_cap is not major.minor"),
])
def test_parse_smi_csv_rejects_garbage(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        smi_src.parse_smi_csv(text)


# -- nvidia-smi -q header and failure texts ------------------------------------------


@pytest.mark.parametrize(("name", "driver", "cuda"), [
    ("smi_q_580_gb10.txt", "580.95.05", "13.0"),
    ("smi_q_580_cuda_not_found.txt", "580.105.06", None),
    ("smi_q_535_interleaved_log.txt", "535.86.10", "12.2"),
    ("smi_q_396_no_cuda_line.txt", "396.54", None),
    ("smi_q_580_header_wide.txt", "580.159.04", "13.0"),  # R580.159's 55-character key column
])
def test_parse_smi_q_cuda(name: str, driver: str, cuda: str | None) -> None:
    assert smi_src.parse_smi_q_cuda(fixture(name)) == {"driver_version": driver, "cuda_version": cuda}


def test_parse_smi_q_cuda_rejects_text_without_header() -> None:
    with pytest.raises(ValueError, match="no 'Driver Version'"):
        smi_src.parse_smi_q_cuda(fixture("nvidia_smi_no_driver.txt"))


@pytest.mark.parametrize(("name", "status", "starts"), [
    ("nvidia_smi_mismatch.txt", "lib_rm_version_mismatch", "Failed to initialize NVML: Driver/library version"),
    ("nvidia_smi_no_driver.txt", "driver_not_loaded", "NVIDIA-SMI has failed"),
    ("nvidia_smi_no_driver_curly.txt", "driver_not_loaded", "NVIDIA-SMI has failed"),
    ("smi_q_580_gb10.txt", "error", "==============NVSMI LOG"),
])
def test_classify_smi_failure(name: str, status: str, starts: str) -> None:
    got_status, message = smi_src.classify_smi_failure(fixture(name))
    assert got_status == status
    assert message.startswith(starts)


H100_BUS_IDS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
                "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


def with_fabric_block(text: str, bus_id: str, block: str, indent: int = 0) -> str:
    """``text`` with the Fabric section of GPU ``bus_id`` replaced by ``block`` (indented by ``indent``)."""
    lines = text.split("\n")
    start = lines.index(f"GPU {bus_id}")
    fabric = lines.index("    Fabric", start)
    end = fabric + 1
    while lines[end].startswith("     "):
        end += 1
    new = [" " * indent + line for line in block.splitlines()]
    return "\n".join(lines[:fabric] + new + lines[end:])


def test_parse_smi_q_fabric_hgx_h100_all_completed() -> None:
    fabric = smi_src.parse_smi_q_fabric(fixture("smi_q_565_h100x8_fabric_completed.txt"))
    assert list(fabric) == H100_BUS_IDS
    assert all(v == {"state": "completed", "status": "success", "note": None} for v in fabric.values())


def test_parse_smi_q_fabric_na_on_boards_without_fabric() -> None:
    fabric = smi_src.parse_smi_q_fabric(fixture("smi_q_535_rtx4090x8_fabric_na.txt"))
    assert len(fabric) == 8
    # The process lists between the blocks must not leak into the next GPU.
    assert set(fabric) == {f"00000000:{b}:00.0" for b in ("01", "23", "41", "61", "81", "A1", "C1", "E1")}
    assert all(v == {"state": None, "status": None, "note": "State N/A"} for v in fabric.values())


def test_parse_smi_q_fabric_completed_with_an_error_status() -> None:
    text = with_fabric_block(fixture("smi_q_565_h100x8_fabric_completed.txt"), "00000000:2A:00.0",
                             fixture("smi_q_fabric_insufficient_resources_block.txt"), indent=4)
    fabric = smi_src.parse_smi_q_fabric(text)
    assert fabric["00000000:2A:00.0"] == {"state": "completed", "status": "insufficient_resources", "note": None}
    assert fabric["00000000:18:00.0"]["status"] == "success"


def test_parse_smi_q_fabric_in_progress_with_r580_column_width() -> None:
    text = with_fabric_block(fixture("smi_q_565_h100x8_fabric_completed.txt"), "00000000:DB:00.0",
                             fixture("smi_q_580_fabric_in_progress_block.txt"))
    fabric = smi_src.parse_smi_q_fabric(text)
    assert fabric["00000000:DB:00.0"] == {"state": "in_progress", "status": None, "note": None}
    assert [v["state"] for v in fabric.values()].count("completed") == 7


# State texts: the captured ones, then the other nvmlGpuFabricState_t names substituted into the
# captured H100 output, then text a future driver might print.
@pytest.mark.parametrize(("printed", "state", "note"), [
    ("Completed", "completed", None),
    ("In Progress", "in_progress", None),
    ("Not Started", "not_started", None),
    ("Not Supported", "not_supported", None),
    ("N/A", None, "State N/A"),
    ("Degraded", None, "unrecognised State 'Degraded'"),
    ("", None, "State N/A"),
])
def test_parse_smi_q_fabric_state_table(printed: str, state: str | None, note: str | None) -> None:
    key = "        State                             : "
    text = fixture("smi_q_565_h100x8_fabric_completed.txt").replace(key + "Completed", key + printed, 1)
    got = smi_src.parse_smi_q_fabric(text)["00000000:18:00.0"]
    assert (got["state"], got["note"]) == (state, note)


def test_parse_smi_q_fabric_ignores_other_state_keys() -> None:
    # -q has other "State" keys (e.g. "Performance State" at GPU level); only Fabric > State counts.
    text = fixture("smi_q_565_h100x8_fabric_completed.txt")
    lines = text.split("\n")
    start = lines.index("GPU 00000000:18:00.0")
    fabric = lines.index("    Fabric", start)
    del lines[fabric:fabric + 3]  # the section header, its State and its Status
    got = smi_src.parse_smi_q_fabric("\n".join(lines))["00000000:18:00.0"]
    # CliqueId and the rest now sit under "Voltage": no fabric state, and no false one either.
    assert got == {"state": None, "status": None, "note": "no Fabric section"}


@pytest.mark.parametrize(("name", "note"), [
    # -d sections and old drivers print no Fabric section at all.
    ("smi_q_580_gb10.txt", "no Fabric section"),
    ("smi_q_535_interleaved_log.txt", "no Fabric section"),
])
def test_parse_smi_q_fabric_without_fabric_section(name: str, note: str) -> None:
    (entry,) = smi_src.parse_smi_q_fabric(fixture(name)).values()
    assert entry == {"state": None, "status": None, "note": note}


def test_parse_smi_q_fabric_truncated_inside_the_section() -> None:
    text = fixture("smi_q_565_h100x8_fabric_completed.txt")
    cut = text[: text.index("    Fabric\n") + len("    Fabric\n        Sta")]
    fabric = smi_src.parse_smi_q_fabric(cut)
    assert fabric["00000000:18:00.0"] == {"state": None, "status": None, "note": "Fabric section has no State line"}
    assert list(fabric) == ["00000000:18:00.0"]


@pytest.mark.parametrize("text", [
    fixture("nvidia_smi_no_driver.txt"), fixture("smi_q_580_header_wide.txt"), "", "GPU 0: NVIDIA H200\n"])
def test_parse_smi_q_fabric_rejects_text_without_gpu_blocks(text: str) -> None:
    with pytest.raises(ValueError, match="no 'GPU <bus id>' block"):
        smi_src.parse_smi_q_fabric(text)


@pytest.mark.parametrize(("value", "normal"), [
    ("00000000:18:00.0", "00000000:18:00.0"),
    ("0000:18:00.0", "00000000:18:00.0"),  # lspci -D and sysfs
    ("0000:ab:00.0", "00000000:AB:00.0"),
    ("0000000F:01:00.0", "0000000F:01:00.0"),  # GB10 (smi_q_580_gb10.txt)
    ("0000:06:00.0", "00000000:06:00.0"),  # nvidia-smi 369 prints a 4-digit domain
    ("18:00.0", "00000000:18:00.0"),
    (" 00000000:2A:00.0 ", "00000000:2A:00.0"),
    ("GPU-b42dd28e", None),
    ("00000000:18:00.8", None),
    ("", None),
    (None, None),
])
def test_normalize_bus_id(value: str | None, normal: str | None) -> None:
    assert drv.normalize_bus_id(value) == normal


@pytest.mark.parametrize(("text", "name"), [
    ("Success", "success"), ("Insufficient Resources", "insufficient_resources"), ("Unknown Error", "unknown_error"),
    ("N/A", None), ("", None), (None, None)])
def test_fabric_status_name(text: str | None, name: str | None) -> None:
    assert gpu_common.fabric_status_name(text) == name


def csv_gpus(name: str) -> list[dict[str, Any]]:
    return [{"index": r["index"], "pci_bus_id": r["pci.bus_id"], "fabric_state": None, "fabric_status": None}
            for r in smi_src.parse_smi_csv(fixture(name))]


def test_apply_smi_fabric_matches_by_bus_id_not_order() -> None:
    gpus = csv_gpus("smi_query_h100x8.csv")
    gpus.reverse()
    # lspci's form of the bus id must still find the -q block.
    gpus[0]["pci_bus_id"] = "0000:db:00.0"
    text = with_fabric_block(fixture("smi_q_565_h100x8_fabric_completed.txt"), "00000000:DB:00.0",
                             fixture("smi_q_580_fabric_in_progress_block.txt"))
    assert smi_src.apply_smi_fabric(gpus, text) is None
    assert [(g["index"], g["fabric_state"]) for g in gpus][:2] == [(7, "in_progress"), (6, "completed")]
    assert {g["fabric_status"] for g in gpus[1:]} == {"success"}


def test_apply_smi_fabric_names_the_gpus_it_could_not_match() -> None:
    gpus = [*csv_gpus("smi_query_quadro_rtx4000.csv"), {"index": 2, "pci_bus_id": None}]
    note = smi_src.apply_smi_fabric(gpus, fixture("smi_q_565_h100x8_fabric_completed.txt"))
    assert note == ("GPU fabric state unknown: GPU 0-1: bus id not in nvidia-smi -q; "
                    "GPU 2: no PCI bus id to match -q by")
    assert all(g.get("fabric_state") is None for g in gpus)


def test_apply_smi_fabric_groups_na_gpus() -> None:
    gpus = [{"index": i, "pci_bus_id": f"00000000:{b}:00.0"}
            for i, b in enumerate(("01", "23", "41", "61", "81", "A1", "C1", "E1"))]
    note = smi_src.apply_smi_fabric(gpus, fixture("smi_q_535_rtx4090x8_fabric_na.txt"))
    assert note == "GPU fabric state unknown: GPU 0-7: State N/A"
    assert smi_src.apply_smi_fabric(gpus[:1], fixture("nvidia_smi_no_driver.txt")) == (
        "GPU fabric state unknown: nvidia-smi -q output has no 'GPU <bus id>' block")


@pytest.mark.parametrize(("value", "text"), [(13000, "13.0"), (12090, "12.9"), (12080, "12.8"), (11040, "11.4")])
def test_cuda_version_from_int(value: int, text: str) -> None:
    assert nvml.cuda_version_from_int(value) == text


@pytest.mark.parametrize(("exc", "status"), [
    (pynvml.NVMLError_LibRmVersionMismatch(), "lib_rm_version_mismatch"),
    (pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND), "library_not_found"),
    (pynvml.NVMLError_DriverNotLoaded(), "driver_not_loaded"),
    (pynvml.NVMLError_NoPermission(), "no_permission"),
    (pynvml.NVMLError_GpuIsLost(), "gpu_is_lost"),
    (pynvml.NVMLError_Unknown(), "error"),
    (RuntimeError("not NVML"), "error"),
])
def test_nvml_error_status_by_real_class(exc: BaseException, status: str) -> None:
    assert nvml.nvml_error_status(exc) == status


# -- NVML through a fake pynvml ------------------------------------------------------


class FakeNvml(types.ModuleType):
    """Just enough of pynvml, with the real error classes and fabric structure."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, gpus: list[dict[str, Any]], *, init_error: BaseException | None = None,
                 driver: Any = "580.95.05", cuda: int = 13000, lost_index: int | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.lost_index = lost_index
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> Any:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == self.lost_index:
            raise pynvml.NVMLError_GpuIsLost()
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return self.gpus[handle]["name"]

    def nvmlDeviceGetUUID(self, handle: int) -> Any:
        return self.gpus[handle]["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        gpu = self.gpus[handle]
        if not version:
            return types.SimpleNamespace(total=gpu["mem_bytes"], free=0, used=gpu.get("reserved_bytes", 0))
        if "reserved_bytes" not in gpu:
            raise pynvml.NVMLError_FunctionNotFound()  # a driver before the v2 call
        return types.SimpleNamespace(total=gpu["mem_bytes"], free=0, used=0, reserved=gpu["reserved_bytes"])

    def nvmlDeviceGetPersistenceMode(self, handle: int) -> int:
        return self.gpus[handle]["persistence"]

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.gpus[handle]["cc"]

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return types.SimpleNamespace(busId=self.gpus[handle]["bus"])

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, ref: Any) -> int:
        state = self.gpus[handle]["fabric"]
        if isinstance(state, BaseException):
            raise state
        ref._obj.state = state
        ref._obj.status = self.gpus[handle].get("fabric_status", pynvml.NVML_SUCCESS)
        return 0


# NVML return values, in the types nvidia-ml-py 12.x (bytes) and 13.x (str) return. Name, memory and
# compute capability are the H200's; the UUIDs and bus ids are placeholders in NVML's format. The first
# answers the v2 memory call with the real idle H200's reserved bytes (tests/fixtures/gpu_health/h200_r580/
# health-nvml-py.txt: reserved 644939776 B, used 0 B); the second has no v2 call (an older driver).
H200 = [
    {"name": b"NVIDIA H200", "uuid": b"GPU-1a4626a2-1754-c017-fdb7-6d7d682f4165", "mem_bytes": 143771 * 1024 * 1024,
     "reserved_bytes": 644939776, "persistence": 1, "cc": (9, 0), "bus": b"00000000:1B:00.0", "fabric": 3},
    {"name": "NVIDIA H200", "uuid": "GPU-50404ee7-1d50-1d0c-6780-806cf66543b8", "mem_bytes": 143771 * 1024 * 1024,
     "persistence": 0, "cc": (9, 0), "bus": "00000000:43:00.0", "fabric": pynvml.NVMLError_NotSupported()},
]


NO_NVLINK_CALL = {"links": None, "active": [], "inactive": [], "errors": {}, "source": "nvml",
                  "reason": "bindings lack nvmlDeviceGetNvLinkState"}


def test_collect_nvml_lists_gpus_bytes_and_str() -> None:
    nv = FakeNvml(H200)
    got = nvml.collect_nvml(nv)
    assert got["nvml"] == {"status": "ok", "error": None}
    assert got["driver_version"] == "580.95.05"
    assert got["cuda_driver_version"] == "13.0"
    # The v2 struct's health mask reads 0 (every condition "not supported"); this fake has no
    # process listing, so processes stay unknown rather than "none".
    no_health = nvml.decode_fabric_health(0, None)
    # This fake has none of the health calls: each health field is unknown with that reason (the
    # health readings have their own table below).
    for gpu in got["gpus"]:
        assert gpu.pop("ecc")["reason"] == "bindings lack the call"
        assert gpu.pop("remapped_rows")["reason"] == "bindings lack the call"
        assert gpu.pop("throttle") == {"active": [], "mask": None, "reason": "bindings lack the call"}
        assert gpu.pop("pcie")["gen_current"] is None
    assert got["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1a4626a2-1754-c017-fdb7-6d7d682f4165",
         "memory_total_mib": 143771, "memory_used_mib": 0, "memory_reserved_mib": 615, "memory_source": "nvml_v2",
         "nvlink": NO_NVLINK_CALL,
         "persistence_mode": True, "compute_capability": "9.0",
         "pci_bus_id": "00000000:1B:00.0", "fabric_state": "completed", "fabric_status": "success",
         "fabric_health": no_health, "processes": None,
         # Registration completed: the domain is read (this fake leaves the struct's UUID and clique zero).
         "fabric_cluster_uuid": "00000000-0000-0000-0000-000000000000", "fabric_clique_id": 0},
        {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-50404ee7-1d50-1d0c-6780-806cf66543b8",
         "memory_total_mib": 143771, "memory_used_mib": 0, "memory_reserved_mib": None, "memory_source": "nvml_v1",
         "nvlink": NO_NVLINK_CALL, "persistence_mode": False, "compute_capability": "9.0",
         "pci_bus_id": "00000000:43:00.0", "fabric_state": "not_supported", "fabric_status": None,
         "fabric_health": None, "processes": None, "fabric_cluster_uuid": None, "fabric_clique_id": None},
    ]
    assert got["note"] == "GPU compute processes unknown: GPU 0-1: bindings lack nvmlDeviceGetComputeRunningProcesses"
    assert nv.calls == ["init", "shutdown"]


@pytest.mark.parametrize(("state", "name"), [(0, "not_supported"), (1, "not_started"), (2, "in_progress"),
                                             (3, "completed"), (9, None)])
def test_collect_nvml_fabric_states(state: int, name: str | None) -> None:
    gpu = dict(H200[0], fabric=state)
    assert nvml.collect_nvml(FakeNvml([gpu]))["gpus"][0]["fabric_state"] == name


@pytest.mark.parametrize(("state", "status", "expected"), [
    # Completed with an error status is a fabric error (Azure/azhpc-images#506 prints it as
    # "Insufficient Resources"); NVML's own texts name the others.
    (3, pynvml.NVML_SUCCESS, "success"),
    (3, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "insufficient_resources"),
    (3, pynvml.NVML_ERROR_UNKNOWN, "unknown_error"),
    (3, pynvml.NVML_ERROR_TIMEOUT, "timeout"),
    (3, 12345, "nvml_return_12345"),
    # Before completion NVML says the status must not be read; nvidia-smi prints N/A then.
    (2, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, None),
    (1, pynvml.NVML_SUCCESS, None),
])
def test_collect_nvml_fabric_status(state: int, status: int, expected: str | None) -> None:
    gpu = dict(H200[0], fabric=state, fabric_status=status)
    assert nvml.collect_nvml(FakeNvml([gpu]))["gpus"][0]["fabric_status"] == expected


def test_collect_nvml_init_mismatch_is_a_status() -> None:
    nv = FakeNvml(H200, init_error=pynvml.NVMLError_LibRmVersionMismatch())
    got = nvml.collect_nvml(nv)
    assert got["nvml"]["status"] == "lib_rm_version_mismatch"
    assert "RM has detected an NVML/RM version mismatch" in got["nvml"]["error"]
    assert got["gpus"] == []
    assert nv.calls == ["init"]  # nothing to shut down after a failed init


def test_collect_nvml_lost_gpu_keeps_the_others_and_shuts_down() -> None:
    nv = FakeNvml([*H200, dict(H200[0], uuid="GPU-x")], lost_index=1)
    got = nvml.collect_nvml(nv)
    assert got["nvml"]["status"] == "gpu_is_lost"
    assert got["nvml"]["error"].startswith("GPU 1: NVMLError_GpuIsLost")
    assert [g["index"] for g in got["gpus"]] == [0, 1, 2]
    assert got["gpus"][1] == {"index": 1}
    assert nv.calls[-1] == "shutdown"


def test_collect_nvml_missing_library_function_is_error_status() -> None:
    nv = FakeNvml(H200)

    def missing() -> int:
        # What pynvml raises when libnvidia-ml.so.1 lacks the symbol (older driver).
        raise pynvml.NVMLError_FunctionNotFound()

    nv.nvmlSystemGetCudaDriverVersion_v2 = missing  # type: ignore[method-assign]
    got = nvml.collect_nvml(nv)
    assert got["nvml"]["status"] == "error"
    assert got["nvml"]["error"].startswith("NVMLError_FunctionNotFound")
    assert nv.calls == ["init", "shutdown"]


def test_collect_nvml_non_nvml_exception_is_error_status() -> None:
    nv = FakeNvml(H200)
    nv.nvmlDeviceGetCount = lambda: None  # type: ignore[assignment, method-assign]
    got = nvml.collect_nvml(nv)
    assert got["nvml"]["status"] == "error"
    assert got["nvml"]["error"].startswith("TypeError")
    assert nv.calls == ["init", "shutdown"]


# -- the collector on a node tree -------------------------------------------------------


def use_pynvml(monkeypatch: pytest.MonkeyPatch, fake: Any) -> None:
    # None: a node without NVML (no pynvml, and no libnvidia-ml.so.1 for k3fleet's own binding).
    if fake is None:
        without_nvml(monkeypatch)
    else:
        monkeypatch.setitem(sys.modules, "pynvml", fake)


def smi_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proc: str, csv: str, q: str,
               rc: int = 0) -> tuple[NodeReader, dict[str, Any]]:
    """The driver collector's facts (schema-valid) on a node without pynvml: /proc/driver/nvidia/version
    from the fixture ``proc``, nvidia-smi answering ``csv`` to its query and ``q`` to -q."""
    use_pynvml(monkeypatch, None)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture(proc)})
    smi(tmp_path, csv, q, rc=rc)
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    return reader, facts


def test_collect_driver_nvml_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, FakeNvml(H200))
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt"),
                             "/proc/modules": fixture("proc_modules_talos.txt")})
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    assert facts["status"] == "ok"
    assert facts["source"] == "nvml"
    # No /proc/driver/nvidia/params on this node: the GPUDirect override is not read (None), never False.
    assert facts["kernel_module"] == {"loaded": True, "version": "565.57.01", "flavour": "open", "arch": "x86_64",
                                      "raw": fixture("proc_version_open_x86_64.txt").splitlines()[0].strip(),
                                      "grdma_topo_override": None}
    assert facts["platform"] == {"kind": "discrete", "l4t_release": None, "evidence": None}
    assert facts["gpu_count"] == 2
    assert facts["cuda_driver_version"] == "13.0"
    # GPU 1 answered only NVML's v1 memory call (used counts reserved): nvidia-smi -q -d MEMORY is asked
    # for its Used and Reserved (here not installed: a note says the figure includes reserved memory);
    # then the kernel log (for Xid lines), here absent.
    # The journal's boot list follows (the Xid lines of earlier boots), here absent too.
    # Then nvidia-smi topo -m (the GPU/NIC topology NVML does not give), here not installed either.
    assert [c["argv"][:2] for c in reader.commands] == [["nvidia-smi", "-q"], ["nvidia-smi", "topo"], ["dmesg"],
                                                        ["journalctl", "-k"], ["journalctl", "--list-boots"]]
    assert "GPU used memory includes the driver's reserved memory" in facts["reason"]
    assert facts["kernel_log"]["status"] == "unknown"


def test_collect_driver_without_pynvml_uses_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, facts = smi_driver(tmp_path, monkeypatch, "proc_version_proprietary_580.txt",
                          fixture("smi_query_quadro_rtx4000.csv"), fixture("smi_q_580_gb10.txt"))
    assert facts["status"] == "ok"
    assert facts["source"] == "nvidia-smi"
    # No bindings loaded a library: said in nvml.error, not in the reason of the answer nvidia-smi gave.
    assert facts["nvml"] == {"status": "library_not_found", "bindings": None, "error": (
        f"{NO_NVML_LIBRARY}: cannot open shared object file: Not a directory "
        "(pynvml not importable: import of pynvml halted; None in sys.modules)")}
    assert facts["driver_version"] == "535.129.03"
    assert facts["cuda_driver_version"] == "13.0"
    assert facts["gpu_count"] == 2
    assert facts["gpus"][1]["pci_bus_id"] == "00000000:07:00.0"
    assert facts["gpus"][0]["persistence_mode"] is False
    assert facts["kernel_module"]["flavour"] == "proprietary"


def test_collect_driver_skips_nvml_when_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(H200)
    use_pynvml(monkeypatch, fake)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")})
    smi(tmp_path, fixture("smi_query_quadro_rtx4000.csv"), fixture("smi_q_535_interleaved_log.txt"))
    facts = drv.collect_driver(reader, use_nvml=False)
    assert fake.calls == []
    assert facts["nvml"]["status"] == "skipped"
    assert facts["source"] == "nvidia-smi"
    assert facts["cuda_driver_version"] == "12.2"


def test_collect_driver_version_mismatch_after_upgrade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, FakeNvml(H200, init_error=pynvml.NVMLError_LibRmVersionMismatch()))
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_proprietary_580.txt")})
    smi(tmp_path, fixture("nvidia_smi_mismatch.txt"), fixture("nvidia_smi_mismatch.txt"), rc=18)
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    assert facts["status"] == "unknown"
    assert facts["nvml"]["status"] == "lib_rm_version_mismatch"
    assert facts["kernel_module"]["version"] == "580.173.02"
    assert facts["gpu_count"] is None
    assert "Driver/library version mismatch" in facts["reason"]
    assert "NVML: nvmlInit" in facts["reason"]


def test_collect_driver_mismatch_seen_only_by_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, facts = smi_driver(tmp_path, monkeypatch, "proc_version_proprietary_580.txt",
                          fixture("nvidia_smi_mismatch.txt"), "", rc=18)
    assert facts["nvml"]["status"] == "lib_rm_version_mismatch"
    assert facts["nvml"]["error"].startswith("via nvidia-smi: nvidia-smi failed (exit 18)")
    assert facts["status"] == "unknown"


def test_collect_driver_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, None)
    reader = node(tmp_path)
    smi(tmp_path, fixture("nvidia_smi_no_driver.txt"), fixture("nvidia_smi_no_driver.txt"), rc=9)
    facts = drv.collect_driver(reader)
    DriverFacts.model_validate(facts)
    assert facts["status"] == "absent"
    assert facts["kernel_module"]["loaded"] is False
    assert facts["nvml"]["status"] == "driver_not_loaded"
    assert facts["reason"].startswith("NVIDIA kernel module not loaded")


def test_collect_driver_nothing_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, None)
    facts = drv.collect_driver(node(tmp_path))
    DriverFacts.model_validate(facts)
    assert facts["status"] == "absent"
    assert "nvidia-smi: command not found" in facts["reason"]
    assert facts["nvml"]["status"] == "library_not_found"
    # Nothing answered: the reason says why NVML was not asked, before what nvidia-smi said.
    assert f"; NVML: {NO_NVML_LIBRARY}: cannot open shared object file" in facts["reason"]
    assert facts["reason"].index("NVML: ") < facts["reason"].index("nvidia-smi: command not found")


def test_collect_driver_truncated_csv_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, facts = smi_driver(tmp_path, monkeypatch, "proc_version_open_x86_64.txt",
                          fixture("smi_query_truncated.csv"), fixture("smi_q_580_gb10.txt"))
    assert facts["status"] == "unknown"
    assert facts["source"] is None
    assert "nvidia-smi --query-gpu output not understood: nvidia-smi CSV line 2 has 3 fields" in facts["reason"]


def test_collect_driver_nvidia_smi_timeout_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, None)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")}, timeout=0.5)
    fake_command(tmp_path / "bin", "nvidia-smi", [("*", fixture("smi_query_quadro_rtx4000.csv"), "", 0)], sleep=5)
    facts = drv.collect_driver(reader)
    assert facts["status"] == "unknown"
    assert "timed out" in facts["reason"]


def test_collect_driver_missing_cuda_header_keeps_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, facts = smi_driver(tmp_path, monkeypatch, "proc_version_open_x86_64.txt",
                          fixture("smi_query_quadro_rtx4000.csv"), fixture("nvidia_smi_no_driver.txt"))
    assert facts["status"] == "ok"
    assert facts["cuda_driver_version"] is None
    assert facts["reason"].startswith("CUDA version unknown: nvidia-smi -q output has no")


def test_collect_driver_nvidia_smi_fills_fabric_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = with_fabric_block(fixture("smi_q_565_h100x8_fabric_completed.txt"), "00000000:3A:00.0",
                          fixture("smi_q_fabric_insufficient_resources_block.txt"), indent=4)
    reader, facts = smi_driver(tmp_path, monkeypatch, "proc_version_open_x86_64.txt",
                               fixture("smi_query_h100x8.csv"), q)
    parsed = DriverFacts.model_validate(facts)
    assert parsed.source == "nvidia-smi"
    assert [g.fabric_state for g in parsed.gpus] == ["completed"] * 8
    assert [g.fabric_status for g in parsed.gpus] == ["success"] * 2 + ["insufficient_resources"] + ["success"] * 5
    # This fake nvidia-smi answers no `nvlink -s`: the NVLink state is unknown, said in the reason.
    assert (parsed.driver_version, parsed.cuda_driver_version, parsed.reason) == (
        "565.57.01", "12.7", "NVLink state unknown: nvidia-smi nvlink -s: exit 127")
    assert ["nvidia-smi", "-q"] in [c["argv"] for c in reader.commands]


def test_collect_driver_nvidia_smi_fabric_na_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = fixture("smi_q_565_h100x8_fabric_completed.txt").replace(
        "        State                             : Completed", "        State                             : N/A")
    _, facts = smi_driver(tmp_path, monkeypatch, "proc_version_open_x86_64.txt",
                          fixture("smi_query_h100x8.csv"), q)
    assert facts["status"] == "ok"
    assert [g["fabric_state"] for g in facts["gpus"]] == [None] * 8
    assert facts["reason"] == ("GPU fabric state unknown: GPU 0-7: State N/A; "
                               "NVLink state unknown: nvidia-smi nvlink -s: exit 127")


def test_collect_driver_nvidia_smi_q_failure_keeps_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_pynvml(monkeypatch, None)
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_open_x86_64.txt")})
    fake_command(tmp_path / "bin", "nvidia-smi", [("*--query-gpu*", fixture("smi_query_h100x8.csv"), "", 0),
                                                  ("-q", "", fixture("nvidia_smi_no_driver.txt"), 9)])
    facts = drv.collect_driver(reader)
    assert facts["status"] == "ok" and facts["gpu_count"] == 8
    assert all(g["fabric_state"] is None for g in facts["gpus"])
    assert all(g["processes"] is None and g["memory_used_mib"] is None for g in facts["gpus"])
    assert facts["reason"].startswith(
        "CUDA version, GPU fabric state, memory use and processes unknown: nvidia-smi -q: exit 9")


def test_kernel_module_truncated_version_file(tmp_path: Path) -> None:
    reader = node(tmp_path, {"/proc/driver/nvidia/version": fixture("proc_version_truncated.txt")})
    km = drv.kernel_module_facts(reader)
    assert km["loaded"] is True
    assert km["version"] is None
    assert "no driver version" in km["reason"]
    assert km["raw"] == fixture("proc_version_truncated.txt")


def test_kernel_module_unreadable_version_file(tmp_path: Path) -> None:
    reader = node(tmp_path)
    (tmp_path / "root" / "proc" / "driver" / "nvidia" / "version").mkdir(parents=True)
    km = drv.kernel_module_facts(reader)
    assert km["loaded"] is True
    assert km["version"] is None
    assert km["reason"].startswith("/proc/driver/nvidia/version: ")


def test_kernel_module_listed_but_no_version_file(tmp_path: Path) -> None:
    km = drv.kernel_module_facts(node(tmp_path, {"/proc/modules": fixture("proc_modules_talos.txt")}))
    assert km["loaded"] is True
    assert "missing although /proc/modules lists nvidia" in km["reason"]


def test_procfs_may_live_elsewhere(tmp_path: Path) -> None:
    # The testbed's stand-in driver writes its /proc view to a separate directory.
    sim = tmp_path / "sim-proc" / "driver" / "nvidia"
    sim.mkdir(parents=True)
    (sim / "version").write_text(fixture("proc_version_proprietary_510.txt"), encoding="utf-8")
    reader = NodeReader(root=str(tmp_path), procfs=str(tmp_path / "sim-proc"), path=str(tmp_path))
    assert drv.kernel_module_facts(reader)["version"] == "510.60.02"


def test_fabric_byref_reaches_the_structure() -> None:
    # The fake writes through ctypes.byref exactly as the C library would.
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    FakeNvml([dict(H200[0], fabric=2)]).nvmlDeviceGetGpuFabricInfoV(0, ctypes.byref(info))
    assert info.state == 2


# -- GPU health: nvidia-smi -q sections and NVML (docs/facts.md section 14) --------------------------

HEALTH_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_health"


def _block(text: str) -> list[Any]:
    """One GPU block of -q, or a published section indented as in -q, as parse_smi_q_blocks' tree."""
    if not any(line.startswith("GPU ") for line in text.splitlines()):
        text = "GPU 00000000:18:00.0\n" + text
    return next(iter(smi_src.parse_smi_q_blocks(text).values()))


@pytest.mark.parametrize(("rel", "field", "expected"), [
    # The 8x H100 capture: ECC on, every counter 0, Gen 5 x16, only Idle active.
    ("driver/smi_q_565_h100x8_fabric_completed.txt", "ecc",
     {"mode": "enabled", "volatile_uncorrected": 0, "aggregate_uncorrected": 0, "volatile_corrected": 0,
      "aggregate_corrected": 0, "reason": None}),
    # "Replays Since Reset : 7" on one GPU of that capture (PCIe replays since the driver loaded).
    ("driver/smi_q_565_h100x8_fabric_completed.txt", "pcie",
     {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16, "replay_counter": 7, "reason": None}),
    ("driver/smi_q_565_h100x8_fabric_completed.txt", "throttle", {"active": ["idle"], "mask": None, "reason": None}),
    # The RTX 4090 at idle: ECC disabled (N/A counters), Gen 1 of 4.
    ("driver/smi_q_535_rtx4090x8_fabric_na.txt", "ecc",
     {"mode": "disabled", "volatile_uncorrected": None, "aggregate_uncorrected": None,
      "volatile_corrected": None, "aggregate_corrected": None, "reason": "ECC is disabled on this GPU"}),
    ("driver/smi_q_535_rtx4090x8_fabric_na.txt", "pcie",
     {"gen_current": 1, "gen_max": 4, "width_current": 16, "width_max": 16, "replay_counter": 0, "reason": None}),
    # R580.159's 55-character layout, with R550's split SRAM counters.
    ("driver/smi_q_580_h200_idle.txt", "remapped_rows",
     {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False, "retired_pages_pending": None,
      "reason": None}),
    ("gpu_health/smi_q_580_h200_ecc_remap_pending.txt", "ecc",
     {"mode": "enabled", "volatile_uncorrected": 4, "aggregate_uncorrected": 4, "volatile_corrected": 0,
      "aggregate_corrected": 0, "reason": None}),
    ("gpu_health/smi_q_580_h200_power_brake_x8.txt", "throttle",
     {"active": ["hw_slowdown", "hw_power_brake_slowdown"], "mask": None, "reason": None}),
    # Published sections: gpud pull request 80 (pending remap), kubeflow issue 68 (pre-R535 label).
    ("gpu_health/smi_q_remapped_rows_pending_gpud80_block.txt", "remapped_rows",
     {"correctable": 0, "uncorrectable": 4, "pending": True, "failure": None, "retired_pages_pending": None,
      "reason": None}),
    ("gpu_health/smi_q_clocks_throttle_reasons_kubeflow68_block.txt", "throttle",
     {"active": ["idle"], "mask": None, "reason": None}),
])
def test_smi_q_health_sections(rel: str, field: str, expected: dict[str, Any]) -> None:
    text = (Path(__file__).resolve().parents[1] / "fixtures" / rel).read_text()
    assert smi_src.smi_q_health(_block(text))[field] == expected


def test_smi_q_without_health_sections_reads_unknown() -> None:
    health = smi_src.smi_q_health(_block(fixture("smi_q_580_fabric_in_progress_block.txt")))
    assert health == {"ecc": None, "remapped_rows": None, "throttle": None, "pcie": None}


class HealthNvml(FakeNvml):
    """FakeNvml with the health calls, answering per GPU or raising what the driver raises."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC

    def _get(self, handle: int, key: str) -> Any:
        value = self.gpus[handle][key]
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        key = "ecc" if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "ecc_corrected"
        return self._get(handle, key)[0 if counter == pynvml.NVML_VOLATILE_ECC else 1]  # type: ignore[no-any-return]

    def nvmlDeviceGetEccMode(self, handle: int) -> tuple[int, int]:
        return 1, 1

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return self._get(handle, "rows")  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._get(handle, "clocks")  # type: ignore[no-any-return]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return self._get(handle, "link")[0]  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return self._get(handle, "link")[1]  # type: ignore[no-any-return]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16


def test_nvml_health_values_and_not_supported_is_unknown_not_a_pass() -> None:
    sick = dict(H200[0], ecc=(2, 6), ecc_corrected=(120, 30000), rows=(0, 4, 1, 0), clocks=0x8 | 0x80, link=(5, 8))
    old = dict(H200[1], ecc=pynvml.NVMLError_NotSupported(), ecc_corrected=pynvml.NVMLError_NotSupported(),
               rows=pynvml.NVMLError_NotSupported(),
               clocks=pynvml.NVMLError_NotSupported(), link=(1, 16))
    got = nvml.collect_nvml(HealthNvml([sick, old]))
    assert got["nvml"]["status"] == "ok"
    a, b = got["gpus"]
    assert a["ecc"] == {"mode": "enabled", "volatile_uncorrected": 2, "aggregate_uncorrected": 6,
                        "volatile_corrected": 120, "aggregate_corrected": 30000, "reason": None}
    assert a["remapped_rows"] == {"correctable": 0, "uncorrectable": 4, "pending": True, "failure": False,
                                  "retired_pages_pending": None, "reason": None}
    assert a["throttle"] == {"active": ["hw_slowdown", "hw_power_brake_slowdown"], "mask": 0x88, "reason": None}
    # This fake has no nvmlDeviceGetPcieReplayCounter: the counter is unknown, not 0.
    assert a["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 8, "width_max": 16,
                         "replay_counter": None, "reason": None}
    assert b["ecc"]["volatile_uncorrected"] is None and "NotSupported" in b["ecc"]["reason"]
    assert b["remapped_rows"]["pending"] is None and "NotSupported" in b["remapped_rows"]["reason"]
    assert b["throttle"]["active"] == [] and "NotSupported" in b["throttle"]["reason"]


def test_nvml_health_lost_gpu_is_reported_not_swallowed() -> None:
    lost = dict(H200[0], ecc=pynvml.NVMLError_GpuIsLost(), rows=(0, 0, 0, 0), clocks=0, link=(5, 16))
    got = nvml.collect_nvml(HealthNvml([lost]))
    assert got["nvml"]["status"] == "gpu_is_lost" and got["gpus"] == [{"index": 0}]


@pytest.mark.parametrize(("rel", "codes"), [
    ("xid79_line_nvsentinel155.txt", [79]),
    ("dmesg_fallen_off_bus_no_xid_nvsentinel155.txt", [79]),
    ("xid94_line_gpud1174.txt", [94]),
    ("xid63_line_ml_engineering.txt", [63]),
    ("dmesg_ctime_xid13_109_gpud46.txt", [13, 13, 13, 109]),
    ("journal_xid45_ogkm1150.txt", [45, 45, 45]),
])
def test_parse_xid_lines_on_real_logs(rel: str, codes: list[int]) -> None:
    events = drv.parse_xid_lines((HEALTH_FIX / rel).read_text())
    assert [e["code"] for e in events] == codes
    assert all(e["pci"] and e["pci"].startswith("PCI:") for e in events)


def test_kernel_log_falls_back_to_the_journal(tmp_path: Path) -> None:
    reader = node(tmp_path)
    # util-linux dmesg under kernel.dmesg_restrict=1, then the journal's kernel messages.
    fake_command(tmp_path / "bin", "dmesg", [("*", "", "dmesg: read kernel buffer failed: Operation not permitted\n",
                                              1)])
    fake_command(tmp_path / "bin", "journalctl", [("*", (HEALTH_FIX / "journal_xid45_ogkm1150.txt").read_text(), "",
                                                   0)])
    log = drv.collect_kernel_log(reader)
    assert (log["status"], log["source"], [e["code"] for e in log["xid"]]) == ("ok", "journalctl", [45, 45, 45])
    none = drv.collect_kernel_log(node(tmp_path / "n"))
    assert none["status"] == "unknown" and "dmesg" in none["reason"] and "journalctl" in none["reason"]


@pytest.mark.parametrize(("version", "arch", "raw", "kind"), [
    ("580.95.05", "x86_64", None, "discrete"),
    ("35.3.1", "aarch64", None, "tegra"),
    # JetPack 6's Tegra driver with no Tegra file: the version shape on aarch64 / the L4T build host.
    ("540.4.0", "aarch64", fixture("proc_version_open_aarch64_540_jetpack6.txt").splitlines()[0], "tegra"),
    ("540.4.0", None, None, "unknown"),
    ("5400.1", "x86_64", None, "unknown"),
])
def test_classify_driver_platform(version: str, arch: str | None, raw: str | None, kind: str) -> None:
    assert drv.classify_driver_platform(version, arch, raw)["kind"] == kind
