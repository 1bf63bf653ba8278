"""GPU checks: count, persistence mode, NVLink fabric state and health, GPUs in use, and the GPU health checks of
docs/facts.md section 14 (ECC, remapped rows, Xid, clock slowdown, PCIe link).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import normalize_bus_id
from k3fleet.models.facts import Gpu, HostFacts, XidEvent
from k3fleet.models.findings import SEVERITY_RANK, Severity
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import Emitter, HostContext, gpu_list

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("gpu.count", "All GPUs visible",
          "The serving strategy needs {gpus_per_node} GPUs per node; a missing GPU breaks tensor parallelism.",
          "error",
          "Check nvidia-smi and the kernel log for a GPU that fell off the bus; reseat or RMA it, then re-audit.",
          source='docs/facts.md section 1 (Kimi K3 recipe: GPUs per strategy)'),
    check("gpu.persistence_mode", "Persistence mode on",
          "Without persistence mode the driver tears down GPU state between clients, slowing start-up "
          "and hiding errors.",
          "warning",
          "Enable nvidia-persistenced (systemctl enable --now nvidia-persistenced).",
          source='docs/facts.md section 5 (NVML nvmlDeviceGetPersistenceMode)'),
    check("gpu.fabric_state", "NVLink fabric training completed",
          "On NVSwitch systems a GPU whose fabric state is not Completed cannot run CUDA work.",
          "error",
          "Check nvidia-fabricmanager is active and at the driver's version, then restart it or reboot.",
          source='docs/facts.md section 3 (fabric state Not Started -> In Progress -> Completed; NVSentinel issues '
          '883, 889)'),
    check("gpu.fabric_health", "NVLink fabric healthy",
          "A GPU can finish fabric registration (State Completed, Status Success) and still report its fabric "
          "health Unhealthy or Limited Capacity, its bandwidth Degraded, a route or access-timeout recovery, or "
          "an incorrect configuration: NCCL traffic over that GPU's NVLinks is slow or fails.",
          "error",
          "Drain the node, check the NVLink/NVSwitch errors (SXid/Xid 74, nvidia-smi nvlink -e) and the fabric "
          "manager log, reset or service the GPU's links, then re-audit.",
          source='docs/facts.md section 9 (NVML nvmlGpuFabricInfo_v3_t health mask and summary; nvidia-smi -q Fabric > '
          'Health)'),
    check("gpu.in_use", "GPUs free for the serving engine",
          "A GPU that another process already holds memory on fails vLLM's start-up check (free memory at least "
          "{gpu_memory_utilization} of the total), and draining or upgrading the node ends that workload.",
          "warning",
          "Find the owner of the processes (the evidence lists pid, name and memory); stop or move the workload "
          "before the change night or before starting vLLM on this node.",
          source='docs/facts.md section 11 (vLLM start-up check: free memory >= gpu_memory_utilization x total, '
          'default 0.9)'),
    check("gpu.ecc", "No uncorrectable ECC errors",
          "An uncorrectable (double-bit) ECC error corrupts the data of whatever ran on that memory; a volatile "
          "count above zero means it happened since the last driver load, an aggregate one that it happened in "
          "the GPU's life.",
          "error",
          "Drain the node; check remapped rows and the kernel log's Xid 48/94/95; reset the GPU (or reboot) to "
          "activate a pending remap, run the DCGM diagnostic (dcgmi diag -r 3), and RMA the GPU if errors "
          "return.",
          source='docs/facts.md section 14 (NVML nvmlDeviceGetTotalEccErrors volatile / aggregate; nvidia-smi -q ECC '
          'Errors; AzHPC ECC checks)'),
    check("gpu.remapped_rows", "No pending or failed row remapping",
          "A GPU repairs a memory row with an uncorrectable error by remapping it; the remap is pending until the "
          "GPU is reset, and a remapping failure means it has no spare rows left (page retirement on older "
          "GPUs).",
          "error",
          "Pending: drain the node and reset the GPU (nvidia-smi -r) or reboot, then re-audit. Failure: take the "
          "GPU out of service and RMA it.",
          source='docs/facts.md section 14 (NVIDIA GPU memory error management: row remapping pending and failure; '
          'NVML nvmlDeviceGetRemappedRows)'),
    check("gpu.xid", "No GPU Xid errors since boot",
          "The driver logs every GPU fault as an Xid in the kernel log: 79 (fallen off the bus), 48/94/95 (ECC), "
          "63/64 (row remapping), 74 (NVLink), 92 (high single-bit error rate) point at hardware that will "
          "fail the serving engine.",
          "error",
          "Read the Xid lines in the evidence against the NVIDIA Xid catalogue: for 79 reseat or RMA the GPU and "
          "check PCIe power and cooling; for ECC codes reset the GPU and check remapped rows; for 74 check the "
          "NVLink and Fabric Manager; re-audit after a reboot.",
          source='docs/facts.md section 14 (NVIDIA Xid catalogue: 48, 63, 64, 74, 79, 92, 94, 95 and more)'),
    check("gpu.throttle", "No hardware clock slowdown",
          "HW Slowdown, HW Thermal Slowdown and HW Power Brake cut the GPU's clocks by half or more (heat, power "
          "supply, an external power brake signal): every shard of a tensor-parallel engine runs at the slowest "
          "GPU's speed.",
          "error",
          "Check the GPU's temperature and power readings (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER), the "
          "chassis cooling and the power supplies; the reasons are read at one instant, so re-check under load.",
          source='docs/facts.md section 14 (nvml.h clocks event reasons: HW slowdown, HW thermal, HW power brake)'),
    check("gpu.pcie_link", "PCIe link at full width",
          "A GPU whose PCIe link trained narrower than its maximum (x8 of x16) has a fraction of its host "
          "bandwidth for model loading and host transfers; a lower generation is normal at idle (power saving) "
          "and is only a warning.",
          "error",
          "Width below the maximum: reseat the GPU or its riser and check the slot; generation below the maximum: "
          "re-check under load (the link drops its generation at idle), then check BIOS PCIe settings.",
          source='docs/facts.md section 14 (nvidia-smi pcie.link.gen/width current and max; the generation drops at '
          'idle)'),
)


def _gpu_count(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


def _persistence(f: HostFacts, c: HostContext, e: Emitter) -> None:
    gpus = f.driver.gpus
    if not gpus or not e.ct.target.driver.require_persistence_mode:
        return
    off = [g.index for g in gpus if g.persistence_mode is False]
    if off:
        e.fail("gpu.persistence_mode", f"persistence mode is off on GPU {gpu_list(off)}", {"gpus_off": off})
    elif all(g.persistence_mode is None for g in gpus):
        e.unknown("gpu.persistence_mode", "persistence mode", f.driver.nvml.error)



def _fabric_state(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if not c.fm_required or not f.driver.gpus:
        return
    states = [(g.index, g.fabric_state) for g in f.driver.gpus]
    bad = [(i, s) for i, s in states if s is not None and s not in ("completed", "not_supported")]
    if bad:
        e.fail("gpu.fabric_state",
               f"NVLink fabric not completed on GPU {gpu_list([i for i, _ in bad])} "
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


def _fabric_health(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
    parts = [f"GPU {gpu_list(indices)}: {faults}" for faults, indices in bad.items()]
    fields = sorted({fault.rsplit(" ", 1)[0] for faults in bad for fault in faults.split(", ")})
    e.fail("gpu.fabric_health", f"NVLink fabric health fails on {'; '.join(parts)}",
           {"gpus": detail, "fields": fields})


def _gpu_in_use(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
                       f"{gpu_list(short)}")
    effects.append("a drain or driver change would end this workload")
    e.fail("gpu.in_use",
           f"GPU {gpu_list([g.index for g in c.gpus_in_use])} in use{used_text}{held}: {'; '.join(effects)}",
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


def _health_unknown(f: HostFacts, c: HostContext, e: Emitter, check: str, what: str, attr: str) -> bool:
    """Report ``check`` unknown when no GPU reported ``attr``; True when there is nothing to judge."""
    gpus = f.driver.gpus
    if not gpus or c.driver_failed:
        return True
    values = [getattr(g, attr) for g in gpus]
    if all(v is None for v in values):
        e.unknown(check, what, f.driver.reason or "not reported by this collector (facts before schema 1.1)")
        return True
    return False


def _ecc(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
        e.fail("gpu.ecc", f"uncorrectable ECC errors on GPU {gpu_list(volatile)} since the last driver load "
               f"({first.volatile_uncorrected} volatile on GPU {volatile[0]})", {"gpus": detail})
    elif aggregate:
        e.fail("gpu.ecc", f"uncorrectable ECC errors recorded over the life of GPU {gpu_list(aggregate)} (aggregate "
               "counter; none since the last driver load): check remapped rows and the Xid log",
               {"gpus": detail}, severity="warning")
    elif reasons and len(reasons[next(iter(reasons))]) == len(f.driver.gpus):
        e.unknown("gpu.ecc", "uncorrectable ECC error counts", next(iter(reasons)))


def _remapped_rows(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
        e.fail("gpu.remapped_rows", f"row remapping failed on GPU {gpu_list(failed)}: the GPU has no spare rows left "
               "for its uncorrectable errors", {"gpus": detail}, severity="critical")
    if pending:
        e.fail("gpu.remapped_rows", f"a row remap or page retirement is pending on GPU {gpu_list(pending)}: it takes "
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


def _xid(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
        gpu = f" (GPU {gpu_list(idx)})" if idx else ""
        parts.append(f"Xid {code} ({meaning}) on {', '.join(where[:4])}{gpu}" +
                     (f" x{len(events)}" if len(events) > 1 else ""))
    e.fail("gpu.xid", "kernel log since boot: " + "; ".join(parts[:6]),
           {"source": log.source, "codes": sorted(by_code),
            "events": [ev.model_dump() for ev in log.xid[-16:]]}, severity=worst)


def _throttle(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
    shown = "; ".join(f"{r} on GPU {gpu_list(i)}" for r, i in [*hw.items(), *sw.items()])
    e.fail("gpu.throttle", f"clocks slowed: {shown}", {"hardware": hw, "software": sw},
           severity="error" if hw else "warning")


def _pcie_link(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    _gpu_count, _persistence, _fabric_state, _fabric_health, _gpu_in_use, _ecc, _remapped_rows, _xid, _throttle,
    _pcie_link,
)
