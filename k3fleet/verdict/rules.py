"""Host rules: one host's facts + the target -> findings. Pure: no I/O, no clock.

Rules read a :class:`HostContext` computed once per host (driver version and its source,
branch, GPU model, flavour, whether Fabric Manager is required), so each fact is
interpreted in exactly one place. Every rule either says nothing (pass), reports a
problem, or reports what it could not read (kind ``unknown``).

Severity of ``unknown``: error when the fact decides whether the host can serve at all
(driver loaded and version, GPU count, kernel module flavour where open modules are
required, Fabric Manager on NVSwitch systems, RDMA on multi-node targets, the image's
CUDA, the facts schema), warning otherwise. A rule stays silent about a fact another
rule already reported as the cause (no GPU count finding when the module is not loaded).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import (
    classify_driver_platform,
    normalize_bus_id,
)
from k3fleet.models.facts import SCHEMA_VERSION, Gpu, HostFacts, SchedulerFacts, XidEvent, readable_schema
from k3fleet.models.findings import SEVERITY_RANK, Finding, FindingKind, Severity, StrategyDecision
from k3fleet.models.target import MatrixRow, Target, cuda_tuple, version_tuple
from k3fleet.verdict.catalogue import CHECKS, fixes_for
from k3fleet.verdict.imex import cluster_uuid, imex_in_use, imex_state
from k3fleet.verdict.strategy import decide_strategy
from k3fleet.verdict.tenants import Tenant, compat_branch_for, judge_tenants

# Probe failures that mean "this driver is too old for this image" (docs/facts.md section 8).
CHAIN_PROBE_FAILURES = frozenset({"requirement_error", "cuda_error_35", "driver_too_old", "error_803", "error_804"})
DRIVER_ROLES = frozenset({"driver", "utils", "compute", "fabricmanager", "dkms", "kernel_modules"})
HOLD_ROLES = frozenset({"driver", "fabricmanager"})

_REQUIRE_CUDA = re.compile(r"cuda>=(\d+\.\d+(?:\.\d+)?)")
_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")
_PRE = ("rc", "a", "b", "c", "dev", "alpha", "beta", "pre", "preview")
_UNKNOWN_FIX = "Make this fact readable on the host (see evidence.reason), then re-run the audit."


@lru_cache(maxsize=1024)
def release_key(text: str | None) -> tuple[tuple[int, ...], int] | None:
    """Order versions like 0.27.1rc1 < 0.27.1 < 0.27.1.post1 / 0.27.1+cu130; None if not a version."""
    if not text:
        return None
    m = _RELEASE.match(text)
    if not m:
        return None
    nums = tuple(int(x) for x in m.group(1).split("."))
    while len(nums) > 1 and nums[-1] == 0:
        nums = nums[:-1]
    tail = m.group(2).lstrip(".-_").lower()
    pre = tail.startswith(_PRE) and not tail.startswith("post")
    return nums, 0 if pre else 1


@dataclass(slots=True)
class HostContext:
    host: str
    version: str | None
    version_t: tuple[int, ...] | None
    version_source: str | None
    branch: int | None
    below_target: bool
    gpu_names: list[str]
    gpu_model: str | None
    gpu_count: int | None
    # Smallest per-GPU memory on the host (MiB): what one tensor-parallel shard can hold.
    gpu_memory_mib: int | None
    flavour: str | None
    fm_required: bool | None
    driver_failed: bool = False
    unconfirmed: set[str] = field(default_factory=set)
    rails: tuple[list[tuple[str, Any]], list[str]] | None = None
    # Why this is no data-center driver platform (a Jetson), or None: then there is no branch.
    platform_note: str | None = None
    # GPUs other processes hold (memory or compute processes); usage_known: any GPU reported either.
    gpus_in_use: list[Gpu] = field(default_factory=list)
    usage_known: bool = False


class CompiledTarget:
    """A target with everything the rules need precomputed once per verdict.

    The serving strategy (and with it whether RDMA is required) may depend on the whole
    fleet's hardware (``gpus.strategy: auto``): compute the hosts' contexts, then
    :meth:`use_strategy` with :func:`decide_strategy` over them, then run the rules.
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.fix = fixes_for(target)
        self.min_driver, self.min_row = target.min_driver()
        self.min_driver_t = version_tuple(self.min_driver) or (0,)
        self.branch = target.driver.branch
        self.image_cuda = target.image.cuda
        self.forbidden_debug = {x.upper() for x in target.nccl.forbidden_debug}
        self.decision: StrategyDecision | None = None
        self.link_layer = target.rdma.link_layer.lower() if target.rdma.link_layer else None
        self.rdma_required = False
        self.vllm_min = release_key(target.vllm.min_version)
        self.toolkit_min = version_tuple(target.container.toolkit_min_version) or (0,)
        self.runtimes = set(target.container.runtimes)
        self.idle_states = {s.lower() for s in target.scheduler.idle_states}
        self.oos_states = {s.lower() for s in target.scheduler.out_of_service_states}
        self.down_states = {s.lower() for s in target.scheduler.down_states}
        self.gpu_util = target.serve.gpu_memory_utilization
        # Other tenants' CUDA against the target driver (docs/facts.md section 16).
        top = target.matrix.max_cuda_for_driver(target.driver.target_version)
        self.target_max_cuda: tuple[int, int] | None = (top.key[0], top.key[1]) if top is not None else None
        self.compat_branch = compat_branch_for(target.matrix)
        self._rows: dict[str, tuple[MatrixRow | None, bool]] = {}
        self._max_cuda: dict[str, MatrixRow | None] = {}
        self._open_req: dict[tuple[str | None, str | None], bool] = {}

    def use_strategy(self, decision: StrategyDecision) -> None:
        self.decision = decision
        self.rdma_required = decision.rdma_required

    def decide(self, contexts: list[HostContext]) -> StrategyDecision:
        """Decide the strategy from the hosts' contexts and use it."""
        decision = decide_strategy(((c.gpu_model, c.gpu_memory_mib) for c in contexts), self.target)
        self.use_strategy(decision)
        return decision

    # Hosts share few distinct versions and GPU models: memoise the matrix look-ups.
    def row_for(self, cuda: str) -> tuple[MatrixRow | None, bool]:
        hit = self._rows.get(cuda)
        if hit is None:
            hit = self._rows[cuda] = self.target.matrix.row_for(cuda)
        return hit

    def max_cuda(self, driver: str) -> MatrixRow | None:
        if driver not in self._max_cuda:
            self._max_cuda[driver] = self.target.matrix.max_cuda_for_driver(driver)
        return self._max_cuda[driver]

    def open_required(self, name: str | None, cc: str | None) -> bool:
        key = (name, cc)
        hit = self._open_req.get(key)
        if hit is None:
            hit = self._open_req[key] = self.target.open_modules.required_for(name, cc)
        return hit


class _Emitter:
    __slots__ = ("ct", "host", "out")

    def __init__(self, ct: CompiledTarget, host: str) -> None:
        self.ct = ct
        self.host = host
        self.out: list[Finding] = []

    def fail(
        self, check_id: str, message: str, evidence: dict[str, Any], *,
        severity: Severity | None = None, chain: bool = False,
    ) -> None:
        self._add(check_id, message, evidence, severity or CHECKS[check_id].severity, "fail", chain)

    def unknown(self, check_id: str, what: str, reason: str | None, *, error: bool = False) -> None:
        reason = reason or "no data"
        self._add(
            check_id, f"{what} could not be read: {reason}", {"reason": reason},
            "error" if error else "warning", "unknown", False,
        )

    def _add(
        self, check_id: str, message: str, evidence: dict[str, Any], severity: Severity,
        kind: FindingKind, chain: bool,
    ) -> None:
        self.out.append(Finding(
            check_id=check_id, severity=severity, kind=kind, host=self.host, message=message,
            evidence=evidence, fix=_UNKNOWN_FIX if kind == "unknown" else self.ct.fix[check_id], chain=chain,
        ))


