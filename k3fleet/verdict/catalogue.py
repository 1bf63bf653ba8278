"""The check catalogue: every check id, what it checks, why it matters, its fix.

Check ids are a public contract (reports, suppressions and dashboards key on them):
never rename one; add a new id instead. ``k3fleet checks`` prints this table.
Fix texts are templates over the target's values (``{target_branch}`` and so on), so a
site target with other versions gets fixes that name its own versions.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from k3fleet.models.findings import Severity
from k3fleet.models.target import Target


class Check(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    scope: Literal["host", "fleet"]
    title: str
    why: str
    severity: Severity
    fix: str
    # True: a failure here is part of the image -> CUDA -> driver chain (rebuild_environment).
    chain: bool = False
    # Where the facts the check relies on come from (a docs/facts.md section and its upstream source).
    source: str = ""


Scope = Literal["host", "fleet"]

# Check id -> where its facts come from; docs/checks.md shows it for every check.
SOURCES: dict[str, str] = {
    "facts.schema": 'docs/architecture.md "Contracts" (host facts schema)',
    "driver.loaded": 'docs/facts.md section 5 (/proc/driver/nvidia/version exists only while nvidia.ko is loaded)',
    "nvml.status": 'docs/facts.md section 5 (nvidia-ml-py 13.615.71 NVMLError classes)',
    "driver.branch": (
        'docs/facts.md sections 1-2 (vLLM Kimi K3 recipe: cu130 image, R580 or newer; CUDA compatibility '
        'guide)'
    ),
    "driver.version_min": 'docs/facts.md section 2 (CUDA 13.2 U2 release notes, table 3: 13.0 GA needs 580.65.06)',
    "driver.platform": (
        'docs/facts.md section 10 (Jetson L4T: nixGL issue 139, anduril/jetpack-nixos; data-center version '
        'shape)'
    ),
    "driver.flavour": (
        'docs/facts.md section 4 (NVIDIA driver installation guide: open modules required on Grace Hopper and '
        'Blackwell)'
    ),
    "driver.pending_reboot": (
        'docs/facts.md section 4 (NVML_ERROR_LIB_RM_VERSION_MISMATCH after an upgrade without reboot)'
    ),
    "gpu.count": 'docs/facts.md section 1 (Kimi K3 recipe: GPUs per strategy)',
    "gpu.persistence_mode": 'docs/facts.md section 5 (NVML nvmlDeviceGetPersistenceMode)',
    "gpu.fabric_state": (
        'docs/facts.md section 3 (fabric state Not Started -> In Progress -> Completed; NVSentinel issues '
        '883, 889)'
    ),
    "gpu.fabric_health": (
        'docs/facts.md section 9 (NVML nvmlGpuFabricInfo_v3_t health mask and summary; nvidia-smi -q Fabric > '
        'Health)'
    ),
    "gpu.in_use": (
        'docs/facts.md section 11 (vLLM start-up check: free memory >= gpu_memory_utilization x total, '
        'default 0.9)'
    ),
    "gpu.ecc": (
        'docs/facts.md section 14 (NVML nvmlDeviceGetTotalEccErrors volatile / aggregate; nvidia-smi -q ECC '
        'Errors; AzHPC ECC checks)'
    ),
    "gpu.remapped_rows": (
        'docs/facts.md section 14 (NVIDIA GPU memory error management: row remapping pending and failure; '
        'NVML nvmlDeviceGetRemappedRows)'
    ),
    "gpu.xid": 'docs/facts.md section 14 (NVIDIA Xid catalogue: 48, 63, 64, 74, 79, 92, 94, 95 and more)',
    "gpu.throttle": (
        'docs/facts.md section 14 (nvml.h clocks event reasons: HW slowdown, HW thermal, HW power brake)'
    ),
    "gpu.pcie_link": (
        'docs/facts.md section 14 (nvidia-smi pcie.link.gen/width current and max; the generation drops at '
        'idle)'
    ),
    "packages.held": 'docs/facts.md section 3 (the GPU Operator holds driver and Fabric Manager) and section 4',
    "packages.unattended_upgrades": 'docs/facts.md section 4',
    "packages.dkms_kernel": 'docs/facts.md section 4 (DKMS or prebuilt linux-modules-nvidia packages)',
    "fabricmanager.present": 'docs/facts.md section 3 (Fabric Manager on NVSwitch systems)',
    "fabricmanager.active": 'docs/facts.md section 3 (nvidia-fabricmanager.service)',
    "fabricmanager.version_match": (
        'docs/facts.md section 3 (cuda-drivers-fabricmanager-580 depends on nvidia-fabricmanager-580 (= '
        'exact))'
    ),
    "fabric.imex": (
        'docs/facts.md section 15 (NVIDIA IMEX guide: nvidia-imex service, IMEX_NODE_CONFIG_FILE node list, '
        'IMEX channels; nvidia-imex-ctl -N node states and Domain State)'
    ),
    "rdma.port_state": 'docs/facts.md section 6 (sysfs 4: ACTIVE, 5: LinkUp, 400 Gb/sec (4X NDR))',
    "rdma.rail_count": 'docs/facts.md section 6',
    "rdma.peermem": 'docs/facts.md sections 1 and 6 (NCCL_DMABUF_ENABLE=0 falls back to nvidia_peermem)',
    "rdma.acs": 'docs/facts.md section 6 (lspci -vvv ACSCtl SrcValid+)',
    "nccl.debug": 'docs/facts.md section 6 (debug settings should not stay in production)',
    "nccl.settings": 'docs/facts.md sections 1 and 6 (MNNVL settings, NCCL_IB_HCA)',
    "container.runtime": 'docs/facts.md section 8',
    "container.toolkit": 'docs/facts.md section 8 (CVE-2025-23266: nvidia-container-toolkit <= 1.17.7)',
    "container.image_present": 'docs/facts.md section 1 (image vllm/vllm-openai:kimi-k3)',
    "container.cuda_runtime": (
        'docs/facts.md sections 2 and 8 (CUDA minor-version compatibility; nvidia-smi CUDA Version is the '
        "driver's maximum)"
    ),
    "container.probe": (
        "docs/facts.md section 8 (requirement error, CUDA errors 35/803/804, PyTorch 'driver too old'; the "
        "probe's matmul checked against the CPU)"
    ),
    "container.vllm_version": 'docs/facts.md section 1 (Kimi K3 recipe: vLLM 0.27.1 or newer)',
    "scheduler.state": 'docs/architecture.md "Flows" (drain reason k3fleet:<change-id>)',
    "fleet.driver_drift": 'docs/facts.md section 2',
    "fleet.image_digest_drift": 'docs/facts.md section 1',
    "fleet.nccl_drift": 'docs/facts.md section 6',
    "fleet.rdma_rail_drift": 'docs/facts.md section 6',
    "fleet.strategy": 'docs/facts.md section 1 (MXFP4 weights about 1680 GB, unconfirmed; GPUs per strategy)',
    "fleet.capacity": 'docs/facts.md section 1 (Kimi K3 recipe: GPUs per strategy, 32 on H100)',
    "fleet.all2all_topology": (
        'docs/facts.md section 15 (vLLM expert parallel deployment: --all2all-backend, DeepEP over RDMA, '
        'FlashInfer over multi-node NVLink: one ClusterUUID and clique, IMEX ready on every node)'
    ),
    "workloads.cuda_compat": (
        'docs/facts.md section 16 (NVIDIA CUDA compatibility guide: backward compatibility, forward-compatibility '
        'package cuda-compat-<major>-<minor> built from one driver branch; CUDA error 803)'
    ),
    "active.dcgm_diag": (
        'docs/facts.md section 17 (NVIDIA DCGM user guide: dcgmi diag run levels 1-4; the result table per '
        'test and GPU)'
    ),
    "active.nccl_busbw": (
        'docs/facts.md section 17 (nccl-tests PERFORMANCE.md: busbw; nccl-tests issue 212: ~480 GB/s peak '
        'on 8 NVLink4 GPUs)'
    ),
    "active.ib_write_bw": 'docs/facts.md section 17 (perftest ib_write_bw: BW average[Gb/sec])',
    "active.nccl_pair_busbw": (
        'docs/facts.md section 17 (nccl-tests issues 290 and 319: 46-48 GB/s busbw per NDR 400 Gb/s NIC with '
        'NCCL_ALGO=Ring between two nodes)'
    ),
    "target.unconfirmed": 'docs/facts.md section 2 (rows marked confirmed: false)',
}


def _c(
    id: str, title: str, why: str, severity: Severity, fix: str, chain: bool = False, scope: Scope = "host"
) -> Check:
    return Check(id=id, scope=scope, title=title, why=why, severity=severity, fix=fix, chain=chain,
                 source=SOURCES[id])


_CHECKS: tuple[Check, ...] = (
    _c("facts.schema", "Host facts readable",
       "Facts that do not validate, or come from another schema major version, cannot be judged.",
       "error",
       "Deploy the collector modules that match this controller and re-run the audit."),
    _c("driver.loaded", "NVIDIA kernel module loaded",
       "Without the kernel module no GPU is usable and nothing else about the driver can be trusted.",
       "critical",
       "Install the R{target_branch} driver packages, then load the module (modprobe nvidia) or reboot."),
    _c("nvml.status", "NVML answers",
       "NVML is how the driver reports GPUs; its error names the failure (library missing, GPU lost).",
       "error",
       "Fix the NVML error shown in the evidence: install the driver's user-space libraries, "
       "or reset/reseat a lost GPU."),
    _c("driver.branch", "Driver branch new enough for the image's CUDA",
       "The image is built for CUDA {image_cuda}, which needs an R{target_branch}-or-newer driver; "
       "older branches cannot initialise it.",
       "critical",
       "Upgrade the driver to {target_version} (R{target_branch}) together with the matching Fabric Manager "
       "in the change night.",
       chain=True),
    _c("driver.version_min", "Driver at or above the matrix minimum",
       "The CUDA -> driver matrix gives {min_driver} as the minimum for CUDA {image_cuda}.",
       "error",
       "Upgrade the driver to {target_version}.",
       chain=True),
    _c("driver.platform", "A data-center driver platform",
       "A Jetson (Tegra, L4T) board reports its L4T release or a Tegra driver as the module version, and a "
       "version of another shape belongs to no known platform: neither is a data-center driver branch, the "
       "image's CUDA {image_cuda} build and the R{target_branch} change night do not apply to it.",
       "critical",
       "Take the board out of the serving inventory; Kimi K3 with {image} needs data-center GPUs on an "
       "R{target_branch}-or-newer driver."),
    _c("driver.flavour", "Open kernel modules where required",
       "Open kernel modules are required on Grace Hopper and Blackwell GPUs.",
       "critical",
       "Install the open flavour of R{target_branch} (e.g. nvidia-driver-{target_branch}-server-open or "
       "nvidia-open-{target_branch}) and reboot."),
    _c("driver.pending_reboot", "No pending driver reboot",
       "A package upgrade without reboot leaves the old module loaded; NVML then reports "
       "Driver/library version mismatch and containers fail.",
       "error",
       "Drain the node and reboot it (or reload the nvidia modules) so the installed driver is loaded."),
    _c("gpu.count", "All GPUs visible",
       "The serving strategy needs {gpus_per_node} GPUs per node; a missing GPU breaks tensor parallelism.",
       "error",
       "Check nvidia-smi and the kernel log for a GPU that fell off the bus; reseat or RMA it, then re-audit."),
    _c("gpu.persistence_mode", "Persistence mode on",
       "Without persistence mode the driver tears down GPU state between clients, slowing start-up "
       "and hiding errors.",
       "warning",
       "Enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)."),
    _c("gpu.fabric_state", "NVLink fabric training completed",
       "On NVSwitch systems a GPU whose fabric state is not Completed cannot run CUDA work.",
       "error",
       "Check nvidia-fabricmanager is active and at the driver's version, then restart it or reboot."),
    _c("gpu.fabric_health", "NVLink fabric healthy",
       "A GPU can finish fabric registration (State Completed, Status Success) and still report its fabric "
       "health Unhealthy or Limited Capacity, its bandwidth Degraded, a route or access-timeout recovery, or "
       "an incorrect configuration: NCCL traffic over that GPU's NVLinks is slow or fails.",
       "error",
       "Drain the node, check the NVLink/NVSwitch errors (SXid/Xid 74, nvidia-smi nvlink -e) and the fabric "
       "manager log, reset or service the GPU's links, then re-audit."),
    _c("gpu.in_use", "GPUs free for the serving engine",
       "A GPU that another process already holds memory on fails vLLM's start-up check (free memory at least "
       "{gpu_memory_utilization} of the total), and draining or upgrading the node ends that workload.",
       "warning",
       "Find the owner of the processes (the evidence lists pid, name and memory); stop or move the workload "
       "before the change night or before starting vLLM on this node."),
    _c("gpu.ecc", "No uncorrectable ECC errors",
       "An uncorrectable (double-bit) ECC error corrupts the data of whatever ran on that memory; a volatile "
       "count above zero means it happened since the last driver load, an aggregate one that it happened in "
       "the GPU's life.",
       "error",
       "Drain the node; check remapped rows and the kernel log's Xid 48/94/95; reset the GPU (or reboot) to "
       "activate a pending remap, run the DCGM diagnostic (dcgmi diag -r 3), and RMA the GPU if errors "
       "return."),
    _c("gpu.remapped_rows", "No pending or failed row remapping",
       "A GPU repairs a memory row with an uncorrectable error by remapping it; the remap is pending until the "
       "GPU is reset, and a remapping failure means it has no spare rows left (page retirement on older "
       "GPUs).",
       "error",
       "Pending: drain the node and reset the GPU (nvidia-smi -r) or reboot, then re-audit. Failure: take the "
       "GPU out of service and RMA it."),
    _c("gpu.xid", "No GPU Xid errors since boot",
       "The driver logs every GPU fault as an Xid in the kernel log: 79 (fallen off the bus), 48/94/95 (ECC), "
       "63/64 (row remapping), 74 (NVLink), 92 (high single-bit error rate) point at hardware that will "
       "fail the serving engine.",
       "error",
       "Read the Xid lines in the evidence against the NVIDIA Xid catalogue: for 79 reseat or RMA the GPU and "
       "check PCIe power and cooling; for ECC codes reset the GPU and check remapped rows; for 74 check the "
       "NVLink and Fabric Manager; re-audit after a reboot."),
    _c("gpu.throttle", "No hardware clock slowdown",
       "HW Slowdown, HW Thermal Slowdown and HW Power Brake cut the GPU's clocks by half or more (heat, power "
       "supply, an external power brake signal): every shard of a tensor-parallel engine runs at the slowest "
       "GPU's speed.",
       "error",
       "Check the GPU's temperature and power readings (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER), the "
       "chassis cooling and the power supplies; the reasons are read at one instant, so re-check under load."),
    _c("gpu.pcie_link", "PCIe link at full width",
       "A GPU whose PCIe link trained narrower than its maximum (x8 of x16) has a fraction of its host "
       "bandwidth for model loading and host transfers; a lower generation is normal at idle (power saving) "
       "and is only a warning.",
       "error",
       "Width below the maximum: reseat the GPU or its riser and check the slot; generation below the maximum: "
       "re-check under load (the link drops its generation at idle), then check BIOS PCIe settings."),
    _c("packages.held", "Driver packages held",
       "An unheld driver can be moved by a routine upgrade, which silently breaks the version chain.",
       "warning",
       "Hold the driver and Fabric Manager packages (apt-mark hold / dnf versionlock add)."),
    _c("packages.unattended_upgrades", "No unattended driver upgrades",
       "Unattended upgrades can change the driver outside a change window.",
       "warning",
       "Disable unattended-upgrades (or dnf-automatic), or at least hold the driver packages."),
    _c("packages.dkms_kernel", "DKMS module built for the running kernel",
       "A DKMS driver not built for the running kernel will not load after the next reboot.",
       "error",
       "Rebuild with dkms autoinstall for the running kernel, or install the prebuilt linux-modules-nvidia "
       "package for it."),
    _c("fabricmanager.present", "Fabric Manager installed on NVSwitch systems",
       "NVSwitch systems need Fabric Manager to bring up the NVLink fabric.",
       "critical",
       "Install nvidia-fabricmanager-{target_branch} at exactly the driver's version and enable it."),
    _c("fabricmanager.active", "Fabric Manager running",
       "Without a running Fabric Manager the GPUs on an NVSwitch system do not finish fabric training.",
       "critical",
       "systemctl enable --now nvidia-fabricmanager; check its log for a version mismatch."),
    _c("fabricmanager.version_match", "Fabric Manager version equals the driver version",
       "Fabric Manager refuses to run against a different driver version; they must match exactly.",
       "error",
       "Install the Fabric Manager package of exactly the loaded driver's version and hold both."),
    _c("fabric.imex", "IMEX ready on multi-node NVLink nodes",
       "On a multi-node NVLink domain (GB200/GB300 NVL72: GPUs with a non-zero ClusterUUID) GPU memory is "
       "shared across the nodes' operating systems only through IMEX: without its daemon running, the IMEX "
       "channel device and every node of the domain READY, CUDA cannot import another node's memory and NCCL's "
       "and FlashInfer's multi-node NVLink paths fail.",
       "error",
       "List every compute tray of the NVLink domain in the IMEX node list (IMEX_NODE_CONFIG_FILE, default "
       "/etc/nvidia-imex/nodes_config.cfg: one IP per line, the same file on every node), systemctl enable --now "
       "nvidia-imex on every node, create /dev/nvidia-caps-imex-channels/channel0 (mknod with the major of "
       "nvidia-caps-imex-channels in /proc/devices), then check that nvidia-imex-ctl -N shows every node READY "
       "and Domain State UP."),
    _c("rdma.port_state", "RDMA rails up at full rate",
       "A rail that is DOWN, not LinkUp or below the expected rate slows or breaks cross-node traffic.",
       "error",
       "Check cabling and the subnet manager (ibstat, ibstatus); on RoCE check the switch port."),
    _c("rdma.rail_count", "Expected number of RDMA rails",
       "Multi-node serving expects {rails_per_node} rails per node; fewer rails mean less bandwidth.",
       "error",
       "Check that every HCA is present (lspci, ibv_devices) and its driver (mlx5_core) is loaded."),
    _c("rdma.peermem", "GPUDirect RDMA available",
       "Without nvidia_peermem or DMA-BUF, NCCL bounces GPU traffic through host memory.",
       "error",
       "modprobe nvidia_peermem (and persist it), or use open kernel modules with DMA-BUF "
       "(do not set NCCL_DMABUF_ENABLE=0)."),
    _c("rdma.acs", "PCIe ACS not redirecting peer-to-peer",
       "ACS SrcValid+ on PCIe bridges silently routes GPU peer-to-peer traffic through the root complex.",
       "warning",
       "Disable ACS on the PCIe switches (setpci or BIOS) on bare-metal GPU nodes."),
    _c("nccl.debug", "NCCL debug logging off",
       "NCCL_DEBUG=INFO/TRACE is for debugging; it floods logs and slows start-up in production.",
       "warning",
       "Remove NCCL_DEBUG (or set WARN) from the environment and /etc/nccl.conf."),
    _c("nccl.settings", "NCCL settings as required",
       "The target may require NCCL settings (e.g. for MNNVL); NCCL_IB_HCA must name HCAs that exist.",
       "error",
       "Set the required NCCL variables in /etc/nccl.conf or the serving environment; fix NCCL_IB_HCA."),
    _c("container.runtime", "Container runtime present",
       "The serving image needs a container runtime with GPU support.",
       "error",
       "Install one of the supported runtimes ({runtimes}) with the NVIDIA Container Toolkit."),
    _c("container.toolkit", "NVIDIA Container Toolkit not vulnerable",
       "{toolkit_advisory}.",
       "error",
       "Upgrade nvidia-container-toolkit to {toolkit_min} or newer."),
    _c("container.image_present", "Serving image present",
       "The serving image ({image}) must be on the node for a fast, predictable start.",
       "error",
       "Pull {image} on the node (and pin its digest in the target)."),
    _c("container.cuda_runtime", "Host driver supports the image's CUDA runtime",
       "The image's CUDA runtime needs a driver whose maximum CUDA is at least its major release "
       "(minor-version compatibility covers the rest with a limited feature set).",
       "critical",
       "Upgrade the driver to {target_version}, or use an image built for the host's CUDA.",
       chain=True),
    _c("container.probe", "CUDA initialises inside the image",
       "Only a real container start proves the chain image -> toolkit -> driver; the failures "
       "(requirement error, CUDA error 35/803/804, driver too old) name the broken link. CUDA initialising "
       "is not enough: the probe runs a matmul on every GPU and checks it against the CPU's result, so a GPU "
       "that is 'available' but fails or miscomputes a real kernel fails here.",
       "critical",
       "Follow the probe's failure: upgrade the driver to {target_version} for version errors, "
       "fix the toolkit/CDI configuration otherwise; for a kernel that failed or differs from the CPU, drain "
       "the node, reset the GPU it names and run the DCGM diagnostic (dcgmi diag -r 3), RMA it if it repeats.",
       chain=True),
    _c("container.vllm_version", "vLLM in the image new enough",
       "The recipe needs vLLM {vllm_min} or newer.",
       "error",
       "Pull a newer {image} (vLLM >= {vllm_min})."),
    _c("scheduler.state", "Node in service",
       "A drained or down node serves nothing; the change night must know which drains are ours.",
       "warning",
       "Resume the node (scontrol update state=resume) if its drain reason is understood."),
    _c("workloads.cuda_compat", "Other tenants' CUDA work keeps working on the target driver",
       "The driver change moves every process on the node to the R{target_branch} driver. CUDA user space built "
       "for an older release (CUDA 12.x) keeps working on a newer driver (backward compatible); a forward-"
       "compatibility package (cuda-compat-12-*) carries the libcuda of its own older branch, and loaded on the "
       "R{target_branch} kernel module it fails CUDA initialisation (error 803). The plan lists, per host, the "
       "containers and GPU processes that keep working and those that break.",
       "error",
       "Before the change: have the owners of the tenants that break take the compat directory off "
       "LD_LIBRARY_PATH (or rebuild on a CUDA the R{target_branch} driver runs), remove the host's old "
       "cuda-compat packages, and find out what the unknown ones run; or accept the finding for the night "
       "(--accept-finding workloads.cuda_compat), which is recorded in change.json."),
    _c("active.dcgm_diag", "DCGM diagnostic passes",
       "dcgmi diag loads every GPU (memory, compute, PCIe, NVLink at levels 2-4) and names the test and GPU "
       "that fails: state a node reports can look right while a GPU fails real work. Run only with "
       "audit --active, never on a node whose GPUs are in use.",
       "error",
       "Drain the node; read the failing test's Warning/Info lines in the evidence, reset the GPU it names (or "
       "reboot), run dcgmi diag -r 3 again and RMA the GPU if it fails again."),
    _c("active.nccl_busbw", "NCCL all-reduce bandwidth within the node",
       "all_reduce_perf (nccl-tests) over every GPU of the node measures the bus bandwidth the serving "
       "engine's tensor-parallel all-reduce gets; its peak at the largest message is judged against the "
       "target's floor for the GPU model (active.nccl_busbw_min_gbs), and #wrong results mean corrupted data.",
       "error",
       "Check the NVLink/NVSwitch state (nvidia-smi nvlink -s, Fabric Manager), NCCL settings (NCCL_ALGO, "
       "NCCL_P2P_DISABLE) and PCIe ACS, then rerun with audit --active full."),
    _c("active.ib_write_bw", "RDMA rails reach their bandwidth",
       "A loopback ib_write_bw on each active rail measures what the HCA and its PCIe path carry; a rail "
       "well below its rate slows every cross-node collective. The path between nodes is "
       "active.nccl_pair_busbw's.",
       "error",
       "Check the HCA's PCIe link (lspci -vvv LnkSta), its firmware and NUMA placement, then the cable and "
       "switch port; rerun with audit --active full."),
    _c("active.nccl_pair_busbw", "NCCL all-reduce bandwidth between nodes",
       "all_reduce_perf across each pair of like nodes (mpirun, one rank per GPU, NCCL_ALGO=Ring) measures what "
       "the RDMA rails, cables and switches carry between them, which the loopback ib_write_bw cannot see; its "
       "peak busbw at the largest message is judged against active.nccl_pair_busbw_min_gbs for the GPU model. "
       "Each node is in two pairs: one in two low pairs is the cause, a low pair of two otherwise good nodes "
       "is the path between them, and #wrong results mean corrupted data.",
       "error",
       "On the node named: ibstat and ib_write_bw to its partner per rail, the rails' cables and switch ports "
       "(ibdiagnet, port counters), GPUDirect RDMA (nvidia_peermem, NCCL_DEBUG=INFO shows GDRDMA) and PCIe "
       "ACS; for a low path between two good nodes, the leaf/spine ports between them. Drain it from "
       "multi-node serving until audit --active full passes."),
    _c("fleet.driver_drift", "One driver version across the fleet",
       "Mixed driver versions make failures host-dependent and can break cross-node NCCL.",
       "warning",
       "Bring every host to {target_version} in the change night.",
       scope="fleet"),
    _c("fleet.image_digest_drift", "One image build across the fleet",
       "The same tag can point at different builds on different hosts; every host must run one digest.",
       "error",
       "Pull the image by digest on every host (pin image.digest in the target).",
       scope="fleet"),
    _c("fleet.nccl_drift", "Consistent NCCL settings",
       "NCCL settings that differ between hosts give hangs or slow collectives that are hard to trace.",
       "warning",
       "Distribute one /etc/nccl.conf (or one serving environment) to every host.",
       scope="fleet"),
    _c("fleet.rdma_rail_drift", "Same RDMA rail count on every host",
       "Hosts with fewer rails drag every collective down to their bandwidth.",
       "warning",
       "Repair or exclude hosts with missing rails.",
       scope="fleet"),
    _c("fleet.strategy", "Serving strategy fits the GPUs' memory",
       "One node must hold the model's weights ({weights_memory}) to serve single-node; otherwise every "
       "instance spans nodes, which needs more GPUs and RDMA on every node.",
       "warning",
       "Set gpus.strategy: auto (or a multi_node_* strategy) in the target; if the weights figure is wrong "
       "for your checkpoint, correct gpus.weights_memory.gb.",
       scope="fleet"),
    _c("fleet.capacity", "Enough healthy GPUs",
       "The serving strategy ({strategy}) needs a minimum number of GPUs that pass the checks.",
       "error",
       "Fix failing hosts or add nodes until the healthy GPU count reaches the minimum.",
       scope="fleet"),
    _c("fleet.all2all_topology", "All-to-all backend fits the interconnect",
       "The expert-parallel all-to-all backend the serving command names (--all2all-backend, formerly "
       "VLLM_ALL2ALL_BACKEND) needs its transport on every node of the serving group: the DeepEP backends "
       "(deepep_v2) RDMA with every rail Active and nvidia_peermem or DMA-BUF, the FlashInfer NVLink backends "
       "(flashinfer_nvlink_one_sided) one NVLink fabric spanning the nodes. Without it the engine fails at "
       "start-up or runs on a fallback: the environment must be rebuilt.",
       "error",
       "Give every serving node the backend's transport (rails up, nvidia_peermem or DMA-BUF; or one NVLink "
       "domain with Fabric Manager and IMEX), leave the hosts without it out of the serving group, or choose the "
       "backend the interconnect has (deepep_v2 over RDMA, flashinfer_nvlink_one_sided on MNNVL).",
       scope="fleet"),
    _c("target.unconfirmed", "Verdict relied on unconfirmed data",
       "Some CUDA -> driver matrix rows are not confirmed by the primary source.",
       "info",
       "Confirm the row against NVIDIA's release notes and set confirmed: true in the matrix file.",
       scope="fleet"),
)

CHECKS: dict[str, Check] = {c.id: c for c in _CHECKS}


def catalogue() -> list[Check]:
    """All checks, in the order a report lists them."""
    return list(_CHECKS)


class _Keep(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def template_values(target: Target) -> dict[str, Any]:
    min_driver, _ = target.min_driver()
    return {
        "target_branch": target.driver.branch,
        "target_version": target.driver.target_version,
        "min_driver": min_driver,
        "image": target.image.ref,
        "image_cuda": target.image.cuda,
        "vllm_min": target.vllm.min_version,
        "toolkit_min": target.container.toolkit_min_version,
        "toolkit_advisory": target.container.toolkit_advisory or "Old toolkits have known vulnerabilities",
        "gpus_per_node": target.gpus.per_node,
        "rails_per_node": target.rdma.rails_per_node,
        "runtimes": ", ".join(target.container.runtimes),
        "strategy": target.gpus.strategy if target.gpus.explicit_strategy else "auto: derived from GPU memory",
        "weights_memory": _weights(target),
        "gpu_memory_utilization": f"{target.serve.gpu_memory_utilization:g}",
    }


def _weights(target: Target) -> str:
    w = target.gpus.weights_memory
    if w is None:
        return "not set in the target"
    return f"about {w.gb:g} GB" + ("" if w.confirmed else ", an unconfirmed estimate")


def render(text: str, values: dict[str, Any]) -> str:
    # Unknown placeholders stay visible rather than raising: a catalogue text must never crash a verdict.
    return string.Formatter().vformat(text, (), _Keep(values))


def fixes_for(target: Target) -> dict[str, str]:
    """Every check's fix text rendered for ``target``."""
    values = template_values(target)
    return {c.id: render(c.fix, values) for c in _CHECKS}


def catalogue_rows(target: Target | None = None) -> list[dict[str, str]]:
    """The catalogue as plain rows (id, scope, severity, title, why, fix, source) for tables and JSON."""
    values = template_values(target) if target is not None else {}
    return [
        {
            "id": c.id,
            "scope": c.scope,
            "severity": c.severity,
            "title": c.title,
            "why": render(c.why, values),
            "fix": render(c.fix, values),
            "source": c.source,
        }
        for c in _CHECKS
    ]


def catalogue_markdown(target: Target | None = None) -> str:
    """The catalogue as a Markdown page, without a final newline (the printer adds it): docs/checks.md
    is ``k3fleet checks --markdown`` for the default target."""
    name = target.name if target is not None else "no target (templates unrendered)"
    lines = [
        "# Check catalogue",
        "",
        f"Every check the verdict runs, rendered for the target `{name}`. Generated by",
        "`k3fleet checks --markdown`; the sources point into [facts.md](facts.md).",
        "",
        "| check | scope | severity | title | why | fix | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in catalogue_rows(target):
        cells = [f"`{r['id']}`", r["scope"], r["severity"], r["title"], r["why"], r["fix"], r["source"]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
