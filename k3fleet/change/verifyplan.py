"""What the night's verify proves beyond the driver, NVML and Fabric Manager (docs/change-night.md
"Verify steps"): the container CUDA probe, the NCCL all-reduce within the node, IMEX read again, and after
the canary the NCCL pair test between the canary and one unchanged node when the fleet needs RDMA.

Decided here, once per night, from the target and the gating audit; the play only runs and judges what
this record says (extra var ``k3fleet_verify``) and journals each step with its result or the reason it did
not run. A step is never skipped silently: every skip carries its reason, and a skip the operator chose
(an accepted finding) names the finding and the pattern.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from k3fleet.models.findings import HostVerdict, StrategyDecision
from k3fleet.models.target import Target


def _accepted(host: HostVerdict | None, family: str, accept: Sequence[str]) -> list[str]:
    """``finding (pattern)`` for each of ``host``'s ``family.*`` findings an ``--accept-finding`` pattern covers."""
    out: list[str] = []
    for f in host.findings if host is not None else []:
        if not f.check_id.startswith(family + "."):
            continue
        for p in accept:
            if fnmatch.fnmatchcase(f.check_id, p):
                out.append(f"{f.check_id} ({p})")
                break
    return sorted(set(out))


def _probe_skip(host: HostVerdict | None, target: Target, accept: Sequence[str]) -> str | None:
    if not target.container.require_probe:
        return "the target does not require it (container.require_probe: false)"
    accepted = _accepted(host, "container", accept)
    if accepted:
        return ("the operator accepted the audit's container findings on this host with --accept-finding: "
                + ", ".join(accepted))
    return None


def _pair_partner(audited: Mapping[str, HostVerdict], canary: str, order: Sequence[str]) -> str | None:
    """An unchanged node with the canary's GPUs: the waves' hosts first (they are changed after the pair test
    anyway), then any other host the audit saw ok, by name."""
    c = audited.get(canary)
    if c is None or c.gpu_count is None:
        return None
    others = [h for h in order if h != canary] + sorted(h for h in audited if h != canary and h not in order)
    for h in others:
        v = audited.get(h)
        if v is not None and v.status != "unreachable" and (v.gpu_model, v.gpu_count) == (c.gpu_model, c.gpu_count):
            return h
    return None


def canary_pair(audited: Mapping[str, HostVerdict], strategy: StrategyDecision | None, target: Target, canary: str,
                order: Sequence[str], accept: Sequence[str]) -> dict[str, Any]:
    """The pair test after the canary: ``needed`` and why, the partner, the ranks per node and the floor."""
    s = strategy
    if s is None:
        return {"needed": False, "reason": "the audit chose no serving strategy: nothing says the fleet needs RDMA",
                "peer": None}
    if not s.rdma_required:
        return {"needed": False, "peer": None,
                "reason": f"the audit's serving strategy {s.strategy} keeps each replica on one node "
                          "(rdma_required false): no traffic crosses nodes"}
    c = audited.get(canary)
    accepted = _accepted(c, "rdma", accept)
    if accepted:
        return {"needed": True, "run": False, "accepted": True, "peer": None,
                "reason": "the operator accepted the audit's RDMA findings on the canary with --accept-finding: "
                          + ", ".join(accepted)}
    peer = _pair_partner(audited, canary, order)
    floor = target.active.nccl_pair_busbw_min_gbs.get((c.gpu_model if c else None) or "")
    out: dict[str, Any] = {"needed": True, "run": peer is not None, "accepted": False, "peer": peer,
                           "gpus": c.gpu_count if c else None, "gpu_model": c.gpu_model if c else None,
                           "min_busbw_gbs": floor,
                           "reason": f"the audit's serving strategy {s.strategy} spans nodes (rdma_required)"}
    if peer is None:
        out["reason"] += (f"; no other node the audit saw has the canary's GPUs "
                          f"({c.gpu_count if c else '?'}x {c.gpu_model if c else '?'}) to pair with")
    return out


def verify_plan(target: Target, audited: Mapping[str, HostVerdict], strategy: StrategyDecision | None, canary: str,
                hosts: Sequence[str], accept: Sequence[str], probe_timeout: int) -> dict[str, Any]:
    """The extra var ``k3fleet_verify``: per host the probe (or why not) and the within-node NCCL floor, the
    NCCL spec and timeout, and the canary's pair test."""
    per_host: dict[str, Any] = {}
    for h in hosts:
        v = audited.get(h)
        model = v.gpu_model if v else None
        per_host[h] = {"probe_skip": _probe_skip(v, target, accept), "gpus": v.gpu_count if v else None,
                       "gpu_model": model, "nccl_min_busbw_gbs": target.active.nccl_busbw_min_gbs.get(model or "")}
    return {
        "probe_timeout": int(probe_timeout),
        "nccl_timeout": int(target.active.timeouts.nccl_s),
        # What k3fleet_nccl_pair_info reads, as the audit's active checks give it (k3fleet.audit.run.active_spec).
        "active_spec": {"nccl_max_bytes": target.active.nccl_max_bytes, "nccl_timeout_s": target.active.timeouts.nccl_s,
                        "nccl_pair_launcher": list(target.active.nccl_pair_launcher)},
        "rdma_networks": list(target.active.nccl_rdma_networks),
        "hosts": per_host,
        "canary_pair": canary_pair(audited, strategy, target, canary, hosts, accept),
    }
