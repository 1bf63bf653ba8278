"""The stand-in driver's NVML shim, nvidia-smi, nv-fabricmanager and /proc writer.

The shim is compiled into a temporary directory and driven through the REAL pynvml
(nvidia-ml-py), exactly as the collectors call it on a node. Output shapes are checked
against outputs captured on real systems (k3fleet/lab/standin/reference/, sources in
SOURCES.md there).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from k3fleet.lab.standin import (
    StandinBuildError,
    compile_shim,
    gpus_conf,
    install_pins,
    release,
    render_template,
)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is needed to compile the stand-in libnvidia-ml.so.1")

STANDIN = Path(__file__).resolve().parents[2] / "k3fleet" / "lab" / "standin"
REFERENCE = STANDIN / "reference"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LIB_VERSION = "580.95.05"
# /proc/version of a Debian 12 machine: the first line of its kernel log.
KERNEL_BANNER = ("Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) 12.2.0, "
                 "GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)")
QUERY = ["--query-gpu=index,name,uuid,driver_version,memory.total,persistence_mode,pci.bus_id,compute_cap",
         "--format=csv,noheader,nounits"]


def reference(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libnvidia-ml.so.1 of driver 580.95.05."""
    return compile_shim(tmp_path_factory.mktemp("shim"), LIB_VERSION)


@dataclass
class Node:
    """A simulated node in a temporary directory, wired to the shim by environment."""

    root: Path
    lib_dir: Path

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def fabric_state(self) -> Path:
        return self.root / "run" / "fabricmanager.state"

    def env(self) -> dict[str, str]:
        return {"NVIDIA_SIM_PROC": str(self.proc),
                "NVIDIA_SIM_HOST_PROC": str(self.root / "hostproc"),
                "NVIDIA_SIM_GPUS_CONF": str(self.root / "gpus.conf"),
                "NVIDIA_SIM_MODULE_CONF": str(self.root / "kernel-module.conf"),
                "NVIDIA_SIM_FABRIC_STATE": str(self.fabric_state),
                "NVIDIA_SIM_MACHINE_ID": str(self.root / "machine-id"),
                "NVIDIA_SIM_KMSG": str(self.root / "kmsg")}

    def script(self, template: str, **values: str) -> Path:
        path = self.root / "bin" / template
        path.parent.mkdir(exist_ok=True)
        path.write_text(render_template(template, **values), encoding="utf-8")
        return path

    def run(self, template: str, *args: str, values: dict[str, str] | None = None,
            lib_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, **self.env(), LD_LIBRARY_PATH=str(lib_dir or self.lib_dir))
        return subprocess.run([sys.executable, str(self.script(template, **(values or {}))), *args],
                              env=env, capture_output=True, text=True, timeout=30, check=False)

    def boot(self, version: str, flavour: str = "open") -> None:
        """What nvidia-sim-load.service does at boot with this kernel module package installed."""
        r = release(version)
        (self.root / "kernel-module.conf").write_text(
            f"version={r.version}\nflavour={flavour}\nbuild_date={r.build_date}\n"
            "builder=dvs-builder@U16-I3-B03-4-3\n", encoding="utf-8")
        done = self.run("nvidia_sim_proc.py", "load")
        assert done.returncode == 0, done.stderr

    def version_line(self) -> str:
        return (self.proc / "driver/nvidia/version").read_text(encoding="utf-8").splitlines()[0]


