"""The target: what "compatible" means for one serving recipe, as data.

A target file (``k3fleet/targets/kimi-k3.yaml`` by default) names the image, its CUDA
release, the driver branch to move to, GPU counts per strategy and the Fabric Manager,
RDMA, NCCL, container and serving expectations. The CUDA -> driver matrix is a separate
data file with a source per row; rows the sources do not confirm carry
``confirmed: false`` and every finding that leans on one says so.

Models here forbid unknown keys: a misspelt key in a target file is an error, not a
silently ignored expectation.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import PAIR_LAUNCHER_FIELDS

Strategy = Literal["single_node_tp", "multi_node_tp_dp", "multi_node_tp_pp", "multi_node_dep"]
# "auto": derive the strategy from the fleet's GPU memory (see GpuSpec.weights_memory).
StrategySetting = Literal["auto", "single_node_tp", "multi_node_tp_dp", "multi_node_tp_pp", "multi_node_dep"]

# nvidia-smi and NVML report GPU memory in MiB.
MIB_PER_GIB = 1024

_NUM = re.compile(r"\d+")
_CUDA_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")


# A fleet repeats a handful of version strings thousands of times: parse each once.
@lru_cache(maxsize=4096)
def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """Numeric release of a driver/toolkit/package version, or None when there is none.

    Accepts "580.95.05", Debian "580.95.05-0ubuntu1" and "1:580.95.05-1" (epoch), RPM
    "580.95.05-1.el9": only the upstream part before the first "-" counts.
    """
    if not text:
        return None
    s = text.strip()
    if ":" in s:
        s = s.split(":", 1)[1]
    s = s.split("-", 1)[0]
    parts: list[int] = []
    for piece in s.split("."):
        m = _NUM.match(piece)
        if not m:
            break
        parts.append(int(m.group(0)))
        if m.end() != len(piece):
            # "1rc2": the numeric head counts, the rest is a pre-release tag.
            break
    return tuple(parts) if parts else None


@lru_cache(maxsize=1024)
def cuda_tuple(text: str | None) -> tuple[int, int, int] | None:
    """A CUDA release as (major, minor, patch); "13.0" means 13.0.0 (GA)."""
    v = version_tuple(text)
    if v is None or len(v) < 2:
        return None
    return (v[0], v[1], v[2] if len(v) > 2 else 0)


def _form(ok: Callable[[str], object], expected: str) -> AfterValidator:
    """A string field (or None) that ``ok`` accepts; otherwise "expected <expected>, got '<value>'"."""

    def check(v: str | None) -> str | None:
        if v is not None and not ok(v):
            raise ValueError(f"expected {expected}, got {v!r}")
        return v

    return AfterValidator(check)


def _driver_like(v: str) -> bool:
    return len(version_tuple(v) or ()) >= 2


def _version_like(example: str) -> AfterValidator:
    return _form(version_tuple, f"a version like {example}")


DriverVersion = Annotated[str, _form(version_tuple, "a driver version like 580.95.05")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetConflict(ValueError):
    """Two parts of a target that contradict each other; ``field`` is the one to change.

    Raised from validators so the loader can name the field, not the top level, in its one line.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)


# vLLM flags that set the tensor-parallel size (long form and vLLM's short alias).
TP_FLAGS = ("--tensor-parallel-size", "-tp")


def tensor_parallel_for(strategy: Strategy, per_node: int) -> int:
    """The tensor-parallel size a strategy serves with (docs/facts.md section 13).

    Tensor parallelism spans one node's GPUs for the single-node layout and for the multi-node
    layouts that add data or pipeline parallelism across nodes; the DEP layout shards the
    experts with data parallelism and runs no tensor parallelism (size 1).
    """
    return 1 if strategy == "multi_node_dep" else per_node


# -- CUDA -> driver matrix -------------------------------------------------------------------


