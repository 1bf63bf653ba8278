"""RDMA and NCCL checks: rails up at rate and their count, GPUDirect RDMA, PCIe ACS, NCCL settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import Severity
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import CompiledTarget, Emitter, HostContext, counter_delta

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("rdma.port_state", "RDMA rails up at full rate",
          "A rail that is DOWN, not LinkUp or below the expected rate slows or breaks cross-node traffic.",
          "error",
          "Check cabling and the subnet manager (ibstat, ibstatus); on RoCE check the switch port.",
          source='docs/facts.md section 6 (sysfs 4: ACTIVE, 5: LinkUp, 400 Gb/sec (4X NDR))'),
    check("rdma.rail_count", "Expected number of RDMA rails",
          "Multi-node serving expects {rails_per_node} rails per node; fewer rails mean less bandwidth.",
          "error",
          "Check that every HCA is present (lspci, ibv_devices) and its driver (mlx5_core) is loaded.",
          source='docs/facts.md section 6'),
    check("rdma.port_counters", "RDMA port error counters quiet",
          "Sampled twice within the audit's visit, an InfiniBand port's counters say what the link does now: a "
          "link_downed or excessive_buffer_overrun_errors increase drops a lossless fabric's packets and ends "
          "any NCCL job on it; symbol errors, receive errors and link error recoveries above their rate mean a "
          "cable or transceiver wearing out.",
          "error",
          "Drain the node from multi-node serving; check the cable, transceiver and switch port (mlxlink, "
          "ibdiagnet), reseat or replace the cable, then re-audit.",
          source='docs/facts.md section 14 (sysfs counters; NVSentinel NIC Health Monitor thresholds)'),
    check("rdma.link_flap", "RDMA links not flapping",
          "A port that went down during the audit (link_downed increased) or whose interface lost its carrier "
          "repeatedly in the kernel log flaps: every flap aborts the NCCL communicators on it.",
          "error",
          "Drain the node; check the cable, transceiver and switch port logs, replace the flapping cable, and "
          "re-audit after a quiet interval.",
          source='docs/facts.md section 14 (link_downed delta; Azure azurehpc-health-checks '
          'customTests/azure_ib_link_flapping.nhc: "ib.*lost carrier" in the kernel log)'),
    check("rdma.gpu_nic_topology", "Each GPU's nearest NIC on its own PCIe switch",
          "GPUDirect RDMA moves each GPU's traffic through its nearest NIC; a GPU whose nearest NIC sits behind the "
          "host bridge (PHB), across host bridges (NODE) or across the socket (SYS in nvidia-smi topo -m) crosses "
          "the CPU's interconnect and loses about half its bandwidth. The SKUs this target serves put a NIC under "
          "each GPU's PCIe switch ({gpu_nic_distance}); each GPU's NUMA affinity is recorded beside it.",
          "error",
          "Check the NIC population and the PCIe slot of each HCA against the system's topology guide, the BIOS's "
          "PCIe settings, and NCCL_IB_HCA's order; on a VM, the VM's NUMA and PCIe layout.",
          source='docs/facts.md section 6 (nvidia-smi topo -m legend; Azure azurehpc-health-checks '
          'check_hw_topology: GPU/NIC NUMA against the SKU)'),
    check("rdma.peermem", "GPUDirect RDMA available",
          "Without nvidia_peermem or DMA-BUF, NCCL bounces GPU traffic through host memory.",
          "error",
          "modprobe nvidia_peermem (and persist it), or use open kernel modules with DMA-BUF "
          "(do not set NCCL_DMABUF_ENABLE=0).",
          source='docs/facts.md sections 1 and 6 (NCCL_DMABUF_ENABLE=0 falls back to nvidia_peermem)'),
    check("rdma.acs", "PCIe ACS not redirecting peer-to-peer",
          "ACS SrcValid+ on PCIe bridges silently routes GPU peer-to-peer traffic through the root complex.",
          "warning",
          "Disable ACS on the PCIe switches (setpci or BIOS) on bare-metal GPU nodes.",
          source='docs/facts.md section 6 (lspci -vvv ACSCtl SrcValid+)'),
    check("nccl.debug", "NCCL debug logging off",
          "NCCL_DEBUG=INFO/TRACE is for debugging; it floods logs and slows start-up in production.",
          "warning",
          "Remove NCCL_DEBUG (or set WARN) from the environment and /etc/nccl.conf.",
          source='docs/facts.md section 6 (debug settings should not stay in production)'),
    check("nccl.settings", "NCCL settings as required",
          "The target may require NCCL settings (e.g. for MNNVL); NCCL_IB_HCA must name HCAs that exist.",
          "error",
          "Set the required NCCL variables in /etc/nccl.conf or the serving environment; fix NCCL_IB_HCA.",
          source='docs/facts.md sections 1 and 6 (MNNVL settings, NCCL_IB_HCA)'),
)


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


def _rdma(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


def _gpudirect(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


def _acs(f: HostFacts, c: HostContext, e: Emitter) -> None:
    rd = f.rdma
    sev: Severity = "error" if e.ct.rdma_required else "warning"
    if rd.acs_enabled_bridges:
        e.fail("rdma.acs", f"ACS SrcValid+ is set on {len(rd.acs_enabled_bridges)} PCIe bridge(s): "
               "GPU peer-to-peer traffic goes through the root complex",
               {"bridges": rd.acs_enabled_bridges[:32]}, severity=sev)
    elif not rd.acs_checked:
        e.unknown("rdma.acs", "PCIe ACS state", rd.acs_reason)


def _nccl(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


def _port_counters(f: HostFacts, c: HostContext, e: Emitter) -> None:
    counters = f.rdma.counters
    if counters is None or not counters.ports:
        return
    t = e.ct.target.health.counter_thresholds(c.gpu_names)
    secs = counters.interval_s
    fatal: list[str] = []
    rate: list[str] = []
    flapped: list[str] = []
    detail: dict[str, Any] = {}
    for port, values in counters.ports.items():
        d = {name: counter_delta(pair) for name, pair in values.items()}
        if "link_downed" in d and d["link_downed"] > t.ib_link_downed_max:
            flapped.append(f"{port} went down {d['link_downed']} time(s) in {secs} s")
        if d.get("excessive_buffer_overrun_errors", 0) > t.ib_buffer_overrun_max:
            fatal.append(f"{port} excessive_buffer_overrun_errors +{d['excessive_buffer_overrun_errors']}")
        for name, limit, per, unit in (("symbol_error", t.ib_symbol_error_per_second, 1, "s"),
                                       ("port_rcv_errors", t.ib_port_rcv_errors_per_second, 1, "s"),
                                       ("link_error_recovery", t.ib_link_error_recovery_per_minute, 60, "min")):
            if name in d and d[name] * per / secs > limit:
                rate.append(f"{port} {name} +{d[name]} in {secs} s ({d[name] * per / secs:.1f}/{unit}, "
                            f"limit {limit:g}/{unit})")
        if any(d.values()):
            detail[port] = {name: values[name] for name in values}
    ev = {"interval_s": secs, "ports": detail, "thresholds": t.model_dump(exclude={"source"}), "source": t.source}
    if flapped:
        e.fail("rdma.link_flap", "RDMA link flapped during the audit: " + "; ".join(flapped[:8]), ev)
    if fatal:
        e.fail("rdma.port_counters", "RDMA port dropped packets during the audit: " + "; ".join(fatal[:8]), ev)
    if rate:
        e.fail("rdma.port_counters", "RDMA port errors above their rate: " + "; ".join(rate[:8]), ev,
               severity="warning")


def _kernel_flaps(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """Azure's link-flap check: an IB interface that lost its carrier twice or more in the kernel log."""
    log = f.driver.kernel_log
    if log is None or log.status != "ok" or not log.ib_carrier_lost:
        return
    by_iface: dict[str, int] = {}
    for ev in log.ib_carrier_lost:
        by_iface[ev.iface] = by_iface.get(ev.iface, 0) + 1
    flapping = {iface: n for iface, n in by_iface.items() if n >= 2}
    if flapping:
        shown = "; ".join(f"{iface} lost its carrier {n} times" for iface, n in sorted(flapping.items()))
        e.fail("rdma.link_flap", f"RDMA link flapping in the kernel log since boot: {shown}",
               {"interfaces": flapping, "events": [ev.model_dump() for ev in log.ib_carrier_lost[-16:]],
                "source": log.source})