@pytest.fixture
def node(tmp_path: Path, shim: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    n = Node(tmp_path, shim.parent)
    (tmp_path / "gpus.conf").write_text(gpus_conf(8, "NVIDIA H200"), encoding="utf-8")
    (tmp_path / "machine-id").write_text("3d1219c7c4c5404aaa1f6d2a48adfda4\n", encoding="utf-8")
    host = tmp_path / "hostproc"
    (host / "sys/kernel").mkdir(parents=True)
    (host / "sys/kernel/osrelease").write_text("6.1.0-28-amd64\n", encoding="utf-8")
    (host / "version").write_text(KERNEL_BANNER + "\n", encoding="utf-8")
    (host / "uptime").write_text("81234.56 160112.40\n", encoding="utf-8")
    # A host that still lists a real nvidia module: the simulated view must not inherit it.
    (host / "modules").write_text(
        "overlay 163840 0 - Live 0x0000000000000000\n"
        "nvidia 56823808 0 - Live 0x0000000000000000 (POE)\n"
        "veth 36864 0 - Live 0x0000000000000000\n", encoding="utf-8")
    for key, value in n.env().items():
        monkeypatch.setenv(key, value)
    return n


@pytest.fixture
def nvml(shim: Path) -> Iterator[ModuleType]:
    """The real pynvml, bound to the stand-in library instead of the system's."""
    import pynvml

    saved = pynvml.nvmlLib
    pynvml.nvmlLib = ctypes.CDLL(str(shim))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield pynvml
    finally:
        while pynvml._nvmlLib_refcount > 0:
            pynvml.nvmlShutdown()
        pynvml.nvmlLib = saved
        pynvml._nvmlGetFunctionPointer_cache.clear()


def start_fabric_manager(node: Node, version: str = LIB_VERSION) -> subprocess.Popen[str]:
    env = dict(os.environ, **node.env())
    proc = subprocess.Popen([sys.executable, str(node.script("nv_fabricmanager.py", FM_VERSION=version,
                                                                 SIM_FAULT="")),
                             "-c", str(STANDIN / "files" / "fabricmanager.cfg")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not node.fabric_state.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"stand-in fabric manager did not come up: {err}")
        time.sleep(0.02)
    return proc


# ---- NVML through pynvml --------------------------------------------------------


def test_init_reports_loaded_driver_and_branch_cuda(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    assert nvml.nvmlSystemGetDriverVersion() == "580.95.05"
    assert nvml.nvmlSystemGetNVMLVersion() == "13.580.95.05"
    # R580 reports CUDA 13.0 (docs/facts.md section 2)
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 13000
    assert nvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert nvml.nvmlDeviceGetCount() == 8


def test_device_queries_describe_the_h200_inventory(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    conf = dict(line.split("=", 1) for line in gpus_conf(8, "NVIDIA H200").splitlines() if "=" in line)
    bus_ids = conf["bus_ids"].split(",")
    uuids = set()
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert nvml.nvmlDeviceGetIndex(h) == i
        assert nvml.nvmlDeviceGetName(h) == "NVIDIA H200"
        uuid = nvml.nvmlDeviceGetUUID(h)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        uuids.add(uuid)
        assert nvml.nvmlDeviceGetMemoryInfo(h).total == 143771 * 1024 * 1024
        assert nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2).total == 143771 * 1024 * 1024
        assert nvml.nvmlDeviceGetPersistenceMode(h) == nvml.NVML_FEATURE_ENABLED
        assert nvml.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        pci = nvml.nvmlDeviceGetPciInfo_v3(h)
        assert pci.busId == bus_ids[i]
        assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x233510DE, 0x18BE10DE)
        assert nvml.nvmlDeviceGetHandleByUUID(uuid).contents is not None
    assert len(uuids) == 8


def test_uuids_are_stable_per_host_and_differ_between_hosts(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)

    def uuids() -> list[str]:
        nvml.nvmlInit()
        try:
            return [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
        finally:
            nvml.nvmlShutdown()

    first = uuids()
    assert uuids() == first
    (node.root / "machine-id").write_text("0123456789abcdef0123456789abcdef\n", encoding="utf-8")
    other = uuids()
    assert not set(first) & set(other)


def test_driver_library_mismatch_fails_init(node: Node, nvml: ModuleType) -> None:
    # Packages upgraded to 580.95.05 but the node has not rebooted: 575 is still loaded.
    node.boot("575.57.08", flavour="proprietary")
    with pytest.raises(nvml.NVMLError_LibRmVersionMismatch) as err:
        nvml.nvmlInit()
    assert err.value.value == nvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH == 18


def test_point_release_mismatch_in_the_same_branch_fails_init(node: Node, nvml: ModuleType) -> None:
    node.boot("580.82.07")
    with pytest.raises(nvml.NVMLError_LibRmVersionMismatch):
        nvml.nvmlInit()


def test_no_version_file_means_driver_not_loaded(node: Node, nvml: ModuleType) -> None:
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        nvml.nvmlInit()


@pytest.mark.parametrize("text", ["", "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n", "\x00\xff garbage\n"])
def test_unreadable_version_file_is_an_nvml_error_not_a_crash(node: Node, nvml: ModuleType, text: str) -> None:
    path = node.proc / "driver/nvidia/version"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="latin-1")
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlInit()


def test_calls_before_init_are_uninitialized(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_functions_the_shim_lacks_raise_function_not_found(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)


def test_fabric_state_follows_the_fabric_manager(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)

    def state() -> int:
        # pynvml passes the struct through: the caller must hand over a pointer.
        info = nvml.c_nvmlGpuFabricInfoV_t()
        assert nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info)) == nvml.NVML_SUCCESS
        return info.state

    assert state() == nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED
    assert nvml.nvmlDeviceGetNvLinkState(h, 0) == 0
    fm = start_fabric_manager(node)
    try:
        assert state() == nvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert [nvml.nvmlDeviceGetNvLinkState(h, link) for link in range(18)] == [1] * 18
        v3 = nvml.c_nvmlGpuFabricInfo_v3_t()
        nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
        assert (v3.state, v3.status, v3.healthSummary) == (3, 0, nvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
    finally:
        fm.send_signal(signal.SIGTERM)
        fm.communicate(timeout=10)
    assert fm.returncode == 0
    assert not node.fabric_state.exists()
    assert state() == nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED


def test_stale_fabric_state_of_a_dead_daemon_is_not_started(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    dead = subprocess.Popen(["true"])
    dead.wait()
    node.fabric_state.parent.mkdir(parents=True)
    node.fabric_state.write_text(f"pid={dead.pid}\nversion={LIB_VERSION}\nstate=completed\n", encoding="utf-8")
    nvml.nvmlInit()
    info = nvml.c_nvmlGpuFabricInfoV_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    assert info.state == nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED


def test_fabric_info_with_unknown_struct_version_is_rejected(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    info = nvml.c_nvmlGpuFabricInfoV_t()
    info.version = (1 << 24) | ctypes.sizeof(info)
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))


def test_nvlink_beyond_the_gpus_links_is_invalid_argument(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(0), 18)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)


def test_health_calls_answer_a_healthy_idle_gpu(node: Node, nvml: ModuleType) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import nvml_health

    node.boot(LIB_VERSION)
    nvml.nvmlInit()
    for i in range(8):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        for counter in (nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC):
            for kind in (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
                assert nvml.nvmlDeviceGetTotalEccErrors(h, kind, counter) == 0
        assert nvml.nvmlDeviceGetEccMode(h) == [nvml.NVML_FEATURE_ENABLED] * 2
        assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
        assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) == nvml.nvmlClocksEventReasonGpuIdle
        assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == nvml.nvmlClocksThrottleReasonGpuIdle
        assert (nvml.nvmlDeviceGetCurrPcieLinkGeneration(h), nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)) == (5, 5)
        assert (nvml.nvmlDeviceGetCurrPcieLinkWidth(h), nvml.nvmlDeviceGetMaxPcieLinkWidth(h)) == (16, 16)
        assert nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
        # The collector's own NVML path reads every field, none of them unknown.
        health = nvml_health(nvml, h)
        assert health["ecc"] == {"mode": "enabled", "volatile_uncorrected": 0, "aggregate_uncorrected": 0,
                                 "volatile_corrected": 0, "aggregate_corrected": 0, "reason": None}
        assert (health["remapped_rows"]["pending"], health["remapped_rows"]["failure"]) == (False, False)
        assert health["throttle"] == {"active": ["gpu_idle"], "mask": 1, "reason": None}
        assert health["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16,
                                  "replay_counter": 0, "reason": None}
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTotalEccErrors(h, 2, nvml.NVML_VOLATILE_ECC)


