"""Driver checks: the facts schema, the kernel module, NVML, the driver's branch, version, platform and flavour, a
pending reboot.
"""

from __future__ import annotations

from collections.abc import Callable

from k3fleet.models.facts import SCHEMA_VERSION, HostFacts, readable_schema
from k3fleet.models.findings import Severity
from k3fleet.models.target import version_tuple
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import CompiledTarget, Emitter, HostContext

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("facts.schema", "Host facts readable",
          "Facts that do not validate, or come from another schema major version, cannot be judged.",
          "error",
          "Deploy the collector modules that match this controller and re-run the audit.",
          source='docs/architecture.md "Contracts" (host facts schema)'),
    check("driver.loaded", "NVIDIA kernel module loaded",
          "Without the kernel module no GPU is usable and nothing else about the driver can be trusted.",
          "critical",
          "Install the R{target_branch} driver packages, then load the module (modprobe nvidia) or reboot.",
          source='docs/facts.md section 5 (/proc/driver/nvidia/version exists only while nvidia.ko is loaded)'),
    check("nvml.status", "NVML answers",
          "NVML is how the driver reports GPUs; its error names the failure (library missing, GPU lost).",
          "error",
          "Fix the NVML error shown in the evidence: install the driver's user-space libraries, "
          "or reset/reseat a lost GPU.",
          source='docs/facts.md section 5 (nvidia-ml-py 13.615.71 NVMLError classes)'),
    check("driver.branch", "Driver branch new enough for the image's CUDA",
          "The image is built for CUDA {image_cuda}, which needs an R{target_branch}-or-newer driver; "
          "older branches cannot initialise it.",
          "critical",
          "Upgrade the driver to {target_version} (R{target_branch}) together with the matching Fabric Manager "
          "in the change night.",
          chain=True,
          source='docs/facts.md sections 1-2 (vLLM Kimi K3 recipe: cu130 image, R580 or newer; CUDA compatibility '
          'guide)'),
    check("driver.version_min", "Driver at or above the matrix minimum",
          "The CUDA -> driver matrix gives {min_driver} as the minimum for CUDA {image_cuda}.",
          "error",
          "Upgrade the driver to {target_version}.",
          chain=True,
          source='docs/facts.md section 2 (CUDA 13.2 U2 release notes, table 3: 13.0 GA needs 580.65.06)'),
    check("driver.platform", "A data-center driver platform",
          "A Jetson (Tegra, L4T) board reports its L4T release or a Tegra driver as the module version, and a "
          "version of another shape belongs to no known platform: neither is a data-center driver branch, the "
          "image's CUDA {image_cuda} build and the R{target_branch} change night do not apply to it.",
          "critical",
          "Take the board out of the serving inventory; Kimi K3 with {image} needs data-center GPUs on an "
          "R{target_branch}-or-newer driver.",
          source='docs/facts.md section 10 (Jetson L4T: nixGL issue 139, anduril/jetpack-nixos; data-center version '
          'shape)'),
    check("driver.flavour", "Open kernel modules where required",
          "Open kernel modules are required on Grace Hopper and Blackwell GPUs.",
          "critical",
          "Install the open flavour of R{target_branch} (e.g. nvidia-driver-{target_branch}-server-open or "
          "nvidia-open-{target_branch}) and reboot.",
          source='docs/facts.md section 4 (NVIDIA driver installation guide: open modules required on Grace Hopper and '
          'Blackwell)'),
    check("driver.pending_reboot", "No pending driver reboot",
          "A package upgrade without reboot leaves the old module loaded; NVML then reports "
          "Driver/library version mismatch and containers fail.",
          "error",
          "Drain the node and reboot it (or reload the nvidia modules) so the installed driver is loaded.",
          source='docs/facts.md section 4 (NVML_ERROR_LIB_RM_VERSION_MISMATCH after an upgrade without reboot)'),
    check("driver.gb200_gdr_override", "GB200 GPUDirect RDMA over PCIe NICs enabled before R595",
          "On GB200 with PCIe NICs, drivers before R595 refuse dma-buf GPUDirect RDMA unless the module is loaded "
          "with NVreg_RegistryDwords=GrdmaPciTopoCheckOverride=1; without it NCCL silently falls back to "
          "sockets between nodes.",
          "error",
          "Add options nvidia NVreg_RegistryDwords=\"GrdmaPciTopoCheckOverride=1\" to /etc/modprobe.d, reload the "
          "driver (or reboot), and check /proc/driver/nvidia/params shows GrdmaPciTopoCheckOverride: 1; or move "
          "to R595, where the override is not needed.",
          source='docs/facts.md section 6 (NVIDIA AICR docs/user/validation.md and its validator reading '
          '/proc/driver/nvidia/params)'),
)


