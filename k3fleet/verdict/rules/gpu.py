"""GPU checks: count, persistence mode, NVLink fabric state and health, GPUs in use, and the GPU health checks of
docs/facts.md section 14 (ECC, remapped rows, Xid, clock slowdown, PCIe link).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import normalize_bus_id
from k3fleet.models.facts import Gpu, HostFacts, XidEvent
from k3fleet.models.findings import SEVERITY_RANK, Severity
from k3fleet.models.target import XidEntry
from k3fleet.targets import xid_catalog
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import Emitter, HostContext, counter_delta, gpu_list

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
    check("gpu.nvlink", "NVLink links up",
          "On an NVSwitch board (HGX H100/H200/B200) or an NVLink rack every GPU's links carry tensor-parallel "
          "traffic: an inactive link cuts the GPU's NVLink bandwidth, and a GPU that reports no links at all "
          "(nvidia-smi nvlink -s prints nothing, NVML answers not supported) has none to use. On a board "
          "without NVLink no links is expected, never read as healthy links.",
          "error",
          "Drain the node; read nvidia-smi nvlink -s and -e and the Fabric Manager log, reset the GPU (or reboot) "
          "to retrain the links, and service the GPU or its baseboard if a link stays inactive.",
          source='docs/facts.md section 14 (NVML nvmlDeviceGetNvLinkState; nvidia-smi nvlink -s: '
          'Azure/azhpc-diagnostics issue 73, an empty answer on a GPU without NVLink)'),
    check("gpu.nvlink_errors", "NVLink error counters quiet",
          "Each NVLink link's replay, recovery and CRC counters, sampled twice within the audit's visit, say what "
          "the link does now: a recovery is the link retraining, replays re-send corrupted flits, and CRC "
          "errors above DCGM's rate (100 per second) cost bandwidth and precede a link failure.",
          "error",
          "Drain the node; read nvidia-smi nvlink -e and the Xid log (74, 144-150), reset the GPU to retrain "
          "the links, and service the GPU or baseboard if the counters keep rising.",
          source='docs/facts.md section 14 (nvmlDeviceGetNvLinkErrorCounter, nvidia-smi nvlink -e; NVIDIA/DCGM '
          'dcgm_gpu_hardware_limits.h)'),
    check("gpu.pcie_replay", "PCIe replays below DCGM's rate",
          "A PCIe replay re-sends a packet the link corrupted; DCGM holds more than 8 replays per minute to be a "
          "failing link (signal integrity, riser, slot), which slows host transfers and model loading.",
          "warning",
          "Reseat the GPU or its riser, check the slot and BIOS PCIe settings, and re-audit; a rate that stays "
          "high needs the GPU or baseboard serviced.",
          source='docs/facts.md section 14 (nvmlDeviceGetPcieReplayCounter; NVIDIA/DCGM dcgm_gpu_hardware_limits.h: '
          '8 replays per minute)'),
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
    check("gpu.xid_application", "Application Xids kept apart from node faults",
          "Xid 13, 31, 43 and the other codes NVIDIA's catalogue resolves by restarting the application "
          "(RESTART_APP, investigate CHECK_APP/CUDA) are usually the application's own fault, not the node's: "
          "they are reported, but do not fail the node.",
          "warning",
          "Check the application named in the line (pid, name): its CUDA errors, out-of-bounds accesses or "
          "killed kernels. Only when the same code returns with different applications, or beside a node "
          "Xid, suspect the GPU.",
          source='docs/facts.md section 14 (NVIDIA Xid catalogue resolution buckets; gpud: Xid 13/31/43 '
          'CHECK_USER_APP_AND_GPU)'),
    check("gpu.xid_recurring", "No node Xid repeated across boots",
          "The same node or memory Xid in two boots (this one or the last few the journal keeps) survived a "
          "reboot: the repair the catalogue names (reset, reboot) did not hold, and gpud escalates it to "
          "hardware inspection.",
          "critical",
          "Take the GPU out of service for hardware inspection (RMA): collect nvidia-bug-report.sh, run dcgmi "
          "diag -r 3 on the drained node, and do not return it to serving on a reboot alone.",
          source='docs/facts.md section 14 (gpud components/accelerator/nvidia/xid/threshold.go: same Xid after '
          '2 reboots -> HARDWARE_INSPECTION; journalctl --list-boots)'),
    check("gpu.ecc_correctable", "Correctable ECC errors below the threshold",
          "Correctable (single-bit) ECC errors are repaired on the fly, but a count in the millions says the "
          "memory is wearing out and uncorrectable errors follow; Azure's health checks fail a GPU above "
          "{ecc_correctable_max} correctable errors.",
          "warning",
          "Drain the node, check remapped rows and the Xid log (Xid 92: high single-bit rate), run dcgmi diag -r "
          "3, and plan the GPU's replacement if the count keeps rising.",
          source='docs/facts.md section 14 (Azure azurehpc-health-checks customTests/azure_gpu_ecc.nhc, '
          'check_gpu_ecc 20000000 10000 in conf/nd96isr_h200_v5.conf)'),
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


def _nvlink(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """Inactive NVLink links fail; no links at all fail only where the board has NVSwitches (Fabric Manager
    required), where every GPU must have them; elsewhere "no links" is recorded as such, never as healthy."""
    gpus = f.driver.gpus
    if not gpus or c.driver_failed:
        return
    read = [g for g in gpus if g.nvlink is not None and g.nvlink.links is not None]
    if not read:
        why = next((g.nvlink.reason for g in gpus if g.nvlink is not None and g.nvlink.reason), None)
        if c.fm_required and why:
            e.unknown("gpu.nvlink", "the GPUs' NVLink links", why)
        return
    inactive = {g.index: g.nvlink.inactive for g in read if g.nvlink is not None and g.nvlink.inactive}
    none = [g.index for g in read if g.nvlink is not None and g.nvlink.links == 0]
    ev = {"links": {str(g.index): g.nvlink.links for g in read if g.nvlink is not None},
          "inactive": {str(i): links for i, links in inactive.items()}, "no_links": none,
          "source": read[0].nvlink.source if read[0].nvlink is not None else None}
    if inactive:
        shown = "; ".join(f"GPU {i} link {', '.join(str(k) for k in links)}" for i, links in list(inactive.items())[:8])
        e.fail("gpu.nvlink", f"NVLink links inactive: {shown}", ev)
    if none and c.fm_required:
        e.fail("gpu.nvlink", f"GPU {gpu_list(none)} report no NVLink links on a board with NVSwitches "
               "(an empty nvidia-smi nvlink -s is no links, not healthy links)", ev)


def _gpu_counters(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """NVLink error counters and PCIe replays judged by their rate over the visit's two samples."""
    counters = f.driver.counters
    if counters is None or not counters.gpus or c.driver_failed:
        return
    t = e.ct.target.health.counter_thresholds(c.gpu_names)
    secs = counters.interval_s
    retrain: list[str] = []
    crc: list[str] = []
    replays: list[str] = []
    detail: dict[str, Any] = {}
    for index, g in counters.gpus.items():
        for link, values in g.nvlink.items():
            d = {name: counter_delta(pair) for name, pair in values.items()}
            bad = {k: v for k, v in d.items() if k in ("replay", "recovery") and v > t.nvlink_replay_recovery_max}
            if bad:
                retrain.append(f"GPU {index} link {link} " + ", ".join(f"{k} +{v}" for k, v in bad.items()))
            crc_n = sum(v for k, v in d.items() if k.startswith("crc"))
            if crc_n / secs > t.nvlink_crc_per_second:
                crc.append(f"GPU {index} link {link} CRC +{crc_n} in {secs} s ({crc_n / secs:.0f}/s)")
            if any(d.values()):
                detail.setdefault(index, {})[link] = values
        if g.pcie_replay is not None:
            n = counter_delta(g.pcie_replay)
            if n * 60 / secs > t.pcie_replay_per_minute:
                replays.append(f"GPU {index} +{n} in {secs} s ({n * 60 / secs:.0f}/min)")
    ev = {"interval_s": secs, "source": counters.source, "links": detail,
          "thresholds": t.model_dump(exclude={"source"}), "thresholds_source": t.source}
    if retrain or crc:
        e.fail("gpu.nvlink_errors", "NVLink errors during the audit: " + "; ".join((retrain + crc)[:8]), ev,
               severity="error" if retrain else "warning")
    if replays:
        e.fail("gpu.pcie_replay", f"PCIe replays above {t.pcie_replay_per_minute:g}/min: " + "; ".join(replays[:8]),
               {"interval_s": secs, "replays": replays})


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