def test_health_of_a_node_is_judged_healthy_by_the_verdict(node: Node, nvml: ModuleType,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's collector on a stand-in node (NVML through the shim, nvidia-smi and dmesg on PATH):
    every GPU health check and the platform pass, none reads unknown."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import collect_driver
    from k3fleet.models.facts import HostFacts
    from k3fleet.targets import load_target
    from k3fleet.verdict.rules import evaluate_host

    node.boot(LIB_VERSION)
    bindir = node.root / "bin"
    bindir.mkdir(exist_ok=True)
    for template, name in (("nvidia_smi.py", "nvidia-smi"), ("dmesg.py", "dmesg")):
        script = node.script(template)
        wrapper = bindir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n', encoding="utf-8")
        wrapper.chmod(0o755)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(node.lib_dir))
    reader = NodeReader(procfs=str(node.proc), path=f"{bindir}:/usr/bin:/bin")
    driver = collect_driver(reader)
    assert driver["source"] == "nvml" and driver["gpu_count"] == 8
    assert driver["kernel_log"]["status"] == "ok" and driver["kernel_log"]["xid"] == []
    host = json.loads((FIXTURES / "verdict" / "host_r580_h200_hgx.json").read_text(encoding="utf-8"))
    host["driver"] = driver
    findings = evaluate_host(HostFacts.model_validate(host), load_target())
    health = {"gpu.ecc", "gpu.remapped_rows", "gpu.xid", "gpu.throttle", "gpu.pcie_link", "driver.platform",
              "gpu.in_use"}
    assert [f"{f.check_id}: {f.message}" for f in findings if f.check_id in health] == []


def test_dmesg_prints_the_kernel_banner_and_the_driver_load_line(node: Node) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import parse_xid_lines

    assert node.run("dmesg.py").stdout == ""  # nothing booted yet: an empty log, not an error
    node.boot(LIB_VERSION)
    done = node.run("dmesg.py")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"[    0.000000] {KERNEL_BANNER}"
    # The lab's kernel log carries the same load line (k3fleet/lab/render/driver.py, dmesg).
    first = node.version_line().removeprefix("NVRM version: ")
    assert lines[1] == f"[81234.560000] NVRM: loading {first}"
    assert parse_xid_lines(done.stdout) == []
    bad = node.run("dmesg.py", "--bogus")
    assert bad.returncode == 1 and bad.stderr.startswith("dmesg: unrecognized option '--bogus'")


# ---- NVML through k3fleet's own binding (k3fleet_nvml_lib) ----------------------
#
# The same shim through pynvml and through the binding: collect_nvml must read the same facts from both.


@pytest.fixture
def builtin(shim: Path) -> Any:
    """k3fleet's binding on the stand-in library."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml_lib import open_library

    lib, problem = open_library(str(shim))
    assert lib is not None, problem
    return lib


def both(nvml: ModuleType, builtin: Any) -> dict[str, Any]:
    """collect_nvml through pynvml and through the binding: the same facts, returned once."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import collect_nvml

    through_pynvml = collect_nvml(nvml)
    through_builtin = collect_nvml(builtin)
    assert through_builtin == through_pynvml
    return through_builtin


def add_conf(node: Node, line: str) -> None:
    with (node.root / "gpus.conf").open("a", encoding="utf-8") as conf:
        conf.write(line + "\n")


def test_binding_reads_the_inventory_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any) -> None:
    node.boot(LIB_VERSION)
    facts = both(nvml, builtin)
    assert (facts["nvml"], facts["driver_version"], facts["cuda_driver_version"]) == (
        {"status": "ok", "error": None}, LIB_VERSION, "13.0")
    conf = dict(line.split("=", 1) for line in gpus_conf(8, "NVIDIA H200").splitlines() if "=" in line)
    assert [g["pci_bus_id"] for g in facts["gpus"]] == conf["bus_ids"].split(",")
    gpu = facts["gpus"][0]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["memory_used_mib"], gpu["compute_capability"],
            gpu["persistence_mode"], gpu["processes"]) == ("NVIDIA H200", 143771, 0, "9.0", True, [])
    assert (gpu["fabric_state"], gpu["fabric_status"], gpu["fabric_cluster_uuid"]) == ("not_started", None, None)
    assert gpu["ecc"] == {"mode": "enabled", "volatile_uncorrected": 0, "aggregate_uncorrected": 0,
                          "volatile_corrected": 0, "aggregate_corrected": 0, "reason": None}
    assert gpu["throttle"] == {"active": ["gpu_idle"], "mask": 1, "reason": None}
    # Memory through NVML's v2 call (the shim reserves nothing); NVLink: the H200's 18 links, waiting for
    # the fabric (Fabric Manager not running), every error counter 0.
    assert (gpu["memory_reserved_mib"], gpu["memory_source"]) == (0, "nvml_v2")
    assert (gpu["nvlink"]["links"], gpu["nvlink"]["active"], len(gpu["nvlink"]["inactive"])) == (18, [], 18)
    assert gpu["nvlink"]["errors"]["17"] == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    # Strings are str, as pynvml 13 returns them.
    builtin.nvmlInit()
    h = builtin.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(builtin.nvmlDeviceGetUUID(h), str) and builtin.nvmlDeviceGetUUID(h) == gpu["uuid"]
    assert builtin.nvmlDeviceGetPciInfo(h).busId == gpu["pci_bus_id"]
    builtin.nvmlShutdown()


