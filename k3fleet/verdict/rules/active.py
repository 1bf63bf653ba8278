"""Active checks (audit --active; docs/facts.md section 17): DCGM diagnostic, NCCL bandwidth in the node, RDMA loopback
bandwidth. The pair check between nodes is k3fleet.verdict.pairs'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import DcgmCode, DcgmTest, HostFacts
from k3fleet.targets import dcgm_errors
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import Emitter, HostContext, gpu_list

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("active.dcgm_diag", "DCGM diagnostic passes",
          "dcgmi diag loads every GPU (memory, compute, PCIe, NVLink at levels 2-4) and names the test and GPU "
          "that fails: state a node reports can look right while a GPU fails real work. Run only with "
          "audit --active, never on a node whose GPUs are in use.",
          "error",
          "Drain the node; read the failing test's Warning/Info lines in the evidence, reset the GPU it names (or "
          "reboot), run dcgmi diag -r 3 again and RMA the GPU if it fails again.",
          source='docs/facts.md section 17 (NVIDIA DCGM user guide: dcgmi diag run levels 1-4; the result table per '
          'test and GPU)'),
    check("active.nccl_busbw", "NCCL all-reduce bandwidth within the node",
          "all_reduce_perf (nccl-tests) over every GPU of the node measures the bus bandwidth the serving "
          "engine's tensor-parallel all-reduce gets; its peak at the largest message is judged against the "
          "target's floor for the GPU model (active.nccl_busbw_min_gbs), and #wrong results mean corrupted data.",
          "error",
          "Check the NVLink/NVSwitch state (nvidia-smi nvlink -s, Fabric Manager), NCCL settings (NCCL_ALGO, "
          "NCCL_P2P_DISABLE) and PCIe ACS, then rerun with audit --active full.",
          source='docs/facts.md section 17 (nccl-tests PERFORMANCE.md: busbw; nccl-tests issue 212: ~480 GB/s peak '
          'on 8 NVLink4 GPUs)'),
    check("active.nccl_transport", "NCCL inside the node over P2P (NVLink)",
          "The within-node all_reduce_perf runs with NCCL_DEBUG=INFO; its channel lines say how the GPUs reach "
          "each other. On an NVSwitch node every channel must go over P2P (NVLink): channels via SHM or NET mean "
          "the GPUs do not see each other's memory (ACS, IOMMU, NCCL_P2P_DISABLE), whatever the bandwidth a small "
          "message reaches; NVLS (and MNNVL on an NVLink rack) is asserted where the target asks for it.",
          "error",
          "Check PCIe ACS and the IOMMU (rdma.acs), NCCL_P2P_DISABLE / NCCL_P2P_LEVEL and the Fabric Manager; for "
          "NVLS the NVSwitch driver and CUDA 12.1+; rerun with audit --active full.",
          source='docs/facts.md section 6 (NCCL_DEBUG=INFO channel lines "via P2P/IPC", "via NET/Socket"; NVIDIA '
          'AICR validation: NVLS/MNNVL asserted from the INFO lines)'),
    check("active.ib_write_bw", "RDMA rails reach their bandwidth",
          "A loopback ib_write_bw on each active rail measures what the HCA and its PCIe path carry; a rail "
          "well below its rate slows every cross-node collective. The path between nodes is "
          "active.nccl_pair_busbw's.",
          "error",
          "Check the HCA's PCIe link (lspci -vvv LnkSta), its firmware and NUMA placement, then the cable and "
          "switch port; rerun with audit --active full.",
          source='docs/facts.md section 17 (perftest ib_write_bw: BW average[Gb/sec])'),
)


def _active_gate(f: HostFacts, e: Emitter, check: str, what: str) -> bool:
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


def _tool_unknown(e: Emitter, check: str, what: str, tool: Any) -> bool:
    if tool is None:
        return True  # not part of this level
    if not tool.ran or tool.error:
        e.unknown(check, what, tool.reason or tool.error)
        return True
    return False


# dcgmi returns DCGM_ST_NVVS_ERROR (-30) as the unsigned exit status 226 (NVIDIA/DCGM issue 158).
NVVS_ERROR_RC = 226


def code_text(code: DcgmCode) -> str:
    """ "DCGM_FR_CUDA_CONTEXT (Cannot create a CUDA context on this GPU; TRIAGE: run a field diagnostic)"."""
    cat = dcgm_errors()
    entry = cat.codes.get(code.id)
    name = entry.name if entry else f"DCGM_FR code {code.id}"
    sev = cat.severities.get(code.severity) if code.severity is not None else None
    tail = f"; {sev.name}: {sev.action}" if sev else ""
    return f"{name} ({entry.meaning if entry else 'not in the packaged code list'}{tail})"


def _could_not_run(t: DcgmTest) -> bool:
    cat = dcgm_errors()
    return bool(t.codes) and all((cat.codes.get(c.id) is not None and cat.codes[c.id].could_not_run)
                                 or c.category == 16 for c in t.codes)


def known_false_result(t: DcgmTest, level: int | None) -> str | None:
    """A documented false result of DCGM's diagnostic, or None."""
    text = " ".join(d.get("text", "") for d in t.details)
    if t.result == "fail" and "nvbandwidth" in t.name.lower() and "MCUTIL" in text and (level or 0) >= 3:
        return ("nvbandwidth fails 'MCUTIL > 10%' right after the level-3/4 GEMM burn even on an idle GPU "
                "(NVIDIA/DCGM issue 272): run the nvbandwidth test alone to judge it")
    if t.result == "pass" and any(c.id == 56 for c in t.codes):
        return ("the memory test passed while recording DCGM_FR_MEMORY_ALLOC (NVIDIA/DCGM issue 284): it did not "
                "test the memory it was configured to")
    return None


