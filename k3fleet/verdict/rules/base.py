"""What every host rule reads and writes: the host's context, the compiled target, the emitter. Pure.

The rules themselves sit by concern beside their catalogue entries (driver.py, gpu.py, packages.py,
fabric.py, rdma.py, container.py, workloads.py, active.py, scheduler.py); engine.py runs them.

How the rules read it, and the severity of what they cannot read: the package's docstring.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import classify_driver_platform
from k3fleet.models.facts import Gpu, HostFacts
from k3fleet.models.findings import Finding, FindingKind, Severity, StrategyDecision
from k3fleet.models.target import MatrixRow, Target, version_tuple
from k3fleet.verdict.check import FixTexts, registered
from k3fleet.verdict.strategy import decide_strategy
from k3fleet.verdict.tenants import compat_branch_for

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")
_PRE = ("rc", "a", "b", "c", "dev", "alpha", "beta", "pre", "preview")
UNKNOWN_FIX = "Make this fact readable on the host (see evidence.reason), then re-run the audit."


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
        self.fix = FixTexts(target)
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


class Emitter:
    """Collects one host's findings; a check's severity and fix come from its catalogue entry."""

    __slots__ = ("ct", "host", "out")

    def __init__(self, ct: CompiledTarget, host: str) -> None:
        self.ct = ct
        self.host = host
        self.out: list[Finding] = []

    def fail(
        self, check_id: str, message: str, evidence: dict[str, Any], *,
        severity: Severity | None = None, chain: bool = False,
    ) -> None:
        self._add(check_id, message, evidence, severity or registered(check_id).severity, "fail", chain)

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
            evidence=evidence, fix=UNKNOWN_FIX if kind == "unknown" else self.ct.fix[check_id], chain=chain,
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



def gpu_list(items: list[int]) -> str:
    """GPU indices as a finding's message shows them: 0,1,3."""
    return ",".join(map(str, items))


def counter_delta(pair: list[int]) -> int:
    """A counter's growth between the visit's two samples (second - first); a counter that went back (a driver
    reload or a port reset zeroed it, or it wrapped) counts from zero."""
    first, second = pair[0], pair[-1]
    return second - first if second >= first else second