def _captured_memory_v2() -> dict[str, int]:
    """The v2 memory struct pynvml printed on the real idle H200 (tests/fixtures/gpu_health/h200_r580)."""
    text = (Path(__file__).resolve().parents[1] / "fixtures/gpu_health/h200_r580/health-nvml-py.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("memory_v2 = "))
    return {k: int(v) for k, v in re.findall(r"(\w+): (\d+) B", line)}


def test_memory_used_and_reserved_apart_as_the_real_h200_reports(node: Node, nvml: ModuleType,
                                                                 builtin: Any) -> None:
    # The real H200: v1 said 615 MiB used on the idle GPU, v2 used 0 and reserved 615 MiB, nvidia-smi
    # -q -d MEMORY Used 0 and Reserved 616 MiB. The shim holds back the captured reserved bytes.
    real = _captured_memory_v2()
    assert (real["used"], real["reserved"] // 2**20) == (0, 615)
    node.boot(LIB_VERSION)
    add_conf(node, f"reserved_bytes={real['reserved']}")
    facts = both(nvml, builtin)
    gpu = facts["gpus"][0]
    assert (gpu["memory_used_mib"], gpu["memory_reserved_mib"], gpu["memory_source"]) == (0, 615, "nvml_v2")
    # The v1 call through either binding still counts it as used: what the facts said before.
    for bindings in (nvml, builtin):
        bindings.nvmlInit()
        v1 = bindings.nvmlDeviceGetMemoryInfo(bindings.nvmlDeviceGetHandleByIndex(0))
        bindings.nvmlShutdown()
        assert int(v1.used) // 2**20 == 615
    recorded = json.loads((Path(__file__).resolve().parents[1] /
                           "fixtures/gpu_health/h200_r580/facts-nvml-pynvml.json").read_text())
    assert recorded["driver"]["gpus"][0]["memory_used_mib"] == 615


def test_binding_reads_a_registered_fabric_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any) -> None:
    node.boot(LIB_VERSION)
    fm = start_fabric_manager(node)
    try:
        facts = both(nvml, builtin)
    finally:
        fm.send_signal(signal.SIGTERM)
        fm.communicate(timeout=10)
    gpus = facts["gpus"]
    assert {(g["fabric_state"], g["fabric_status"], g["fabric_health"]["summary"]) for g in gpus} == {
        ("completed", "success", "healthy")}
    assert len({g["fabric_cluster_uuid"] for g in gpus}) == 1 and {g["fabric_clique_id"] for g in gpus} == {0}


def test_binding_reads_a_stale_fabric_state_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any) -> None:
    node.boot(LIB_VERSION)
    dead = subprocess.Popen(["true"])
    dead.wait()
    node.fabric_state.parent.mkdir(parents=True)
    node.fabric_state.write_text(f"pid={dead.pid}\nversion={LIB_VERSION}\nstate=completed\n", encoding="utf-8")
    facts = both(nvml, builtin)
    assert {g["fabric_state"] for g in facts["gpus"]} == {"not_started"}


def test_binding_lists_compute_processes_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any) -> None:
    # More processes than the first (count-only) call can know of: NVML's two calls, as pynvml makes them.
    add_conf(node, "processes=0:443:103010:python3,0:5120:1024:/usr/bin/python3,5:777:2048:vllm")
    node.boot(LIB_VERSION)
    facts = both(nvml, builtin)
    gpus = facts["gpus"]
    assert gpus[0]["processes"] == [
        {"pid": 443, "type": "C", "name": "python3", "used_memory_mib": 103010},
        {"pid": 5120, "type": "C", "name": "/usr/bin/python3", "used_memory_mib": 1024}]
    assert gpus[0]["memory_used_mib"] == 104034
    assert gpus[5]["processes"] == [{"pid": 777, "type": "C", "name": "vllm", "used_memory_mib": 2048}]
    assert [g["processes"] for i, g in enumerate(gpus) if i not in (0, 5)] == [[]] * 6
    assert facts["note"] is None


def test_binding_reports_a_lost_gpu_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any) -> None:
    add_conf(node, "lost=3")
    node.boot(LIB_VERSION)
    facts = both(nvml, builtin)
    assert facts["nvml"] == {"status": "gpu_is_lost", "error": "GPU 3: NVMLError_GpuIsLost: GPU is lost"}
    assert facts["gpus"][3] == {"index": 3}
    assert [g["index"] for g in facts["gpus"] if "uuid" in g] == [0, 1, 2, 4, 5, 6, 7]


@pytest.mark.parametrize(("boot", "status", "error"), [
    (None, "driver_not_loaded", "nvmlInit: NVMLError_DriverNotLoaded: Driver Not Loaded"),
    ("575.57.08", "lib_rm_version_mismatch",
     "nvmlInit: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch."),
    ("580.82.07", "lib_rm_version_mismatch",
     "nvmlInit: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch."),
])
def test_binding_reports_init_failures_as_pynvml_does(node: Node, nvml: ModuleType, builtin: Any,
                                                       boot: str | None, status: str, error: str) -> None:
    if boot:
        node.boot(boot, flavour="proprietary")
    facts = both(nvml, builtin)
    assert facts["nvml"] == {"status": status, "error": error}
    assert facts["gpus"] == []


def test_binding_reports_an_unreadable_version_file_as_pynvml_does(node: Node, nvml: ModuleType,
                                                                    builtin: Any) -> None:
    path = node.proc / "driver/nvidia/version"
    path.parent.mkdir(parents=True)
    path.write_text("\x00\xff garbage\n", encoding="latin-1")
    assert both(nvml, builtin)["nvml"] == {"status": "error", "error": "nvmlInit: NVMLError_Unknown: Unknown Error"}


