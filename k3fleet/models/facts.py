"""Host facts: the contract between node collectors and the controller.

Collectors (``ansible_collections/k3fleet/gpu/plugins/module_utils``) emit plain JSON of this shape; the
controller validates it here. ``schema_version`` changes on any incompatible
change. Every section carries ``status`` (``ok`` / ``unknown`` / ``absent``)
and a ``reason`` when it is not ``ok``: a node that cannot answer a question is
data, never a crash.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import FACTS_SCHEMA_VERSION

# Defined once, where the collector stamps it (k3fleet_sources.py says what each version added).
SCHEMA_VERSION: str = FACTS_SCHEMA_VERSION


def schema_major(version: object) -> str:
    """The major part of a facts schema version (``"1"`` of ``"1.1"``; ``""`` when there is none)."""
    return str(version if version is not None else "").split(".", 1)[0]


def readable_schema(data: object) -> bool:
    """Facts (a dict, or their ``schema_version``) this controller reads: the same major version as its
    own. The one major-version check: an older or newer collector of the same major validates here."""
    version = data.get("schema_version") if isinstance(data, dict) else data if isinstance(data, str) else None
    return schema_major(version) == schema_major(SCHEMA_VERSION)


def schema_mismatch(host: str, data: object) -> str | None:
    """The one line for a host whose facts are of another major version (None when they are readable)."""
    if readable_schema(data):
        return None
    got = data.get("schema_version") if isinstance(data, dict) else None
    return f"host {host}: facts schema {got!r} from the node, controller expects {SCHEMA_VERSION}"


SectionStatus = Literal["ok", "unknown", "absent"]


class _Model(BaseModel):
    # Newer collectors may add keys; older controllers ignore them rather than fail.
    model_config = ConfigDict(extra="ignore")


class Section(_Model):
    status: SectionStatus = "unknown"
    reason: str | None = None


# -- driver and GPUs ---------------------------------------------------------


class KernelModule(_Model):
    loaded: bool | None = None
    version: str | None = None
    flavour: Literal["open", "proprietary"] | None = None
    arch: str | None = Field(default=None, description="x86_64, aarch64: the module's architecture")
    raw: str | None = Field(default=None, description="first line of /proc/driver/nvidia/version")
    grdma_topo_override: bool | None = Field(
        default=None, description="GrdmaPciTopoCheckOverride=1 in /proc/driver/nvidia/params; None: not read")


class Platform(_Model):
    """Data-center driver platform or a Jetson (Tegra, L4T) board (docs/facts.md section 10)."""

    kind: Literal["discrete", "tegra", "unknown"] | None = Field(
        default=None, description="tegra: Jetson / L4T, no data-center driver branch; unknown: a version "
                                  "that is on no data-center branch and no known platform; None: not read")
    l4t_release: str | None = Field(default=None, description="L4T release, e.g. 35.3.1, on Jetson")
    evidence: str | None = None


class NvmlStatus(_Model):
    # ok, skipped, library_not_found, driver_not_loaded, lib_rm_version_mismatch,
    # no_permission, gpu_is_lost, error, not_installed (pynvml absent: collectors before the
    # k3fleet binding; now a node without pynvml asks libnvidia-ml.so.1 through that binding)
    status: str = "skipped"
    error: str | None = None
    bindings: Literal["pynvml", "k3fleet"] | None = Field(
        default=None, description="what asked NVML: pynvml (nvidia-ml-py) or k3fleet's own ctypes binding "
                                  "(k3fleet_nvml_lib); None when no bindings loaded the library or NVML was "
                                  "not asked (facts from older collectors too)")


class FabricHealth(_Model):
    """NVLink fabric health of one GPU: nvidia-smi -q "Fabric" > "Health", NVML's health mask
    and summary (docs/facts.md section 9). None in a field: not reported (N/A, not supported)."""

    summary: str | None = Field(default=None, description="healthy, unhealthy, limited_capacity")
    bandwidth: str | None = Field(default=None, description="full or degraded")
    route_recovery_in_progress: bool | None = None
    route_unhealthy: bool | None = None
    access_timeout_recovery: bool | None = None
    incorrect_configuration: str | None = Field(default=None, description="none, or the condition's name")
    partition_assigned: bool | None = None
    gfm_state: str | None = Field(default=None, description="connected or disconnected")
    other: dict[str, str] = Field(default_factory=dict,
                                  description="fields or values this collector does not know, as reported")
    mask: int | None = Field(default=None, description="NVML healthMask, when NVML answered")


class GpuProcess(_Model):
    pid: int | None = None
    type: str | None = Field(default=None, description="C compute, G graphics, C+G")
    name: str | None = None
    used_memory_mib: int | None = None


class GpuEcc(_Model):
    """Uncorrectable ECC error counts of one GPU (docs/facts.md section 14). None: not reported."""

    mode: Literal["enabled", "disabled"] | None = None
    volatile_uncorrected: int | None = Field(default=None, description="since the last driver load")
    aggregate_uncorrected: int | None = Field(default=None, description="lifetime (persists across reboots)")
    volatile_corrected: int | None = Field(default=None, description="correctable errors since the last driver load")
    aggregate_corrected: int | None = Field(default=None, description="correctable errors over the GPU's life")
    reason: str | None = Field(default=None, description="why the counts are unknown (N/A, not supported)")


class GpuRemappedRows(_Model):
    """Row remapping (Ampere and newer) or page retirement (older) of one GPU (docs/facts.md section 14)."""

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = Field(default=None, description="a remap or retirement waits for a GPU reset")
    failure: bool | None = Field(default=None, description="a remap failed: the GPU is out of spare rows")
    retired_pages_pending: bool | None = Field(default=None, description="page retirement (pre-Ampere)")
    reason: str | None = None


class GpuThrottle(_Model):
    """Active clock event (throttle) reasons of one GPU, snake_case (hw_slowdown, hw_power_brake_slowdown...)."""

    active: list[str] = Field(default_factory=list)
    mask: int | None = Field(default=None, description="NVML's bitmask, when NVML answered")
    reason: str | None = None


class GpuPcieLink(_Model):
    """PCIe link of one GPU: current against maximum generation and width (docs/facts.md section 14)."""

    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    replay_counter: int | None = Field(default=None, description="PCIe replays since the driver loaded")
    reason: str | None = None


class GpuNvlink(_Model):
    """NVLink links of one GPU (docs/facts.md section 14): ``links`` 0 means the GPU has none (NVML
    answers "not supported" on link 0, ``nvidia-smi nvlink -s`` prints nothing): "no links", not
    "healthy links". None: not read."""

    links: int | None = None
    active: list[int] = Field(default_factory=list)
    inactive: list[int] = Field(default_factory=list)
    errors: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="link -> replay, recovery, crc_flit, crc_data counters")
    source: str | None = Field(default=None, description="nvml or nvidia-smi")
    reason: str | None = None


class XidEvent(_Model):
    """One "NVRM: Xid (PCI:...): N, ..." line of the kernel log (docs/facts.md section 14)."""

    code: int
    pci: str | None = Field(default=None, description="the PCI address the line names, as printed")
    pid: int | None = None
    text: str | None = Field(default=None, description="the line after the code, shortened")
    time: str | None = Field(default=None, description="the line's timestamp as printed")


class BootXid(_Model):
    """The Xid lines of one earlier boot, from the journal."""

    offset: int = Field(description="journalctl's boot offset: -1 the previous boot")
    boot_id: str | None = None
    span: str | None = Field(default=None, description="first and last entry as --list-boots prints them")
    xid: list[XidEvent] = Field(default_factory=list)


class XidHistory(_Model):
    """Xid lines of the last few earlier boots (docs/facts.md section 14); ok with no boots when the journal
    keeps none (volatile storage)."""

    status: SectionStatus = "unknown"
    reason: str | None = None
    boots_listed: int | None = Field(default=None, description="boots journalctl --list-boots lists, this one too")
    boots: list[BootXid] = Field(default_factory=list)


class CarrierEvent(_Model):
    """One "ib...: lost carrier" line of the log (an IPoIB link going down)."""

    iface: str
    time: str | None = None


class KernelLog(_Model):
    """Xid events of the kernel log since boot; status unknown when no log could be read."""

    status: SectionStatus = "unknown"
    reason: str | None = None
    source: str | None = Field(default=None, description="dmesg or journalctl")
    xid: list[XidEvent] = Field(default_factory=list)
    ib_carrier_lost: list[CarrierEvent] = Field(default_factory=list)
    # None: not read (facts from before the history was collected).
    history: XidHistory | None = None


class Gpu(_Model):
    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_mib: int | None = None
    persistence_mode: bool | None = None
    compute_capability: str | None = None
    pci_bus_id: str | None = None
    # not_supported, not_started, in_progress, completed, or None when unknown
    fabric_state: str | None = None
    # The fabric probe's error status, snake_case ("success", "insufficient_resources"); only
    # meaningful once fabric_state is completed (NVML), None when not reported.
    fabric_status: str | None = None
    # None: no Health section (older driver, no fabric) or not read.
    fabric_health: FabricHealth | None = None
    # The GPU's NVLink domain once registration completed (NVML clusterUuid / cliqueId, -q ClusterUUID /
    # CliqueId): GPUs of one multi-node NVLink domain share a non-zero UUID; a single HGX board reports the
    # zero UUID. None: not reported or not read (docs/facts.md section 15).
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    # Used as the driver means it: without the driver's reserved memory (NVML's v2 memory call,
    # nvidia-smi's "Used"); with memory_source "nvml_v1" the figure includes the reserved memory.
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None
    memory_source: Literal["nvml_v2", "nvml_v1", "nvidia-smi"] | None = None
    nvlink: GpuNvlink | None = None
    # None: not read (the call is missing or refused); []: no compute process on the GPU.
    processes: list[GpuProcess] | None = None
    # GPU health (schema 1.1); None: not read by this collector (older facts) or not captured.
    ecc: GpuEcc | None = None
    remapped_rows: GpuRemappedRows | None = None
    throttle: GpuThrottle | None = None
    pcie: GpuPcieLink | None = None


class GpuCounterPair(_Model):
    """One GPU's error counters read twice in one visit: each value is [first, second]."""

    pcie_replay: list[int] | None = Field(default=None, description="PCIe replay counter [first, second]")
    nvlink: dict[str, dict[str, list[int]]] = Field(
        default_factory=dict,
        description="link -> counter (replay, recovery, crc_flit, crc_data, crc) -> [first, second]")


