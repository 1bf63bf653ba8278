# Stdlib only: shipped to nodes inside AnsiballZ.
"""Package facts: NVIDIA driver/utils/compute/Fabric Manager/DKMS/kernel-module/toolkit packages.

``collect_packages(reader)`` returns a dict shaped like
``k3fleet.models.facts.PackageFacts`` for dpkg (Debian/Ubuntu) and rpm (RHEL)
nodes: versions, hold state (``apt-mark hold`` / ``dnf versionlock``), the
driver branch and version, Fabric Manager version, unattended upgrades and DKMS.
Parse functions are pure and raise ``ValueError`` on output they do not
understand; the collector turns that into ``unknown`` + reason.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

# Package name patterns (docs/facts.md sections 3-4), first match wins. "open" is the
# flavour when the name says so; None means the name does not decide it.
_B = r"(?P<branch>\d{3,})"
_PACKAGE_RULES = (
    (re.compile(r"^nvidia-driver-pinning-" + _B + r"$"), "other", None),
    # The CUDA forward-compatibility package: a user-mode driver (libcuda) of the branch its version
    # names, for the CUDA release in its name (docs/facts.md section 16).
    (re.compile(r"^cuda-compat-\d+-\d+$"), "compat", None),
    (re.compile(r"^nvidia-driver-" + _B + r"(?:-server)?(?P<open>-open)?$"), "driver", "proprietary"),
    (re.compile(r"^nvidia-headless(?:-no-dkms)?-" + _B + r"(?:-server)?(?P<open>-open)?$"), "driver",
     "proprietary"),
    (re.compile(r"^nvidia-open(?:-" + _B + r")?$"), "driver", "open"),
    (re.compile(r"^cuda-drivers-fabricmanager(?:-" + _B + r")?$"), "fabricmanager", None),
    (re.compile(r"^cuda-drivers(?:-" + _B + r")?$"), "driver", None),
    (re.compile(r"^nvidia-fabric-?manager(?:-" + _B + r")?$"), "fabricmanager", None),
    (re.compile(r"^nvidia-(?:compute-)?utils-" + _B + r"(?:-server)?$"), "utils", None),
    (re.compile(r"^libnvidia-compute-" + _B + r"(?:-server)?$"), "compute", None),
    (re.compile(r"^nvidia-dkms-" + _B + r"(?:-server)?(?P<open>-open)?$"), "dkms", "proprietary"),
    (re.compile(r"^linux-(?:modules|objects)-nvidia-" + _B + r"(?:-server)?(?P<open>-open)?-(?P<kernel>.+)$"),
     "kernel_modules", "proprietary"),
    (re.compile(r"^linux-signatures-nvidia-(?P<kernel>.+)$"), "kernel_modules", None),
    # RHEL (CUDA repository) names.
    (re.compile(r"^kmod-nvidia-open-dkms$"), "dkms", "open"),
    (re.compile(r"^kmod-nvidia-latest-dkms$"), "dkms", "proprietary"),
    (re.compile(r"^kmod-nvidia-" + _B + r"\..+$"), "kernel_modules", None),
    (re.compile(r"^nvidia-driver$"), "driver", None),
    (re.compile(r"^nvidia-driver-cuda$"), "utils", None),
    (re.compile(r"^nvidia-driver-(?:cuda-libs|NVML|libs)$"), "compute", None),
    (re.compile(r"^(?:nvidia-container-toolkit(?:-base)?|libnvidia-container1|libnvidia-container-tools)$"),
     "toolkit", None),
)
# Any other package with "nvidia" in its name is listed with role "other".
_OTHER_BRANCH = re.compile(r"-(\d{3,})(?=-|$)")

# Roles that carry the driver's own version, best first: the metapackage, then
# the userspace pieces a headless install may have without it.
_DRIVER_ROLES = ("driver", "utils", "compute", "dkms")
_DRIVER_VERSION = re.compile(r"^(\d{3,})\.\d+(?:\.\d+)?$")
# Read size for small /proc and config files.
SMALL_FILE = 64 * 1024


# -- pure parsers ----------------------------------------------------------------


def upstream_version(version: str | None) -> str | None:
    """The upstream part of a package version.

    "580.95.05-0ubuntu1" -> "580.95.05", "580.95.05-1.el9" -> "580.95.05",
    "3:580.95.05-1.el9" -> "580.95.05" (epoch dropped).
    """
    if not version:
        return None
    text = version.strip()
    if re.match(r"^\d+:", text):
        text = text.split(":", 1)[1]
    return text.split("-", 1)[0] or None


def _version_key(version: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", upstream_version(version) or ""))


def classify_package(name: str) -> dict[str, Any] | None:
    """Role, branch (from the name) and flavour of an NVIDIA package, or None.

    Roles: driver, utils, compute, fabricmanager, dkms, kernel_modules, toolkit,
    other. "-open" (and nvidia-open, kmod-nvidia-open-dkms) means the open
    kernel modules; a driver/dkms/kernel-module name without it is the
    proprietary flavour on Ubuntu; other names leave the flavour open (None).
    """
    base = name.split(":", 1)[0]
    for pattern, role, flavour in _PACKAGE_RULES:
        match = pattern.match(base)
        if not match:
            continue
        groups = match.groupdict()
        if groups.get("open"):
            flavour = "open"
        out = {"role": role, "branch": groups.get("branch"), "flavour": flavour}
        if groups.get("kernel"):
            out["kernel"] = groups["kernel"]
        return out
    if "nvidia" in base:
        branch = _OTHER_BRANCH.search(base)
        return {"role": "other", "branch": branch.group(1) if branch else None,
                "flavour": "open" if base.endswith("-open") else None}
    return None


def parse_dpkg_query(text: str) -> list[dict[str, Any]]:
    """Parse COMMANDS["dpkg_query"] output: ``package<TAB>version<TAB>status-abbrev``.

    Returns every row as ``{"name", "arch", "version", "status", "installed",
    "held"}``. ``installed`` is the second status letter 'i'; ``held`` is the
    first letter 'h' (``apt-mark hold``). Raises ValueError on a malformed line,
    which is what a truncated listing ends with.
    """
    rows = []
    for line_no, line in enumerate((text or "").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        status = parts[2].strip() if len(parts) == 3 else ""
        if len(parts) != 3 or not parts[0] or not re.match(r"^[uihrp][ncHUFWti][ R]?$", status):
            raise ValueError(f"dpkg-query line {line_no} is not 'package<TAB>version<TAB>status': {line[:160]!r}")
        name, _, arch = parts[0].partition(":")
        rows.append({
            "name": name,
            "arch": arch or None,
            "version": parts[1],
            "status": status,
            "installed": status[1] == "i",
            "held": status[0] == "h",
        })
    return rows


def parse_rpm(text: str) -> list[dict[str, Any]]:
    """Parse COMMANDS["rpm_query"] output: ``name<TAB>version-release<TAB>arch``."""
    rows = []
    for line_no, line in enumerate((text or "").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0] or "-" not in parts[1] or not parts[2].strip():
            raise ValueError(f"rpm line {line_no} is not 'name<TAB>version-release<TAB>arch': {line[:160]!r}")
        rows.append({"name": parts[0], "version": parts[1], "arch": parts[2].strip()})
    return rows


def _lock_name(entry: str) -> str | None:
    # dnf4 writes "name-EPOCH:version-release.*", yum writes "EPOCH:name-version-release.arch".
    entry = re.sub(r"^\d+:", "", entry.strip())
    pieces = entry.rsplit("-", 2)
    if len(pieces) != 3 or not pieces[0]:
        return None
    return pieces[0]


def parse_versionlock(text: str) -> dict[str, set[str]]:
    """Parse a dnf/yum versionlock.list: ``{"locked": names, "excluded": names}``.

    Lines starting with '!' are excludes (a version skipped), not locks.
    """
    locked: set[str] = set()
    excluded: set[str] = set()
    for line in (text or "").splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        target = excluded if entry.startswith("!") else locked
        name = _lock_name(entry.lstrip("!"))
        if name:
            target.add(name)
    return {"locked": locked, "excluded": excluded}


def parse_dkms_status(text: str) -> list[dict[str, Any]]:
    """Parse ``dkms status`` in both formats.

    dkms 2.x: "nvidia, 575.57.08, 6.8.0-45-generic, x86_64: installed"
    dkms 3.x: "nvidia/580.95.05, 6.8.0-45-generic, x86_64: installed"
    A module only added prints "nvidia/580.95.05: added". Text after the status
    word ("(original_module exists)") is kept as ``detail``. Lines that are not
    module lines (warnings) are skipped; output with no module line at all but
    other text raises ValueError.
    """
    pattern = re.compile(
        r"^(?P<name>[^/,:\s]+)(?:/|,\s*)(?P<version>[^,:\s]+)"
        r"(?:,\s*(?P<kernel>[^,:\s]+))?(?:,\s*(?P<arch>[^,:\s]+))?:\s*(?P<status>\S+)\s*(?P<detail>.*)$")
    modules = []
    stray = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        match = pattern.match(line.strip())
        if not match:
            stray.append(line.strip())
            continue
        module = {k: match.group(k) for k in ("name", "version", "kernel", "arch", "status")}
        module["status"] = module["status"].rstrip(",")
        if match.group("detail"):
            module["detail"] = match.group("detail").strip()
        modules.append(module)
    if stray and not modules:
        raise ValueError(f"dkms status output has no module line: {stray[0][:160]!r}")
    return modules


def parse_apt_periodic(text: str, key: str = "APT::Periodic::Unattended-Upgrade") -> str | None:
    """The value of an APT::Periodic setting in an apt.conf snippet, or None."""
    for line in (text or "").splitlines():
        stripped = line.split("//", 1)[0].strip()
        match = re.match(r'^' + re.escape(key) + r'\s+"([^"]*)"\s*;', stripped)
        if match:
            return match.group(1)
    return None


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """Parse ``systemctl show -p ...`` for several units: ``{Id: {property: value}}``.

    Units are separated by blank lines; a block without Id= is keyed by its
    position ("#2") so nothing is silently merged.
    """
    units: dict[str, dict[str, str]] = {}
    blocks = re.split(r"\n\s*\n", (text or "").strip())
    for pos, block in enumerate(blocks):
        props = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip():
                props[key.strip()] = value.strip()
        if props:
            units[props.get("Id") or f"#{pos}"] = props
    return units


def systemctl_show_problem(res: Any) -> str | None:
    """Why a systemctl_show result cannot be used, or None when it can."""
    text = (res.stdout or "") + "\n" + (res.stderr or "")
    if "System has not been booted with systemd" in text or "Failed to connect to bus" in text:
        first = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return "systemd not running: " + (first[0] if first else "no output")
    if res.error is not None:
        return res.reason()
    if not (res.stdout or "").strip():
        return res.reason() if res.rc else "systemctl show printed nothing"
    return None


# -- collector helpers ---------------------------------------------------------------


def _branch(classified: dict[str, Any], version: str) -> tuple[str | None, str | None]:
    """(branch, name_branch). The installed version decides for driver packages:
    some "-575" names are transitional packages that install 580 (docs/facts.md section 4)."""
    name_branch = classified["branch"]
    up = upstream_version(version) or ""
    match = _DRIVER_VERSION.match(up)
    if classified["role"] in (*_DRIVER_ROLES, "fabricmanager", "compat") and match:
        return match.group(1), name_branch
    if name_branch is None and classified["role"] == "other" and match:
        return match.group(1), None
    return name_branch, name_branch


def _package_entry(name: str, version: str, held: bool, arch: str | None) -> dict[str, Any] | None:
    classified = classify_package(name)
    if classified is None:
        return None
    branch, name_branch = _branch(classified, version)
    entry: dict[str, Any] = {"name": name, "version": version, "held": held, "role": classified["role"],
                             "branch": branch, "flavour": classified["flavour"]}
    if arch:
        entry["arch"] = arch
    if name_branch and branch and name_branch != branch:
        entry["name_branch"] = name_branch
    if classified.get("kernel"):
        entry["kernel"] = classified["kernel"]
    return entry


def choose_driver_package(packages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The package that states the installed driver: best role first, then highest version."""
    candidates = [p for p in packages if p["role"] in _DRIVER_ROLES and p.get("branch")]
    if not candidates:
        return None
    return min(candidates, key=lambda p: (_DRIVER_ROLES.index(p["role"]),
                                          tuple(-n for n in _version_key(p["version"]))))