def test_binding_error_classes_are_pynvml_s(nvml: ModuleType, builtin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml_lib as lib
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import (
        NVML_ERROR_STATUS,
        _nvml_return_name,
        nvml_error_status,
    )

    # pynvml keeps the texts it asked the library for: those of the stand-in must not outlive the test.
    monkeypatch.setattr(nvml.NVMLError, "_errcode_to_string", dict(nvml.NVMLError._errcode_to_string))
    codes = sorted(nvml.NVMLError._valClassMapping)
    assert sorted(lib.RETURN_NAMES) == codes
    for code in codes:
        ours, theirs = builtin.NVMLError(code), nvml.NVMLError(code)
        assert (type(ours).__name__, ours.value) == (type(theirs).__name__, theirs.value)
        assert isinstance(ours, builtin.NVMLError) and getattr(builtin, type(ours).__name__) is type(ours)
        assert nvml_error_status(ours) == nvml_error_status(theirs)
        # The fabric status text of a code reads the same through both (NVML's own nvmlErrorString).
        assert _nvml_return_name(builtin, code) == _nvml_return_name(nvml, code)
    assert {name for name in NVML_ERROR_STATUS if hasattr(builtin, name)} == set(NVML_ERROR_STATUS)
    # A subclass built without a code knows its own, as pynvml's do.
    assert builtin.NVMLError_GpuIsLost().value == 15 and str(builtin.NVMLError_GpuIsLost()) == "GPU is lost"
    # A code NVML did not name is the base class, with the library's text.
    assert type(builtin.NVMLError(4242)) is builtin.NVMLError and str(builtin.NVMLError(4242)) == "Unknown Error"


class OlderDriver:
    """The stand-in library as a driver that does not export ``missing`` (ctypes raises AttributeError)."""

    def __init__(self, library: Any, missing: set[str]) -> None:
        self.library, self.missing = library, missing

    def __getattr__(self, name: str) -> Any:
        if name in self.missing:
            raise AttributeError(name)
        return getattr(self.library, name)


def test_binding_on_an_older_driver_uses_what_it_exports(node: Node, builtin: Any) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import collect_nvml
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml_lib import Nvml

    add_conf(node, "processes=2:443:1024:python3")
    node.boot(LIB_VERSION)
    old = Nvml(OlderDriver(builtin.library, {"nvmlDeviceGetCurrentClocksEventReasons",
                                             "nvmlDeviceGetComputeRunningProcesses_v3",
                                             "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetRemappedRows"}),
               builtin.path)
    facts = collect_nvml(old)
    assert facts["nvml"] == {"status": "ok", "error": None}
    gpu = facts["gpus"][2]
    # The clock event reasons under their name before R535.
    assert gpu["throttle"] == {"active": ["gpu_idle"], "mask": 1, "reason": None}
    # Calls the driver lacks are NVML's FunctionNotFound: unknown with the reason, never a crash.
    assert (gpu["processes"], gpu["fabric_state"], gpu["fabric_health"]) == (None, None, None)
    assert gpu["remapped_rows"]["reason"] == "NVMLError_FunctionNotFound: Function Not Found"
    assert facts["note"] == "GPU compute processes unknown: GPU 0-7: NVMLError_FunctionNotFound: Function Not Found"
    with pytest.raises(builtin.NVMLError_FunctionNotFound):
        old.function("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")


def test_binding_without_a_library_says_why(tmp_path: Path) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml_lib import open_library

    lib, problem = open_library(str(tmp_path / "libnvidia-ml.so.1"))
    assert lib is None
    assert problem == f"{tmp_path / 'libnvidia-ml.so.1'}: cannot open shared object file: No such file or directory"


def test_collect_driver_through_the_binding_matches_pynvml(node: Node, nvml: ModuleType, shim: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver collector on a stand-in node with pynvml, then without it: the same facts, but for which
    bindings asked NVML, and neither runs nvidia-smi but for its topology matrix."""
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_nvml_lib
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import collect_driver
    from k3fleet.models.facts import DriverFacts

    add_conf(node, "processes=1:443:2048:python3")
    node.boot(LIB_VERSION)
    bindir = node.root / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "dmesg"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{node.script("dmesg.py")}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)

    def collect() -> tuple[dict[str, Any], list[list[str]]]:
        reader = NodeReader(procfs=str(node.proc), path=f"{bindir}:/usr/bin:/bin")
        facts = collect_driver(reader)
        DriverFacts.model_validate(facts)
        return facts, [c["argv"] for c in reader.commands]

    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with_pynvml, ran_with = collect()
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(k3fleet_nvml_lib, "LIBRARY", str(shim))
    with_builtin, ran_without = collect()
    assert (with_pynvml["nvml"]["bindings"], with_builtin["nvml"]["bindings"]) == ("pynvml", "k3fleet")
    with_pynvml["nvml"]["bindings"] = with_builtin["nvml"]["bindings"] = None
    assert with_builtin == with_pynvml
    assert (with_builtin["source"], with_builtin["gpu_count"]) == ("nvml", 8)
    assert with_builtin["gpus"][1]["processes"] == [{"pid": 443, "type": "C", "name": "python3",
                                                     "used_memory_mib": 2048}]
    # NVML has no GPU-to-NIC topology matrix: `nvidia-smi topo -m` is the one nvidia-smi call either makes.
    assert [argv[1:] for argv in ran_with + ran_without if argv[0].endswith("nvidia-smi")] == [
        ["topo", "-m"], ["topo", "-m"]]


# ---- the simulated /proc -------------------------------------------------------

PROPRIETARY_LINE = re.compile(r"^NVRM version: NVIDIA UNIX x86_64 Kernel Module  (\d+\.\d+(?:\.\d+)?)  (\S.*)$")
OPEN_LINE = re.compile(r"^NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  (\d+\.\d+(?:\.\d+)?)"
                       r"  Release Build  \((\S+)\)  (\S.*)$")


@pytest.mark.parametrize(("flavour", "pattern", "ref"), [
    ("proprietary", PROPRIETARY_LINE, "proc-driver-nvidia-version.proprietary.txt"),
    ("open", OPEN_LINE, "proc-driver-nvidia-version.open.txt"),
])
def test_version_file_has_the_real_format_of_each_flavour(
        node: Node, nvml: ModuleType, flavour: str, pattern: re.Pattern[str], ref: str) -> None:
    real = reference(ref).splitlines()
    assert pattern.match(real[0]), "the pattern must describe the real capture"
    node.boot(LIB_VERSION, flavour=flavour)
    ours = (node.proc / "driver/nvidia/version").read_text(encoding="utf-8").splitlines()
    match = pattern.match(ours[0])
    assert match and match.group(1) == LIB_VERSION
    assert ours[1].startswith("GCC version:  gcc version ") and real[1].startswith("GCC version:  gcc version ")
    nvml.nvmlInit()
    assert nvml.nvmlSystemGetDriverVersion() == LIB_VERSION


def test_load_adds_nvidia_modules_switches_and_kernel_release(node: Node) -> None:
    node.boot(LIB_VERSION, flavour="proprietary")
    modules = (node.proc / "modules").read_text(encoding="utf-8").splitlines()
    names = [line.split()[0] for line in modules]
    assert names == ["nvidia_uvm", "nvidia_modeset", "nvidia", "overlay", "veth"]
    for line in modules:
        fields = line.split()
        assert fields[1].isdigit() and fields[2].isdigit() and fields[4] == "Live"
    assert modules[2].split()[3] == "nvidia_uvm,nvidia_modeset,"
    assert modules[0].endswith("(POE)")  # proprietary modules taint the kernel
    assert (node.proc / "sys/kernel/osrelease").read_text(encoding="utf-8") == "6.1.0-28-amd64\n"
    switches = sorted(p.name for p in (node.proc / "driver/nvidia-nvswitch/devices").iterdir())
    assert switches == ["0000:09:00.0", "0000:0a:00.0", "0000:0b:00.0", "0000:0c:00.0"]
    info = (node.proc / "driver/nvidia-nvswitch/devices/0000:09:00.0/information").read_text(encoding="utf-8")
    assert info.startswith("BIOS Version: ")
    node.boot(LIB_VERSION, flavour="open")
    assert (node.proc / "modules").read_text(encoding="utf-8").splitlines()[0].endswith("(OE)")


def test_base_view_without_a_driver_has_no_nvidia(node: Node) -> None:
    done = node.run("nvidia_sim_proc.py", "base")
    assert done.returncode == 0, done.stderr
    text = (node.proc / "modules").read_text(encoding="utf-8")
    assert "nvidia" not in text and "overlay" in text
    assert not (node.proc / "driver/nvidia/version").exists()


def test_load_without_a_module_description_fails_with_a_clear_message(node: Node) -> None:
    done = node.run("nvidia_sim_proc.py", "load")
    assert done.returncode == 1
    assert "kernel-module.conf" in done.stderr
    assert not (node.proc / "driver/nvidia/version").exists()


# ---- nvidia-smi ----------------------------------------------------------------


def test_nvidia_smi_query_matches_nvml_and_the_real_csv_shape(node: Node, nvml: ModuleType) -> None:
    node.boot(LIB_VERSION)
    done = node.run("nvidia_smi.py", *QUERY)
    assert done.returncode == 0, done.stdout
    rows = done.stdout.splitlines()
    assert len(rows) == 8
    real_row = reference("nvidia-smi-query-gpu.csv.txt").splitlines()[0]
    assert ", " in real_row and ",  " not in real_row
    nvml.nvmlInit()
    for i, row in enumerate(rows):
        cells = row.split(", ")
        assert len(cells) == 8, row
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        assert cells == [str(i), "NVIDIA H200", nvml.nvmlDeviceGetUUID(h), LIB_VERSION, "143771",
                         "Enabled", nvml.nvmlDeviceGetPciInfo_v3(h).busId, "9.0"]


def test_nvidia_smi_into_a_closed_pipe_ends_quietly(node: Node) -> None:
    # 64 GPUs with -q print more than a pipe buffer holds, so the writer meets the closed pipe.
    (node.root / "gpus.conf").write_text(gpus_conf(64, "NVIDIA H200"), encoding="utf-8")
    node.boot(LIB_VERSION)
    script = node.script("nvidia_smi.py")
    env = dict(os.environ, **node.env(), LD_LIBRARY_PATH=str(node.lib_dir))
    done = subprocess.run(["sh", "-c", f'"{sys.executable}" "{script}" -q | head -c 10'], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert len(done.stdout) == 10
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_nvidia_smi_query_with_units_and_header(node: Node) -> None:
    node.boot(LIB_VERSION)
    done = node.run("nvidia_smi.py", "--query-gpu=index,memory.total", "--format=csv")
    assert done.stdout.splitlines()[:2] == ["index, memory.total [MiB]", "0, 143771 MiB"]
    bad = node.run("nvidia_smi.py", "--query-gpu=index,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_nvidia_smi_q_compute_header_has_driver_and_cuda_version(node: Node) -> None:
    node.boot(LIB_VERSION)
    done = node.run("nvidia_smi.py", "-q", "-d", "COMPUTE")
    assert done.returncode == 0
    ours = done.stdout.splitlines()
    real = reference("nvidia-smi-q.txt").splitlines()
    for key, value in (("Driver Version", LIB_VERSION), ("CUDA Version", "13.0"), ("Attached GPUs", "8")):
        mine = next(line for line in ours if line.startswith(key))
        theirs = next(line for line in real if line.startswith(key))
        assert mine.index(":") == theirs.index(":")
        assert mine.split(": ", 1)[1] == value
    assert ours.count("    Compute Mode                          : Default") == 8
    one = node.run("nvidia_smi.py", "-q", "-i", "3").stdout.splitlines()
    assert "Attached GPUs                             : 8" in one
    assert [line for line in one if line.startswith("GPU ")] == ["GPU 00000000:5D:00.0"]
    assert node.run("nvidia_smi.py", "-q", "-i", "8").returncode == 6


DRIVER_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "driver"


def test_nvidia_smi_q_health_reads_healthy(node: Node) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_smi import parse_smi_q_blocks, smi_q_health

    node.boot(LIB_VERSION)
    done = node.run("nvidia_smi.py", "-q")
    assert done.returncode == 0, done.stdout
    blocks = parse_smi_q_blocks(done.stdout)
    assert len(blocks) == 8
    for block in blocks.values():
        health = smi_q_health(block)
        assert health["ecc"] == {"mode": "enabled", "volatile_uncorrected": 0, "aggregate_uncorrected": 0,
                                 "volatile_corrected": 0, "aggregate_corrected": 0, "reason": None}
        assert health["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False,
                                           "failure": False, "retired_pages_pending": None, "reason": None}
        assert health["throttle"] == {"active": ["idle"], "mask": None, "reason": None}
        assert health["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16,
                                  "replay_counter": 0, "reason": None}
    ecc = node.run("nvidia_smi.py", "-q", "-d", "ECC").stdout
    assert "ECC Errors" in ecc and "Clocks Event Reasons" not in ecc and "Remapped Rows" not in ecc
    table = node.run("nvidia_smi.py").stdout.splitlines()
    # The summary's Volatile Uncorr. ECC column is NVML's volatile uncorrected count.
    assert table[8].rstrip().endswith("0 |")


def q_blocks(text: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("GPU "):
            current = blocks.setdefault(line[4:], [])
        elif line.strip() and blocks:
            current.append(line)
    return blocks


def q_keys(block: list[str]) -> list[tuple[int, str]]:
    return [(len(line) - len(line.lstrip(" ")), line.split(":", 1)[0].strip()) for line in block]


def test_nvidia_smi_q_fabric_follows_the_fabric_manager(node: Node, nvml: ModuleType) -> None:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_smi import parse_smi_q_fabric

    node.boot(LIB_VERSION)
    down = node.run("nvidia_smi.py", "-q")
    assert down.returncode == 0, down.stdout
    fabric = parse_smi_q_fabric(down.stdout)
    assert len(fabric) == 8
    assert {(v["state"], v["status"]) for v in fabric.values()} == {("not_started", None)}
    fm = start_fabric_manager(node)
    try:
        up = node.run("nvidia_smi.py", "-q")
    finally:
        fm.send_signal(signal.SIGTERM)
        fm.communicate(timeout=10)
    assert up.returncode == 0, up.stdout
    fabric = parse_smi_q_fabric(up.stdout)
    assert {(v["state"], v["status"], v["note"]) for v in fabric.values()} == {("completed", "success", None)}
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    info = nvml.c_nvmlGpuFabricInfoV_t()
    nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    uuid = bytes(info.clusterUuid).hex()
    block = q_blocks(up.stdout)[nvml.nvmlDeviceGetPciInfo_v3(h).busId]
    assert "        CliqueId                          : 0" in block
    assert f"        ClusterUUID                       : {uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-" \
           f"{uuid[20:]}" in block


def test_nvidia_smi_q_blocks_keep_the_real_key_order(node: Node) -> None:
    node.boot(LIB_VERSION)
    ours = q_blocks(node.run("nvidia_smi.py", "-q").stdout)
    real = q_blocks((DRIVER_FIXTURES / "smi_q_565_h100x8_fabric_completed.txt").read_text(encoding="utf-8"))
    real_keys = q_keys(real["00000000:18:00.0"])
    for bus_id, block in ours.items():
        # Every line of ours is a line of a real H100 HGX block, in the real order and nesting.
        keys = iter(real_keys)
        missing = [key for key in q_keys(block) if key not in keys]
        assert not missing, f"{bus_id}: {missing}"
        assert {line.index(":") for line in block if ":" in line} == {42}
    # -d COMPUTE still prints the compute section only: no fabric there, as on a real node.
    compute = node.run("nvidia_smi.py", "-q", "-d", "COMPUTE").stdout
    assert "Fabric" not in compute and compute.count("Compute Mode") == 8


def pipes(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c in "|+"]


def test_nvidia_smi_summary_keeps_the_real_column_layout(node: Node) -> None:
    node.boot(LIB_VERSION)
    done = node.run("nvidia_smi.py")
    assert done.returncode == 0
    ours = done.stdout.splitlines()
    real = reference("nvidia-smi-summary.txt").splitlines()
    # version banner, column headers and the three rows of the first GPU line up
    for i in range(1, 12):
        assert pipes(ours[i]) == pipes(real[i]), f"line {i}:\n{ours[i]}\n{real[i]}"
        assert len(ours[i]) == len(real[i])
    assert re.search(r"NVIDIA-SMI 580\.95\.05 +Driver Version: 580\.95\.05 +CUDA Version: 13\.0 ", ours[2])
    assert sum("NVIDIA H200" in line for line in ours) == 8
    assert "143771MiB" in ours[9]


def test_nvidia_smi_on_mismatch_prints_the_real_message_and_exits_18(node: Node) -> None:
    node.boot("575.57.08", flavour="proprietary")
    done = node.run("nvidia_smi.py", *QUERY)
    real = reference("nvidia-smi-mismatch.txt").splitlines()
    assert done.returncode == 18
    lines = done.stdout.splitlines()
    assert lines[0] == real[0]
    assert re.fullmatch(r"NVML library version: \d+\.\d+", real[1])
    assert lines[1] == "NVML library version: 580.95"


def test_nvidia_smi_without_driver_exits_9(node: Node) -> None:
    done = node.run("nvidia_smi.py")
    assert done.returncode == 9
    assert done.stdout == reference("nvidia-smi-not-loaded.txt")


def test_nvidia_smi_without_library_exits_12(node: Node, tmp_path: Path) -> None:
    found = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    if "libnvidia-ml.so.1" in found:
        pytest.skip("this machine has a real libnvidia-ml.so.1 in the loader cache")
    empty = tmp_path / "nolib"
    empty.mkdir()
    done = node.run("nvidia_smi.py", lib_dir=empty)
    assert done.returncode == 12
    assert "couldn't find libnvidia-ml.so" in done.stdout


# ---- nv-fabricmanager ----------------------------------------------------------

FM_MISMATCH = re.compile(r"fabric manager NVIDIA GPU driver interface version (\S+) don't match with "
                         r"driver version (\S+)\. Please update with matching NVIDIA driver package\.")


def test_fabric_manager_version(node: Node) -> None:
    done = node.run("nv_fabricmanager.py", "--version", values={"FM_VERSION": "580.95.05", "SIM_FAULT": ""})
    assert done.returncode == 0
    assert done.stdout == "Fabric Manager version is : 580.95.05\n"


def test_fabric_manager_refuses_a_different_loaded_driver(node: Node) -> None:
    assert FM_MISMATCH.search(reference("fabricmanager-version-mismatch.txt"))
    node.boot("575.57.08", flavour="proprietary")
    done = node.run("nv_fabricmanager.py", values={"FM_VERSION": "580.95.05", "SIM_FAULT": ""})
    assert done.returncode == 1
    match = FM_MISMATCH.search(done.stderr)
    assert match and match.groups() == ("580.95.05", "575.57.08")
    assert not node.fabric_state.exists()


def test_broken_fabric_manager_build_fails_even_on_a_matching_driver(node: Node) -> None:
    node.boot(LIB_VERSION)
    done = node.run("nv_fabricmanager.py", values={"FM_VERSION": LIB_VERSION, "SIM_FAULT": "nvswitch"})
    assert done.returncode == 1
    assert "NV_WARN_NOTHING_TO_DO" in done.stderr
    assert not node.fabric_state.exists()


def test_fabric_manager_without_nvswitches_fails(node: Node) -> None:
    (node.root / "gpus.conf").write_text(gpus_conf(4, "NVIDIA H200"), encoding="utf-8")
    node.boot(LIB_VERSION)
    assert not (node.proc / "driver/nvidia-nvswitch").exists()
    done = node.run("nv_fabricmanager.py", values={"FM_VERSION": LIB_VERSION, "SIM_FAULT": ""})
    assert done.returncode == 1 and "NV_WARN_NOTHING_TO_DO" in done.stderr


def test_fabric_manager_without_driver_fails(node: Node) -> None:
    done = node.run("nv_fabricmanager.py", values={"FM_VERSION": LIB_VERSION, "SIM_FAULT": ""})
    assert done.returncode == 1 and "not loaded" in done.stderr


def test_fabric_manager_tells_systemd_it_is_ready(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    node.boot(LIB_VERSION)
    address = node.root / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", str(address))
        fm = start_fabric_manager(node)
        try:
            assert sock.recv(64) == b"READY=1"
        finally:
            fm.send_signal(signal.SIGTERM)
            fm.communicate(timeout=10)


# ---- builder pieces that need no dpkg ------------------------------------------


def test_gpus_conf_rejects_unknown_models_and_counts() -> None:
    with pytest.raises(StandinBuildError, match="GPU model 'NVIDIA B999' is unknown"):
        gpus_conf(8, "NVIDIA B999")
    with pytest.raises(StandinBuildError, match="GPU count 0 is out of range"):
        gpus_conf(0, "NVIDIA H200")
    sixteen = dict(x.split("=", 1) for x in gpus_conf(16, "NVIDIA H200").splitlines() if "=" in x)
    assert len(set(sixteen["bus_ids"].split(","))) == 16
    # two 8-GPU baseboards, four NVSwitch chips each
    assert len(set(sixteen["nvswitch_bus_ids"].split(","))) == 8


def test_install_pins_name_exact_versions() -> None:
    assert install_pins("580.95.05") == [
        "nvidia-driver-580-server=580.95.05-0ubuntu1",
        "nvidia-utils-580-server=580.95.05-0ubuntu1",
        "libnvidia-compute-580=580.95.05-0ubuntu1",
        "nvidia-kernel-sim-580=580.95.05-0ubuntu1",
        "nvidia-fabricmanager-580=580.95.05-1",
        "cuda-drivers-fabricmanager-580=580.95.05-1",
    ]
    assert install_pins("575.57.08", open_kernel=True, fabricmanager=False)[0] == \
        "nvidia-driver-575-server-open=575.57.08-0ubuntu1"
    with pytest.raises(StandinBuildError, match=r"release '590\.1' is unknown"):
        install_pins("590.1")


def test_templates_refuse_missing_values() -> None:
    with pytest.raises(StandinBuildError, match="no value for @FM_VERSION@"):
        render_template("nv_fabricmanager.py", SIM_FAULT="")


def test_hardware_package_diverts_dmesg_and_gives_it_back(tmp_path: Path) -> None:
    """The stand-in dmesg takes util-linux's path through dpkg-divert; the maintainer scripts are real
    shell, run here against a dpkg-divert that records its arguments."""
    from k3fleet.lab.standin.builder import _driver_packages, _hardware_package, _maint_scripts

    pkg = _hardware_package(8, "NVIDIA H200")
    assert pkg.files["/bin/dmesg"][0].decode() == render_template("dmesg.py")
    scripts = _maint_scripts(pkg)
    assert set(scripts) == {"preinst", "postinst", "prerm", "postrm"}
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls"
    (bindir / "dpkg-divert").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n', encoding="utf-8")
    (bindir / "dpkg-divert").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    for name, arg in (("preinst", "install"), ("postrm", "upgrade"), ("postrm", "remove")):
        script = tmp_path / name
        script.write_text(scripts[name], encoding="utf-8")
        done = subprocess.run(["sh", str(script), arg], env=env, capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 0, done.stderr
    common = "--package nvidia-sim-hardware --rename --divert /bin/dmesg.util-linux /bin/dmesg"
    # Added on install, kept across an upgrade, removed with the package.
    assert log.read_text(encoding="utf-8").splitlines() == [f"--quiet --add {common}", f"--quiet --remove {common}"]
    # Packages that replace nothing have no preinst and divert nothing.
    shim = Path(__file__)  # any file: only its bytes go into the package
    units = [p for p in _driver_packages(release(LIB_VERSION), "amd64", "x86_64-linux-gnu", shim, None) if p.unit]
    for other in units:
        plain = _maint_scripts(other)
        assert "preinst" not in plain and "dpkg-divert" not in plain["postrm"]
