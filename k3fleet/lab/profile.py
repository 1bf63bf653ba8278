"""Lab host profiles: a GPU node described the way an SRE thinks about it.

A profile is a YAML file named ``<profile>.yaml`` in a fleet's ``profiles/`` directory. It
may ``extends:`` another profile; mappings merge key by key, anything else (lists, scalars,
``null``) replaces what it inherits. A fleet file names the hosts and the profile of each.
Everything is validated here, so a typo fails with one line naming the file and the field
instead of producing a lab host that silently differs from what was meant.

See inventories/lab/README.md for the format with examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.errors import validation_line

# Command sources whose argv depends on the host (runtime, image or node name); a profile
# names them like the k3fleet_sources helper that builds the argv, without "_argv".
DYNAMIC_COMMANDS = ("runtime_version", "image_inspect", "probe", "scontrol_show_node", "squeue_running")
# Directory sources are trees, not text: they are described by profile fields instead.
DIRECTORY_FILES = ("nvswitch_devices_dir", "infiniband_dir", "imex_channels_dir")
RAW_FILE_SOURCES = tuple(name for name in sources.FILES if name not in DIRECTORY_FILES)
RAW_COMMAND_SOURCES = tuple(sources.COMMANDS) + DYNAMIC_COMMANDS
RAW_SOURCES = RAW_FILE_SOURCES + RAW_COMMAND_SOURCES

# The driver's maximum CUDA by branch (docs/facts.md section 2: 575.57.08 is the 12.9 U1 minimum,
# 580.65.06+ run 13.0; 590 -> 13.1; 595 -> 13.2).
BRANCH_CUDA = {"535": "12.2", "550": "12.4", "560": "12.6", "570": "12.8", "575": "12.9",
               "580": "13.0", "590": "13.1", "595": "13.2"}
# nvidia-smi prints "KMD Version" / "CUDA UMD Version" from this branch on (docs/facts.md section 12).
KMD_HEADER_BRANCH = 610

_DRIVER_VERSION = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class LabProfileError(ValueError):
    """A profile or fleet file that cannot be used. The message is one line: file, field, detail."""


class _Spec(BaseModel):
    # Unknown keys are errors: a misspelt "nvidia_peremem: false" must not pass unnoticed.
    model_config = ConfigDict(extra="forbid")


def _check_driver_version(value: str | None) -> str | None:
    if value is not None and not _DRIVER_VERSION.match(value):
        raise ValueError(f"{value!r} is not an NVIDIA driver version like 575.57.08")
    return value


class DriverSpec(_Spec):
    """The installed NVIDIA driver packages and the kernel module actually loaded."""

    version: str
    flavour: Literal["open", "proprietary"] = "open"
    # False: packages installed but the module is not in the kernel (nvidia-smi cannot talk to it).
    loaded: bool = True
    # The module in the kernel when it differs from the packages (pending reboot).
    loaded_version: str | None = None
    loaded_flavour: Literal["open", "proprietary"] | None = None
    dkms: bool = True
    held: bool = True
    # The driver's maximum CUDA ("12.9"); by default derived from the branch.
    cuda: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    build_date: str = "Tue Sep  2 06:12:40 UTC 2025"

    @field_validator("version", "loaded_version")
    @classmethod
    def _versions(cls, value: str | None) -> str | None:
        return _check_driver_version(value)

    @model_validator(mode="after")
    def _cuda_known(self) -> DriverSpec:
        for version in {self.version, self.running_version}:
            if self.cuda is None and version.split(".", 1)[0] not in BRANCH_CUDA:
                raise ValueError(f"no CUDA version known for branch {version.split('.', 1)[0]}; "
                                 f"set cuda (the driver's maximum, e.g. \"13.3\")")
        return self

    @property
    def branch(self) -> str:
        return self.version.split(".", 1)[0]

    @property
    def running_version(self) -> str:
        return self.loaded_version or self.version

    @property
    def running_flavour(self) -> str:
        return self.loaded_flavour or self.flavour

    @property
    def pending_reboot(self) -> bool:
        return self.loaded and self.loaded_version is not None and self.loaded_version != self.version


class GpuProcessSpec(_Spec):
    """A process holding GPU memory, as nvidia-smi -q lists it under each GPU it runs on."""

    pid: int = Field(gt=0)
    name: str = "/usr/bin/python3"
    type: Literal["C", "G", "C+G"] = "C"
    used_mib: int = Field(gt=0)
    # None: on every GPU of the host (a tensor-parallel server holds all of them).
    gpus: list[int] | None = None
    # The libcuda its /proc/<pid>/maps shows; None: the host driver's own. A compat/ path is a
    # forward-compatibility package (docs/facts.md section 16).
    libcuda: str | None = None
    cudart: str | None = Field(default=None, description="libcudart version it mapped, e.g. 12.4.127")
    # False: /proc/<pid>/maps cannot be read (another user's process, no root).
    maps_readable: bool = True


HealthFlag = Literal["True", "False", "N/A"]


class FabricHealthSpec(_Spec):
    """The Fabric > Health block of R580-and-newer nvidia-smi -q (docs/facts.md section 9).

    ``gpus`` names the GPUs that print these values; the others print a healthy fabric. Without a
    fabric_health entry the lab prints R565's one-line block (Bandwidth N/A).
    """

    summary: Literal["Healthy", "Unhealthy", "Limited Capacity", "N/A"] = "Healthy"
    bandwidth: Literal["Full", "Degraded", "N/A"] = "Full"
    route_recovery_in_progress: HealthFlag = "False"
    route_unhealthy: HealthFlag = "False"
    access_timeout_recovery: HealthFlag = "False"
    incorrect_configuration: str = "None"
    partition_assigned: HealthFlag = "N/A"
    gpus: list[int] | None = None


ClockEvent = Literal["HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown",
                     "SW Power Cap", "Idle"]


class GpuHealthSpec(_Spec):
    """What nvidia-smi -q prints in ECC Errors, Remapped Rows, Clocks Event Reasons and GPU Link Info for
    the GPUs in ``gpus`` (docs/facts.md section 14); the other GPUs print a healthy GPU."""

    ecc_volatile_uncorrectable: int = Field(default=0, ge=0)
    ecc_aggregate_uncorrectable: int = Field(default=0, ge=0)
    remapped_uncorrectable: int = Field(default=0, ge=0)
    remap_pending: bool = False
    remap_failure: bool = False
    clock_events: list[ClockEvent] = Field(default_factory=list)
    pcie_gen: int | None = Field(default=None, ge=1, le=6, description="current generation; None: the maximum")
    pcie_width: int | None = Field(default=None, ge=1, le=16, description="current width; None: x16")
    nvlink_inactive: list[int] = Field(default_factory=list, description="NVLink links nvlink -s prints <inactive>")
    own_nic_distance: Literal["PIX", "PXB", "PHB", "NODE", "SYS"] | None = Field(
        default=None, description="what nvidia-smi topo -m prints between the GPU and its own NIC (None: PIX)")
    gpus: list[int] | None = None


class XidSpec(_Spec):
    """One NVRM Xid line in the host's kernel log (dmesg), on GPU ``gpu``."""

    code: int = Field(gt=0)
    gpu: int = Field(default=0, ge=0)
    text: str
    pid: int | None = None
    name: str | None = None
    uptime_s: float = Field(default=81234.5, gt=0)
    # 0: this boot (dmesg); -1 the previous boot, and so on (the journal's kernel messages of that boot).
    boot: int = Field(default=0, ge=-8, le=0)