class MatrixRow(_Strict):
    cuda: Annotated[str, _form(_CUDA_RE.match, "a CUDA release like 13.0.2")] = Field(
        description="toolkit release as major.minor.patch; Update N is patch N")
    label: str
    min_driver: Annotated[str | None, _form(_driver_like, "a driver version like 580.65.06")] = Field(
        default=None, description="minimum Linux x86_64 driver; None if unknown")
    confirmed: bool = True
    source: str

    @property
    def key(self) -> tuple[int, int, int]:
        t = cuda_tuple(self.cuda)
        assert t is not None  # guaranteed by the validator
        return t


class MinorVersionCompat(_Strict):
    cuda_major: int
    min_driver_branch: int
    note: str | None = None
    source: str


class BranchInfo(_Strict):
    branch: int
    kind: str
    eol: str | None = None
    source: str


class CudaDriverMatrix(_Strict):
    schema_version: str = "1"
    platform: str = "linux-x86_64"
    sources: list[str] = Field(default_factory=list)
    rows: list[MatrixRow]
    minor_version_compat: list[MinorVersionCompat] = Field(default_factory=list)
    branches: list[BranchInfo] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_rows(self) -> CudaDriverMatrix:
        seen: set[tuple[int, int, int]] = set()
        for row in self.rows:
            if row.key in seen:
                raise ValueError(f"duplicate matrix row for CUDA {row.cuda}")
            seen.add(row.key)
        return self

    def row_for(self, cuda: str) -> tuple[MatrixRow | None, bool]:
        """The row that governs ``cuda`` and whether it is an exact match.

        Without an exact row, the newest row of the same major.minor at or below the
        requested patch is used; failing that, the oldest newer one of that minor,
        which can only make the requirement stricter.
        """
        want = cuda_tuple(cuda)
        if want is None:
            return None, False
        same_minor = sorted((r for r in self.rows if r.key[:2] == want[:2]), key=lambda r: r.key)
        for r in same_minor:
            if r.key == want:
                return r, True
        below = [r for r in same_minor if r.key < want]
        if below:
            return below[-1], False
        return (same_minor[0], False) if same_minor else (None, False)

    def max_cuda_for_driver(self, driver: str) -> MatrixRow | None:
        """The newest toolkit row whose minimum driver ``driver`` meets (nvidia-smi's "CUDA Version")."""
        d = version_tuple(driver)
        if d is None:
            return None
        best: MatrixRow | None = None
        for r in self.rows:
            m = version_tuple(r.min_driver)
            if m is not None and m <= d and (best is None or r.key > best.key):
                best = r
        return best

    def floor_branch(self, cuda_major: int) -> MinorVersionCompat | None:
        for c in self.minor_version_compat:
            if c.cuda_major == cuda_major:
                return c
        return None

    def branch_info(self, branch: int) -> BranchInfo | None:
        for b in self.branches:
            if b.branch == branch:
                return b
        return None


# -- target sections ----------------------------------------------------------------------------


class ImageSpec(_Strict):
    ref: str
    cuda: Annotated[str, _form(_CUDA_RE.match, "a CUDA release like 13.0")] = Field(
        description="CUDA release the image is built against, e.g. 13.0")
    digest: str | None = Field(default=None, description="pin: every host must hold this digest")


class VllmSpec(_Strict):
    min_version: Annotated[str, _version_like("0.27.1")]


class DriverSpec(_Strict):
    branch: int = Field(gt=0, description="branch the fleet moves to (R580)")
    target_version: DriverVersion = Field(description="exact driver (and Fabric Manager) version the change installs")
    min_version: DriverVersion | None = Field(
        default=None, description="override of the matrix minimum for image.cuda; None = from the matrix"
    )
    require_persistence_mode: bool = True


class OpenModulesSpec(_Strict):
    required_min_compute_capability: str = "10.0"
    required_name_patterns: list[str] = Field(default_factory=list)
    why: str | None = None

    def required_for(self, name: str | None, compute_capability: str | None) -> bool:
        cc = version_tuple(compute_capability)
        floor = version_tuple(self.required_min_compute_capability) or (10, 0)
        if cc is not None and cc >= floor:
            return True
        upper = (name or "").upper()
        return any(p.upper() in upper for p in self.required_name_patterns)