class GpuCounters(_Model):
    """The GPUs' error counters sampled at the start and the end of the module's visit (docs/facts.md
    section 14); the verdict judges their rate over ``interval_s``."""

    interval_s: int = Field(ge=1, description="whole seconds between the samples, rounded up")
    source: str | None = Field(default=None, description="nvml or nvidia-smi (NVLink only)")
    reason: str | None = None
    gpus: dict[str, GpuCounterPair] = Field(default_factory=dict)


class PortCounters(_Model):
    """The RDMA ports' error counters sampled at the start and the end of the visit: port ("mlx5_0/1") ->
    counter (symbol_error, link_downed, port_rcv_errors, link_error_recovery, excessive_buffer_overrun_errors)
    -> [first, second]."""

    interval_s: int = Field(ge=1)
    ports: dict[str, dict[str, list[int]]] = Field(default_factory=dict)


class GpuTopology(_Model):
    nearest_nic: str | None = None
    distance: str | None = Field(default=None, description="PIX, PXB, PHB, NODE or SYS (nvidia-smi topo -m)")
    cpu_affinity: str | None = None
    numa: str | None = None


class Topology(_Model):
    """``nvidia-smi topo -m``: each GPU's nearest NIC with its PCIe distance, CPU and NUMA affinity
    (docs/facts.md section 6)."""

    status: SectionStatus = "unknown"
    reason: str | None = None
    nics: list[str] = Field(default_factory=list)
    gpus: dict[str, GpuTopology] = Field(default_factory=dict)


