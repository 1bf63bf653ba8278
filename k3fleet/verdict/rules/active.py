"""Active checks (audit --active; docs/facts.md section 17): DCGM diagnostic, NCCL bandwidth in the node, RDMA loopback
bandwidth. The pair check between nodes is k3fleet.verdict.pairs'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts
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


def _active_dcgm(f: HostFacts, c: HostContext, e: Emitter) -> None:
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
        parts = [f"{t.name} fails" + (f" on GPU {gpu_list(t.failed_gpus)}" if t.failed_gpus else "")
                 + (f" ({t.details[0]['text'][:160]})" if t.details else "") for t in failed]
        e.fail("active.dcgm_diag", f"dcgmi diag -r {d.level}: " + "; ".join(parts[:3]), ev)
    elif bad:
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


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (_active_dcgm, _active_nccl, _active_ib,)