def _fabricmanager_package(packages: list[dict[str, Any]]) -> dict[str, Any] | None:
    fm = [p for p in packages if p["role"] == "fabricmanager"]
    # The daemon package, not the cuda-drivers-fabricmanager metapackage, carries the binary.
    fm.sort(key=lambda p: (p["name"].startswith("cuda-drivers"), tuple(-n for n in _version_key(p["version"]))))
    return fm[0] if fm else None


def _dkms_facts(reader: NodeReader, packages: list[dict[str, Any]], running_kernel: str | None,
                notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"dkms_used": None, "dkms_modules": [], "dkms_built_for_running_kernel": None}
    dkms_packages = [p for p in packages if p["role"] == "dkms"]
    res = reader.run(COMMANDS["dkms_status"])
    modules = None
    if res.ok:
        try:
            modules = parse_dkms_status(res.stdout)
        except ValueError as exc:
            notes.append(str(exc))
    elif res.error != "not_found":
        notes.append(res.reason())
    nvidia_modules = [m for m in (modules or []) if m["name"].startswith("nvidia")]
    out["dkms_modules"] = nvidia_modules
    out["dkms_used"] = bool(dkms_packages or nvidia_modules)
    if out["dkms_used"] and modules is not None and running_kernel:
        out["dkms_built_for_running_kernel"] = any(
            m["kernel"] == running_kernel and m["status"] == "installed" for m in nvidia_modules)
    elif out["dkms_used"] and modules is None and res.error == "not_found":
        notes.append("nvidia DKMS package installed but the dkms command is missing")
    return out