class GpuSpec(_Spec):
    model: str = "NVIDIA H200"
    count: int = Field(default=8, ge=0, le=64)
    memory_mib: int = Field(default=143771, gt=0)
    compute_cap: str = "9.0"
    persistence_mode: bool = True
    compute_mode: str = "Default"
    # PCI device id as lspci prints it when pci.ids has no name for it (H200 SXM: 2335).
    pci_device_id: str = "2335"
    pci_bus_ids: list[str] | None = None
    # Memory in use on a GPU no process holds (driver contexts); processes add theirs.
    memory_used_mib: int = Field(default=0, ge=0)
    # What the driver keeps for itself, printed as "Reserved" beside "Used" (a real idle H200 on R580:
    # 616 MiB; docs/facts.md section 14).
    memory_reserved_mib: int = Field(default=616, ge=0)
    # NVLink links per GPU; None: 18 on an NVSwitch board or an NVLink rack (NVLink 4 and 5), else none.
    nvlinks: int | None = Field(default=None, ge=0, le=36)
    processes: list[GpuProcessSpec] = Field(default_factory=list)
    fabric_health: FabricHealthSpec | None = None
    health: GpuHealthSpec | None = None
    # PCIe generation of the slots (H200 / H100 SXM: Gen 5).
    pcie_gen_max: int = Field(default=5, ge=1, le=6)

    @field_validator("pci_bus_ids")
    @classmethod
    def _bus_ids(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        pattern = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
        for bus_id in value:
            if not pattern.match(bus_id):
                raise ValueError(f"{bus_id!r} is not an nvidia-smi bus id like 00000000:18:00.0")
        return value

    @model_validator(mode="after")
    def _bus_id_count(self) -> GpuSpec:
        if self.pci_bus_ids is not None and len(self.pci_bus_ids) != self.count:
            raise ValueError(f"pci_bus_ids lists {len(self.pci_bus_ids)} GPUs but count is {self.count}")
        named = [i for spec in self.processes for i in (spec.gpus or [])]
        if self.fabric_health is not None:
            named += self.fabric_health.gpus or []
        if self.health is not None:
            named += self.health.gpus or []
        beyond = sorted({i for i in named if not 0 <= i < self.count})
        if beyond:
            raise ValueError(f"GPU index {', '.join(map(str, beyond))} does not exist (count is {self.count})")
        for index in range(self.count):
            used = self.used_mib(index)
            if used > self.memory_mib:
                raise ValueError(f"GPU {index} would use {used} MiB of {self.memory_mib} MiB")
        return self

    def health_of(self, index: int) -> GpuHealthSpec:
        h = self.health
        if h is not None and (h.gpus is None or index in h.gpus):
            return h
        return GpuHealthSpec()

    def processes_on(self, index: int) -> list[GpuProcessSpec]:
        return [p for p in self.processes if p.gpus is None or index in p.gpus]

    def used_mib(self, index: int) -> int:
        return self.memory_used_mib + sum(p.used_mib for p in self.processes_on(index))


class FabricManagerSpec(_Spec):
    installed: bool = True
    # Package and daemon version; by default the driver package version (they must match).
    version: str | None = None
    active: Literal["active", "inactive", "failed", "activating"] = "active"
    enabled: Literal["enabled", "disabled", "masked"] = "enabled"
    held: bool = True

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        return _check_driver_version(value)


class NvlinkDomainSpec(_Spec):
    """The multi-node NVLink domain a GB200/GB300 NVL72 compute tray's GPUs registered with (nvidia-smi -q
    Fabric > ClusterUUID / CliqueId; docs/facts.md section 15). Its Fabric Manager runs outside the tray,
    so the GPUs read Completed without local NVSwitches."""

    cluster_uuid: str = Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    clique_id: int = Field(default=32766, ge=0)


class ImexSpec(_Spec):
    """IMEX on the node (docs/facts.md section 15): the nvidia-imex unit, /etc/nvidia-imex/config.cfg, the
    node list, the channel devices and what ``nvidia-imex-ctl -N`` prints (k3fleet/lab/imex_data/SOURCES.md)."""

    installed: bool = True
    active: Literal["active", "inactive", "failed", "activating"] = "active"
    enabled: Literal["enabled", "disabled", "masked"] = "enabled"
    # The domain's node list, one address per line, in IMEX node-index order.
    nodes: list[str] = Field(min_length=1)
    # /dev/nvidia-caps-imex-channels/channel0..channel<N-1>.
    channels: int = Field(default=1, ge=0, le=2048)
    # Node indices whose daemon does not answer: UNAVAILABLE, their links never connected.
    unavailable: list[int] = Field(default_factory=list)
    # The Version column; by default the driver's version (IMEX ships with the driver).
    version: str | None = None

    @model_validator(mode="after")
    def _known_nodes(self) -> ImexSpec:
        beyond = sorted({i for i in self.unavailable if not 0 <= i < len(self.nodes)})
        if beyond:
            raise ValueError(f"unavailable names node {', '.join(map(str, beyond))}, which is not in nodes "
                             f"(0..{len(self.nodes) - 1})")
        return self


class IbPortSpec(_Spec):
    state: Literal["DOWN", "INIT", "ARMED", "ACTIVE"] = "ACTIVE"
    phys_state: Literal["Sleep", "Polling", "Disabled", "LinkUp", "LinkErrorRecovery"] = "LinkUp"
    rate: str | None = None
    link_layer: Literal["InfiniBand", "Ethernet"] | None = None
    # Error counters in sysfs (counters/<name>): totals since the port came up. A replayed file reads the
    # same twice, so a lab port shows totals, not a rate (the rate cases are unit tests).
    counters: dict[str, int] = Field(default_factory=dict)
    # IPoIB "lost carrier" lines in the kernel log (Azure's link-flap check), each at this uptime.
    carrier_lost_at: list[float] = Field(default_factory=list)


class InfinibandSpec(_Spec):
    """RDMA devices: ``hcas`` devices named ``<prefix>0..``, port 1 each, healthy unless overridden."""

    hcas: int = Field(default=8, ge=0, le=64)
    prefix: str = "mlx5_"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand"
    ports: dict[str, IbPortSpec] = Field(default_factory=dict)

    def device_names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.hcas)]

    @model_validator(mode="after")
    def _known_ports(self) -> InfinibandSpec:
        unknown = sorted(set(self.ports) - set(self.device_names()))
        if unknown:
            raise ValueError(f"ports names devices that do not exist: {', '.join(unknown)} "
                             f"(devices are {self.prefix}0..{self.prefix}{max(self.hcas - 1, 0)})")
        return self