def host_context(facts: HostFacts, ct: CompiledTarget, host: str | None = None) -> HostContext:
    drv = facts.driver
    km = drv.kernel_module
    pk = facts.packages
    version, source = None, None
    for cand, src in ((km.version, "kernel_module"), (drv.driver_version, drv.source or "nvml"),
                      (pk.driver_version, "package")):
        if cand and version_tuple(cand):
            version, source = cand, src
            break
    vt = version_tuple(version)
    platform_note = platform_problem(facts, version, vt)
    # A Jetson's L4T release or Tegra driver is no branch: never read "35.3.1" as an R35.
    branch = vt[0] if vt and platform_note is None else None
    below = branch is not None and vt is not None and (vt[0] < ct.branch or vt < ct.min_driver_t)
    names = [g.name for g in drv.gpus if g.name]
    if not names:
        model = None
    elif names.count(names[0]) == len(names):
        model = names[0]
    else:
        model = Counter(names).most_common(1)[0][0]
    count = drv.gpu_count if drv.gpu_count is not None else (len(drv.gpus) if drv.gpus else None)
    mems = [g.memory_total_mib for g in drv.gpus if g.memory_total_mib]
    flavour = km.flavour
    if flavour is None:
        for p in pk.packages:
            if p.role == "driver" and p.flavour:
                flavour = p.flavour
                break
    fm = facts.fabricmanager
    fm_required = fm.required if fm.required is not None else fm.nvswitch_present
    in_use, usage_known = gpus_in_use(drv.gpus, ct.gpu_util)
    return HostContext(
        host=host or facts.host, version=version, version_t=vt, version_source=source, branch=branch,
        below_target=below, gpu_names=names, gpu_model=model, gpu_count=count,
        gpu_memory_mib=min(mems) if mems else None, flavour=flavour,
        fm_required=fm_required, driver_failed=platform_note is not None, platform_note=platform_note,
        gpus_in_use=in_use, usage_known=usage_known,
    )


def platform_problem(facts: HostFacts, version: str | None, vt: tuple[int, ...] | None) -> str | None:
    """Why the host is no data-center driver platform (docs/facts.md section 10), or None."""
    plat = facts.driver.platform
    if plat.kind == "tegra":
        release = f"L4T {plat.l4t_release}" if plat.l4t_release else "L4T"
        shown = f"the kernel module reports {version}" if version else "no driver version"
        # The evidence (an L4T release line such as "# R35 (release)") stays in the finding's evidence: in
        # the message it would read like a branch name.
        return (f"NVIDIA Jetson (Tegra, {release}) board: {shown}, which is no data-center driver branch "
                "(unsupported platform, unknown branch)")
    if vt is not None and vt[0] < 100:
        return (f"driver version {version} is no data-center driver branch (unsupported platform, unknown "
                "branch): data-center branches are three-digit (R535 ... R620)")
    km = facts.driver.kernel_module
    # Facts of a collector that did not classify the version (schema 1.0, a capture): the same rule,
    # on what the driver itself reports (a package version carries the distribution's suffix).
    loaded = km.version or facts.driver.driver_version
    kind = plat.kind if plat.kind in ("unknown", "discrete") else (
        classify_driver_platform(loaded, km.arch, km.raw)["kind"] if loaded and vt is not None else None)
    if kind == "tegra":
        return (f"NVIDIA Jetson (Tegra driver {version}, L4T build) board: {version} is a Tegra driver, no "
                "data-center driver branch (unsupported platform, unknown branch)")
    if kind == "unknown":
        return (f"driver version {version} is on no data-center branch (unknown platform): data-center "
                "versions read NNN.NN[.NN], e.g. 580.95.05")
    return None


def gpus_in_use(gpus: list[Gpu], util: float) -> tuple[list[Gpu], bool]:
    """(GPUs another process holds, whether any GPU reported its use).

    In use: a compute process runs on it, or its free memory is below ``util`` of the total, the
    share vLLM claims at start-up (docs/facts.md section 11).
    """
    busy: list[Gpu] = []
    known = False
    for g in gpus:
        used = g.memory_used_mib
        procs = g.processes
        if used is None and procs is None:
            continue
        known = True
        compute = bool(procs) and any(p.type is None or "C" in p.type for p in procs or ())
        total = g.memory_total_mib
        short = used is not None and total is not None and total > 0 and total - used < util * total
        if compute or short:
            busy.append(g)
    return busy, known


# -- driver ------------------------------------------------------------------------------------