def _unit_states(reader: NodeReader) -> tuple[dict[str, dict[str, str]] | None, str | None]:
    res = reader.run_cached(COMMANDS["systemctl_show"])
    problem = systemctl_show_problem(res)
    if problem:
        return None, problem
    return parse_systemctl_show(res.stdout), None


# -- the collector -----------------------------------------------------------------


def _empty_facts() -> dict[str, Any]:
    return {
        "status": "unknown", "reason": None, "manager": None, "running_kernel": None, "packages": [],
        "driver_branch": None, "driver_version": None, "fabricmanager_version": None,
        "unattended_upgrades_installed": None, "unattended_upgrades_enabled": None,
        "dkms_used": None, "dkms_modules": [], "dkms_built_for_running_kernel": None,
    }


def collect_packages(reader: NodeReader) -> dict[str, Any]:
    """Installed NVIDIA packages and their state (``PackageFacts`` shape).

    Manager: dpkg-query present -> dpkg, else rpm present -> rpm, else
    ``absent``. Only installed rows count (dpkg 'ii'/'hi'). status ``absent``
    also when the manager lists no NVIDIA package at all; ``unknown`` when the
    listing cannot be read or understood. Secondary facts that fail (dkms,
    systemd, apt config) leave their field None and add to ``reason``.
    """
    facts = _empty_facts()
    notes: list[str] = []
    # A small read size: some kernels refuse large reads of /proc/sys files (ENOMEM).
    kernel = reader.read(FILES["kernel_release"], limit=SMALL_FILE)
    facts["running_kernel"] = (kernel.strip() or None) if kernel is not None else None
    if facts["running_kernel"] is None:
        problem = reader.read_error(FILES["kernel_release"]) or f"{FILES['kernel_release']} empty or unreadable"
        notes.append(f"running kernel unknown: {problem}")

    if reader.which("dpkg-query"):
        facts["manager"] = "dpkg"
    elif reader.which("rpm"):
        facts["manager"] = "rpm"
    else:
        facts["status"] = "absent"
        facts["reason"] = "no package manager: neither dpkg-query nor rpm is on PATH"
        return facts

    command = COMMANDS["dpkg_query"] if facts["manager"] == "dpkg" else COMMANDS["rpm_query"]
    res = reader.run_cached(command)
    if not res.ok:
        facts["reason"] = res.reason()
        return facts
    installed_names = set()
    packages = []
    try:
        if facts["manager"] == "dpkg":
            for row in parse_dpkg_query(res.stdout):
                if not row["installed"]:
                    continue
                installed_names.add(row["name"])
                entry = _package_entry(row["name"], row["version"], row["held"], row["arch"])
                if entry:
                    packages.append(entry)
        else:
            lock_text = reader.read(FILES["dnf_versionlock"])
            locked = parse_versionlock(lock_text)["locked"] if lock_text is not None else set()
            for row in parse_rpm(res.stdout):
                installed_names.add(row["name"])
                entry = _package_entry(row["name"], row["version"], row["name"] in locked, row["arch"])
                if entry:
                    packages.append(entry)
    except ValueError as exc:
        facts["reason"] = f"{command[0]} output not understood: {exc}"
        return facts

    facts["packages"] = packages
    driver = choose_driver_package(packages)
    if driver is not None:
        facts["driver_branch"] = driver["branch"]
        facts["driver_version"] = upstream_version(driver["version"])
    else:
        modules = [p for p in packages if p["role"] == "kernel_modules" and p.get("branch")]
        facts["driver_branch"] = modules[0]["branch"] if modules else None
    fm = _fabricmanager_package(packages)
    facts["fabricmanager_version"] = upstream_version(fm["version"]) if fm else None

    if facts["manager"] == "dpkg":
        facts["unattended_upgrades_installed"] = "unattended-upgrades" in installed_names
        periodic = reader.read(FILES["apt_auto_upgrades"], limit=SMALL_FILE)
        # APT::Periodic::Unattended-Upgrade is a day interval; absent means 0 (off).
        value = parse_apt_periodic(periodic) if periodic is not None else None
        enabled = value is not None and value.strip() not in ("", "0")
        facts["unattended_upgrades_enabled"] = facts["unattended_upgrades_installed"] and enabled
    else:
        facts["unattended_upgrades_installed"] = "dnf-automatic" in installed_names
        units, unit_problem = _unit_states(reader)
        if units is None:
            notes.append(f"dnf-automatic.timer state unknown: {unit_problem}")
        else:
            timer = units.get("dnf-automatic.timer", {})
            facts["unattended_upgrades_enabled"] = (timer.get("UnitFileState") == "enabled"
                                                    or timer.get("ActiveState") == "active")

    facts.update(_dkms_facts(reader, packages, facts["running_kernel"], notes))

    if packages:
        facts["status"] = "ok"
        facts["reason"] = "; ".join(notes) or None
    else:
        facts["status"] = "absent"
        facts["reason"] = "; ".join([f"no NVIDIA packages installed ({facts['manager']})", *notes])
    return facts


__all__ = [
    "choose_driver_package",
    "classify_package",
    "collect_packages",
    "parse_apt_periodic",
    "parse_dkms_status",
    "parse_dpkg_query",
    "parse_rpm",
    "parse_systemctl_show",
    "parse_versionlock",
    "systemctl_show_problem",
    "upstream_version",
]