class AcsSpec(_Spec):
    # ACSCtl SrcValid+ on the PCIe switch ports above the GPUs: peer-to-peer goes via the root complex.
    enabled: bool = False


class UnattendedSpec(_Spec):
    installed: bool = True
    enabled: bool = False


class ImageSpec(_Spec):
    present: bool = True
    # sha256 hex digests; by default derived from the image reference so they stay stable.
    digest: str | None = None
    id: str | None = None
    cuda_version: str = "13.0.2"
    nvidia_require_cuda: str = "cuda>=13.0"
    vllm_version: str | None = "0.27.1"
    created: str = "2026-07-27T00:00:00Z"
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("cuda_version")
    @classmethod
    def _cuda(cls, value: str) -> str:
        if not re.match(r"^\d+\.\d+(\.\d+)?$", value):
            raise ValueError(f"{value!r} is not a CUDA version like 13.0.2")
        return value

    @field_validator("digest", "id")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(sha256:)?[0-9a-f]{64}$", value):
            raise ValueError(f"{value!r} is not a sha256 digest (64 hex digits, optional sha256: prefix)")
        return value


ProbeResult = Literal["auto", "ok", "requirement_error", "driver_too_old", "nvml_mismatch",
                      "not_initialized", "error"]


class ProbeSpec(_Spec):
    # auto: what the runtime really does with this host's driver and this image.
    result: ProbeResult = "auto"
    visible_gpus: int | None = Field(default=None, ge=0)
    message: str | None = None
    # GPUs whose matmul in the probe differs from the CPU's result (a GPU that computes wrong).
    matmul_wrong_gpus: list[int] = Field(default_factory=list)


