"""Host rules as tables: one fact changed on a synthetic host -> the findings it must produce.

Every case starts from a fixture in tests/fixtures/verdict (see its README) and patches
dotted paths; the expected value is the complete set of findings as
"check_id/severity" (kind "fail") or "check_id/severity/unknown", so a rule that fires
too often fails a case as surely as one that does not fire.

The default target derives its strategy from GPU memory (8x H200 cannot hold the
weights: multi-node, RDMA required). The single-node rule table pins the strategy
explicitly (SINGLE); the multi-node one uses MULTI; AUTO_CASES pin the derivation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from verdict_fixtures import B200, GOOD, R575, SINGLE, TARGET, patched, raw

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import Finding
from k3fleet.models.target import Target
from k3fleet.verdict import CHECKS, evaluate_host
from k3fleet.verdict.rules import missing_hcas, release_key


def _multi(**rdma: Any) -> Target:
    t = TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update={"strategy": "multi_node_tp_dp"})})
    if rdma:
        t = t.model_copy(update={"rdma": t.rdma.model_copy(update=rdma)})
    return t


MULTI = _multi()


def facts(base: str, patch: dict[str, Any] | None = None) -> HostFacts:
    return HostFacts.model_validate(patched(raw(base), patch))


def keys(findings: list[Finding]) -> set[str]:
    return {f"{f.check_id}/{f.severity}" + ("/unknown" if f.kind == "unknown" else "") for f in findings}


def each_gpu(**fields: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    return lambda gpus: [{**g, **fields} for g in gpus]


def first_gpu(**fields: Any) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    return lambda gpus: [{**g, **fields} if i == 0 else g for i, g in enumerate(gpus)]


def port(**fields: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {**p, **fields}


NOT_LOADED = {
    "driver.status": "absent", "driver.kernel_module.loaded": False, "driver.kernel_module.version": None,
    "driver.kernel_module.raw": None, "driver.driver_version": None, "driver.cuda_driver_version": None,
    "driver.source": None, "driver.gpus": [], "driver.gpu_count": None,
    "driver.nvml": {"status": "driver_not_loaded", "error": "nvmlInit: NVMLError_DriverNotLoaded: Driver Not Loaded"},
    "driver.reason": "NVIDIA kernel module not loaded (/proc/driver/nvidia/version absent)",
}
CHAIN_575 = {"driver.branch/critical", "container.cuda_runtime/critical", "container.probe/critical"}

CASES: list[tuple[str, str, dict[str, Any], set[str]]] = [
    # -- driver and NVML
    ("module not loaded", GOOD, NOT_LOADED, {"driver.loaded/critical"}),
    ("module state unreadable", GOOD,
     {"driver.status": "unknown", "driver.kernel_module.loaded": None, "driver.kernel_module.version": None,
      "driver.driver_version": None, "driver.reason": "/proc/driver/nvidia/version: Permission denied"},
     {"driver.loaded/error/unknown"}),
    ("gpu lost", GOOD, {"driver.nvml": {"status": "gpu_is_lost", "error": "NVMLError_GpuIsLost: GPU is lost"}},
     {"nvml.status/critical"}),
    ("nvml library missing", GOOD, {"driver.nvml.status": "library_not_found"}, {"nvml.status/error"}),
    ("nvml library missing, nvidia-smi answered", GOOD,
     {"driver.nvml.status": "library_not_found", "driver.source": "nvidia-smi"}, {"nvml.status/warning"}),
    ("module not loaded, no nvml library", GOOD,
     {**NOT_LOADED, "driver.nvml": {"status": "library_not_found", "error": "libnvidia-ml.so.1: cannot open"}},
     {"driver.loaded/critical"}),
    ("nvml error, no fallback", GOOD, {"driver.nvml.status": "error"}, {"nvml.status/error"}),
    ("nvml error, nvidia-smi answered", GOOD, {"driver.nvml.status": "error", "driver.source": "nvidia-smi"},
     {"nvml.status/warning"}),
    ("nvml no permission", GOOD, {"driver.nvml.status": "no_permission"}, {"nvml.status/warning/unknown"}),
    ("nvml version mismatch", GOOD,
     {"driver.nvml": {"status": "lib_rm_version_mismatch", "error": "Driver/library version mismatch"}},
     {"driver.pending_reboot/error"}),
    ("package upgraded, old module loaded", R575, {"packages.driver_version": "580.95.05"},
     CHAIN_575 | {"driver.pending_reboot/error"}),
    ("R580 below the matrix minimum", GOOD,
     {"driver.kernel_module.version": "580.10.01", "driver.driver_version": "580.10.01",
      "packages.driver_version": "580.10.01", "fabricmanager.version": "580.10.01"},
     {"driver.version_min/error", "container.cuda_runtime/warning"}),
    ("driver version unreadable", GOOD,
     {"driver.kernel_module.version": None, "driver.driver_version": "garbage", "packages.driver_version": None},
     {"driver.branch/error/unknown"}),
    ("Blackwell on proprietary modules", B200, {"driver.kernel_module.flavour": "proprietary"},
     {"driver.flavour/critical"}),
    ("Grace Hopper on proprietary modules", GOOD,
     {"driver.gpus": each_gpu(name="NVIDIA GH200 480GB"), "driver.kernel_module.flavour": "proprietary"},
     {"driver.flavour/critical"}),
    ("Blackwell flavour unknown", B200,
     {"driver.kernel_module.flavour": None, "packages.packages.0.flavour": None},
     {"driver.flavour/error/unknown"}),
    ("Blackwell flavour from the package", B200, {"driver.kernel_module.flavour": None}, set()),
    # -- GPUs
    ("one GPU missing", GOOD, {"driver.gpus": lambda g: g[:7], "driver.gpu_count": 7}, {"gpu.count/error"}),
    ("no GPU", GOOD, {"driver.gpus": [], "driver.gpu_count": 0}, {"gpu.count/critical"}),
    ("GPU count unknown", GOOD, {"driver.gpus": [], "driver.gpu_count": None}, {"gpu.count/error/unknown"}),
    ("persistence off", GOOD, {"driver.gpus.3.persistence_mode": False}, {"gpu.persistence_mode/warning"}),
    ("persistence unknown", GOOD, {"driver.gpus": each_gpu(persistence_mode=None)},
     {"gpu.persistence_mode/warning/unknown"}),
    ("fabric training in progress", GOOD, {"driver.gpus.2.fabric_state": "in_progress"},
     {"gpu.fabric_state/error"}),
    ("fabric state unknown", GOOD, {"driver.gpus": each_gpu(fabric_state=None)},
     {"gpu.fabric_state/warning/unknown"}),
    ("PCIe host without NVSwitch or FM", GOOD,
     {"fabricmanager": {"status": "absent", "nvswitch_present": False, "nvswitch_count": 0, "required": False,
                        "unit": {"installed": False, "active": "inactive", "enabled": "not-found"}},
      "driver.gpus": each_gpu(fabric_state="not_supported")},
     set()),
    # -- packages
    ("driver not held", GOOD, {"packages.packages.0.held": False}, {"packages.held/warning"}),
    ("unattended upgrades on, driver not held", GOOD,
     {"packages.unattended_upgrades_enabled": True, "packages.packages.0.held": False},
     {"packages.unattended_upgrades/error", "packages.held/warning"}),
    ("unattended upgrades on, driver held", GOOD, {"packages.unattended_upgrades_enabled": True},
     {"packages.unattended_upgrades/warning"}),
    ("package listing unreadable", GOOD,
     {"packages": {"status": "unknown", "reason": "dpkg-query: exit 2: dpkg: error: parsing file"}},
     {"packages.held/warning/unknown", "packages.unattended_upgrades/warning/unknown",
      "driver.pending_reboot/warning/unknown"}),
    ("runfile install", GOOD, {"packages.packages": lambda ps: [p for p in ps if p["role"] == "toolkit"]},
     {"packages.held/warning/unknown"}),
    ("DKMS not built for the running kernel", GOOD,
     {"packages.dkms_used": True, "packages.dkms_built_for_running_kernel": False,
      "packages.dkms_modules": [{"name": "nvidia", "version": "580.95.05", "kernel": "6.8.0-45-generic",
                                 "arch": "x86_64", "status": "installed"}]},
     {"packages.dkms_kernel/error"}),
    # -- Fabric Manager
    ("FM not installed", GOOD,
     {"fabricmanager.status": "absent", "fabricmanager.unit.installed": None, "fabricmanager.version": None},
     {"fabricmanager.present/critical"}),
    ("FM failed", GOOD, {"fabricmanager.unit.active": "failed"}, {"fabricmanager.active/critical"}),
    ("FM version differs", GOOD, {"fabricmanager.version": "580.82.07"}, {"fabricmanager.version_match/error"}),
    ("NVSwitch presence unknown", GOOD,
     {"fabricmanager": {"status": "unknown", "reason": "NVSwitch presence unknown"}},
     {"fabricmanager.present/error/unknown"}),
    # -- NCCL
    ("NCCL_DEBUG=INFO", GOOD, {"nccl.settings.NCCL_DEBUG": {"value": "INFO", "source": "/etc/nccl.conf"}},
     {"nccl.debug/warning"}),
    ("NCCL_DEBUG=WARN", GOOD, {"nccl.settings.NCCL_DEBUG": {"value": "WARN", "source": "env"}}, set()),
    ("NCCL_IB_HCA names a missing HCA", GOOD,
     {"nccl.settings.NCCL_IB_HCA": {"value": "mlx5_0,mlx5_9", "source": "env"}}, {"nccl.settings/error"}),
    ("NCCL_IB_HCA exclude list", GOOD, {"nccl.settings.NCCL_IB_HCA": {"value": "^mlx5_9", "source": "env"}}, set()),
    ("NCCL settings unreadable", GOOD, {"nccl": {"status": "unknown", "reason": "/etc/nccl.conf: Permission denied"}},
     {"nccl.debug/warning/unknown", "nccl.settings/warning/unknown"}),
    ("ACS redirects P2P", GOOD, {"rdma.acs_enabled_bridges": ["0000:15:01.0", "0000:16:00.0"]},
     {"rdma.acs/warning"}),
    ("ACS not checked", GOOD, {"rdma.acs_checked": False, "rdma.acs_reason": "lspci: command not found"},
     {"rdma.acs/warning/unknown"}),
    # -- container
    ("no container runtime", GOOD, {"container.runtime": None, "container.runtimes": []}, {"container.runtime/error"}),
    ("unsupported runtime", GOOD, {"container.runtime.name": "lxc"}, {"container.runtime/warning"}),
    ("vulnerable toolkit", GOOD, {"container.toolkit_version": "1.17.7"}, {"container.toolkit/error"}),
    ("toolkit version unknown", GOOD, {"container.toolkit_version": None}, {"container.toolkit/warning/unknown"}),
    ("image missing", GOOD, {"container.image.present": False}, {"container.image_present/error"}),
    ("facts for another image", GOOD, {"container.image.ref": "vllm/vllm-openai:v0.27.1"},
     {"container.image_present/warning"}),
    ("vLLM too old", GOOD, {"container.image.vllm_version": "0.27.0"}, {"container.vllm_version/error"}),
    ("vLLM release candidate", GOOD, {"container.image.vllm_version": "0.27.1rc1"}, {"container.vllm_version/error"}),
    ("vLLM local build", GOOD, {"container.image.vllm_version": "0.27.1+cu130"}, set()),
    ("vLLM newer", GOOD, {"container.image.vllm_version": "0.28.0"}, set()),
    ("vLLM unknown", GOOD, {"container.image.vllm_version": None}, {"container.vllm_version/warning/unknown"}),
    ("image CUDA 13.2 on R580", GOOD, {"container.image.cuda_version": "13.2.0"}, {"container.cuda_runtime/warning"}),
    ("image CUDA 13.4 (no known driver)", GOOD, {"container.image.cuda_version": "13.4.0"},
     {"container.cuda_runtime/error/unknown"}),
    ("image CUDA from NVIDIA_REQUIRE_CUDA", GOOD,
     {"container.image.cuda_version": None, "container.image.nvidia_require_cuda": "cuda>=13.1"},
     {"container.cuda_runtime/warning"}),
    ("probe: CUDA error 35", GOOD,
     {"container.probe": {"ran": True, "ok": False, "failure": "cuda_error_35",
                          "message": "CUDA driver version is insufficient for CUDA runtime version"}},
     {"container.probe/critical"}),
    ("probe: runtime error", GOOD,
     {"container.probe": {"ran": True, "ok": False, "failure": "runtime_error", "message": "exit 125"}},
     {"container.probe/error"}),
    ("probe not run", GOOD, {"container.probe": {"ran": False, "message": "probe disabled"}},
     {"container.probe/warning/unknown"}),
    ("probe sees fewer GPUs", GOOD, {"container.probe.visible_gpus": 4}, {"container.probe/error"}),
    # -- scheduler
    ("drained", GOOD, {"scheduler.state": "drained", "scheduler.reason": "bad gpu"}, {"scheduler.state/warning"}),
    ("down", GOOD, {"scheduler.state": "down"}, {"scheduler.state/error"}),
    ("idle but maint", GOOD, {"scheduler.state_flags": ["maint"]}, {"scheduler.state/warning"}),
    ("raw slurm state", GOOD, {"scheduler.state": "IDLE+DRAIN"}, {"scheduler.state/warning"}),
    ("scheduler unreadable", GOOD,
     {"scheduler": {"status": "unknown", "kind": "slurm", "reason": "scontrol: timed out after 20s"}},
     {"scheduler.state/warning/unknown"}),
    ("no scheduler", GOOD, {"scheduler": {"status": "absent", "kind": "none"}}, set()),
    # -- schema
    ("facts from another schema major", GOOD, {"schema_version": "2.0"}, {"facts.schema/error/unknown"}),
    # -- GPU health (docs/facts.md section 14)
    ("volatile uncorrectable ECC", GOOD, {"driver.gpus": first_gpu(ecc={"mode": "enabled",
     "volatile_uncorrected": 2, "aggregate_uncorrected": 2})}, {"gpu.ecc/error"}),
    ("aggregate uncorrectable ECC only", GOOD, {"driver.gpus": first_gpu(ecc={"mode": "enabled",
     "volatile_uncorrected": 0, "aggregate_uncorrected": 4})}, {"gpu.ecc/warning"}),
    ("ECC counters N/A on every GPU", GOOD, {"driver.gpus": each_gpu(ecc={"mode": "disabled",
     "reason": "ECC is disabled on this GPU"})}, {"gpu.ecc/warning/unknown"}),
    ("row remap pending", GOOD, {"driver.gpus": first_gpu(remapped_rows={"uncorrectable": 4, "pending": True,
     "failure": False})}, {"gpu.remapped_rows/error"}),
    ("row remap failure", GOOD, {"driver.gpus": first_gpu(remapped_rows={"uncorrectable": 9, "pending": False,
     "failure": True})}, {"gpu.remapped_rows/critical"}),
    ("Xid 79 in the kernel log", GOOD, {"driver.kernel_log.xid": [{"code": 79, "pci": "PCI:0000:1b:00",
     "text": "GPU has fallen off the bus."}]}, {"gpu.xid/critical"}),
    ("Xid 13 only (an application fault)", GOOD, {"driver.kernel_log.xid": [{"code": 13, "pci": "PCI:0000:1b:00"}]},
     {"gpu.xid_application/warning"}),
    # Xid 63 on a GPU whose row remapping reads clean: the remap was recorded and activated; the remapped
    # rows check judges it (gpud leaves 63/64 to it), not gpu.xid.
    ("Xid 63 with remapped rows read", GOOD, {"driver.kernel_log.xid": [{"code": 63, "pci": "PCI:0000:18:00"}]},
     set()),
    # On a GPU the audit cannot match (or whose remapping state is unknown) Xid 63 stays a node fault.
    ("Xid 63 on an unmatched GPU", GOOD, {"driver.kernel_log.xid": [{"code": 63, "pci": "PCI:0000:99:00"}]},
     {"gpu.xid/error"}),
    # The same Xid 79 this boot and the boot before: the reboot did not fix it.
    ("Xid 79 in two boots", GOOD, {"driver.kernel_log.xid": [{"code": 79, "pci": "PCI:0000:1b:00"}],
     "driver.kernel_log.history": {"status": "ok", "boots_listed": 3, "boots": [
         {"offset": -1, "xid": [{"code": 79, "pci": "PCI:0000:1b:00"}]}, {"offset": -2, "xid": []}]}},
     {"gpu.xid/critical", "gpu.xid_recurring/critical"}),
    # Xid 94 in two earlier boots (none this boot) escalates too; Xid 13 in two boots is the application's.
    ("Xid 94 in two earlier boots", GOOD, {"driver.kernel_log.history": {"status": "ok", "boots": [
         {"offset": -1, "xid": [{"code": 94}, {"code": 13}]}, {"offset": -2, "xid": [{"code": 94}, {"code": 13}]}]}},
     {"gpu.xid_recurring/critical"}),
    ("Xid 79 in one earlier boot only", GOOD, {"driver.kernel_log.history": {"status": "ok", "boots": [
         {"offset": -1, "xid": [{"code": 79}]}]}}, set()),
    ("earlier boots unreadable", GOOD, {"driver.kernel_log.history": {"status": "unknown", "reason":
     "journalctl --list-boots: command not found"}}, {"gpu.xid_recurring/warning/unknown"}),
    # NVLink: GPU 3 with links 3 and 5 inactive as nvidia-smi nvlink -s printed them (azhpc-diagnostics 73).
    ("NVLink links inactive", GOOD, {"driver.gpus.3.nvlink": {"links": 6, "active": [0, 1, 2, 4],
     "inactive": [3, 5], "source": "nvidia-smi"}}, {"gpu.nvlink/error"}),
    # An empty nvlink -s on an NVSwitch board: no links, not healthy links.
    ("no NVLink links on an NVSwitch board", GOOD, {"driver.gpus": each_gpu(nvlink={"links": 0,
     "source": "nvidia-smi"})}, {"gpu.nvlink/error"}),
    ("no NVLink links on a board without NVSwitches", GOOD, {"driver.gpus": each_gpu(nvlink={"links": 0,
     "source": "nvidia-smi"}), "fabricmanager.required": False, "fabricmanager.nvswitch_present": False}, set()),
    ("18 NVLink links up", GOOD, {"driver.gpus": each_gpu(nvlink={"links": 18, "active": list(range(18)),
     "source": "nvml"})}, set()),
    # Counters sampled twice in one visit: judged by their change, not their total.
    ("IB port went down during the visit", GOOD, {"rdma.counters": {"interval_s": 3, "ports": {
     "mlx5_3/1": {"link_downed": [3, 4], "symbol_error": [41, 41]}}}}, {"rdma.link_flap/error"}),
    ("IB port totals without change", GOOD, {"rdma.counters": {"interval_s": 3, "ports": {
     "mlx5_3/1": {"link_downed": [3, 3], "symbol_error": [41, 41], "port_rcv_errors": [9000, 9000]}}}}, set()),
    ("IB buffer overrun during the visit", GOOD, {"rdma.counters": {"interval_s": 3, "ports": {
     "mlx5_0/1": {"excessive_buffer_overrun_errors": [0, 2]}}}}, {"rdma.port_counters/error"}),
    # 90 symbol errors in 3 s: 30/s, above NVSentinel's 10/s; 20 in 3 s (6.7/s) is below it.
    ("IB symbol errors above their rate", GOOD, {"rdma.counters": {"interval_s": 3, "ports": {
     "mlx5_0/1": {"symbol_error": [10, 100]}}}}, {"rdma.port_counters/warning"}),
    ("IB symbol errors below their rate", GOOD, {"rdma.counters": {"interval_s": 3, "ports": {
     "mlx5_0/1": {"symbol_error": [10, 30]}}}}, set()),
    ("IPoIB lost carrier twice in the kernel log", GOOD, {"driver.kernel_log.ib_carrier_lost": [
     {"iface": "ib3", "time": "8123.402117"}, {"iface": "ib3", "time": "8190.216650"}]}, {"rdma.link_flap/error"}),
    ("NVLink recovery during the visit", GOOD, {"driver.counters": {"interval_s": 2, "source": "nvml", "gpus": {
     "1": {"nvlink": {"7": {"recovery": [1, 2], "crc_flit": [700, 700]}}}}}}, {"gpu.nvlink_errors/error"}),
    # 1,400 CRC flit errors in 2 s: 700/s, above DCGM's 100/s.
    ("NVLink CRC errors above DCGM's rate", GOOD, {"driver.counters": {"interval_s": 2, "source": "nvml", "gpus": {
     "1": {"nvlink": {"7": {"crc_flit": [0, 1400], "recovery": [0, 0]}}}}}}, {"gpu.nvlink_errors/warning"}),
    ("PCIe replays above DCGM's rate", GOOD, {"driver.counters": {"interval_s": 2, "source": "nvml", "gpus": {
     "1": {"pcie_replay": [60, 120], "nvlink": {}}}}}, {"gpu.pcie_replay/warning"}),
    ("PCIe replay total without change", GOOD, {"driver.counters": {"interval_s": 2, "source": "nvml", "gpus": {
     "1": {"pcie_replay": [5000, 5000], "nvlink": {}}}}}, set()),
    # A single-node fleet sends no GPUDirect RDMA between nodes: GB200 without the override says nothing.
    ("GB200 on R580 without the GPUDirect override, one node", GOOD, {"driver.gpus": each_gpu(name="NVIDIA GB200"),
     "driver.kernel_module.grdma_topo_override": False}, set()),
    # Azure's check_gpu_ecc threshold: 20,000,000 correctable errors.
    ("correctable ECC above the threshold", GOOD, {"driver.gpus.0.ecc": {"mode": "enabled",
     "volatile_uncorrected": 0, "aggregate_uncorrected": 0, "volatile_corrected": 12, "aggregate_corrected":
     25_000_000}}, {"gpu.ecc_correctable/warning"}),
    ("correctable ECC below the threshold", GOOD, {"driver.gpus.0.ecc": {"mode": "enabled",
     "volatile_uncorrected": 0, "aggregate_uncorrected": 0, "volatile_corrected": 12, "aggregate_corrected":
     19_000_000}}, set()),
    ("kernel log unreadable", GOOD, {"driver.kernel_log": {"status": "unknown", "reason": "dmesg: Operation not "
     "permitted"}}, {"gpu.xid/warning/unknown"}),
    ("HW power brake slowdown", GOOD, {"driver.gpus": first_gpu(throttle={"active": ["hw_slowdown",
     "hw_power_brake_slowdown"]})}, {"gpu.throttle/error"}),
    ("idle and power cap are not faults", GOOD, {"driver.gpus": each_gpu(throttle={"active": ["gpu_idle",
     "sw_power_cap"]})}, set()),
    ("PCIe link x8 of x16", GOOD, {"driver.gpus": first_gpu(pcie={"gen_current": 5, "gen_max": 5,
     "width_current": 8, "width_max": 16})}, {"gpu.pcie_link/error"}),
    ("PCIe Gen 1 of 5 (idle)", GOOD, {"driver.gpus": first_gpu(pcie={"gen_current": 1, "gen_max": 5,
     "width_current": 16, "width_max": 16})}, {"gpu.pcie_link/warning"}),
    ("schema 1.0 facts: health never read", GOOD,
     {"schema_version": "1.0", "driver.kernel_log": None,
      "driver.gpus": each_gpu(ecc=None, remapped_rows=None, throttle=None, pcie=None)},
     {"gpu.ecc/warning/unknown", "gpu.remapped_rows/warning/unknown", "gpu.xid/warning/unknown",
      "gpu.throttle/warning/unknown", "gpu.pcie_link/warning/unknown"}),
    # -- a version on no data-center branch (docs/facts.md section 10)
    ("Tegra driver 540.4.0 from the L4T build host, no other Tegra evidence", GOOD,
     {"driver.kernel_module.version": "540.4.0", "driver.kernel_module.arch": "aarch64",
      "driver.kernel_module.raw": "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.4.0  Release "
                                  "Build  (buildbrain@mobile-u64-6289-d7000)  Sun Mar 19 08:09:33 PDT 2023",
      "driver.driver_version": "540.4.0", "packages.driver_version": None},
     {"driver.platform/critical"}),
    ("version of no known shape", GOOD,
     {"driver.kernel_module.version": "5400.1", "driver.driver_version": "5400.1", "packages.driver_version": None,
      },
     {"driver.platform/critical"}),
]


def test_clean_host_has_no_findings() -> None:
    for t in (TARGET, SINGLE, MULTI):
        assert evaluate_host(facts(GOOD), t) == []
        assert evaluate_host(facts(B200), t) == []


def test_r575_host_fails_the_version_chain_only() -> None:
    found = evaluate_host(facts(R575), SINGLE)
    assert keys(found) == CHAIN_575
    assert all(f.chain and f.kind == "fail" for f in found)
    branch = next(f for f in found if f.check_id == "driver.branch")
    assert "575.57.08" in branch.message and "R580" in branch.message and "EOL" in branch.message
    assert branch.evidence["driver_version"] == "575.57.08"
    assert branch.evidence["source"] == "kernel_module"
    assert "580.95.05" in (branch.fix or "")
    runtime = next(f for f in found if f.check_id == "container.cuda_runtime")
    assert runtime.evidence["host_max_cuda"] == "12.9"
    assert runtime.evidence["image_cuda"] == "13.0.2"


@pytest.mark.parametrize(("case", "base", "patch", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rule_table(case: str, base: str, patch: dict[str, Any], expected: set[str]) -> None:
    found = evaluate_host(facts(base, patch), SINGLE)
    assert keys(found) == expected, case
    for f in found:
        assert f.check_id in CHECKS
        assert f.host == raw(base)["host"]
        assert f.message and "\n" not in f.message
        assert f.fix and "{" not in f.fix


MULTI_CASES: list[tuple[str, str, dict[str, Any], set[str]]] = [
    # GB200 before R595 on an RDMA fleet: dma-buf GPUDirect RDMA needs GrdmaPciTopoCheckOverride=1 (AICR).
    ("GB200 on R580 without the GPUDirect override", GOOD, {"driver.gpus": each_gpu(name="NVIDIA GB200"),
     "driver.kernel_module.grdma_topo_override": False}, {"driver.gb200_gdr_override/error"}),
    ("GB200 on R580 with the GPUDirect override", GOOD, {"driver.gpus": each_gpu(name="NVIDIA GB200"),
     "driver.kernel_module.grdma_topo_override": True}, set()),
    ("GB200 on R580, override not read", GOOD, {"driver.gpus": each_gpu(name="NVIDIA GB200")},
     {"driver.gb200_gdr_override/warning/unknown"}),
    ("H200 without the override needs none", GOOD, {"driver.kernel_module.grdma_topo_override": False}, set()),
    ("DMA-BUF off, no peermem", GOOD, {"nccl.settings.NCCL_DMABUF_ENABLE": {"value": "0", "source": "env"}},
     {"rdma.peermem/error"}),
    ("DMA-BUF off, peermem loaded", GOOD,
     {"nccl.settings.NCCL_DMABUF_ENABLE": {"value": "0", "source": "env"}, "rdma.nvidia_peermem_loaded": True},
     set()),
    ("R575 proprietary without peermem", R575, {}, CHAIN_575 | {"rdma.peermem/error"}),
    ("a rail down", GOOD,
     {"rdma.devices.3.ports.0": port(state="DOWN", state_code=1, phys_state="Disabled", phys_state_code=3)},
     {"rdma.port_state/error"}),
    ("a rail at 200 Gb/s", GOOD,
     {"rdma.devices.5.ports.0": port(rate="200 Gb/sec (4X HDR)", rate_gbps=200.0)}, {"rdma.port_state/error"}),
    ("six rails", GOOD, {"rdma.devices": lambda d: d[:6]}, {"rdma.rail_count/error"}),
    ("rails on Ethernet", GOOD,
     {"rdma.devices.0.ports.0": port(link_layer="Ethernet"), "rdma.devices.1.ports.0": port(link_layer="Ethernet")},
     {"rdma.rail_count/error"}),
    ("no RDMA devices", GOOD,
     {"rdma.status": "absent", "rdma.devices": [], "rdma.reason": "/sys/class/infiniband does not exist"},
     {"rdma.rail_count/error"}),
    ("RDMA unreadable", GOOD, {"rdma.status": "unknown", "rdma.reason": "no port state could be read"},
     {"rdma.port_state/error/unknown", "rdma.rail_count/error/unknown"}),
    ("ACS on a multi-node target", GOOD, {"rdma.acs_enabled_bridges": ["0000:15:01.0"]}, {"rdma.acs/error"}),
    ("peermem and flavour unknown", GOOD,
     {"rdma.nvidia_peermem_loaded": None, "driver.kernel_module.flavour": None,
      "packages.packages.0.flavour": None},
     {"rdma.peermem/warning/unknown"}),
]


@pytest.mark.parametrize(("case", "base", "patch", "expected"), MULTI_CASES, ids=[c[0] for c in MULTI_CASES])
def test_multi_node_rule_table(case: str, base: str, patch: dict[str, Any], expected: set[str]) -> None:
    assert keys(evaluate_host(facts(base, patch), MULTI)) == expected, case


def test_rdma_rules_are_off_for_single_node() -> None:
    f = facts(GOOD, {"rdma.devices": [], "rdma.status": "absent"})
    assert evaluate_host(f, SINGLE) == []
    assert keys(evaluate_host(f, MULTI)) == {"rdma.rail_count/error"}
    # The default target derives multi-node on 8x H200: rails are required there.
    assert keys(evaluate_host(f, TARGET)) == {"rdma.rail_count/error"}


RAIL_DOWN = {"rdma.devices.3.ports.0": port(state="DOWN", state_code=1, phys_state="Disabled", phys_state_code=3)}
# Per-GPU memory (MiB) at which 8 GPUs hold exactly the target's 1561 GB of weights (compared as GiB).
HOLDS = 1561 * 1024 // 8
NOT_RDMA = TARGET.model_copy(update={"rdma": TARGET.rdma.model_copy(update={"required": False})})

# (case, base, patch, target, expected findings): the strategy decides whether RDMA is required,
# and a rail that is down is reported either way (an error where required, a warning where not).
AUTO_CASES: list[tuple[str, str, dict[str, Any], Target, set[str]]] = [
    ("8x H200 (about 1.1 TB): multi-node, rail down is an error", GOOD, RAIL_DOWN, TARGET,
     {"rdma.port_state/error"}),
    ("8x B200 (about 1.4 TB): multi-node", B200, RAIL_DOWN, TARGET, {"rdma.port_state/error"}),
    ("R575 H200, proprietary without peermem: no GPUDirect path", R575, {}, TARGET,
     CHAIN_575 | {"rdma.peermem/error"}),
    ("R575 H200 with peermem loaded", R575, {"rdma.nvidia_peermem_loaded": True}, TARGET, CHAIN_575),
    ("node memory exactly the weights: single-node, rail down warns", GOOD,
     {**RAIL_DOWN, "driver.gpus": each_gpu(memory_total_mib=HOLDS)}, TARGET, {"rdma.port_state/warning"}),
    ("one MiB per GPU short: multi-node", GOOD,
     {**RAIL_DOWN, "driver.gpus": each_gpu(memory_total_mib=HOLDS - 1)}, TARGET, {"rdma.port_state/error"}),
    ("the smallest GPU decides", GOOD,
     {**RAIL_DOWN, "driver.gpus": each_gpu(memory_total_mib=HOLDS), "driver.gpus.5.memory_total_mib": HOLDS - 1},
     TARGET, {"rdma.port_state/error"}),
    ("single-node, no peermem, rails absent: silent", GOOD,
     {"driver.gpus": each_gpu(memory_total_mib=HOLDS), "rdma.devices": [], "rdma.status": "absent"}, TARGET,
     set()),
    ("GPU memory unknown: judged multi-node", GOOD,
     {**RAIL_DOWN, "driver.gpus": each_gpu(memory_total_mib=None)}, TARGET, {"rdma.port_state/error"}),
    ("explicit single_node_tp wins on H200: rail down warns", GOOD, RAIL_DOWN, SINGLE, {"rdma.port_state/warning"}),
    ("explicit multi-node wins on a node that holds the weights", GOOD,
     {**RAIL_DOWN, "driver.gpus": each_gpu(memory_total_mib=HOLDS)}, MULTI, {"rdma.port_state/error"}),
    ("rdma.required false on a multi-node derivation", GOOD, RAIL_DOWN, NOT_RDMA, {"rdma.port_state/warning"}),
    ("slow rail where RDMA is not required warns", GOOD,
     {"rdma.devices.5.ports.0": port(rate="200 Gb/sec (4X HDR)", rate_gbps=200.0)}, SINGLE,
     {"rdma.port_state/warning"}),
    ("RDMA unreadable where not required: silent", GOOD,
     {"rdma.status": "unknown", "rdma.reason": "no port state could be read"}, SINGLE, set()),
    ("ignored bridge function down where not required: silent", GOOD,
     {"rdma.devices.3.name": "mlx5_bridge_0", **RAIL_DOWN}, SINGLE.model_copy(
         update={"rdma": SINGLE.rdma.model_copy(update={"ignore_devices": ["mlx5_bridge*"]})}), set()),
]


@pytest.mark.parametrize(("case", "base", "patch", "target", "expected"), AUTO_CASES,
                         ids=[c[0] for c in AUTO_CASES])
def test_strategy_decides_rdma(case: str, base: str, patch: dict[str, Any], target: Target,
                               expected: set[str]) -> None:
    assert keys(evaluate_host(facts(base, patch), target)) == expected, case


def test_rail_down_where_rdma_is_not_required_names_the_rail() -> None:
    found = evaluate_host(facts(GOOD, RAIL_DOWN), SINGLE)
    assert len(found) == 1
    f = found[0]
    assert (f.check_id, f.severity, f.kind) == ("rdma.port_state", "warning", "fail")
    assert "mlx5_3/1: DOWN/Disabled" in f.message and "not required" in f.message
    assert f.evidence["down"] == ["mlx5_3/1: DOWN/Disabled"] and f.evidence["rdma_required"] is False


def test_ignored_devices_are_not_rails() -> None:
    bridge = {"name": "mlx5_bridge_0", "ports": [{"port": 1, "state": "INIT", "state_code": 2,
                                                  "phys_state": "Polling", "phys_state_code": 2,
                                                  "link_layer": "InfiniBand"}]}
    f = facts(GOOD, {"rdma.devices": lambda d: [*d, bridge]})
    assert keys(evaluate_host(f, MULTI)) == {"rdma.port_state/error"}
    assert evaluate_host(f, _multi(ignore_devices=["mlx5_bridge*"])) == []


def test_required_nccl_settings() -> None:
    t = TARGET.model_copy(update={"nccl": TARGET.nccl.model_copy(update={"required": {"NCCL_MNNVL_ENABLE": "1"}})})
    found = evaluate_host(facts(GOOD), t)
    assert keys(found) == {"nccl.settings/error"}
    assert "NCCL_MNNVL_ENABLE=<unset> (required 1)" in found[0].message
    ok = facts(GOOD, {"nccl.settings.NCCL_MNNVL_ENABLE": {"value": "1", "source": "/etc/nccl.conf"}})
    assert evaluate_host(ok, t) == []


def test_unconfirmed_matrix_row_is_named() -> None:
    found = evaluate_host(facts(GOOD, {"container.image.cuda_version": "13.3.0"}), TARGET)
    assert keys(found) == {"container.cuda_runtime/warning"}
    assert "unconfirmed" in found[0].message
    assert found[0].evidence["matrix_confirmed"] is False
    assert found[0].evidence["min_driver"] == "610.43.02"


def test_fm_mismatch_on_a_host_below_target_is_part_of_the_chain() -> None:
    found = evaluate_host(facts(R575, {"fabricmanager.version": "570.124.06"}), TARGET)
    fm = next(f for f in found if f.check_id == "fabricmanager.version_match")
    assert fm.chain
    same = evaluate_host(facts(GOOD, {"fabricmanager.version": "580.82.07"}), TARGET)
    assert not same[0].chain


GARBAGE: list[dict[str, Any]] = [
    {"driver.cuda_driver_version": "N/A", "driver.driver_version": "[Unknown Error]"},
    {"driver.gpus": each_gpu(compute_capability="n/a", name=None)},
    {"container.toolkit_version": "unknown", "container.image.vllm_version": "dev"},
    {"container.image.cuda_version": "thirteen", "container.image.nvidia_require_cuda": "brand=tesla"},
    {"scheduler.state": "", "scheduler.jobs_running": None},
    {"rdma.devices.0.ports.0": port(state=None, phys_state=None, rate=None, rate_gbps=None, link_layer=None)},
    {"fabricmanager.version": "garbage", "fabricmanager.version_matches_driver": None},
    {"nccl.settings.NCCL_IB_HCA": {"value": "", "source": "env"}},
]


@pytest.mark.parametrize("patch", GARBAGE)
def test_garbage_facts_never_raise(patch: dict[str, Any]) -> None:
    for t in (TARGET, MULTI):
        for f in evaluate_host(facts(GOOD, patch), t):
            assert f.check_id in CHECKS


def test_garbage_fm_version_is_unknown_not_a_pass() -> None:
    found = evaluate_host(facts(GOOD, {"fabricmanager.version": "garbage",
                                       "fabricmanager.version_matches_driver": None}), TARGET)
    assert keys(found) == {"fabricmanager.version_match/error/unknown"}


@pytest.mark.parametrize(
    ("value", "devices", "missing"),
    [
        ("mlx5_0,mlx5_1", ["mlx5_0", "mlx5_1"], []),
        ("mlx5", ["mlx5_0"], []),
        ("mlx5_0:1,mlx5_7:1", ["mlx5_0"], ["mlx5_7"]),
        ("=mlx5_1", ["mlx5_10"], ["mlx5_1"]),
        ("^mlx5_9", ["mlx5_0"], []),
        ("", ["mlx5_0"], []),
    ],
)
def test_missing_hcas(value: str, devices: list[str], missing: list[str]) -> None:
    assert missing_hcas(value, devices) == missing


@pytest.mark.parametrize(
    ("a", "b"),
    [("0.27.0", "0.27.1"), ("0.27.1rc1", "0.27.1"), ("0.27.1", "0.28.0"), ("0.27.1.dev3", "0.27.1"),
     ("0.9.2", "0.27.1"), ("0.27", "0.27.1")],
)
def test_release_order(a: str, b: str) -> None:
    ka, kb = release_key(a), release_key(b)
    assert ka is not None and kb is not None and ka < kb
    assert release_key("0.27.1+cu130") == release_key("0.27.1") == release_key("0.27.1.0")