def _gpu_nic_topology(f: HostFacts, c: HostContext, e: Emitter) -> None:
    topo = f.driver.topology
    if not e.ct.rdma_required or topo is None or not f.driver.gpus or c.driver_failed:
        return
    if topo.status != "ok":
        e.unknown("rdma.gpu_nic_topology", "the GPUs' nearest NICs (nvidia-smi topo -m)", topo.reason)
        return
    if not topo.nics:
        if f.rdma.devices:
            e.unknown("rdma.gpu_nic_topology", "the GPUs' nearest NICs",
                      "nvidia-smi topo -m lists no NIC although the node has RDMA devices")
        return
    allowed = e.ct.target.rdma.gpu_nic_distance
    far = {i: g for i, g in topo.gpus.items() if g.distance is not None and g.distance not in allowed}
    ev = {"gpus": {i: g.model_dump() for i, g in topo.gpus.items()}, "nics": topo.nics, "allowed": list(allowed)}
    if far:
        shown = "; ".join(f"GPU {i} nearest {g.nearest_nic} at {g.distance}" for i, g in list(far.items())[:8])
        e.fail("rdma.gpu_nic_topology", f"a GPU's nearest NIC is not on its PCIe switch ({'/'.join(allowed)}): "
               f"{shown}", ev)


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    _rdma, _port_counters, _kernel_flaps, _gpu_nic_topology, _acs, _nccl,
)