def _active_dcgm(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if not _active_gate(f, e, "active.dcgm_diag", "the DCGM diagnostic"):
        return
    assert f.active is not None
    d = f.active.dcgm
    if d is None or _tool_unknown(e, "active.dcgm_diag", f"dcgmi diag -r {d.level}", d):
        return
    if d.result is None or d.runtime_error:
        why = d.runtime_error or f"no test row in its output (exit {d.rc})"
        if d.rc == NVVS_ERROR_RC:
            why += ("; exit 226 is DCGM_ST_NVVS_ERROR, the diagnostic's own failure (NVIDIA/DCGM issue 158): "
                    "read nvvs.log and nv-hostengine.log under /var/log/nvidia-dcgm")
        e.unknown("active.dcgm_diag", f"dcgmi diag -r {d.level}'s results", why, error=True)
        return
    false_results = {t.name: reason for t in d.tests if (reason := known_false_result(t, d.level))}
    unrun = [t for t in d.tests if t.result == "fail" and _could_not_run(t) and t.name not in false_results]
    bad = [t for t in d.tests if t.result in ("fail", "warn") and t not in unrun and t.name not in false_results]
    failed = [t for t in bad if t.result == "fail"]
    ev: dict[str, Any] = {"level": d.level, "tests": [t.model_dump() for t in bad], "metadata": d.metadata,
                          "codes": {t.name: [code_text(x) for x in t.codes] for t in d.tests if t.codes},
                          "could_not_run": [t.name for t in unrun], "known_false_results": false_results}
    if failed:
        parts = [f"{t.name} fails" + (f" on GPU {gpu_list(t.failed_gpus)}" if t.failed_gpus else "")
                 + (f": {code_text(t.codes[0])}" if t.codes else
                    (f" ({t.details[0]['text'][:160]})" if t.details else "")) for t in failed]
        e.fail("active.dcgm_diag", f"dcgmi diag -r {d.level}: " + "; ".join(parts[:3]), ev)
        return
    if unrun or false_results:
        whys = [f"{t.name} could not run: {code_text(t.codes[0])}" for t in unrun]
        whys += [f"{name}: {why}" for name, why in false_results.items()]
        e.unknown("active.dcgm_diag", f"dcgmi diag -r {d.level}", "; ".join(whys[:4]), error=bool(unrun))
        if not bad:
            return
    if bad:
        e.fail("active.dcgm_diag", f"dcgmi diag -r {d.level} warns: " + ", ".join(t.name for t in bad), ev,
               severity="warning")
    elif d.rc not in (0, None):
        e.unknown("active.dcgm_diag", f"dcgmi diag -r {d.level}", d.reason or f"exit {d.rc}", error=True)


def _active_nccl(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


def _active_transport(f: HostFacts, c: HostContext, e: Emitter) -> None:
    a = f.active
    if a is None or a.skipped or a.nccl is None or not a.nccl.ran:
        return
    t = a.nccl.transport
    if t is None:
        e.unknown("active.nccl_transport", "the NCCL transport of all_reduce_perf",
                  "the run printed no NCCL INFO line (NCCL_DEBUG=INFO was not honoured)")
        return
    spec = e.ct.target.active
    ev: dict[str, Any] = t.model_dump()
    problems = []
    p2p = sum(n for k, n in t.channels.items() if k.startswith("P2P"))
    other = {k: n for k, n in t.channels.items() if not k.startswith("P2P") and k != "NVLS"}
    if spec.nccl_require_p2p and c.fm_required and (a.nccl.gpus or 0) > 1 and other and not p2p:
        problems.append("channels go over " + ", ".join(sorted(other)) + ", none over P2P (NVLink)")
    if spec.nccl_require_nvls and t.nvls is not True:
        problems.append("NVLS multicast is " + ("not available" if t.nvls is False else "not reported"))
    in_domain = any(g.fabric_cluster_uuid and set(g.fabric_cluster_uuid) - {"0", "-"} for g in f.driver.gpus)
    if in_domain and t.mnnvl_uuid in (None, "0.0"):
        problems.append("the GPUs are in a multi-node NVLink domain but NCCL saw no MNNVL fabric (set "
                        "NCCL_MNNVL_ENABLE=1, NCCL_CUMEM_ENABLE=1 and run IMEX)")
    if problems:
        e.fail("active.nccl_transport", "all_reduce_perf within the node: " + "; ".join(problems), ev)


def _active_ib(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    _active_dcgm, _active_nccl, _active_transport, _active_ib,
)