class TenantSpec(_Spec):
    """A running container of another tenant, as `<runtime> container inspect` shows it (docs/facts.md
    section 16)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    image: str
    cuda_version: str | None = None
    nvidia_require_cuda: str | None = None
    # NVIDIA's CUDA images set it (cuda-compat-12-4) and install the package.
    compat_package: str | None = None
    ld_library_path: str = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
    gpus: bool = True
    # GPU processes (gpus.processes pids) that run in it.
    pids: list[int] = Field(default_factory=list)


class ContainerSpec(_Spec):
    runtime: Literal["docker", "podman", "none"] = "docker"
    runtime_version: str = "28.1.1"
    # docker prints its git commit; podman prints none.
    runtime_build: str | None = "4eba377"
    toolkit_version: str | None = "1.17.8"
    toolkit_commit: str | None = "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"
    image: ImageSpec = Field(default_factory=ImageSpec)
    probe: ProbeSpec = Field(default_factory=ProbeSpec)
    # Other tenants' running containers.
    tenants: list[TenantSpec] = Field(default_factory=list)


SlurmState = Literal["idle", "mixed", "allocated", "drained", "draining", "down"]


class SlurmSpec(_Spec):
    state: SlurmState = "idle"
    reason: str | None = None
    jobs: list[int] = Field(default_factory=list)
    partition: str = "gpu"
    version: str = "23.11.10"
    sockets: int = 2
    cores_per_socket: int = 56
    threads_per_core: int = 2
    real_memory_mb: int = 2063000

    @model_validator(mode="after")
    def _jobs_match_state(self) -> SlurmSpec:
        busy = self.state in ("mixed", "allocated", "draining")
        if busy and not self.jobs:
            raise ValueError(f"state {self.state} needs at least one running job in jobs")
        if not busy and self.jobs:
            raise ValueError(f"state {self.state} cannot have running jobs {self.jobs}")
        return self


class RawCapture(_Spec):
    """A recorded command: what it printed, its exit status, and how long it took."""

    stdout: str = ""
    stderr: str = ""
    rc: int = Field(default=0, ge=0, le=255)
    sleep: float = Field(default=0.0, ge=0.0)


class ActiveToolsSpec(_Spec):
    """The active-check tools a lab host has, each printing a recorded real output
    (k3fleet/lab/active_data/SOURCES.md); absent: not installed (docs/facts.md section 17)."""

    dcgmi: Literal["absent", "pass", "gpu_memory_fail"] = "absent"
    all_reduce_perf: Literal["absent", "low_busbw"] = "absent"
    ib_write_bw: Literal["absent", "slow"] = "absent"
    # A stand-in mpirun for the NCCL pair test (k3fleet.lab.mpirun): a pair of lab hosts
    # prints the recorded two-node run of a good pair, or of a low one when either host's link is low.
    mpirun: Literal["absent", "good", "low"] = "absent"


class Profile(_Spec):
    description: str = ""
    reachable: bool = True
    os: Literal["ubuntu-22.04", "ubuntu-24.04", "rhel-9"] = "ubuntu-22.04"
    kernel: str | None = None
    driver: DriverSpec | None = None
    gpus: GpuSpec = Field(default_factory=GpuSpec)
    nvswitches: int = Field(default=4, ge=0, le=16)
    fabricmanager: FabricManagerSpec = Field(default_factory=FabricManagerSpec)
    # A GB200/GB300 NVL72 tray: the rack's NVLink domain and IMEX; null on HGX boards (NVLink inside the node).
    nvlink_domain: NvlinkDomainSpec | None = None
    imex: ImexSpec | None = None
    infiniband: InfinibandSpec = Field(default_factory=InfinibandSpec)
    nvidia_peermem: bool = True
    # /etc/nccl.conf as KEY: VALUE; null means the file does not exist.
    nccl_conf: dict[str, str] | None = None
    # Extra lines of /etc/environment (after PATH).
    environment: dict[str, str] = Field(default_factory=dict)
    acs: AcsSpec = Field(default_factory=AcsSpec)
    unattended_upgrades: UnattendedSpec = Field(default_factory=UnattendedSpec)
    # Further packages on hold besides the driver/Fabric Manager ones ``held`` already covers.
    held_packages: list[str] = Field(default_factory=list)
    # CUDA forward-compatibility packages installed on the host: name -> version (cuda-compat-12-9:
    # 575.57.08-0ubuntu1).
    compat_packages: dict[str, str] = Field(default_factory=dict)
    container: ContainerSpec = Field(default_factory=ContainerSpec)
    active_tools: ActiveToolsSpec = Field(default_factory=ActiveToolsSpec)
    slurm: SlurmSpec | None = Field(default_factory=SlurmSpec)
    # NVRM Xid lines in the kernel log (dmesg) since boot.
    xid: list[XidSpec] = Field(default_factory=list)
    # kernel.dmesg_restrict=1 for the audit's user: dmesg is refused, the journal's kernel messages answer.
    dmesg_restricted: bool = False
    # NVreg_RegistryDwords="GrdmaPciTopoCheckOverride=1" on the loaded module (GB200 with PCIe NICs before R595).
    grdma_topo_override: bool = False
    # Boots the journal keeps, this one included (1: a volatile journal); raised to reach every Xid's boot.
    journal_boots: int = Field(default=1, ge=1, le=9)
    # Captured text per k3fleet_sources name; overrides what would be rendered. null: absent.
    raw: dict[str, str | RawCapture | None] = Field(default_factory=dict)

    @field_validator("raw")
    @classmethod
    def _raw_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, capture in value.items():
            if name in DIRECTORY_FILES:
                raise ValueError(f"{name} is a directory source; describe it with profile fields "
                                 f"(nvswitches, infiniband, imex), not raw text")
            if name not in RAW_SOURCES:
                raise ValueError(f"unknown source {name!r}; known: {', '.join(RAW_SOURCES)}")
            if name in RAW_FILE_SOURCES and isinstance(capture, RawCapture):
                raise ValueError(f"{name} is a file: give its text, not stdout/stderr/rc")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.container.runtime == "none":
            used = sorted(set(self.raw) & {"runtime_version", "image_inspect", "probe"})
            if used:
                raise ValueError(f"raw has {', '.join(used)} but container.runtime is none")
        pids = {p.pid for p in self.gpus.processes}
        unknown_pids = sorted({pid for t in self.container.tenants for pid in t.pids} - pids)
        if unknown_pids:
            raise ValueError(f"container.tenants name pid {', '.join(map(str, unknown_pids))}, which is in no "
                             "gpus.processes entry")
        if self.container.tenants and self.container.runtime == "none":
            raise ValueError("container.tenants needs a container runtime")
        beyond = sorted({x.gpu for x in self.xid if x.gpu >= self.gpus.count})
        if beyond:
            raise ValueError(f"xid names GPU {', '.join(map(str, beyond))}, which does not exist")
        if self.slurm is None:
            used = sorted(set(self.raw) & {"scontrol_show_node", "squeue_running"})
            if used:
                raise ValueError(f"raw has {', '.join(used)} but slurm is null")
        return self

    @property
    def fabricmanager_version(self) -> str | None:
        if not self.fabricmanager.installed:
            return None
        if self.fabricmanager.version:
            return self.fabricmanager.version
        return self.driver.version if self.driver else None


@dataclass(frozen=True)
class LabHost:
    name: str
    profile_name: str
    profile: Profile


@dataclass(frozen=True)
class FleetSpec:
    """A validated fleet: hosts in order, each with its fully resolved profile."""

    hosts: tuple[LabHost, ...]
    source: Path | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"lab fleet has no host {name!r}")


# -- loading -------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LabProfileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise LabProfileError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                              f"{exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise LabProfileError(f"{path}: invalid YAML: {detail}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LabProfileError(f"{path}: expected a mapping at the top, found {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else in ``override`` replaces the inherited value."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve_raw_files(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """Turn ``raw_file`` entries (paths relative to the declaring file) into ``raw`` text."""
    raw_file = data.pop("raw_file", None)
    if raw_file is None:
        return data
    if not isinstance(raw_file, dict):
        raise LabProfileError(f"{path}: raw_file: expected a mapping of source name to file path")
    raw = dict(data.get("raw") or {})

    def read(name: str, rel: Any) -> str:
        if not isinstance(rel, str):
            raise LabProfileError(f"{path}: raw_file.{name}: expected a file path, found {rel!r}")
        target = (path.parent / rel).resolve()
        try:
            return target.read_text(encoding="utf-8")
        except OSError as exc:
            raise LabProfileError(f"{path}: raw_file.{name}: cannot read {target}: "
                                  f"{exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            # A capture is replayed as the tool's text output: re-save it as UTF-8 (iconv -f ... -t UTF-8).
            raise LabProfileError(f"{path}: raw_file.{name}: {target} is not UTF-8 text (byte "
                                  f"0x{exc.object[exc.start]:02x} at offset {exc.start}); convert it to "
                                  "UTF-8") from None

    for name, entry in raw_file.items():
        if isinstance(entry, dict):
            capture = {k: v for k, v in entry.items() if k not in ("stdout", "stderr")}
            for stream in ("stdout", "stderr"):
                if stream in entry:
                    capture[stream] = read(f"{name}.{stream}", entry[stream])
            raw[name] = capture
        else:
            raw[name] = read(name, entry)
    data["raw"] = raw
    return data


class ProfileLoader:
    """Loads profiles by name from one directory, following ``extends`` chains."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._raw: dict[str, dict[str, Any]] = {}
        self.profiles: dict[str, Profile] = {}

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.yaml"

    def _merged(self, name: str, chain: tuple[str, ...], referrer: str) -> dict[str, Any]:
        if name in chain:
            loop = " -> ".join((*chain, name))
            raise LabProfileError(f"{self.path(chain[0])}: extends: inheritance loop {loop}")
        path = self.path(name)
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in self.directory.glob("*.yaml"))) or "none"
            raise LabProfileError(f"{referrer}: profile {name!r} not found in {self.directory} "
                                  f"(profiles: {known})")
        if name not in self._raw:
            self._raw[name] = _resolve_raw_files(path, _read_yaml(path))
        data = dict(self._raw[name])
        parent = data.pop("extends", None)
        if parent is None:
            return data
        if not isinstance(parent, str):
            raise LabProfileError(f"{path}: extends: expected a profile name, found {parent!r}")
        return deep_merge(self._merged(parent, (*chain, name), f"{path}: extends"), data)

    def merged_data(self, name: str, referrer: str) -> dict[str, Any]:
        return self._merged(name, (), referrer)

    def load(self, name: str, referrer: str | None = None) -> Profile:
        if name not in self.profiles:
            data = self.merged_data(name, referrer or str(self.directory))
            self.profiles[name] = validate_profile(data, str(self.path(name)))
        return self.profiles[name]