class DriverFacts(Section):
    kernel_module: KernelModule = Field(default_factory=KernelModule)
    platform: Platform = Field(default_factory=Platform)
    nvml: NvmlStatus = Field(default_factory=NvmlStatus)
    source: Literal["nvml", "nvidia-smi"] | None = None
    driver_version: str | None = None
    # The driver's maximum supported CUDA ("13.0"), not any container's runtime.
    cuda_driver_version: str | None = None
    gpu_count: int | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    # None: facts from a collector older than schema 1.1 (the kernel log was not read).
    kernel_log: KernelLog | None = None
    # None: not sampled (no GPU listed, or facts from before the counters were read twice).
    counters: GpuCounters | None = None
    # None: not read (no GPU listed, or older facts).
    topology: Topology | None = None


# -- packages ------------------------------------------------------------------


class Package(_Model):
    name: str
    version: str
    held: bool = False
    # driver, utils, compute, fabricmanager, dkms, kernel_modules, toolkit, compat (cuda-compat-*), other
    role: str = "other"
    branch: str | None = None
    flavour: Literal["open", "proprietary"] | None = None


class DkmsModule(_Model):
    name: str
    version: str
    kernel: str | None = None
    arch: str | None = None
    status: str


class PackageFacts(Section):
    manager: Literal["dpkg", "rpm"] | None = None
    running_kernel: str | None = None
    packages: list[Package] = Field(default_factory=list)
    driver_branch: str | None = None
    driver_version: str | None = None
    fabricmanager_version: str | None = None
    unattended_upgrades_installed: bool | None = None
    unattended_upgrades_enabled: bool | None = None
    dkms_used: bool | None = None
    dkms_modules: list[DkmsModule] = Field(default_factory=list)
    dkms_built_for_running_kernel: bool | None = None


