# Stdlib only: shipped to nodes inside AnsiballZ.
"""Fabric Manager facts: NVSwitch presence, the nvidia-fabricmanager unit, version vs driver.

``collect_fabricmanager(reader, driver=None, packages=None)`` returns a dict
shaped like ``k3fleet.models.facts.FabricManagerFacts``. ``driver`` and
``packages`` are the dicts of ``collect_driver`` / ``collect_packages`` when the
caller already has them; missing ones are gathered here (the driver part only
from /proc, which is all the comparison needs).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, settled
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import kernel_module_facts
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import (
    collect_packages,
    parse_systemctl_show,
    systemctl_show_problem,
    upstream_version,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

UNIT = "nvidia-fabricmanager.service"
# Character devices the driver creates per switch; nvidia-nvswitchctl is the control node, not a switch.
_NVSWITCH_DEV = re.compile(r"^nvidia-nvswitch\d+$")


# -- pure parsers ----------------------------------------------------------------


def parse_fm_version(text: str) -> str:
    """Version from ``nv-fabricmanager --version`` ("Fabric Manager version is : 580.95.05")."""
    match = re.search(r"Fabric Manager version is\s*:\s*(\d+(?:\.\d+)+)", text or "")
    if not match:
        first = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
        raise ValueError(f"nv-fabricmanager --version printed no version: {first[:160]!r}")
    return match.group(1)


def unit_state(units: dict[str, dict[str, str]], unit: str = UNIT) -> dict[str, Any]:
    """UnitState for ``unit`` from parsed ``systemctl show``.

    LoadState=not-found means no unit file: not installed, enabled "not-found".
    A masked unit is installed with enabled "masked".
    """
    props = units.get(unit)
    if props is None:
        return {"installed": None, "active": None, "enabled": None}
    load = props.get("LoadState")
    if load == "not-found":
        return {"installed": False, "active": props.get("ActiveState") or "inactive", "enabled": "not-found"}
    return {
        "installed": True if load else None,
        "active": props.get("ActiveState") or None,
        "enabled": props.get("UnitFileState") or ("masked" if load == "masked" else None),
    }


def versions_match(fm_version: str | None, driver_version: str | None) -> bool | None:
    """Exact upstream comparison ("580.95.05-1" == "580.95.05"); None when either is unknown."""
    left, right = upstream_version(fm_version), upstream_version(driver_version)
    if not left or not right:
        return None
    return left == right


# -- collector -----------------------------------------------------------------------


def nvswitch_facts(reader: NodeReader) -> tuple[bool | None, int | None, str | None]:
    """(present, count, how): the driver's per-switch procfs entries, else /dev nodes."""
    entries = reader.listdir(FILES["nvswitch_devices_dir"])
    if entries is not None:
        return bool(entries), len(entries), FILES["nvswitch_devices_dir"]
    nodes = [n for n in reader.glob_names("/dev", "nvidia-nvswitch") if _NVSWITCH_DEV.match(n)]
    if nodes:
        return True, len(nodes), "/dev/nvidia-nvswitch*"
    return None, None, None


def _comparison_driver_version(driver: dict[str, Any], packages: dict[str, Any]) -> str | None:
    # The loaded module is what Fabric Manager must match; the packages only say what loads next boot.
    km = driver.get("kernel_module") or {}
    return km.get("version") or driver.get("driver_version") or packages.get("driver_version")


def collect_fabricmanager(reader: NodeReader, driver: dict[str, Any] | None = None,
                          packages: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fabric Manager facts (``FabricManagerFacts`` shape).

    required = NVSwitch present. status: ``absent`` when Fabric Manager is not
    installed at all (no package, no unit, no binary), ``unknown`` (+reason) when
    NVSwitch presence, the unit or the installed version cannot be established,
    else ``ok``.
    """
    if driver is None:
        driver = {"kernel_module": kernel_module_facts(reader)}
    if packages is None:
        packages = collect_packages(reader)
    facts: dict[str, Any] = {
        "status": "unknown", "reason": None, "nvswitch_present": None, "nvswitch_count": None,
        "required": None, "unit": {"installed": None, "active": None, "enabled": None},
        "version": None, "driver_version": None, "version_matches_driver": None,
    }
    problems: list[str] = []

    present, count, source = nvswitch_facts(reader)
    if present is None:
        loaded = (driver.get("kernel_module") or {}).get("loaded")
        if loaded is False:
            problems.append("NVSwitch presence unknown: NVIDIA driver not loaded "
                            f"({FILES['nvswitch_devices_dir']} and /dev/nvidia-nvswitch* absent)")
        else:
            # The driver publishes the procfs directory when it loads; without it and
            # without device nodes there is no switch to manage.
            present, count = False, 0
    facts.update(nvswitch_present=present, nvswitch_count=count, required=present, nvswitch_source=source)

    res = reader.run_cached(COMMANDS["systemctl_show"])
    problem = systemctl_show_problem(res)
    if problem:
        problems.append(f"{UNIT} state unknown: {problem}")
    else:
        facts["unit"] = unit_state(parse_systemctl_show(res.stdout))

    version = packages.get("fabricmanager_version")
    binary_found = False
    if not version:
        fm = reader.run(COMMANDS["fabricmanager_version"])
        if fm.ok:
            binary_found = True
            try:
                version = parse_fm_version(fm.stdout + "\n" + fm.stderr)
            except ValueError as exc:
                problems.append(str(exc))
        elif fm.error != "not_found":
            binary_found = True
            problems.append(fm.reason())
    facts["version"] = version
    facts["driver_version"] = _comparison_driver_version(driver, packages)
    facts["version_matches_driver"] = versions_match(version, facts["driver_version"])

    installed = bool(version) or binary_found or facts["unit"]["installed"] is True
    # No package (listing read fine), no binary, no unit file: nothing is installed,
    # even when systemd could not be asked.
    listing_read = bool(packages.get("manager")) and packages.get("status") in ("ok", "absent")
    if not installed and (facts["unit"]["installed"] is False or listing_read):
        facts["status"] = "absent"
        where = f"NVSwitch present: {count}" if present else (
            "no NVSwitch" if present is False else "NVSwitch presence unknown")
        facts["reason"] = "; ".join([f"Fabric Manager not installed ({where})", *problems])
        return facts
    if installed and not version:
        problems.append("Fabric Manager version unknown")
    return settled(facts, problems)


__all__ = [
    "UNIT",
    "collect_fabricmanager",
    "nvswitch_facts",
    "parse_fm_version",
    "unit_state",
    "versions_match",
]