# Xid codes: NVIDIA's catalogue with each code's action, scope and severity here
# (k3fleet/targets/xid_catalog.yaml, docs/facts.md section 14). A code not in it is a warning, by number.
_UNKNOWN_XID: tuple[str, Severity] = ("not in the packaged Xid catalogue: look it up in the NVIDIA Xid catalogue",
                                     "warning")


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


def xid_entry(code: int) -> XidEntry | None:
    return xid_catalog().codes.get(code)


def xid_meaning(code: int) -> tuple[str, Severity]:
    """The catalogue's description of ``code`` and how bad it is for a serving node."""
    entry = xid_entry(code)
    return (entry.description, entry.severity) if entry is not None else _UNKNOWN_XID


def xid_action(code: int) -> tuple[str, str]:
    """(the catalogue's immediate action, what it means here); CONTACT_SUPPORT for a code it does not list."""
    cat = xid_catalog()
    entry = cat.codes.get(code)
    bucket = entry.immediate if entry is not None else "CONTACT_SUPPORT"
    return bucket, cat.actions.get(bucket, bucket)


def xid_scope(code: int) -> str:
    entry = xid_entry(code)
    return entry.scope if entry is not None else "node"


def _remap_known(g: Gpu | None) -> bool:
    r = g.remapped_rows if g is not None else None
    return r is not None and (r.pending is not None or r.failure is not None)