def _schema(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if f.schema_version == SCHEMA_VERSION:
        return
    if not readable_schema(f.schema_version):
        e.unknown("facts.schema", f"facts of schema {f.schema_version} (controller reads {SCHEMA_VERSION})",
                  "the collector on this host is from another major version", error=True)


def _driver_loaded(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    drv = f.driver
    km = drv.kernel_module
    if drv.status == "absent" or km.loaded is False:
        c.driver_failed = True
        pkg = f.packages.driver_version
        installed = f"driver package {pkg} is installed" if pkg else "no driver package is recorded"
        e.fail("driver.loaded", f"the NVIDIA kernel module is not loaded ({installed})",
               {"reason": drv.reason, "package_version": pkg})
    elif km.loaded is None and not (drv.driver_version or km.version):
        c.driver_failed = True
        e.unknown("driver.loaded", "whether the NVIDIA kernel module is loaded", drv.reason, error=True)


_NVML_FAIL: dict[str, tuple[Severity, str]] = {
    "library_not_found": ("error", "libnvidia-ml.so.1 not found: the driver's user-space libraries are missing"),
    "driver_not_loaded": ("critical", "NVML reports the driver is not loaded"),
    "gpu_is_lost": ("critical", "NVML reports a GPU is lost (fallen off the bus)"),
}


def _nvml(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    nv = f.driver.nvml
    st = nv.status
    if st == "ok" or st == "lib_rm_version_mismatch":
        # The mismatch is reported once, as driver.pending_reboot.
        return
    if st in ("skipped", "not_installed"):
        if c.gpu_count is None and not c.driver_failed:
            e.unknown("nvml.status", f"GPU inventory (NVML {st}, no nvidia-smi data)", nv.error or f.driver.reason)
        return
    if st == "no_permission":
        e.unknown("nvml.status", "NVML (no permission)", nv.error)
        return
    if st in ("driver_not_loaded", "library_not_found") and c.driver_failed:
        # A node with no driver loaded has no NVML either: driver.loaded says it once.
        return
    sev, text = _NVML_FAIL.get(st, ("error", f"NVML failed ({st})"))
    if st == "library_not_found" and f.driver.source == "nvidia-smi" and c.gpu_count:
        # nvidia-smi reached NVML from its own link path; k3fleet's loader did not find the library.
        sev, text = "warning", "libnvidia-ml.so.1 not found by k3fleet's NVML reader; GPU facts came from nvidia-smi"
    elif st not in _NVML_FAIL and f.driver.source == "nvidia-smi" and c.gpu_count:
        # NVML's own bindings failed, but nvidia-smi (an NVML client) answered: a degraded reader.
        sev, text = "warning", f"NVML failed ({st}); GPU facts came from nvidia-smi"
    e.fail("nvml.status", text + (f": {nv.error}" if nv.error else ""), {"status": st, "error": nv.error},
           severity=sev)


def _branch_label(ct: CompiledTarget, branch: int) -> str:
    info = ct.target.matrix.branch_info(branch)
    if info is None:
        return f"R{branch}"
    return f"R{branch} ({info.kind}{', EOL ' + info.eol if info.eol and info.kind != 'EOL' else ''})"


def _driver_version(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    ct = e.ct
    if c.platform_note is not None:
        plat = f.driver.platform
        e.fail("driver.platform", c.platform_note,
               {"driver_version": c.version, "platform": plat.kind, "l4t_release": plat.l4t_release,
                "evidence": plat.evidence, "arch": f.driver.kernel_module.arch, "image": ct.target.image.ref})
        return
    if c.version_t is None:
        if not c.driver_failed:
            e.unknown("driver.branch", "the loaded driver version", f.driver.reason, error=True)
        return
    assert c.branch is not None
    ev = {"driver_version": c.version, "source": c.version_source, "branch": c.branch,
          "required_branch": ct.branch, "image": ct.target.image.ref, "image_cuda": ct.image_cuda}
    if c.branch < ct.branch:
        e.fail("driver.branch",
               f"driver {c.version} is on {_branch_label(ct, c.branch)}, below R{ct.branch} which CUDA "
               f"{ct.image_cuda} ({ct.target.image.ref}) needs", ev, chain=True)
        return
    if c.version_t < ct.min_driver_t:
        row = ct.min_row
        basis = f"the matrix minimum for CUDA {row.label}" if row else "the target's driver.min_version"
        if row is not None and not row.confirmed:
            basis += " [unconfirmed matrix row]"
            c.unconfirmed.add(row.label)
        e.fail("driver.version_min", f"driver {c.version} is below {ct.min_driver}, {basis}",
               {**ev, "min_driver": ct.min_driver, "matrix_row": row.label if row else None,
                "matrix_confirmed": row.confirmed if row else None}, chain=True)


def _flavour(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    needing = [g for g in f.driver.gpus if e.ct.open_required(g.name, g.compute_capability)]
    if not needing:
        return
    ev = {"gpu": needing[0].name, "compute_capability": needing[0].compute_capability, "flavour": c.flavour}
    if c.flavour is None:
        e.unknown("driver.flavour", f"the kernel module flavour (open required for {needing[0].name})",
                  f.driver.kernel_module.raw or f.driver.reason, error=True)
    elif c.flavour != "open":
        e.fail("driver.flavour",
               f"{needing[0].name} (compute capability {needing[0].compute_capability or '?'}) requires open "
               f"kernel modules; the {c.flavour} module is installed", ev)


def _pending_reboot(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if c.platform_note is not None:
        return  # an L4T release compared with data-center package versions means nothing
    nv = f.driver.nvml
    pkg_v = f.packages.driver_version
    loaded = f.driver.kernel_module.version or f.driver.driver_version
    if nv.status == "lib_rm_version_mismatch":
        e.fail("driver.pending_reboot",
               "NVML reports Driver/library version mismatch: the driver packages changed without a reboot",
               {"nvml_error": nv.error, "package_version": pkg_v, "loaded_version": loaded})
        return
    if not pkg_v or not loaded:
        if f.packages.status == "unknown" and not c.driver_failed:
            e.unknown("driver.pending_reboot", "the installed driver package version", f.packages.reason)
        return
    pt, lt = version_tuple(pkg_v), version_tuple(loaded)
    if pt and lt and pt != lt:
        e.fail("driver.pending_reboot",
               f"installed driver package {pkg_v} differs from the loaded module {loaded}: reboot pending",
               {"package_version": pkg_v, "loaded_version": loaded})


# -- GPUs ------------------------------------------------------------------------------------------


def _gpu_count(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    want = e.ct.target.gpus.per_node
    if c.gpu_count is None:
        if not c.driver_failed:
            e.unknown("gpu.count", "the GPU count", f.driver.nvml.error or f.driver.reason, error=True)
        return
    ev = {"gpu_count": c.gpu_count, "expected_per_node": want, "gpu_model": c.gpu_model}
    if c.gpu_count == 0:
        e.fail("gpu.count", f"no GPU visible, {want} expected per node", ev, severity="critical")
    elif c.gpu_count < want:
        e.fail("gpu.count", f"{c.gpu_count} GPUs visible, {want} expected per node", ev)


def _persistence(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    gpus = f.driver.gpus
    if not gpus or not e.ct.target.driver.require_persistence_mode:
        return
    off = [g.index for g in gpus if g.persistence_mode is False]
    if off:
        e.fail("gpu.persistence_mode", f"persistence mode is off on GPU {_idx(off)}", {"gpus_off": off})
    elif all(g.persistence_mode is None for g in gpus):
        e.unknown("gpu.persistence_mode", "persistence mode", f.driver.nvml.error)


def _idx(items: list[int]) -> str:
    return ",".join(str(i) for i in items)


def _fabric_state(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not c.fm_required or not f.driver.gpus:
        return
    states = [(g.index, g.fabric_state) for g in f.driver.gpus]
    bad = [(i, s) for i, s in states if s is not None and s not in ("completed", "not_supported")]
    if bad:
        e.fail("gpu.fabric_state",
               f"NVLink fabric not completed on GPU {_idx([i for i, _ in bad])} "
               f"({', '.join(sorted({s for _, s in bad}))})",
               {"states": {str(i): s for i, s in bad}})
    elif all(s is None for _, s in states):
        # Fabric Manager's own state (present, active, version) is checked separately; this per-GPU
        # signal is extra, and nvidia-smi's query does not carry it at all.
        why = ("GPU facts came from nvidia-smi, whose query does not report it" if f.driver.source == "nvidia-smi"
               else f.driver.nvml.error)
        e.unknown("gpu.fabric_state", "GPU fabric state", why)


_SUMMARY_TEXT = {"unhealthy": "Unhealthy", "limited_capacity": "Limited Capacity"}


def fabric_health_faults(g: Gpu) -> list[str]:
    """The fields of one GPU's fabric health that fail it, as nvidia-smi names them (docs/facts.md section 9)."""
    h = g.fabric_health
    if h is None:
        return []
    out: list[str] = []
    if h.summary in _SUMMARY_TEXT:
        out.append(f"Summary {_SUMMARY_TEXT[h.summary]}")
    if h.bandwidth == "degraded":
        out.append("Bandwidth Degraded")
    if h.route_recovery_in_progress:
        out.append("Route Recovery in progress True")
    if h.route_unhealthy:
        out.append("Route Unhealthy True")
    if h.access_timeout_recovery:
        out.append("Access Timeout Recovery True")
    if h.incorrect_configuration not in (None, "none"):
        out.append(f"Incorrect Configuration {h.incorrect_configuration}")
    return out


def _fabric_health(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    bad: dict[str, list[int]] = {}
    detail: dict[str, Any] = {}
    for g in f.driver.gpus:
        faults = fabric_health_faults(g)
        if not faults:
            continue
        bad.setdefault(", ".join(faults), []).append(g.index)
        h = g.fabric_health
        assert h is not None
        detail[str(g.index)] = {k: v for k, v in h.model_dump().items() if v not in (None, {})}
    if not bad:
        return
    parts = [f"GPU {_idx(indices)}: {faults}" for faults, indices in bad.items()]
    fields = sorted({fault.rsplit(" ", 1)[0] for faults in bad for fault in faults.split(", ")})
    e.fail("gpu.fabric_health", f"NVLink fabric health fails on {'; '.join(parts)}",
           {"gpus": detail, "fields": fields})


def _gpu_in_use(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not c.gpus_in_use:
        if f.driver.gpus and not c.usage_known and not c.driver_failed:
            e.unknown("gpu.in_use", "GPU memory in use and compute processes", f.driver.reason)
        return
    util = e.ct.gpu_util
    pids: dict[int | None, str] = {}
    short: list[int] = []
    listed: list[dict[str, Any]] = []
    for g in c.gpus_in_use:
        total, used = g.memory_total_mib, g.memory_used_mib
        if used is not None and total and total - used < util * total:
            short.append(g.index)
        for p in g.processes or ():
            pids.setdefault(p.pid, p.name or "?")
        if len(listed) < 16:
            listed.append({"index": g.index, "memory_used_mib": used, "memory_total_mib": total,
                           "processes": [p.model_dump() for p in (g.processes or ())[:8]]})
    used_text = ""
    first = c.gpus_in_use[0]
    if first.memory_used_mib is not None and first.memory_total_mib:
        used_text = f" ({first.memory_used_mib} of {first.memory_total_mib} MiB in use on GPU {first.index})"
    procs = ", ".join(f"pid {pid} {name}" for pid, name in list(pids.items())[:4])
    held = f"; {len(pids)} compute process(es): {procs}" if pids else ""
    effects = []
    if short:
        effects.append(f"vLLM's start-up memory check (gpu_memory_utilization {util:g}) would fail on GPU "
                       f"{_idx(short)}")
    effects.append("a drain or driver change would end this workload")
    e.fail("gpu.in_use",
           f"GPU {_idx([g.index for g in c.gpus_in_use])} in use{used_text}{held}: {'; '.join(effects)}",
           {"gpus": listed, "gpus_in_use": len(c.gpus_in_use), "processes": len(pids),
            "gpu_memory_utilization": util, "vllm_start_fails_on": short})


# -- GPU health (docs/facts.md section 14) ------------------------------------------------------------

# Xid codes this verdict names, with the NVIDIA Xid catalogue's meaning and how bad each is for a
# serving node (docs/facts.md section 14). A code not listed is reported as a warning, by number.
XID_CODES: dict[int, tuple[str, Severity]] = {
    13: ("Graphics Engine Exception, often the application's own fault", "warning"),
    31: ("GPU memory page fault, often the application's own fault", "warning"),
    43: ("GPU stopped processing, a user application fault", "warning"),
    45: ("preemptive cleanup after a previous error", "warning"),
    48: ("Double Bit ECC Error (DBE): an uncorrectable memory error", "critical"),
    61: ("internal micro-controller breakpoint or warning", "error"),
    62: ("internal micro-controller halt", "error"),
    63: ("ECC page retirement or row remapping recorded: a GPU reset activates it", "error"),
    64: ("ECC page retirement or row remapper recording failure", "critical"),
    74: ("NVLink error", "error"),
    79: ("GPU has fallen off the bus", "critical"),
    92: ("high single-bit ECC error rate", "warning"),
    94: ("contained ECC error: the affected application stopped, the GPU needs a reset", "error"),
    95: ("uncontained ECC error: every application on the GPU is affected", "critical"),
    119: ("GSP RPC timeout", "error"),
    120: ("GSP error", "error"),
}
# Clock event reasons that mean the hardware itself slows the GPU (power, heat); the others are
# the GPU at idle, a setting someone chose, or the normal power cap under load.
HW_SLOWDOWN = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
SLOWDOWN_WARN = frozenset({"sw_thermal_slowdown"})


def _health_unknown(f: HostFacts, c: HostContext, e: _Emitter, check: str, what: str, attr: str) -> bool:
    """Report ``check`` unknown when no GPU reported ``attr``; True when there is nothing to judge."""
    gpus = f.driver.gpus
    if not gpus or c.driver_failed:
        return True
    values = [getattr(g, attr) for g in gpus]
    if all(v is None for v in values):
        e.unknown(check, what, f.driver.reason or "not reported by this collector (facts before schema 1.1)")
        return True
    return False


def _ecc(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if _health_unknown(f, c, e, "gpu.ecc", "uncorrectable ECC error counts", "ecc"):
        return
    volatile: list[int] = []
    aggregate: list[int] = []
    detail: dict[str, Any] = {}
    reasons: dict[str, list[int]] = {}
    for g in f.driver.gpus:
        ecc = g.ecc
        if ecc is None:
            continue
        v, a = ecc.volatile_uncorrected, ecc.aggregate_uncorrected
        if v:
            volatile.append(g.index)
        elif a:
            aggregate.append(g.index)
        if v or a:
            detail[str(g.index)] = {"volatile_uncorrected": v, "aggregate_uncorrected": a}
        elif v is None and a is None:
            reasons.setdefault(ecc.reason or "counters not reported", []).append(g.index)
    if volatile:
        first = f.driver.gpus[[g.index for g in f.driver.gpus].index(volatile[0])].ecc
        assert first is not None
        e.fail("gpu.ecc", f"uncorrectable ECC errors on GPU {_idx(volatile)} since the last driver load "
               f"({first.volatile_uncorrected} volatile on GPU {volatile[0]})", {"gpus": detail})
    elif aggregate:
        e.fail("gpu.ecc", f"uncorrectable ECC errors recorded over the life of GPU {_idx(aggregate)} (aggregate "
               "counter; none since the last driver load): check remapped rows and the Xid log",
               {"gpus": detail}, severity="warning")
    elif reasons and len(reasons[next(iter(reasons))]) == len(f.driver.gpus):
        e.unknown("gpu.ecc", "uncorrectable ECC error counts", next(iter(reasons)))


def _remapped_rows(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if _health_unknown(f, c, e, "gpu.remapped_rows", "row remapping and page retirement", "remapped_rows"):
        return
    failed: list[int] = []
    pending: list[int] = []
    detail: dict[str, Any] = {}
    known = False
    for g in f.driver.gpus:
        r = g.remapped_rows
        if r is None:
            continue
        known = known or r.pending is not None or r.failure is not None or r.retired_pages_pending is not None
        if r.failure:
            failed.append(g.index)
        elif r.pending or r.retired_pages_pending:
            pending.append(g.index)
        if r.failure or r.pending or r.retired_pages_pending:
            detail[str(g.index)] = {k: v for k, v in r.model_dump().items() if v is not None}
    if failed:
        e.fail("gpu.remapped_rows", f"row remapping failed on GPU {_idx(failed)}: the GPU has no spare rows left "
               "for its uncorrectable errors", {"gpus": detail}, severity="critical")
    if pending:
        e.fail("gpu.remapped_rows", f"a row remap or page retirement is pending on GPU {_idx(pending)}: it takes "
               "effect only after a GPU reset or reboot", {"gpus": detail})
    if not known:
        why = next((g.remapped_rows.reason for g in f.driver.gpus if g.remapped_rows and g.remapped_rows.reason),
                   None)
        e.unknown("gpu.remapped_rows", "row remapping and page retirement", why)


def _xid_gpu(event: XidEvent, gpus: list[Gpu]) -> int | None:
    """The GPU index an Xid line names: "PCI:0000:3b:00" is domain:bus:device of the GPU's bus id."""
    bus = normalize_bus_id((event.pci or "").removeprefix("PCI:") + ".0")
    for g in gpus:
        if bus is not None and normalize_bus_id(g.pci_bus_id) == bus:
            return g.index
    return None


def xid_meaning(code: int) -> tuple[str, Severity]:
    return XID_CODES.get(code, ("not in this verdict's Xid table: look it up in the NVIDIA Xid catalogue",
                                "warning"))


def _xid(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    log = f.driver.kernel_log
    if log is None or log.status != "ok":
        if not c.driver_failed and f.driver.kernel_module.loaded is not False:
            reason = log.reason if log is not None else "not read by this collector (facts before schema 1.1)"
            e.unknown("gpu.xid", "the kernel log's Xid events", reason)
        return
    if not log.xid:
        return
    by_code: dict[int, list[XidEvent]] = {}
    for ev in log.xid:
        by_code.setdefault(ev.code, []).append(ev)
    worst: Severity = "info"
    parts = []
    for code, events in sorted(by_code.items(), key=lambda kv: -SEVERITY_RANK[xid_meaning(kv[0])[1]]):
        meaning, sev = xid_meaning(code)
        if SEVERITY_RANK[sev] > SEVERITY_RANK[worst]:
            worst = sev
        where = sorted({ev.pci or "?" for ev in events})
        idx = sorted({i for i in (_xid_gpu(ev, f.driver.gpus) for ev in events) if i is not None})
        gpu = f" (GPU {_idx(idx)})" if idx else ""
        parts.append(f"Xid {code} ({meaning}) on {', '.join(where[:4])}{gpu}" +
                     (f" x{len(events)}" if len(events) > 1 else ""))
    e.fail("gpu.xid", "kernel log since boot: " + "; ".join(parts[:6]),
           {"source": log.source, "codes": sorted(by_code),
            "events": [ev.model_dump() for ev in log.xid[-16:]]}, severity=worst)


def _throttle(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if _health_unknown(f, c, e, "gpu.throttle", "clock event (throttle) reasons", "throttle"):
        return
    hw: dict[str, list[int]] = {}
    sw: dict[str, list[int]] = {}
    for g in f.driver.gpus:
        for reason in (g.throttle.active if g.throttle else ()):
            if reason in HW_SLOWDOWN:
                hw.setdefault(reason, []).append(g.index)
            elif reason in SLOWDOWN_WARN:
                sw.setdefault(reason, []).append(g.index)
    if not hw and not sw:
        if all(g.throttle is None or (not g.throttle.active and g.throttle.reason) for g in f.driver.gpus):
            why = next((g.throttle.reason for g in f.driver.gpus if g.throttle and g.throttle.reason), None)
            e.unknown("gpu.throttle", "clock event (throttle) reasons", why)
        return
    shown = "; ".join(f"{r} on GPU {_idx(i)}" for r, i in [*hw.items(), *sw.items()])
    e.fail("gpu.throttle", f"clocks slowed: {shown}", {"hardware": hw, "software": sw},
           severity="error" if hw else "warning")


def _pcie_link(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if _health_unknown(f, c, e, "gpu.pcie_link", "the PCIe link generation and width", "pcie"):
        return
    narrow: list[str] = []
    slow: list[str] = []
    idle = False
    known = False
    for g in f.driver.gpus:
        p = g.pcie
        if p is None:
            continue
        if p.width_current is not None and p.width_max is not None:
            known = True
            if p.width_current < p.width_max:
                narrow.append(f"GPU {g.index} x{p.width_current} of x{p.width_max}")
        if p.gen_current is not None and p.gen_max is not None:
            known = True
            if p.gen_current < p.gen_max:
                slow.append(f"GPU {g.index} Gen{p.gen_current} of Gen{p.gen_max}")
                idle = idle or bool(g.throttle and "gpu_idle" in g.throttle.active) or bool(
                    g.throttle and "idle" in g.throttle.active)
    ev = {"narrow": narrow, "slow": slow, "idle": idle}
    if narrow:
        e.fail("gpu.pcie_link", f"PCIe link narrower than its maximum: {'; '.join(narrow[:8])}", ev)
    if slow:
        note = " while the GPU is idle (power saving lowers the generation at idle: check under load)" if idle \
            else " (the generation drops at idle to save power: check under load)"
        e.fail("gpu.pcie_link", f"PCIe link below its maximum generation: {'; '.join(slow[:8])}{note}", ev,
               severity="warning")
    if not known:
        why = next((g.pcie.reason for g in f.driver.gpus if g.pcie and g.pcie.reason), None)
        e.unknown("gpu.pcie_link", "the PCIe link generation and width", why)


# -- packages ----------------------------------------------------------------------------------


def _held(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not e.ct.target.packages.require_driver_hold:
        return
    pk = f.packages
    if pk.status != "ok":
        e.unknown("packages.held", "driver package holds", pk.reason)
        return
    mine = [p for p in pk.packages if p.role in HOLD_ROLES]
    if not mine:
        e.unknown("packages.held", "driver package holds",
                  "no driver package is installed through the package manager (runfile install?)")
        return
    loose = sorted(p.name for p in mine if not p.held)
    if loose:
        e.fail("packages.held", f"driver packages not held: {', '.join(loose)}",
               {"not_held": loose, "manager": pk.manager})


def _unattended(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if e.ct.target.packages.unattended_upgrades_allowed:
        return
    pk = f.packages
    if pk.status != "ok":
        e.unknown("packages.unattended_upgrades", "the unattended-upgrades state", pk.reason)
        return
    if pk.unattended_upgrades_enabled:
        loose = [p.name for p in pk.packages if p.role in HOLD_ROLES and not p.held]
        ev = {"installed": pk.unattended_upgrades_installed, "enabled": True, "unheld_driver_packages": loose}
        if loose:
            e.fail("packages.unattended_upgrades",
                   "unattended upgrades are enabled and the driver packages are not held: the driver can "
                   "change outside a change window", ev, severity="error")
        else:
            e.fail("packages.unattended_upgrades", "unattended upgrades are enabled (driver packages are held)",
                   ev)
    elif pk.unattended_upgrades_installed and pk.unattended_upgrades_enabled is None:
        e.unknown("packages.unattended_upgrades", "whether unattended upgrades are enabled", pk.reason)


def _dkms(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    pk = f.packages
    if not pk.dkms_used:
        return
    if pk.dkms_built_for_running_kernel is False:
        mods = [f"{m.name}/{m.version} {m.kernel or '?'}: {m.status}" for m in pk.dkms_modules][:8]
        e.fail("packages.dkms_kernel",
               f"the DKMS NVIDIA module is not built for the running kernel {pk.running_kernel or '?'}",
               {"running_kernel": pk.running_kernel, "dkms": mods})
    elif pk.dkms_built_for_running_kernel is None:
        e.unknown("packages.dkms_kernel", "the DKMS build state for the running kernel", pk.reason)


# -- Fabric Manager ------------------------------------------------------------------------------


def _fabricmanager(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    spec = e.ct.target.fabric_manager
    if not spec.required_when_nvswitch:
        return
    fm = f.fabricmanager
    if c.fm_required is None:
        if not c.driver_failed:
            e.unknown("fabricmanager.present", "whether NVSwitches are present (Fabric Manager needed)",
                      fm.reason, error=True)
        return
    if not c.fm_required:
        return
    unit = fm.unit
    # The collector says "absent" only when no package, unit or binary exists.
    installed = False if fm.status == "absent" else unit.installed
    ev: dict[str, Any] = {"nvswitch_count": fm.nvswitch_count, "installed": installed,
                          "active": unit.active, "enabled": unit.enabled, "version": fm.version}
    if installed is False:
        e.fail("fabricmanager.present",
               f"Fabric Manager is not installed on an NVSwitch system ({fm.nvswitch_count or '?'} switches)", ev)
        return
    if installed is None:
        e.unknown("fabricmanager.present", "whether Fabric Manager is installed", fm.reason, error=True)
    if spec.must_be_active:
        if unit.active is None or unit.active == "unknown":
            e.unknown("fabricmanager.active", "the nvidia-fabricmanager unit state", fm.reason, error=True)
        elif unit.active != "active":
            e.fail("fabricmanager.active", f"nvidia-fabricmanager.service is {unit.active}", ev)
    if spec.version_must_match_driver:
        _fm_version(f, c, e)


def _fm_version(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if c.platform_note is not None:
        return  # driver.platform says why: no data-center driver for a Fabric Manager to match
    fm = f.fabricmanager
    driver = c.version
    if fm.version and driver:
        vf, vd = version_tuple(fm.version), version_tuple(driver)
        matches = vf == vd if vf and vd else fm.version_matches_driver
    else:
        matches = fm.version_matches_driver
    if matches is None:
        e.unknown("fabricmanager.version_match", "the Fabric Manager version", fm.reason, error=True)
    elif not matches:
        e.fail("fabricmanager.version_match",
               f"Fabric Manager {fm.version or '?'} does not equal driver {driver or fm.driver_version or '?'}",
               {"fabricmanager_version": fm.version, "driver_version": driver}, chain=c.below_target)


# -- IMEX (multi-node NVLink domains) -------------------------------------------------------------


def _imex(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    """A node of a multi-node NVLink domain (a non-zero ClusterUUID, or IMEX set to run) needs IMEX ready:
    the unit active, channel0 present, every node of its node list READY (docs/facts.md section 15)."""
    if c.driver_failed:
        return
    domain = cluster_uuid(f)
    if domain is None and not imex_in_use(f):
        return
    state = imex_state(f)
    im = f.imex
    where = f"multi-node NVLink domain {domain}" if domain else "an IMEX domain"
    if state.problems:
        ev: dict[str, Any] = {"cluster_uuid": domain, "problems": state.problems}
        if im is not None:
            ev.update(unit_active=im.unit.active, channels=im.channels, domain_state=im.domain_state,
                      nodes_not_ready={str(n.index): f"{n.address} {n.status}" for n in im.nodes
                                       if n.status != "READY"},
                      node_list=im.nodes_file)
        e.fail("fabric.imex", f"IMEX is not ready on this node of {where}: {'; '.join(state.problems)}", ev)
    elif state.ready is None:
        e.unknown("fabric.imex", f"the IMEX state of this node of {where}", state.unknown, error=True)


# -- RDMA and NCCL ----------------------------------------------------------------------------------


Rails = tuple[list[tuple[str, Any]], list[str]]


def rails(f: HostFacts, ct: CompiledTarget) -> Rails:
    """(rail ports as (device, port), ports skipped for their link layer as "device/port (layer)").

    :func:`rail_name` spells a rail "device/port"; names are built only for what a finding shows.
    """
    spec = ct.target.rdma
    ignore = bool(spec.ignore_devices)
    want = ct.link_layer
    out: list[tuple[str, Any]] = []
    other: list[str] = []
    for d in f.rdma.devices:
        if ignore and spec.ignored(d.name):
            continue
        for p in d.ports:
            if want and p.link_layer and p.link_layer.lower() != want:
                other.append(f"{d.name}/{p.port} ({p.link_layer})")
            else:
                out.append((d.name, p))
    return out, other


def rail_name(device: str, port: Any) -> str:
    return f"{device}/{port.port}"


def host_rails(f: HostFacts, c: HostContext, ct: CompiledTarget) -> Rails:
    """:func:`rails`, computed once per host (the rules and the fleet's drift check both read them)."""
    if c.rails is None:
        c.rails = rails(f, ct)
    return c.rails


def _port_ok(p: Any) -> bool:
    # The numeric codes first: sysfs gives "4: ACTIVE" / "5: LinkUp", and this runs per rail per host.
    return ((p.state_code == 4 or (p.state or "").upper() == "ACTIVE")
            and (p.phys_state_code == 5 or (p.phys_state or "").lower() == "linkup"))


def _rail_problems(found: list[tuple[str, Any]], min_rate: float) -> tuple[list[str], list[str]]:
    down: list[str] = []
    slow: list[str] = []
    for n, p in found:
        if not _port_ok(p):
            down.append(f"{rail_name(n, p)}: {p.state or '?'}/{p.phys_state or '?'}")
        elif p.rate_gbps is not None and p.rate_gbps < min_rate:
            slow.append(f"{rail_name(n, p)}: {p.rate or p.rate_gbps}")
    return down, slow


def _all_ports_good(f: HostFacts, min_rate: float) -> bool:
    # The common case, cheaply: every port (rail or not) up at full rate leaves nothing to report.
    for d in f.rdma.devices:
        for p in d.ports:
            if not _port_ok(p) or (p.rate_gbps is not None and p.rate_gbps < min_rate):
                return False
    return True


def _rail_message(down: list[str], slow: list[str], min_rate: float) -> str:
    parts = []
    if down:
        parts.append(f"{len(down)} rail(s) not ACTIVE/LinkUp ({'; '.join(down[:4])})")
    if slow:
        parts.append(f"{len(slow)} below {min_rate:g} Gb/s ({'; '.join(slow[:4])})")
    return ", ".join(parts)


def _rdma(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    spec = e.ct.target.rdma
    rd = f.rdma
    if not e.ct.rdma_required:
        # Single-node serving does not use the rails, but a rail that is down is a hardware fault
        # someone must hear about (and the next multi-node layout would trip over it).
        if rd.status == "ok" and rd.devices and not _all_ports_good(f, spec.min_rate_gbps):
            down, slow = _rail_problems(host_rails(f, c, e.ct)[0], spec.min_rate_gbps)
            if down or slow:
                e.fail("rdma.port_state",
                       _rail_message(down, slow, spec.min_rate_gbps) + " (RDMA is not required by the strategy)",
                       {"down": down, "slow": slow, "rdma_required": False}, severity="warning")
        return
    if rd.status == "unknown":
        e.unknown("rdma.port_state", "RDMA port state", rd.reason, error=True)
        e.unknown("rdma.rail_count", "RDMA devices", rd.reason, error=True)
        return
    found, other = host_rails(f, c, e.ct)
    if len(found) < spec.rails_per_node:
        e.fail("rdma.rail_count",
               f"{len(found)} {spec.link_layer or 'RDMA'} rails found, {spec.rails_per_node} expected",
               {"rails": [rail_name(n, p) for n, p in found], "other_link_layer": other,
                "expected": spec.rails_per_node})
    if spec.require_all_active:
        down, slow = _rail_problems(found, spec.min_rate_gbps)
        if down or slow:
            e.fail("rdma.port_state", _rail_message(down, slow, spec.min_rate_gbps),
                   {"down": down, "slow": slow, "rdma_required": True})
    _gpudirect(f, c, e)


def _gpudirect(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    mode = e.ct.target.rdma.gpudirect
    peermem = f.rdma.nvidia_peermem_loaded
    dmabuf_env = f.nccl.settings.get("NCCL_DMABUF_ENABLE")
    dmabuf_off = dmabuf_env is not None and dmabuf_env.value.strip() == "0"
    dmabuf = None if c.flavour is None else (c.flavour == "open" and not dmabuf_off)
    if mode == "peermem":
        ok: bool | None = peermem
    elif mode == "dmabuf":
        ok = dmabuf
    else:
        ok = True if (peermem or dmabuf) else (None if peermem is None or dmabuf is None else False)
    ev = {"nvidia_peermem_loaded": peermem, "flavour": c.flavour,
          "NCCL_DMABUF_ENABLE": dmabuf_env.value if dmabuf_env else None, "mode": mode}
    if ok is None:
        e.unknown("rdma.peermem", "the GPUDirect RDMA path (nvidia_peermem / DMA-BUF)", f.rdma.reason)
    elif not ok:
        why = []
        if not peermem:
            why.append("nvidia_peermem is not loaded")
        if not dmabuf:
            why.append("DMA-BUF is off (NCCL_DMABUF_ENABLE=0)" if dmabuf_off else
                       f"DMA-BUF needs open kernel modules ({c.flavour} installed)")
        e.fail("rdma.peermem", f"no GPUDirect RDMA path: {' and '.join(why)}", ev)


def _acs(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    rd = f.rdma
    sev: Severity = "error" if e.ct.rdma_required else "warning"
    if rd.acs_enabled_bridges:
        e.fail("rdma.acs", f"ACS SrcValid+ is set on {len(rd.acs_enabled_bridges)} PCIe bridge(s): "
               "GPU peer-to-peer traffic goes through the root complex",
               {"bridges": rd.acs_enabled_bridges[:32]}, severity=sev)
    elif not rd.acs_checked:
        e.unknown("rdma.acs", "PCIe ACS state", rd.acs_reason)


def _nccl(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    nc = f.nccl
    if nc.status == "unknown":
        e.unknown("nccl.debug", "NCCL settings", nc.reason)
        e.unknown("nccl.settings", "NCCL settings", nc.reason)
        return
    dbg = nc.settings.get("NCCL_DEBUG")
    if dbg is not None and dbg.value.strip().upper() in e.ct.forbidden_debug:
        e.fail("nccl.debug", f"NCCL_DEBUG={dbg.value} (from {dbg.source}) is a debugging setting",
               {"value": dbg.value, "source": dbg.source})
    problems: list[str] = []
    ev: dict[str, Any] = {}
    for key, want in e.ct.target.nccl.required.items():
        have = nc.settings.get(key)
        if have is None or have.value.strip() != want:
            problems.append(f"{key}={have.value if have else '<unset>'} (required {want})")
    hca = nc.settings.get("NCCL_IB_HCA")
    if hca is not None and f.rdma.status == "ok" and f.rdma.devices:
        missing = missing_hcas(hca.value, [d.name for d in f.rdma.devices])
        if missing:
            problems.append(f"NCCL_IB_HCA names absent HCA(s) {', '.join(missing)}")
            ev["present_hcas"] = sorted(d.name for d in f.rdma.devices)[:32]
    if problems:
        ev["problems"] = problems
        e.fail("nccl.settings", "; ".join(problems), ev)


def missing_hcas(value: str, devices: list[str]) -> list[str]:
    """Entries of an NCCL_IB_HCA list that match no device ("^" lists exclude: nothing is missing)."""
    v = value.strip()
    if not v or v.startswith("^"):
        return []
    exact = v.startswith("=")
    if exact:
        v = v[1:]
    out = []
    for item in v.split(","):
        name = item.strip().split(":", 1)[0]
        if not name:
            continue
        hit = name in devices if exact else any(d.startswith(name) for d in devices)
        if not hit:
            out.append(name)
    return out


# -- container ------------------------------------------------------------------------------------


def _runtime(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    ct = f.container
    if ct.status == "unknown" and ct.runtime is None:
        e.unknown("container.runtime", "the container runtime", ct.reason, error=True)
        return
    if ct.runtime is None:
        e.fail("container.runtime",
               f"no container runtime found (looked for {', '.join(e.ct.target.container.runtimes)})",
               {"reason": ct.reason})
    elif ct.runtime.name not in e.ct.runtimes:
        e.fail("container.runtime", f"container runtime {ct.runtime.name} is not one the target supports",
               {"runtime": ct.runtime.name, "supported": sorted(e.ct.runtimes)}, severity="warning")


def _toolkit(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    ct = f.container
    tv = version_tuple(ct.toolkit_version)
    if tv is None:
        if ct.runtime is not None or ct.status == "ok":
            e.unknown("container.toolkit", "the NVIDIA Container Toolkit version", ct.reason)
        return
    if tv < e.ct.toolkit_min:
        adv = e.ct.target.container.toolkit_advisory
        e.fail("container.toolkit",
               f"nvidia-container-toolkit {ct.toolkit_version} is older than "
               f"{e.ct.target.container.toolkit_min_version}" + (f" ({adv})" if adv else ""),
               {"toolkit_version": ct.toolkit_version, "min": e.ct.target.container.toolkit_min_version})


def _image(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    ct = f.container
    want = e.ct.target.image.ref
    img = ct.image
    if img is None or img.present is False:
        if ct.status == "unknown" and img is None:
            e.unknown("container.image_present", f"whether {want} is present", ct.reason)
        else:
            e.fail("container.image_present", f"image {want} is not present", {"image": want})
        return
    if img.present is None:
        e.unknown("container.image_present", f"whether {want} is present", ct.reason)
        return
    if img.ref != want:
        e.fail("container.image_present", f"facts describe image {img.ref}, the target serves {want}",
               {"image": img.ref, "target_image": want}, severity="warning")
    pin = e.ct.target.image.digest
    if pin and img.digest and img.digest != pin:
        e.fail("container.image_present", f"image {want} has digest {img.digest}, the target pins {pin}",
               {"digest": img.digest, "pinned": pin})


def image_cuda(f: HostFacts, ct: CompiledTarget) -> tuple[str, str]:
    """The CUDA release the host's image carries, and where that came from."""
    img = f.container.image
    if img is not None and img.present:
        if img.cuda_version and cuda_tuple(img.cuda_version):
            return img.cuda_version, "image CUDA_VERSION"
        m = _REQUIRE_CUDA.search(img.nvidia_require_cuda or "")
        if m:
            return m.group(1), "image NVIDIA_REQUIRE_CUDA"
    return ct.image_cuda, "target image.cuda"


def _cuda_runtime(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    ct = e.ct
    if c.platform_note is not None:
        return  # driver.platform says why: no data-center driver, so no CUDA chain to judge
    cuda, src = image_cuda(f, ct)
    want = cuda_tuple(cuda)
    assert want is not None
    reported = f.driver.cuda_driver_version
    host_max = reported if cuda_tuple(reported) else None
    row_max = ct.max_cuda(c.version) if c.version else None
    hm = cuda_tuple(host_max) or (row_max.key if row_max else None)
    # Like nvidia-smi's "CUDA Version": major.minor, whether reported or derived from the matrix.
    ev: dict[str, Any] = {"image_cuda": cuda, "image_cuda_source": src, "driver_version": c.version,
                          "host_max_cuda": host_max or (f"{row_max.key[0]}.{row_max.key[1]}" if row_max else None)}
    if c.version_t is None and hm is None:
        if not c.driver_failed:
            e.unknown("container.cuda_runtime", f"the host's maximum CUDA (image needs {cuda})",
                      f.driver.reason, error=True)
        return
    floor = ct.target.matrix.floor_branch(want[0])
    if c.version_t is not None and floor is not None and c.version_t[0] < floor.min_driver_branch:
        e.fail("container.cuda_runtime",
               f"image CUDA {cuda} needs an R{floor.min_driver_branch}-or-newer driver; the host runs "
               f"{c.version} (max CUDA {ev['host_max_cuda'] or '?'})",
               {**ev, "min_driver_branch": floor.min_driver_branch}, chain=True)
        return
    if hm is not None and hm[0] < want[0]:
        e.fail("container.cuda_runtime", f"image CUDA {cuda} is newer than the host's maximum CUDA "
               f"{ev['host_max_cuda']}", ev, chain=True)
        return
    row, exact = ct.row_for(cuda)
    if row is None or row.min_driver is None:
        label = row.label if row else cuda
        if row is not None:
            c.unconfirmed.add(row.label)
        e.unknown("container.cuda_runtime", f"the minimum driver for CUDA {cuda}",
                  f"the CUDA driver matrix has no {'value' if row else 'row'} for {label}", error=True)
        return
    if not row.confirmed:
        c.unconfirmed.add(row.label)
    ev.update(matrix_row=row.label, matrix_exact=exact, matrix_confirmed=row.confirmed, min_driver=row.min_driver)
    below = (c.version_t is not None and c.version_t < (version_tuple(row.min_driver) or (0,))) or (
        c.version_t is None and hm is not None and hm[:2] < want[:2])
    if below:
        note = "" if row.confirmed else " [unconfirmed matrix row]"
        e.fail("container.cuda_runtime",
               f"image CUDA {cuda} runs only under minor-version compatibility (limited features): CUDA "
               f"{row.label} wants driver {row.min_driver}, host has {c.version or host_max}{note}",
               ev, severity="warning")


def _probe(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not e.ct.target.container.require_probe:
        return
    ct = f.container
    pr = ct.probe
    if c.platform_note is not None:
        return  # driver.platform says why; no driver change would make CUDA start here
    if ct.image is None or ct.image.present is False or ct.runtime is None:
        # No image or runtime: container.image_present / container.runtime already say why.
        return
    ev = {"failure": pr.failure, "message": pr.message, "cuda_init": pr.cuda_init, "visible_gpus": pr.visible_gpus}
    if not pr.ran:
        e.unknown("container.probe", "the in-container CUDA probe (not run)", pr.message)
    elif pr.ok:
        if c.gpu_count is not None and pr.visible_gpus is not None and pr.visible_gpus < c.gpu_count:
            e.fail("container.probe", f"the container sees {pr.visible_gpus} of {c.gpu_count} GPUs", ev,
                   severity="error")
        elif pr.kernel_ok is None:
            # CUDA initialised, but only a kernel's verified result proves the GPUs compute.
            e.unknown("container.probe", "a verified CUDA operation in the image",
                      "the probe printed no matmul result (a probe of an older collector, or a captured output)")
    elif pr.failure in CHAIN_PROBE_FAILURES:
        e.fail("container.probe", f"CUDA does not initialise in the image ({pr.failure}): {pr.message or ''}"
               .rstrip(": "), ev, chain=True)
    elif pr.ok is False:
        e.fail("container.probe", f"the container probe failed ({pr.failure or 'error'}): {pr.message or ''}"
               .rstrip(": "), ev, severity="error")
    else:
        e.unknown("container.probe", "the in-container CUDA probe result", pr.message)


def _vllm(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    img = f.container.image
    if img is None or not img.present:
        return
    have = release_key(img.vllm_version)
    if have is None:
        e.unknown("container.vllm_version", f"the vLLM version in {img.ref}",
                  f"image reports {img.vllm_version!r}" if img.vllm_version else "no vLLM version label")
    elif e.ct.vllm_min is not None and have < e.ct.vllm_min:
        e.fail("container.vllm_version",
               f"vLLM {img.vllm_version} in {img.ref} is older than {e.ct.target.vllm.min_version}",
               {"vllm_version": img.vllm_version, "min": e.ct.target.vllm.min_version})


def tenants(f: HostFacts, ct: CompiledTarget) -> list[Tenant] | None:
    """Other tenants' CUDA work judged against the target driver; None when the facts lack it."""
    w = f.container.workloads
    if w is None:
        return None
    return judge_tenants(w, ct.branch, ct.target_max_cuda, ct.compat_branch)


def _tenants(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not c.below_target:
        return  # no driver change planned here: nothing of the tenants' CUDA moves
    judged = tenants(f, e.ct)
    busy = bool(c.gpus_in_use)
    if judged is None:
        # Facts of an older collector: the GPUs' own use says whether there is work to ask about.
        if busy:
            e.unknown("workloads.cuda_compat", "the CUDA work of the processes holding the GPUs",
                      "facts from a collector that does not list containers and GPU processes")
        return
    ev: dict[str, Any] = {"tenants": [t.as_dict() for t in judged]}
    broken = [t for t in judged if t.outcome == "breaks"]
    unsure = [t for t in judged if t.outcome == "unknown"]
    w = f.container.workloads
    assert w is not None
    if broken:
        e.fail("workloads.cuda_compat",
               f"{len(broken)} tenant(s) break on R{e.ct.branch}: "
               + "; ".join(f"{t.who}: {t.why}" for t in broken[:3]) + (" ..." if len(broken) > 3 else ""), ev)
    elif unsure:
        e._add("workloads.cuda_compat",
               f"whether {len(unsure)} tenant(s) keep working on R{e.ct.branch} is unknown: "
               + "; ".join(f"{t.who}: {t.why}" for t in unsure[:3]), ev, "error", "unknown", False)
    elif w.status != "ok":
        e.unknown("workloads.cuda_compat", "the CUDA work of other tenants on the GPUs", w.reason, error=busy)


# -- active checks (audit --active; docs/facts.md section 17) -----------------------------------


def _active_gate(f: HostFacts, e: _Emitter, check: str, what: str) -> bool:
    """True when the check has results to judge; otherwise say why not (skipped, unread)."""
    a = f.active
    if a is None:
        return False  # no active check was asked for
    if a.skipped:
        e.unknown(check, what, f"not run: {a.skipped}")
        return False
    if a.status != "ok" and a.dcgm is None:
        e.unknown(check, what, a.reason)
        return False
    return True


def _tool_unknown(e: _Emitter, check: str, what: str, tool: Any) -> bool:
    if tool is None:
        return True  # not part of this level
    if not tool.ran or tool.error:
        e.unknown(check, what, tool.reason or tool.error)
        return True
    return False


def _active_dcgm(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not _active_gate(f, e, "active.dcgm_diag", "the DCGM diagnostic"):
        return
    assert f.active is not None
    d = f.active.dcgm
    if d is None or _tool_unknown(e, "active.dcgm_diag", f"dcgmi diag -r {d.level}", d):
        return
    if d.result is None:
        e.unknown("active.dcgm_diag", f"dcgmi diag -r {d.level}'s results",
                  f"no test row in its output (exit {d.rc})", error=True)
        return
    bad = [t for t in d.tests if t.result in ("fail", "warn")]
    failed = [t for t in bad if t.result == "fail"]
    ev: dict[str, Any] = {"level": d.level, "tests": [t.model_dump() for t in bad], "metadata": d.metadata}
    if failed:
        parts = [f"{t.name} fails" + (f" on GPU {_idx(t.failed_gpus)}" if t.failed_gpus else "")
                 + (f" ({t.details[0]['text'][:160]})" if t.details else "") for t in failed]
        e.fail("active.dcgm_diag", f"dcgmi diag -r {d.level}: " + "; ".join(parts[:3]), ev)
    elif bad:
        e.fail("active.dcgm_diag", f"dcgmi diag -r {d.level} warns: " + ", ".join(t.name for t in bad), ev,
               severity="warning")
    elif d.rc not in (0, None):
        e.unknown("active.dcgm_diag", f"dcgmi diag -r {d.level}", d.reason or f"exit {d.rc}", error=True)


def _active_nccl(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not _active_gate(f, e, "active.nccl_busbw", "the NCCL all-reduce bus bandwidth"):
        return
    assert f.active is not None
    n = f.active.nccl
    if n is None or _tool_unknown(e, "active.nccl_busbw", "all_reduce_perf within the node", n):
        return
    floors = e.ct.target.active.nccl_busbw_min_gbs
    floor = floors.get(c.gpu_model or "")
    ev: dict[str, Any] = {"peak_busbw_gbs": n.peak_busbw_gbs, "avg_busbw_gbs": n.avg_busbw_gbs,
                          "max_bytes": n.max_bytes, "ranks": n.ranks, "gpus": n.gpus, "wrong": n.wrong,
                          "min_gbs": floor, "gpu_model": c.gpu_model}
    if n.peak_busbw_gbs is None:
        e.unknown("active.nccl_busbw", "all_reduce_perf's bus bandwidth",
                  n.reason or "no result row in its output", error=True)
    elif n.wrong or n.out_of_bounds:
        e.fail("active.nccl_busbw", f"all_reduce_perf reports wrong results ({n.wrong or 0} #wrong, "
               f"{n.out_of_bounds or 0} out of bounds): a GPU or link corrupts data", ev)
    elif floor is None:
        e.unknown("active.nccl_busbw", f"the bus bandwidth floor for {c.gpu_model or 'this GPU'}",
                  f"the target's active.nccl_busbw_min_gbs has no entry for it (measured "
                  f"{n.peak_busbw_gbs} GB/s)")
    elif n.peak_busbw_gbs < floor:
        e.fail("active.nccl_busbw", f"all_reduce_perf peak bus bandwidth {n.peak_busbw_gbs} GB/s at "
               f"{n.max_bytes} B is below {floor:g} GB/s for {c.gpu_model}", ev)


def _active_ib(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    if not _active_gate(f, e, "active.ib_write_bw", "ib_write_bw per rail"):
        return
    assert f.active is not None
    if f.active.level != "full":
        return
    frac = e.ct.target.active.ib_write_bw_min_fraction
    slow: list[str] = []
    unread: dict[str, list[str]] = {}
    for r in f.active.ib_write_bw:
        name = f"{r.device}/{r.port}"
        if not r.ran or r.error or r.bw_avg_gbps is None:
            unread.setdefault(r.reason or r.error or "no result row", []).append(name)
            continue
        want = (r.rate_gbps or e.ct.target.rdma.min_rate_gbps) * frac
        if r.bw_avg_gbps < want:
            slow.append(f"{name} {r.bw_avg_gbps:g} Gb/s < {want:g}")
    # One finding per reason: a missing tool is one line, not one per rail.
    for reason, names in unread.items():
        ran = any(r.ran for r in f.active.ib_write_bw if f"{r.device}/{r.port}" in names)
        e.unknown("active.ib_write_bw", f"ib_write_bw on {', '.join(names[:8])}", reason, error=ran)
    if slow:
        e.fail("active.ib_write_bw", f"rail(s) below {frac:g} of their rate: {', '.join(slow[:8])}",
               {"rails": [r.model_dump() for r in f.active.ib_write_bw], "min_fraction": frac})


@lru_cache(maxsize=256)
def state_words(state: str | None) -> frozenset[str]:
    """Slurm writes "IDLE+DRAIN", "idle*", "mixed-": the base words, lower case, flags stripped.

    A fleet repeats a handful of states: each is split once.
    """
    if not state:
        return frozenset()
    return frozenset(w.strip("*~#!%$@^-") for w in state.lower().split("+") if w.strip("*~#!%$@^-"))


def _scheduler(f: HostFacts, c: HostContext, e: _Emitter) -> None:
    _scheduler_state(f.scheduler, e)


def _scheduler_state(sc: SchedulerFacts, e: _Emitter) -> None:
    if sc.kind == "none" or (sc.status == "absent" and sc.kind is None):
        return
    if sc.status == "unknown" or not sc.state:
        e.unknown("scheduler.state", f"the {sc.kind or 'scheduler'} node state", sc.reason)
        return
    st = state_words(sc.state)
    if sc.state_flags:
        st = st | {x.lower() for x in sc.state_flags}
    down = bool(st & e.ct.down_states)
    if not down and not st & e.ct.oos_states:
        return  # in service: the common case, nothing to build
    # The collector already folds DRAIN into "drained"/"draining": show only flags that add something.
    shown = "+".join([sc.state, *(x for x in sc.state_flags if x.lower() not in sc.state.lower())])
    ev = {"kind": sc.kind, "node": sc.node, "state": sc.state, "flags": sc.state_flags, "reason": sc.reason}
    reason = f" ({sc.reason})" if sc.reason else ""
    if down:
        e.fail("scheduler.state", f"{sc.kind} reports the node {shown}{reason}", ev, severity="error")
    else:
        e.fail("scheduler.state", f"{sc.kind} reports the node {shown}{reason}: not serving", ev)


RULES: tuple[Callable[[HostFacts, HostContext, _Emitter], None], ...] = (
    _schema, _driver_loaded, _nvml, _driver_version, _flavour, _pending_reboot,
    _gpu_count, _persistence, _fabric_state, _fabric_health, _gpu_in_use,
    _ecc, _remapped_rows, _xid, _throttle, _pcie_link,
    _held, _unattended, _dkms,
    _fabricmanager, _imex,
    _rdma, _acs, _nccl,
    _runtime, _toolkit, _image, _cuda_runtime, _probe, _vllm, _tenants,
    _active_dcgm, _active_nccl, _active_ib,
    _scheduler,
)


# Rules that read what differs between hosts of one kind (schema version aside, the scheduler's
# state); every other rule reads only what validate_facts' rule key covers.
PER_HOST_RULES = (_schema, _scheduler)
SHARED_RULES = tuple(rule for rule in RULES if rule not in PER_HOST_RULES)


def rule_key(facts: HostFacts) -> tuple[Any, ...] | None:
    """The rule key validate_facts set (None otherwise), read without pydantic's attribute hook,
    which costs more than the rules of a cached host."""
    private = facts.__pydantic_private__
    return private.get("_rule_key") if private else None


_set = object.__setattr__
_new = object.__new__


def _for_host(shared: list[Finding], host: str) -> list[Finding]:
    """A kind's findings for another host of the kind; the evidence stays shared (read-only).

    :func:`k3fleet.models.facts.replaced`, inlined: this runs for every finding of the fleet.
    """
    out: list[Finding] = []
    for f in shared:
        if f.host == host:
            out.append(f)
            continue
        fields = f.__dict__.copy()
        fields["host"] = host
        new = _new(Finding)
        _set(new, "__dict__", fields)
        _set(new, "__pydantic_fields_set__", f.__pydantic_fields_set__)
        _set(new, "__pydantic_extra__", f.__pydantic_extra__)
        _set(new, "__pydantic_private__", f.__pydantic_private__)
        out.append(new)
    return out


class RuleCache:
    """Host rules once per node kind: hosts with one rule key (validate_facts) share their context
    and the findings of SHARED_RULES, stamped with each host's name; PER_HOST_RULES run per host."""

    __slots__ = ("_own", "contexts", "ct", "findings", "kinds", "ranks")

    def __init__(self, ct: CompiledTarget) -> None:
        self.ct = ct
        self.contexts: dict[tuple[Any, ...], HostContext] = {}
        # Contexts shared by a kind (by id), with the kind's findings and their worst severity rank.
        self.kinds: set[int] = set()
        self.findings: dict[int, list[Finding]] = {}
        self.ranks: dict[int, int] = {}
        # The emitter of the per-host rules, reused host after host (its host and list are reset).
        self._own = _Emitter(ct, "")

    def context(self, facts: HostFacts, host: str) -> HostContext:
        key = rule_key(facts)
        if key is None:
            return host_context(facts, self.ct, host)
        ctx = self.contexts.get(key)
        if ctx is None:
            ctx = self.contexts[key] = host_context(facts, self.ct, host)
            self.kinds.add(id(ctx))
        return ctx

    def run(self, facts: HostFacts, host: str, ctx: HostContext,
            scheduler: SchedulerFacts | None = None) -> tuple[list[Finding], int, bool]:
        """The host's findings, the highest SEVERITY_RANK among them, and whether they are exactly its
        kind's (no finding of its own): then whatever follows from the findings holds for the kind.

        ``facts`` may be the facts of another host of the kind (the streaming verdict keeps one per
        kind): ``scheduler`` is then the host's own scheduler section.
        """
        if id(ctx) not in self.kinds:
            findings = run_rules(facts, self.ct, host, ctx)[0]
            return findings, max((SEVERITY_RANK[f.severity] for f in findings), default=0), False
        shared = self.findings.get(id(ctx))
        if shared is None:
            em = _Emitter(self.ct, host)
            for rule in SHARED_RULES:
                rule(facts, ctx, em)
            shared = self.findings[id(ctx)] = em.out
            self.ranks[id(ctx)] = max((SEVERITY_RANK[f.severity] for f in shared), default=0)
            stamped = list(shared)
        else:
            stamped = _for_host(shared, host)
        rank = self.ranks[id(ctx)]
        em = self._own
        em.host = host
        head = em.out = []
        _schema(facts, ctx, em)
        tail = em.out = []
        _scheduler_state(facts.scheduler if scheduler is None else scheduler, em)
        if not head and not tail:
            return stamped, rank, True
        own = [*head, *tail]
        return [*head, *stamped, *tail], max(rank, *(SEVERITY_RANK[f.severity] for f in own)), False


def run_rules(
    facts: HostFacts, ct: CompiledTarget, host: str | None = None, ctx: HostContext | None = None
) -> tuple[list[Finding], HostContext]:
    """Every rule over one host; ``ct`` must have its strategy decided (:meth:`CompiledTarget.decide`)."""
    if ct.decision is None:
        raise ValueError(f"target {ct.target.name}: the serving strategy is not decided; call "
                         "CompiledTarget.decide(contexts) before running the rules")
    if ctx is None:
        ctx = host_context(facts, ct, host)
    em = _Emitter(ct, host or ctx.host)
    for rule in RULES:
        rule(facts, ctx, em)
    return em.out, ctx


def evaluate_host(facts: HostFacts, target: Target) -> list[Finding]:
    """Findings for one host against ``target`` (empty: every applicable check passed).

    With ``gpus.strategy: auto`` the strategy is derived from this host alone.
    """
    ct = CompiledTarget(target)
    ctx = host_context(facts, ct)
    ct.decide([ctx])
    return run_rules(facts, ct, ctx=ctx)[0]