class CapacityOverride(_Strict):
    gpu_name_contains: str
    min_total_gpus: int = Field(gt=0)
    source: str


class WeightsMemory(_Strict):
    """GPU memory the model's weights need across one serving instance (data, not truth)."""

    gb: float = Field(gt=0, description="GPU memory the weights need, in GB as the source states it")
    format: str | None = Field(default=None, description="weight format the figure is for, e.g. MXFP4")
    confirmed: bool = Field(default=False, description="false: an estimate; override gb when the real figure is known")
    source: str
    load_s: float | None = Field(default=None, gt=0, description="seconds a measured load of the weights took")
    load_source: str | None = None


def is_multi_node(strategy: str) -> bool:
    return strategy.startswith("multi_node")


class GpuSpec(_Strict):
    strategy: StrategySetting = Field(
        default="auto",
        description="auto: single_node_tp where one node's GPU memory holds weights_memory, otherwise "
        "multi_node_strategy; an explicit strategy is used as given",
    )
    multi_node_strategy: Strategy = Field(
        default="multi_node_tp_dp", description="the strategy auto picks when one node cannot hold the weights"
    )
    weights_memory: WeightsMemory | None = None
    per_node: int = Field(gt=0)
    min_total_by_strategy: dict[Strategy, int]
    overrides: list[CapacityOverride] = Field(default_factory=list)
    source: str | None = None

    @model_validator(mode="after")
    def _auto_needs_memory(self) -> GpuSpec:
        if not is_multi_node(self.multi_node_strategy):
            raise ValueError(f"multi_node_strategy must be a multi_node_* strategy, got {self.multi_node_strategy!r}")
        if self.strategy == "auto" and self.weights_memory is None:
            raise ValueError("strategy auto derives the layout from GPU memory: set weights_memory "
                             "(or name an explicit strategy)")
        return self

    def min_total(self, gpu_names: list[str], strategy: Strategy | None = None) -> tuple[int, str]:
        """Minimum GPUs for ``strategy`` (default: the explicit one), raised by any override whose model is present."""
        strat = strategy or self.explicit_strategy
        if strat is None:
            raise ValueError("gpus.strategy is auto: pass the derived strategy")
        need = self.min_total_by_strategy.get(strat, self.per_node)
        why = f"strategy {strat}"
        upper = [n.upper() for n in gpu_names]
        for o in self.overrides:
            if o.min_total_gpus > need and any(o.gpu_name_contains.upper() in n for n in upper):
                need, why = o.min_total_gpus, f"{o.gpu_name_contains} (any layout)"
        return need, why

    @property
    def explicit_strategy(self) -> Strategy | None:
        """The strategy the target names, or None for auto."""
        if self.strategy == "auto":
            return None
        return self.strategy


class FabricManagerSpec(_Strict):
    required_when_nvswitch: bool = True
    version_must_match_driver: bool = True
    must_be_active: bool = True


PcieDistance = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
NEAR_NIC: tuple[PcieDistance, ...] = ("PIX", "PXB")


class RdmaSpec(_Strict):
    required: bool | None = Field(
        default=None, description="None: required for multi_node_* strategies (explicit or derived)"
    )
    rails_per_node: int = Field(default=8, ge=0)
    link_layer: Literal["InfiniBand", "Ethernet"] | None = "InfiniBand"
    min_rate_gbps: float = Field(default=400.0, ge=0)
    require_all_active: bool = True
    gpudirect: Literal["peermem_or_dmabuf", "peermem", "dmabuf"] = "peermem_or_dmabuf"
    ignore_devices: list[str] = Field(
        default_factory=list, description="glob patterns of RDMA devices that are not fabric rails"
    )
    gpu_nic_distance: list[PcieDistance] = Field(
        default_factory=lambda: list(NEAR_NIC),
        description="PCIe distances (nvidia-smi topo -m) each GPU's nearest NIC may be at on an RDMA fleet")

    def ignored(self, device: str) -> bool:
        return any(fnmatch.fnmatchcase(device, p) for p in self.ignore_devices)


