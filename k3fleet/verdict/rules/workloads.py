"""Workload checks: other tenants' CUDA work on the target driver (docs/facts.md section 16).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import CompiledTarget, Emitter, HostContext
from k3fleet.verdict.tenants import Tenant, judge_tenants

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("workloads.cuda_compat", "Other tenants' CUDA work keeps working on the target driver",
          "The driver change moves every process on the node to the R{target_branch} driver. CUDA user space built "
          "for an older release (CUDA 12.x) keeps working on a newer driver (backward compatible); a forward-"
          "compatibility package (cuda-compat-12-*) carries the libcuda of its own older branch, and loaded on the "
          "R{target_branch} kernel module it fails CUDA initialisation (error 803). The plan lists, per host, the "
          "containers and GPU processes that keep working and those that break.",
          "error",
          "Before the change: have the owners of the tenants that break take the compat directory off "
          "LD_LIBRARY_PATH (or rebuild on a CUDA the R{target_branch} driver runs), remove the host's old "
          "cuda-compat packages, and find out what the unknown ones run; or accept the finding for the night "
          "(--accept-finding workloads.cuda_compat), which is recorded in change.json.",
          source='docs/facts.md section 16 (NVIDIA CUDA compatibility guide: backward compatibility, '
          'forward-compatibility package cuda-compat-<major>-<minor> built from one driver branch; CUDA error 803)'),
)


def tenants(f: HostFacts, ct: CompiledTarget) -> list[Tenant] | None:
    """Other tenants' CUDA work judged against the target driver; None when the facts lack it."""
    w = f.container.workloads
    if w is None:
        return None
    return judge_tenants(w, ct.branch, ct.target_max_cuda, ct.compat_branch)


def _tenants(f: HostFacts, c: HostContext, e: Emitter) -> None:
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


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (_tenants,)