# -- Fabric Manager ------------------------------------------------------------


class UnitState(_Model):
    installed: bool | None = None
    active: str | None = None  # active, inactive, failed, activating, unknown
    enabled: str | None = None  # enabled, disabled, masked, static, not-found


class FabricManagerFacts(Section):
    nvswitch_present: bool | None = None
    nvswitch_count: int | None = None
    required: bool | None = None
    unit: UnitState = Field(default_factory=UnitState)
    version: str | None = None
    driver_version: str | None = None
    version_matches_driver: bool | None = None


# -- IMEX (multi-node NVLink racks; docs/facts.md section 15) ----------------------


class ImexNode(_Model):
    """One node of the IMEX domain as ``nvidia-imex-ctl -N`` lists it."""

    index: int
    address: str
    status: str | None = Field(default=None, description="READY, UNAVAILABLE, WAITING_FOR_PEERS... as printed")
    version: str | None = None
    hostname: str | None = None


class ImexFacts(Section):
    """IMEX: status absent where it is not installed; unknown (+reason) where something installed was not read."""

    installed: bool | None = None
    unit: UnitState = Field(default_factory=UnitState)
    config_path: str | None = None
    config_present: bool | None = None
    config: dict[str, str] = Field(default_factory=dict, description="the keys k3fleet reads, as set")
    nodes_file: str | None = Field(default=None, description="IMEX_NODE_CONFIG_FILE or its default")
    nodes_file_present: bool | None = None
    node_list: list[str] = Field(default_factory=list, description="the node list's addresses, in order")
    channels: list[int] | None = Field(default=None, description="N of /dev/nvidia-caps-imex-channels/channelN")
    domain_state: str | None = Field(default=None, description="UP, DOWN, DEGRADED (nvidia-imex-ctl -N)")
    nodes: list[ImexNode] = Field(default_factory=list)
    links_not_connected: list[str] = Field(default_factory=list, description='"from->to code", up to 64')
    links_not_connected_count: int | None = None
    ctl_reason: str | None = Field(default=None, description="why nvidia-imex-ctl -N gave no domain status")


