"""Other tenants' CUDA work against the target driver: which keeps working, which breaks.

The rule (docs/facts.md section 16, NVIDIA's CUDA compatibility guide): a newer driver runs
user space built for an older CUDA (backward compatibility), so CUDA 12.x containers and processes
keep working on R580. What breaks is a forward-compatibility user-mode driver
(``cuda-compat-<major>-<minor>``, a libcuda of the branch that CUDA release shipped with) loaded
against a newer kernel module: an R575 libcuda from ``cuda-compat-12-9`` on the R580 kernel module
fails CUDA initialisation (error 803, "system has unsupported display driver / cuda driver
combination"). A requirement above the target's maximum CUDA breaks too. NVIDIA's images carry
``cuda-compat`` (``NV_CUDA_COMPAT_PACKAGE``) without putting it on the library path; that alone
breaks nothing (the toolkit uses it only when it is newer than the host's driver).

Pure: facts and target values in, a list of per-tenant judgements out. Anything this cannot tell
is ``unknown``, never "keeps working".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from k3fleet.models.facts import TenantContainer, TenantProcess, WorkloadFacts
from k3fleet.models.target import CudaDriverMatrix, cuda_tuple, version_tuple

Outcome = Literal["keeps", "breaks", "unknown"]

_REQUIRE_CUDA = re.compile(r"cuda>=(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)
# cuda-compat-12-9, /usr/local/cuda-12.9/compat
_COMPAT_CUDA = re.compile(r"cuda(?:-compat)?-(\d+)[-.](\d+)")


@dataclass(frozen=True, slots=True)
class Tenant:
    who: str
    outcome: Outcome
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"who": self.who, "outcome": self.outcome, "why": self.why}


def compat_branch_for(matrix: CudaDriverMatrix) -> Callable[[str | None], int | None]:
    """``cuda-compat-12-9`` (or a ``cuda-12.9/compat`` path) -> the driver branch its libcuda is from."""

    def branch(text: str | None) -> int | None:
        m = _COMPAT_CUDA.search(text or "")
        if not m:
            return None
        row, _ = matrix.row_for(f"{m.group(1)}.{m.group(2)}")
        v = version_tuple(row.min_driver) if row is not None else None
        return v[0] if v else None

    return branch


def _container_who(c: TenantContainer) -> str:
    name = c.name or (c.id or "?")[:12]
    return f"container {name} (image {c.image or '?'})"


def _process_who(p: TenantProcess) -> str:
    return f"process {p.pid} ({p.name or '?'}, GPU {','.join(str(g) for g in p.gpus if g is not None) or '?'})"


def _cuda_of(c: TenantContainer) -> tuple[str | None, str]:
    if c.cuda_version and cuda_tuple(c.cuda_version):
        return c.cuda_version, "CUDA_VERSION"
    m = _REQUIRE_CUDA.search(c.nvidia_require_cuda or "")
    return (m.group(1), "NVIDIA_REQUIRE_CUDA") if m else (None, "")


def _too_new(cuda: str, target_max: tuple[int, int] | None) -> bool:
    want = cuda_tuple(cuda)
    return bool(want and target_max and want[:2] > target_max)


def _compat_break(branch: int | None, target_branch: int, what: str) -> str | None:
    if branch is None or branch >= target_branch:
        return None
    return (f"{what}: the forward-compatibility libcuda of R{branch} fails CUDA initialisation on the "
            f"R{target_branch} kernel module (error 803)")


def _loaded_compat(p: TenantProcess, target_branch: int) -> str | None:
    if not p.libcuda_compat or not p.libcuda_version:
        return None
    v = version_tuple(p.libcuda_version)
    return _compat_break(v[0] if v else None, target_branch, f"loaded {p.libcuda}")


def judge_tenants(w: WorkloadFacts, target_branch: int, target_max: tuple[int, int] | None,
                  compat_branch: Callable[[str | None], int | None]) -> list[Tenant]:
    """One judgement per GPU-using container, per GPU process outside a container and per host compat package."""
    out: list[Tenant] = []
    tmax = f"CUDA {target_max[0]}.{target_max[1]}" if target_max else "the target's CUDA"
    procs = {p.pid: p for p in w.processes}
    for c in w.containers:
        if c.uses_gpu is False:
            continue
        who = _container_who(c)
        broken = [why for why in (_loaded_compat(procs[pid], target_branch) for pid in c.gpu_pids if pid in procs)
                  if why]
        if c.compat_on_path and not broken:
            why = _compat_break(compat_branch(c.compat_package or c.compat_on_path), target_branch,
                                f"{c.compat_package or 'the compat package'} on LD_LIBRARY_PATH ({c.compat_on_path})")
            if why:
                broken.append(why)
        cuda, src = _cuda_of(c)
        if cuda and _too_new(cuda, target_max):
            broken.append(f"it asks for CUDA {cuda} ({src}), newer than R{target_branch}'s maximum {tmax}")
        if broken:
            out.append(Tenant(who, "breaks", "; ".join(broken)))
        elif cuda:
            unused = (f"; its {c.compat_package} is not on the library path, so it is not used"
                      if c.compat_package else "")
            out.append(Tenant(who, "keeps", f"CUDA {cuda} user space ({src}) runs on R{target_branch} "
                                            f"(backward compatible){unused}"))
        else:
            gpu = "uses the GPUs" if c.uses_gpu else "may use the GPUs"
            out.append(Tenant(who, "unknown", f"{gpu}; its environment names no CUDA_VERSION or "
                                              "NVIDIA_REQUIRE_CUDA"))
    for p in w.processes:
        if p.container_id:
            continue  # judged with its container
        who = _process_who(p)
        why = _loaded_compat(p, target_branch)
        if why:
            out.append(Tenant(who, "breaks", why))
        elif p.cudart_version and _too_new(p.cudart_version, target_max):
            out.append(Tenant(who, "breaks", f"its libcudart {p.cudart_version} is newer than {tmax}"))
        elif p.libcuda or p.cudart_version:
            rt = f"libcudart {p.cudart_version}" if p.cudart_version else "CUDA"
            out.append(Tenant(who, "keeps", f"{rt} on the host driver's libcuda ({p.libcuda or '?'}), which "
                                            f"the change replaces with R{target_branch}'s (backward compatible)"))
        else:
            why_not = "its memory map could not be read" if not p.maps_read else "it mapped no libcuda"
            out.append(Tenant(who, "unknown", f"outside any container and {why_not}"))
    for pkg in w.compat_packages:
        v = version_tuple(pkg.version.split(":", 1)[-1] if pkg.version else None)
        branch = int(pkg.branch) if pkg.branch and pkg.branch.isdigit() else (v[0] if v else None)
        why = _compat_break(branch, target_branch, f"{pkg.version}")
        if why:
            out.append(Tenant(f"host package {pkg.name}", "breaks",
                              why + " in any process that loads it from /usr/local/cuda-*/compat"))
    return out


def summary(tenants: list[Tenant], target_branch: int) -> str:
    """One line for the plan: what keeps working on the target branch, what breaks, what is unknown."""
    parts = []
    for outcome, label in (("breaks", "break"), ("unknown", "unknown"), ("keeps", "keep working")):
        who = [t.who for t in tenants if t.outcome == outcome]
        if who:
            parts.append(f"{label}: {', '.join(who[:6])}{' ...' if len(who) > 6 else ''}")
    return f"other tenants' CUDA work on R{target_branch}: " + "; ".join(parts)