class NcclSpec(_Strict):
    forbidden_debug: list[str] = Field(default_factory=lambda: ["INFO", "TRACE"])
    consistent_keys: list[str] = Field(default_factory=list)
    required: dict[str, str] = Field(default_factory=dict)


class ContainerSpec(_Strict):
    runtimes: list[str] = Field(default_factory=lambda: ["docker", "podman", "nerdctl"])
    toolkit_min_version: Annotated[str, _version_like("1.17.8")] = "1.17.8"
    toolkit_advisory: str | None = None
    require_probe: bool = True


class PackagesSpec(_Strict):
    require_driver_hold: bool = True
    unattended_upgrades_allowed: bool = False


class SchedulerSpec(_Strict):
    idle_states: list[str] = Field(default_factory=lambda: ["idle"])
    out_of_service_states: list[str] = Field(
        default_factory=lambda: ["drain", "drained", "draining", "down", "fail", "failing", "maint",
                                 "not_responding"]
    )
    down_states: list[str] = Field(default_factory=lambda: ["down", "fail"])


class ServeSpec(_Strict):
    model: str
    flags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    # flag -> required value (None: the flag takes no value); a serving command lacking any is wrong.
    required_flags: dict[str, str | None] = Field(default_factory=dict)
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="vLLM's --gpu-memory-utilization (0.9 by default): the share of each GPU's memory the engine "
        "claims at start-up; a GPU with less free memory fails the start")

    @model_validator(mode="after")
    def _required_present(self) -> ServeSpec:
        missing = self.missing_flags(self.flags)
        if missing:
            raise ValueError(f"serve.flags lacks required flags: {', '.join(missing)}")
        return self

    @staticmethod
    def given_flags(argv: list[str]) -> dict[str, str | None]:
        """flag -> value for every ``--flag value``, ``--flag=value`` and ``-x value`` in ``argv``."""
        given: dict[str, str | None] = {}
        for i, tok in enumerate(argv):
            if not tok.startswith("-") or tok == "-":
                continue
            if "=" in tok:
                k, v = tok.split("=", 1)
                given[k] = v
            else:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                given[tok] = nxt if nxt is not None and not nxt.startswith("-") else None
        return given

    def tensor_parallel_size(self) -> tuple[str, str | None] | None:
        """(flag as written, its value) when the flags set the tensor-parallel size, else None."""
        given = self.given_flags(self.flags)
        for flag in TP_FLAGS:
            if flag in given:
                return flag, given[flag]
        return None

    def missing_flags(self, argv: list[str]) -> list[str]:
        """Required flags absent from ``argv`` (or present with another value), as "flag[ value]"."""
        given = self.given_flags(argv)
        out: list[str] = []
        for flag, value in self.required_flags.items():
            if flag not in given or (value is not None and given[flag] != value):
                out.append(flag if value is None else f"{flag} {value}")
        return out

    def argv(self) -> list[str]:
        return ["vllm", "serve", self.model, *self.flags]

    def argv_for(self, tensor_parallel: int) -> list[str]:
        """The serve command with the tensor-parallel size set to ``tensor_parallel`` (the strategy's)."""
        flags = list(self.flags)
        for i, tok in enumerate(flags):
            name = tok.split("=", 1)[0]
            if name in TP_FLAGS:
                if "=" in tok:
                    flags[i] = f"{name}={tensor_parallel}"
                elif i + 1 < len(flags):
                    flags[i + 1] = str(tensor_parallel)
                return ["vllm", "serve", self.model, *flags]
        return ["vllm", "serve", self.model, "--tensor-parallel-size", str(tensor_parallel), *flags]