# -- RDMA and NCCL ---------------------------------------------------------------


class RdmaPort(_Model):
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED
    state_code: int | None = None
    phys_state: str | None = None  # LinkUp, Disabled, Polling
    phys_state_code: int | None = None
    rate: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet


class RdmaDevice(_Model):
    name: str
    ports: list[RdmaPort] = Field(default_factory=list)


class AcsDevice(_Model):
    bdf: str
    src_valid: bool


class RdmaFacts(Section):
    devices: list[RdmaDevice] = Field(default_factory=list)
    active_ports: int = 0
    nvidia_peermem_loaded: bool | None = None
    acs_checked: bool = False
    acs_reason: str | None = None
    acs_enabled_bridges: list[str] = Field(default_factory=list)
    # None: not sampled (no RDMA device, or facts from before the counters were read).
    counters: PortCounters | None = None


class NcclSetting(_Model):
    value: str
    source: str  # "env", "/etc/nccl.conf", "/etc/environment", or an env file path


class NcclFacts(Section):
    settings: dict[str, NcclSetting] = Field(default_factory=dict)
    nccl_conf_present: bool | None = None


# -- container -----------------------------------------------------------------


class ContainerRuntime(_Model):
    name: str
    version: str | None = None


class ImageFacts(_Model):
    ref: str
    present: bool | None = None
    id: str | None = None
    digest: str | None = None
    cuda_version: str | None = None
    nvidia_require_cuda: str | None = None
    vllm_version: str | None = None


class ProbeKernel(_Model):
    """One GPU's matmul in the probe, against the CPU's result of the same inputs."""

    gpu: int
    ok: bool
    max_abs_err: float | None = None
    tolerance: float | None = None
    error: str | None = None


class ProbeFacts(_Model):
    ran: bool = False
    ok: bool | None = None
    cuda_init: bool | None = None
    visible_gpus: int | None = None
    # requirement_error, cuda_error_35, driver_too_old, error_803, error_804, kernel_mismatch,
    # kernel_error, runtime_error, None
    failure: str | None = None
    message: str | None = None
    # The probe's real CUDA operation (optional in 1.1): None when no kernel result was printed.
    kernel_ok: bool | None = None
    kernel: list[ProbeKernel] = Field(default_factory=list)


class TenantContainer(_Model):
    """A running container as the runtime's inspect shows it (docs/facts.md section 16)."""

    id: str | None = None
    name: str | None = None
    image: str | None = None
    image_id: str | None = None
    pid: int | None = None
    uses_gpu: bool | None = Field(default=None, description="the runtime gives it GPUs (device request, "
                                                            "nvidia runtime, GPU devices) or a GPU process runs in it")
    cuda_version: str | None = Field(default=None, description="env CUDA_VERSION")
    nvidia_require_cuda: str | None = Field(default=None, description="env NVIDIA_REQUIRE_CUDA")
    compat_package: str | None = Field(default=None, description="env NV_CUDA_COMPAT_PACKAGE (cuda-compat-12-4)")
    compat_on_path: str | None = Field(default=None, description="a .../compat directory on LD_LIBRARY_PATH")
    gpu_pids: list[int] = Field(default_factory=list)


class TenantProcess(_Model):
    """One of NVML's compute processes, with its container and the libcuda it loaded."""

    pid: int
    name: str | None = None
    gpus: list[int | None] = Field(default_factory=list)
    used_memory_mib: int | None = None
    container_id: str | None = None
    maps_read: bool | None = Field(default=None, description="/proc/<pid>/maps could be read")
    libcuda: str | None = None
    libcuda_version: str | None = None
    libcuda_compat: bool | None = Field(default=None, description="libcuda loaded from a compat/ directory")
    cudart_version: str | None = None


