"""Package checks: driver packages held, unattended upgrades, DKMS or prebuilt kernel modules.
"""

from __future__ import annotations

from collections.abc import Callable

from k3fleet.models.facts import HostFacts
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import Emitter, HostContext

DRIVER_ROLES = frozenset({"driver", "utils", "compute", "fabricmanager", "dkms", "kernel_modules"})
HOLD_ROLES = frozenset({"driver", "fabricmanager"})

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("packages.held", "Driver packages held",
          "An unheld driver can be moved by a routine upgrade, which silently breaks the version chain.",
          "warning",
          "Hold the driver and Fabric Manager packages (apt-mark hold / dnf versionlock add).",
          source='docs/facts.md section 3 (the GPU Operator holds driver and Fabric Manager) and section 4'),
    check("packages.unattended_upgrades", "No unattended driver upgrades",
          "Unattended upgrades can change the driver outside a change window.",
          "warning",
          "Disable unattended-upgrades (or dnf-automatic), or at least hold the driver packages.",
          source='docs/facts.md section 4'),
    check("packages.dkms_kernel", "DKMS module built for the running kernel",
          "A DKMS driver not built for the running kernel will not load after the next reboot.",
          "error",
          "Rebuild with dkms autoinstall for the running kernel, or install the prebuilt linux-modules-nvidia "
          "package for it.",
          source='docs/facts.md section 4 (DKMS or prebuilt linux-modules-nvidia packages)'),
)


def _held(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if not e.ct.target.packages.require_driver_hold:
        return
    pk = f.packages
    if pk.status != "ok":
        e.unknown("packages.held", "driver package holds", pk.reason)
        return
    mine = [p for p in pk.packages if p.role in HOLD_ROLES]
    if not mine:
        e.unknown("packages.held", "driver package holds",
                  "no driver package is installed through the package manager (runfile install?)")
        return
    loose = sorted(p.name for p in mine if not p.held)
    if loose:
        e.fail("packages.held", f"driver packages not held: {', '.join(loose)}",
               {"not_held": loose, "manager": pk.manager})


def _unattended(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if e.ct.target.packages.unattended_upgrades_allowed:
        return
    pk = f.packages
    if pk.status != "ok":
        e.unknown("packages.unattended_upgrades", "the unattended-upgrades state", pk.reason)
        return
    if pk.unattended_upgrades_enabled:
        loose = [p.name for p in pk.packages if p.role in HOLD_ROLES and not p.held]
        ev = {"installed": pk.unattended_upgrades_installed, "enabled": True, "unheld_driver_packages": loose}
        if loose:
            e.fail("packages.unattended_upgrades",
                   "unattended upgrades are enabled and the driver packages are not held: the driver can "
                   "change outside a change window", ev, severity="error")
        else:
            e.fail("packages.unattended_upgrades", "unattended upgrades are enabled (driver packages are held)",
                   ev)
    elif pk.unattended_upgrades_installed and pk.unattended_upgrades_enabled is None:
        e.unknown("packages.unattended_upgrades", "whether unattended upgrades are enabled", pk.reason)


def _dkms(f: HostFacts, c: HostContext, e: Emitter) -> None:
    pk = f.packages
    if not pk.dkms_used:
        return
    if pk.dkms_built_for_running_kernel is False:
        mods = [f"{m.name}/{m.version} {m.kernel or '?'}: {m.status}" for m in pk.dkms_modules][:8]
        e.fail("packages.dkms_kernel",
               f"the DKMS NVIDIA module is not built for the running kernel {pk.running_kernel or '?'}",
               {"running_kernel": pk.running_kernel, "dkms": mods})
    elif pk.dkms_built_for_running_kernel is None:
        e.unknown("packages.dkms_kernel", "the DKMS build state for the running kernel", pk.reason)


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (_held, _unattended, _dkms,)