def validate_profile(data: dict[str, Any], where: str) -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise LabProfileError(f"{where}: {validation_line(exc)}") from None


def load_fleet_file(path: Path) -> FleetSpec:
    """Read a fleet file (``hosts: {name: {profile: p, set: {...}}}``) and resolve every host."""
    data = _read_yaml(path)
    unknown = sorted(set(data) - {"hosts", "profiles_dir", "description"})
    if unknown:
        raise LabProfileError(f"{path}: unknown top-level field(s): {', '.join(unknown)} "
                              f"(known: hosts, profiles_dir, description)")
    hosts = data.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        raise LabProfileError(f"{path}: hosts: expected a non-empty mapping of host name to profile")
    profiles_dir = (path.parent / str(data.get("profiles_dir", "profiles"))).resolve()
    loader = ProfileLoader(profiles_dir)
    resolved: list[LabHost] = []
    for name, entry in hosts.items():
        where = f"{path}: hosts.{name}"
        if not isinstance(name, str) or not _HOSTNAME.match(name):
            raise LabProfileError(f"{where}: host name must be a lowercase DNS label")
        if isinstance(entry, str):
            entry = {"profile": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("profile"), str):
            raise LabProfileError(f"{where}: expected 'profile: <name>' (and optionally 'set: {{...}}')")
        extra = sorted(set(entry) - {"profile", "set"})
        if extra:
            raise LabProfileError(f"{where}: unknown field(s) {', '.join(extra)} (known: profile, set)")
        overrides = entry.get("set")
        if overrides is None:
            profile = loader.load(entry["profile"], where)
        else:
            if not isinstance(overrides, dict):
                raise LabProfileError(f"{where}.set: expected a mapping of profile fields")
            merged = deep_merge(loader.merged_data(entry["profile"], where),
                                _resolve_raw_files(path, dict(overrides)))
            profile = validate_profile(merged, where)
        resolved.append(LabHost(name=name, profile_name=entry["profile"], profile=profile))
    return FleetSpec(hosts=tuple(resolved), source=path, profiles=dict(loader.profiles))