class CompatPackage(_Model):
    name: str | None = None
    version: str | None = None
    branch: str | None = Field(default=None, description="the driver branch its libcuda belongs to")


class WorkloadFacts(Section):
    """Other tenants' CUDA work; status unknown when some of it could not be read."""

    containers: list[TenantContainer] = Field(default_factory=list)
    processes: list[TenantProcess] = Field(default_factory=list)
    compat_packages: list[CompatPackage] = Field(default_factory=list)


class ContainerFacts(Section):
    runtime: ContainerRuntime | None = None
    runtimes: list[ContainerRuntime] = Field(default_factory=list)
    toolkit_version: str | None = None
    image: ImageFacts | None = None
    probe: ProbeFacts = Field(default_factory=ProbeFacts)
    # Optional in schema 1.1: None for facts of a collector that did not read them (read as unknown).
    workloads: WorkloadFacts | None = None


# -- scheduler -----------------------------------------------------------------


class SchedulerFacts(Section):
    kind: Literal["slurm", "kubernetes", "none"] | None = None
    node: str | None = None
    state: str | None = None  # idle, mixed, allocated, drained, draining, down
    # Slurm flags beside the state, lower case (not_responding, maint, reserved, ...).
    state_flags: list[str] = Field(default_factory=list)
    reason: str | None = None
    jobs_running: int | None = None


# -- active checks (audit --active; docs/facts.md section 17) -----------------------


class ActiveTool(_Model):
    """One tool's run: ran False with a reason when it is not installed."""

    ran: bool = False
    reason: str | None = None
    rc: int | None = None
    error: str | None = None
    duration_s: float | None = None


class DcgmCode(_Model):
    """A DCGM_FR_* failure code a test recorded (``dcgmi diag -j``; docs/facts.md section 17)."""

    id: int
    severity: int | None = None
    category: int | None = None
    gpu: int | None = None


class DcgmTest(_Model):
    section: str | None = None
    name: str
    result: Literal["pass", "fail", "warn", "skip"] | None = None
    failed_gpus: list[int] = Field(default_factory=list)
    details: list[dict[str, str]] = Field(default_factory=list)
    codes: list[DcgmCode] = Field(default_factory=list)


class DcgmDiag(ActiveTool):
    level: int | None = None
    result: Literal["pass", "fail", "warn"] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    tests: list[DcgmTest] = Field(default_factory=list)
    format: Literal["json", "table"] | None = Field(default=None, description="json: dcgmi diag -j")
    runtime_error: str | None = None


class NcclTransport(_Model):
    """What a run's NCCL_DEBUG=INFO lines say about its transport (docs/facts.md section 6)."""

    network: str | None = Field(default=None, description='"Using network X": IB, Socket, IBext_v8, ...')
    ib_devices: str | None = Field(default=None, description="NET/IB : Using <devices>")
    ib_no_device: bool = Field(default=False, description="NET/IB : No device found")
    socket: bool = Field(default=False, description="NET/Socket : Using ...")
    ib_hca: str | None = Field(default=None, description="NCCL_IB_HCA as NCCL read it")
    gdr_enabled: list[str] = Field(default_factory=list, description="HCAs with GPU Direct RDMA enabled")
    gdr_disabled: list[str] = Field(default_factory=list, description="HCAs with GPU Direct RDMA disabled")
    dmabuf: bool = False
    channels: dict[str, int] = Field(default_factory=dict,
                                     description="channel transport -> lines (P2P/IPC, NET/IB...)")
    nvls: bool | None = Field(default=None, description="NVLS multicast available on every device that said")
    mnnvl_uuid: str | None = Field(default=None, description="the MNNVL fabric UUID NCCL saw (0.0: none)")


class NcclRun(ActiveTool):
    gpus: int | None = None
    ranks: int | None = None
    sizes: int | None = None
    wrong: int | None = None
    max_bytes: int | None = None
    peak_busbw_gbs: float | None = Field(default=None, description="busbw of the largest message, GB/s")
    avg_busbw_gbs: float | None = None
    out_of_bounds: int | None = None
    # None: the run printed no NCCL INFO line (older facts, or NCCL_DEBUG not honoured).
    transport: NcclTransport | None = None