def _xid_parts(events: list[XidEvent], gpus: list[Gpu]) -> tuple[list[str], Severity, dict[str, str]]:
    """One text per code (meaning, where, count, action), the worst severity, code -> immediate action."""
    by_code: dict[int, list[XidEvent]] = {}
    for ev in events:
        by_code.setdefault(ev.code, []).append(ev)
    worst: Severity = "info"
    parts = []
    actions: dict[str, str] = {}
    for code, evs in sorted(by_code.items(), key=lambda kv: -SEVERITY_RANK[xid_meaning(kv[0])[1]]):
        meaning, sev = xid_meaning(code)
        if SEVERITY_RANK[sev] > SEVERITY_RANK[worst]:
            worst = sev
        bucket, todo = xid_action(code)
        actions[str(code)] = bucket
        where = sorted({ev.pci or "?" for ev in evs})
        idx = sorted({i for i in (_xid_gpu(ev, gpus) for ev in evs) if i is not None})
        gpu = f" (GPU {gpu_list(idx)})" if idx else ""
        parts.append(f"Xid {code} ({meaning}) on {', '.join(where[:4])}{gpu}" +
                     (f" x{len(evs)}" if len(evs) > 1 else "") + f": {bucket}, {todo}")
    return parts, worst, actions


def _xid(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """This boot's Xid lines: node and memory faults fail gpu.xid with the catalogue's action; the
    application's own codes go to gpu.xid_application; 63/64 on a GPU whose row-remapping state was read
    are left to gpu.remapped_rows (the remap is judged there, as gpud does)."""
    log = f.driver.kernel_log
    if log is None or log.status != "ok":
        if not c.driver_failed and f.driver.kernel_module.loaded is not False:
            reason = log.reason if log is not None else "not read by this collector (facts before schema 1.1)"
            e.unknown("gpu.xid", "the kernel log's Xid events", reason)
        return
    if not log.xid:
        return
    by_index = {g.index: g for g in f.driver.gpus}
    node: list[XidEvent] = []
    app: list[XidEvent] = []
    remap: list[XidEvent] = []
    for ev in log.xid:
        index = _xid_gpu(ev, f.driver.gpus)
        if ev.code in (63, 64) and _remap_known(by_index.get(index) if index is not None else None):
            remap.append(ev)
        elif xid_scope(ev.code) == "application":
            app.append(ev)
        else:
            node.append(ev)
    if node:
        parts, worst, actions = _xid_parts(node, f.driver.gpus)
        e.fail("gpu.xid", "kernel log since boot: " + "; ".join(parts[:6]),
               {"source": log.source, "codes": sorted({ev.code for ev in node}), "actions": actions,
                "left_to_remapped_rows": sorted({ev.code for ev in remap}),
                "events": [ev.model_dump() for ev in node[-16:]]}, severity=worst)
    if app:
        parts, _worst, actions = _xid_parts(app, f.driver.gpus)
        e.fail("gpu.xid_application", "application Xids since boot (usually the application's own fault): "
               + "; ".join(parts[:6]),
               {"source": log.source, "codes": sorted({ev.code for ev in app}), "actions": actions,
                "events": [ev.model_dump() for ev in app[-16:]]})


def _xid_recurring(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """A node or memory Xid in two or more boots (this one and the journal's earlier ones): hardware inspection."""
    log = f.driver.kernel_log
    history = log.history if log is not None else None
    if history is None:
        return
    if history.status != "ok":
        if not c.driver_failed and f.driver.kernel_module.loaded is not False:
            e.unknown("gpu.xid_recurring", "the Xid lines of earlier boots", history.reason)
        return
    boots: dict[int, set[int]] = {}
    current = log.xid if log is not None and log.status == "ok" else []
    for offset, events in [(0, current), *((b.offset, b.xid) for b in history.boots)]:
        for ev in events:
            if xid_scope(ev.code) != "application" and xid_action(ev.code)[0] != "IGNORE":
                boots.setdefault(ev.code, set()).add(offset)
    need = e.ct.target.health.xid_recurring_boots
    repeated = {code: sorted(seen, reverse=True) for code, seen in boots.items() if len(seen) >= need}
    if not repeated:
        return
    parts = [f"Xid {code} ({xid_meaning(code)[0]}) in boots {', '.join(str(b) for b in seen)}"
             for code, seen in sorted(repeated.items())]
    e.fail("gpu.xid_recurring", "the same Xid survived a reboot: " + "; ".join(parts[:6]) +
           f": {xid_catalog().actions['HARDWARE_INSPECTION']}",
           {"codes": {str(k): v for k, v in repeated.items()}, "boots_read": [b.offset for b in history.boots],
            "boots_listed": history.boots_listed, "action": "HARDWARE_INSPECTION"})


def _ecc_correctable(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """Correctable ECC counts (volatile or aggregate) against the target's threshold (Azure's check_gpu_ecc)."""
    gpus = f.driver.gpus
    if not gpus or c.driver_failed:
        return
    limit = e.ct.target.health.ecc_correctable_max
    over: dict[str, Any] = {}
    for g in gpus:
        ecc = g.ecc
        if ecc is None:
            continue
        counts = [v for v in (ecc.volatile_corrected, ecc.aggregate_corrected) if v is not None]
        if counts and max(counts) > limit:
            over[str(g.index)] = {"volatile_corrected": ecc.volatile_corrected,
                                  "aggregate_corrected": ecc.aggregate_corrected}
    if over:
        first = next(iter(over))
        worst = max(v for v in over[first].values() if v is not None)
        e.fail("gpu.ecc_correctable", f"correctable ECC errors above {limit:,} on GPU "
               f"{gpu_list([int(i) for i in over])} ({worst:,} on GPU {first})",
               {"gpus": over, "threshold": limit})


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
    _gpu_count, _persistence, _fabric_state, _fabric_health, _nvlink, _gpu_in_use, _ecc, _remapped_rows, _xid,
    _xid_recurring, _ecc_correctable, _gpu_counters, _throttle, _pcie_link,
)
