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

One module per concern holds its checks' catalogue entries and their rules: driver, gpu (count,
fabric, health), packages, fabric (Fabric Manager, IMEX), rdma (and NCCL), container, workloads,
active, scheduler. base.py holds what they share; engine.py runs them (docs/architecture.md
"Adding a check").
"""

from __future__ import annotations

from k3fleet.verdict.rules.base import CompiledTarget, HostContext, host_context, release_key
from k3fleet.verdict.rules.engine import RULES, RuleCache, evaluate_host, rule_key, run_rules
from k3fleet.verdict.rules.packages import DRIVER_ROLES
from k3fleet.verdict.rules.rdma import host_rails, missing_hcas
from k3fleet.verdict.rules.scheduler import state_words
from k3fleet.verdict.rules.workloads import tenants

__all__ = [
    "DRIVER_ROLES",
    "RULES",
    "CompiledTarget",
    "HostContext",
    "RuleCache",
    "evaluate_host",
    "host_context",
    "host_rails",
    "missing_hcas",
    "release_key",
    "rule_key",
    "run_rules",
    "state_words",
    "tenants",
]