class IbWriteBw(ActiveTool):
    device: str | None = None
    port: int | None = None
    state: str | None = None
    rate_gbps: float | None = None
    bytes: int | None = None
    bw_avg_gbps: float | None = None
    bw_peak_gbps: float | None = None


class ActiveFacts(Section):
    level: Literal["quick", "full"] | None = None
    skipped: str | None = Field(default=None, description="why nothing ran (GPUs in use)")
    dcgm: DcgmDiag | None = None
    nccl: NcclRun | None = None
    ib_write_bw: list[IbWriteBw] = Field(default_factory=list)


# -- the whole host --------------------------------------------------------------


class HostFacts(_Model):
    schema_version: str = SCHEMA_VERSION
    host: str
    hostname: str | None = None
    collected_at: str | None = None
    duration_s: float | None = None
    driver: DriverFacts = Field(default_factory=DriverFacts)
    packages: PackageFacts = Field(default_factory=PackageFacts)
    fabricmanager: FabricManagerFacts = Field(default_factory=FabricManagerFacts)
    # Optional in 1.1: None for facts of a collector that did not read IMEX (read as unknown where needed).
    imex: ImexFacts | None = None
    rdma: RdmaFacts = Field(default_factory=RdmaFacts)
    nccl: NcclFacts = Field(default_factory=NcclFacts)
    container: ContainerFacts = Field(default_factory=ContainerFacts)
    scheduler: SchedulerFacts = Field(default_factory=SchedulerFacts)
    # Only with audit --active (optional in 1.1): None when no active check was asked for.
    active: ActiveFacts | None = None
    commands: list[dict[str, Any]] = Field(default_factory=list)
    # Set by k3fleet.verdict.validate_facts: equal for hosts whose facts the host rules read alike
    # (everything but identity, timing and scheduler state), so the verdict judges each kind once.
    _rule_key: tuple[Any, ...] | None = PrivateAttr(default=None)


_M = TypeVar("_M", bound=BaseModel)


def replaced(model: _M, **changes: Any) -> _M:
    """A copy of a validated model with some fields replaced by values of the right type.

    For the verdict's bulk paths only (a GPU with another UUID, a finding for another host):
    copies the validated fields as they are, which costs half of pydantic's model_copy. The
    changes are not validated: callers pass values of the fields' types.
    """
    new = model.__class__.__new__(model.__class__)
    fields = model.__dict__.copy()
    fields.update(changes)
    object.__setattr__(new, "__dict__", fields)
    object.__setattr__(new, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    object.__setattr__(new, "__pydantic_extra__", model.__pydantic_extra__)
    object.__setattr__(new, "__pydantic_private__", model.__pydantic_private__)
    return new


_FIELDS: dict[type[BaseModel], dict[str, Any]] = {}


def unchecked(cls: type[_M], **fields: Any) -> _M:
    """A model built from values the verdict itself computed, without validating them again.

    For the verdict's per-host outputs (a host's verdict, a plan item) at fleet size: the values
    come from validated facts and typed code, and validating them once more costs as much as the
    rest of the host's verdict. Fields left out take their defaults.
    """
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = dict(cls.model_fields)
    if len(fields) != len(known):
        for name, info in known.items():
            if name not in fields:
                fields[name] = info.get_default(call_default_factory=True)
    new = cls.__new__(cls)
    object.__setattr__(new, "__dict__", fields)
    object.__setattr__(new, "__pydantic_fields_set__", set(fields))
    object.__setattr__(new, "__pydantic_extra__", None)
    object.__setattr__(new, "__pydantic_private__", None)
    return new


def host_facts_json_schema() -> dict[str, Any]:
    schema = HostFacts.model_json_schema()
    schema["$id"] = f"https://k3fleet.invalid/schema/host-facts-{SCHEMA_VERSION}.json"
    return schema