class ChangeSpec(_Strict):
    wave_fraction: float = Field(default=0.1, gt=0, le=1)
    min_wave_size: int = Field(default=1, ge=1)
    # The change night's timeouts: the one place they are set (docs/change-night.md "Timeouts").
    drain_timeout_s: int = Field(default=3600, ge=0, description="wait for running jobs before the package change")
    reboot_timeout_s: int = Field(default=1200, gt=0, description="wait for a rebooted node to come back")
    fabricmanager_settle_s: int = Field(default=60, ge=0, description="Fabric Manager's start after the driver")
    command_timeout_s: int = Field(default=20, gt=0, description="one collector command on a node")
    audit_max_age_s: int = Field(default=3600, gt=0, description="how long the gating audit stays fresh")
    lease_ttl_s: int = Field(default=14400, gt=0, description="how long a Kubernetes lease says it holds a node")
    # The serving smoke after each host's verification (docs/change-night.md "Serving smoke").
    smoke_ready_timeout_s: int = Field(default=1800, gt=0,
                                       description="the smoke's server to answer /health after its container starts")
    smoke_request_timeout_s: int = Field(default=120, gt=0,
                                         description="each smoke request: /v1/models, then one chat completion")
    # The rollback kit staged before each host's first change (docs/change-night.md "Rollback kit").
    rollback_kit_timeout_s: int = Field(default=1200, gt=0,
                                        description="one package's download into a node's rollback kit")


class ActiveTimeouts(_Strict):
    """Seconds each active check may run on a node (docs/facts.md section 17)."""

    dcgm_quick_s: int = Field(default=180, gt=0, le=3600, description="dcgmi diag at the quick level")
    dcgm_full_s: int = Field(default=2400, gt=0, le=14400, description="dcgmi diag at the full level")
    nccl_s: int = Field(default=600, gt=0, le=3600,
                        description="all_reduce_perf within the node, and each pair of nodes (audit --active full)")
    ib_write_bw_s: int = Field(default=60, gt=0, le=600, description="ib_write_bw on one rail")