def facts_schema(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if f.schema_version == SCHEMA_VERSION:
        return
    if not readable_schema(f.schema_version):
        e.unknown("facts.schema", f"facts of schema {f.schema_version} (controller reads {SCHEMA_VERSION})",
                  "the collector on this host is from another major version", error=True)


def _driver_loaded(f: HostFacts, c: HostContext, e: Emitter) -> None:
    drv = f.driver
    km = drv.kernel_module
    if drv.status == "absent" or km.loaded is False:
        c.driver_failed = True
        pkg = f.packages.driver_version
        installed = f"driver package {pkg} is installed" if pkg else "no driver package is recorded"
        e.fail("driver.loaded", f"the NVIDIA kernel module is not loaded ({installed})",
               {"reason": drv.reason, "package_version": pkg})
    elif km.loaded is None and not (drv.driver_version or km.version):
        c.driver_failed = True
        e.unknown("driver.loaded", "whether the NVIDIA kernel module is loaded", drv.reason, error=True)


_NVML_FAIL: dict[str, tuple[Severity, str]] = {
    "library_not_found": ("error", "libnvidia-ml.so.1 not found: the driver's user-space libraries are missing"),
    "driver_not_loaded": ("critical", "NVML reports the driver is not loaded"),
    "gpu_is_lost": ("critical", "NVML reports a GPU is lost (fallen off the bus)"),
}


def _nvml(f: HostFacts, c: HostContext, e: Emitter) -> None:
    nv = f.driver.nvml
    st = nv.status
    if st == "ok" or st == "lib_rm_version_mismatch":
        # The mismatch is reported once, as driver.pending_reboot.
        return
    if st in ("skipped", "not_installed"):
        if c.gpu_count is None and not c.driver_failed:
            e.unknown("nvml.status", f"GPU inventory (NVML {st}, no nvidia-smi data)", nv.error or f.driver.reason)
        return
    if st == "no_permission":
        e.unknown("nvml.status", "NVML (no permission)", nv.error)
        return
    if st in ("driver_not_loaded", "library_not_found") and c.driver_failed:
        # A node with no driver loaded has no NVML either: driver.loaded says it once.
        return
    sev, text = _NVML_FAIL.get(st, ("error", f"NVML failed ({st})"))
    if st == "library_not_found" and f.driver.source == "nvidia-smi" and c.gpu_count:
        # nvidia-smi reached NVML from its own link path; k3fleet's loader did not find the library.
        sev, text = "warning", "libnvidia-ml.so.1 not found by k3fleet's NVML reader; GPU facts came from nvidia-smi"
    elif st not in _NVML_FAIL and f.driver.source == "nvidia-smi" and c.gpu_count:
        # NVML's own bindings failed, but nvidia-smi (an NVML client) answered: a degraded reader.
        sev, text = "warning", f"NVML failed ({st}); GPU facts came from nvidia-smi"
    e.fail("nvml.status", text + (f": {nv.error}" if nv.error else ""), {"status": st, "error": nv.error},
           severity=sev)


def _branch_label(ct: CompiledTarget, branch: int) -> str:
    info = ct.target.matrix.branch_info(branch)
    if info is None:
        return f"R{branch}"
    return f"R{branch} ({info.kind}{', EOL ' + info.eol if info.eol and info.kind != 'EOL' else ''})"


def _driver_version(f: HostFacts, c: HostContext, e: Emitter) -> None:
    ct = e.ct
    if c.platform_note is not None:
        plat = f.driver.platform
        e.fail("driver.platform", c.platform_note,
               {"driver_version": c.version, "platform": plat.kind, "l4t_release": plat.l4t_release,
                "evidence": plat.evidence, "arch": f.driver.kernel_module.arch, "image": ct.target.image.ref})
        return
    if c.version_t is None:
        if not c.driver_failed:
            e.unknown("driver.branch", "the loaded driver version", f.driver.reason, error=True)
        return
    assert c.branch is not None
    ev = {"driver_version": c.version, "source": c.version_source, "branch": c.branch,
          "required_branch": ct.branch, "image": ct.target.image.ref, "image_cuda": ct.image_cuda}
    if c.branch < ct.branch:
        e.fail("driver.branch",
               f"driver {c.version} is on {_branch_label(ct, c.branch)}, below R{ct.branch} which CUDA "
               f"{ct.image_cuda} ({ct.target.image.ref}) needs", ev, chain=True)
        return
    if c.version_t < ct.min_driver_t:
        row = ct.min_row
        basis = f"the matrix minimum for CUDA {row.label}" if row else "the target's driver.min_version"
        if row is not None and not row.confirmed:
            basis += " [unconfirmed matrix row]"
            c.unconfirmed.add(row.label)
        e.fail("driver.version_min", f"driver {c.version} is below {ct.min_driver}, {basis}",
               {**ev, "min_driver": ct.min_driver, "matrix_row": row.label if row else None,
                "matrix_confirmed": row.confirmed if row else None}, chain=True)


def _flavour(f: HostFacts, c: HostContext, e: Emitter) -> None:
    needing = [g for g in f.driver.gpus if e.ct.open_required(g.name, g.compute_capability)]
    if not needing:
        return
    ev = {"gpu": needing[0].name, "compute_capability": needing[0].compute_capability, "flavour": c.flavour}
    if c.flavour is None:
        e.unknown("driver.flavour", f"the kernel module flavour (open required for {needing[0].name})",
                  f.driver.kernel_module.raw or f.driver.reason, error=True)
    elif c.flavour != "open":
        e.fail("driver.flavour",
               f"{needing[0].name} (compute capability {needing[0].compute_capability or '?'}) requires open "
               f"kernel modules; the {c.flavour} module is installed", ev)


def _pending_reboot(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if c.platform_note is not None:
        return  # an L4T release compared with data-center package versions means nothing
    nv = f.driver.nvml
    pkg_v = f.packages.driver_version
    loaded = f.driver.kernel_module.version or f.driver.driver_version
    if nv.status == "lib_rm_version_mismatch":
        e.fail("driver.pending_reboot",
               "NVML reports Driver/library version mismatch: the driver packages changed without a reboot",
               {"nvml_error": nv.error, "package_version": pkg_v, "loaded_version": loaded})
        return
    if not pkg_v or not loaded:
        if f.packages.status == "unknown" and not c.driver_failed:
            e.unknown("driver.pending_reboot", "the installed driver package version", f.packages.reason)
        return
    pt, lt = version_tuple(pkg_v), version_tuple(loaded)
    if pt and lt and pt != lt:
        e.fail("driver.pending_reboot",
               f"installed driver package {pkg_v} differs from the loaded module {loaded}: reboot pending",
               {"package_version": pkg_v, "loaded_version": loaded})


def _gb200_gdr_override(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """GB200 before R595 on an RDMA fleet: dma-buf GPUDirect RDMA needs GrdmaPciTopoCheckOverride=1."""
    if not e.ct.rdma_required or c.branch is None or c.branch >= 595:
        return
    if not any("GB200" in (name or "").upper() for name in c.gpu_names):
        return
    override = f.driver.kernel_module.grdma_topo_override
    ev = {"branch": c.branch, "gpu_model": c.gpu_model, "grdma_topo_override": override}
    if override is None:
        e.unknown("driver.gb200_gdr_override", "GrdmaPciTopoCheckOverride in /proc/driver/nvidia/params",
                  "not read (older facts, or the file is unreadable)")
    elif not override:
        e.fail("driver.gb200_gdr_override", f"GB200 on R{c.branch} without GrdmaPciTopoCheckOverride=1: dma-buf "
               "GPUDirect RDMA over its PCIe NICs is refused before R595, so NCCL falls back to sockets", ev)


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    facts_schema, _driver_loaded, _nvml, _driver_version, _flavour, _pending_reboot, _gb200_gdr_override,)