class ActiveSpec(_Strict):
    """Active checks of ``audit --active LEVEL``: what runs at each level and how it is judged."""

    dcgm_level: dict[Literal["quick", "full"], int] = Field(
        default_factory=lambda: {"quick": 1, "full": 3},  # type: ignore[arg-type,return-value]
        description="dcgmi diag -r N per level (1-4)")
    timeouts: ActiveTimeouts = Field(default_factory=ActiveTimeouts)
    # Largest all_reduce_perf message and its peak bus bandwidth floor per GPU model (GB/s).
    nccl_max_bytes: str = Field(default="8G", pattern=r"^\d+[KMG]?$")
    nccl_busbw_min_gbs: dict[str, float] = Field(default_factory=dict)
    # all_reduce_perf across each pair of nodes (full): its peak busbw floor per GPU model (GB/s, for the
    # target's rails), and the launcher the first node runs it with ({hosts}: a:G,b:G, {ranks}: 2G,
    # {gpus}: G); all_reduce_perf -b 8 -e <nccl_max_bytes> -f 2 -g 1 follows it.
    nccl_pair_busbw_min_gbs: dict[str, float] = Field(default_factory=dict)
    nccl_pair_launcher: list[str] = Field(
        default_factory=lambda: ["mpirun", "-H", "{hosts}", "-np", "{ranks}", "--bind-to", "none",
                                 "-x", "NCCL_ALGO=Ring", "-x", "PATH", "-x", "LD_LIBRARY_PATH"],
        description="the launcher's command line before all_reduce_perf")
    # ib_write_bw's average against the rail's rate (sysfs rate, Gb/s).
    ib_write_bw_min_fraction: float = Field(default=0.9, gt=0, le=1)
    # The transport the NCCL runs must use, from their NCCL_DEBUG=INFO lines (docs/facts.md section 6).
    nccl_rdma_networks: list[str] = Field(
        default_factory=lambda: ["IB", "IBext"],
        description='"Using network X" names that are RDMA (a prefix: IBext_v8 is IBext); any other, Socket above '
        "all, fails a pair run on a fleet that needs RDMA")
    nccl_require_p2p: bool = Field(
        default=True, description="on an NVSwitch node the within-node run's channels must go over P2P (NVLink)")
    nccl_require_nvls: bool = Field(
        default=False, description="the within-node run must report NVLS multicast available (NVSwitch, CUDA 12.1+)")

    @field_validator("nccl_busbw_min_gbs", "nccl_pair_busbw_min_gbs")
    @classmethod
    def _floors(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(model for model, floor in v.items() if not floor > 0)
        if bad:
            raise ValueError(f"a bandwidth floor is above 0 GB/s: {', '.join(bad)}")
        return v

    @field_validator("nccl_pair_launcher")
    @classmethod
    def _launcher(cls, v: list[str]) -> list[str]:
        if not v or not v[0].strip() or any(c.isspace() for c in v[0]):
            raise ValueError("give the launcher as a command and its arguments, one list item each")
        used: set[str] = set()
        for part in v:
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
            except ValueError as exc:
                raise ValueError(f"{part!r}: {exc} (a literal brace is written {{{{ or }}}})") from None
            unknown = sorted(set(fields) - set(PAIR_LAUNCHER_FIELDS))
            if unknown:
                raise ValueError(f"{part!r}: unknown placeholder {', '.join(unknown)} "
                                 f"(known: {', '.join(PAIR_LAUNCHER_FIELDS)})")
            used.update(fields)
        if "hosts" not in used:
            raise ValueError("the launcher must name the pair's hosts with {hosts} (a:G,b:G)")
        return v

    @field_validator("dcgm_level")
    @classmethod
    def _levels(cls, v: dict[str, int]) -> dict[str, int]:
        if set(v) != {"quick", "full"}:
            raise ValueError(f"give a level for quick and full, got {', '.join(sorted(v)) or 'none'}")
        for name, level in v.items():
            if not 1 <= level <= 4:
                raise ValueError(f"{name}: dcgmi diag levels are 1 to 4, got {level}")
        return v


class CounterThresholds(_Strict):
    """Error-counter rates a node may show during the audit's visit, for the GPU models whose name contains
    ``gpu_name_contains`` ("" matches every model; the first matching row applies). docs/facts.md section 14."""

    gpu_name_contains: str = ""
    ib_symbol_error_per_second: float = Field(default=10, ge=0)
    ib_port_rcv_errors_per_second: float = Field(default=10, ge=0)
    ib_link_error_recovery_per_minute: float = Field(default=5, ge=0)
    # Any increase of these fails: the link went down, or the lossless fabric dropped a packet.
    ib_link_downed_max: int = Field(default=0, ge=0)
    ib_buffer_overrun_max: int = Field(default=0, ge=0)
    nvlink_crc_per_second: float = Field(default=100, ge=0)
    nvlink_replay_recovery_max: int = Field(default=0, ge=0)
    pcie_replay_per_minute: float = Field(default=8, ge=0)
    source: str = (
        "IB: NVSentinel NIC Health Monitor design, docs/nic-health-monitor/link-counter-detection.md Appendix A "
        "(link_downed and excessive_buffer_overrun_errors delta > 0 fatal; symbol_error > 10/sec, port_rcv_errors "
        "> 10/sec, link_error_recovery > 5/min); NVLink and PCIe: NVIDIA/DCGM dcgm_gpu_hardware_limits.h (CRC "
        "errors matter at 100+ per second, one other NVLink error, 8 PCIe replays per minute)")


class HealthSpec(_Strict):
    """Node health thresholds (docs/facts.md section 14), each with its source."""

    counter_interval_s: float = Field(
        default=0, ge=0, le=60,
        description="least seconds between the two counter samples of one visit (0: the visit's own length)")
    counters: list[CounterThresholds] = Field(default_factory=lambda: [CounterThresholds()])

    def counter_thresholds(self, gpu_names: list[str]) -> CounterThresholds:
        upper = [n.upper() for n in gpu_names]
        for row in self.counters:
            if not row.gpu_name_contains or any(row.gpu_name_contains.upper() in n for n in upper):
                return row
        return CounterThresholds()

    ecc_correctable_max: int = Field(
        default=20_000_000, ge=0,
        description="correctable ECC errors (volatile or aggregate) above which a GPU fails gpu.ecc_correctable")
    ecc_correctable_source: str = (
        "Azure azurehpc-health-checks conf/nd96isr_h200_v5.conf: check_gpu_ecc 20000000 10000 "
        "(customTests/azure_gpu_ecc.nhc: 20000000 for DRAM counts; NVML's totals mix SRAM and DRAM)")
    xid_recurring_boots: int = Field(
        default=2, ge=2, le=4, description="boots a node Xid must appear in to escalate to hardware inspection")
    xid_recurring_source: str = (
        "leptonai/gpud components/accelerator/nvidia/xid/threshold.go: the same Xid after 2 reboots escalates "
        "to HARDWARE_INSPECTION")


class XidEntry(_Strict):
    """One Xid of NVIDIA's catalogue (k3fleet/targets/xid_catalog.yaml; docs/facts.md section 14)."""

    mnemonic: str
    description: str
    immediate: str = Field(description="the catalogue's Resolution Bucket (Immediate Action)")
    investigatory: str = Field(default="", description="the catalogue's Resolution Bucket (Investigatory Action)")
    scope: Literal["application", "memory", "node"]
    severity: Literal["info", "warning", "error", "critical"]


class XidCatalog(_Strict):
    source: str
    actions: dict[str, str] = Field(description="resolution bucket -> what to do, in this project's words")
    codes: dict[int, XidEntry]

    @model_validator(mode="after")
    def _actions_known(self) -> XidCatalog:
        missing = sorted({e.immediate for e in self.codes.values()} - set(self.actions))
        if missing:
            raise ValueError(f"immediate actions without a meaning in actions: {', '.join(missing)}")
        return self


class DcgmSeverity(_Strict):
    name: str
    action: str


class DcgmCodeEntry(_Strict):
    name: str
    meaning: str
    could_not_run: bool = False


class DcgmErrors(_Strict):
    """DCGM's DCGM_FR_* codes (k3fleet/targets/dcgm_errors.yaml; docs/facts.md section 17)."""

    source: str
    severities: dict[int, DcgmSeverity]
    categories: dict[int, str]
    codes: dict[int, DcgmCodeEntry]


class Source(_Strict):
    what: str
    where: str


class Target(_Strict):
    schema_version: str = "1"
    name: str
    description: str | None = None
    sources: list[Source] = Field(default_factory=list)
    matrix_file: str = "cuda_driver_matrix.yaml"
    image: ImageSpec
    vllm: VllmSpec
    driver: DriverSpec
    open_modules: OpenModulesSpec = Field(default_factory=OpenModulesSpec)
    gpus: GpuSpec
    fabric_manager: FabricManagerSpec = Field(default_factory=FabricManagerSpec)
    rdma: RdmaSpec = Field(default_factory=RdmaSpec)
    nccl: NcclSpec = Field(default_factory=NcclSpec)
    container: ContainerSpec = Field(default_factory=ContainerSpec)
    packages: PackagesSpec = Field(default_factory=PackagesSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    serve: ServeSpec
    change: ChangeSpec = Field(default_factory=ChangeSpec)
    active: ActiveSpec = Field(default_factory=ActiveSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    # Filled by the loader from matrix_file; a target is unusable without it.
    matrix: CudaDriverMatrix

    @model_validator(mode="after")
    def _consistent(self) -> Target:
        row, _ = self.matrix.row_for(self.image.cuda)
        if row is None:
            raise TargetConflict("image.cuda", f"{self.image.cuda} has no row in the CUDA driver matrix")
        if self.driver.min_version is None and row.min_driver is None:
            raise TargetConflict(
                "image.cuda",
                f"{self.image.cuda}: the matrix row {row.label} has no minimum driver; set driver.min_version",
            )
        tv = version_tuple(self.driver.target_version)
        if tv is not None and tv[0] != self.driver.branch:
            raise TargetConflict(
                "driver.target_version",
                f"{self.driver.target_version} is not on branch {self.driver.branch} (driver.branch)",
            )
        self._check_target_meets_minimum(row, tv)
        self._check_tensor_parallel()
        return self

    def _check_target_meets_minimum(self, row: MatrixRow, tv: tuple[int, ...] | None) -> None:
        """The change must install a driver the image can run on (docs/facts.md section 13)."""
        minimum = self.driver.min_version if self.driver.min_version is not None else row.min_driver
        mt = version_tuple(minimum)
        if tv is None or mt is None or tv >= mt:
            return
        basis = ("driver.min_version" if self.driver.min_version is not None else
                 f"the CUDA driver matrix minimum for image.cuda {self.image.cuda} ({row.label}"
                 + ("" if row.confirmed else ", unconfirmed row") + ")")
        raise TargetConflict(
            "driver.target_version",
            f"{self.driver.target_version} is below {minimum}, {basis}: the change would install a driver "
            "the image still cannot run on; raise driver.target_version (and driver.branch) or use an image "
            "built for an older CUDA")

    def _check_tensor_parallel(self) -> None:
        """A --tensor-parallel-size in serve.flags must be the one the serving strategy uses."""
        given = self.serve.tensor_parallel_size()
        if given is None:
            return
        flag, value = given
        if value is None or not value.isdigit():
            raise TargetConflict("serve.flags", f"{flag} needs a number, got {value!r}")
        explicit = self.gpus.explicit_strategy
        candidates: list[Strategy] = [explicit] if explicit is not None else ["single_node_tp",
                                                                            self.gpus.multi_node_strategy]
        for strategy in candidates:
            want = tensor_parallel_for(strategy, self.gpus.per_node)
            if int(value) != want:
                how = ("gpus.strategy names it" if explicit is not None else
                       "gpus.strategy auto derives it when "
                       + ("one node holds the weights" if strategy == "single_node_tp" else
                          "one node cannot hold the weights"))
                raise TargetConflict(
                    "serve.flags",
                    f"{flag} {value} does not match strategy {strategy} ({how}), which serves with tensor "
                    f"parallel size {want}; drop the flag (the verdict's serve command sets it from the "
                    "strategy) or make it agree")

    # -- derived values the rules use ---------------------------------------------------------

    @property
    def rdma_required(self) -> bool | None:
        """Whether every node needs RDMA rails; None when that follows from a derived (auto) strategy."""
        if self.rdma.required is not None:
            return self.rdma.required
        strat = self.gpus.explicit_strategy
        return None if strat is None else is_multi_node(strat)

    def rdma_required_for(self, strategy: Strategy) -> bool:
        if self.rdma.required is not None:
            return self.rdma.required
        return is_multi_node(strategy)

    def min_driver(self) -> tuple[str, MatrixRow | None]:
        """Minimum driver for the image's CUDA release and the matrix row it came from."""
        row, _ = self.matrix.row_for(self.image.cuda)
        if self.driver.min_version is not None:
            return self.driver.min_version, None
        assert row is not None and row.min_driver is not None  # checked in _consistent
        return row.min_driver, row

    def tensor_parallel_size(self, strategy: Strategy) -> int:
        return tensor_parallel_for(strategy, self.gpus.per_node)

    def serve_argv(self, strategy: Strategy) -> list[str]:
        """The vLLM serve command for ``strategy``: serve.flags with the strategy's tensor-parallel size."""
        return self.serve.argv_for(self.tensor_parallel_size(strategy))

    def unconfirmed_rows_used(self) -> list[MatrixRow]:
        row, _ = self.matrix.row_for(self.image.cuda)
        return [row] if row is not None and not row.confirmed else []
