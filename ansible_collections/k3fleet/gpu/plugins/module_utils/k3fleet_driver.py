# Stdlib only: shipped to nodes inside AnsiballZ. pynvml is optional and imported lazily.
"""Driver and GPU facts: loaded kernel module, NVML (or nvidia-smi), per-GPU details.

``collect_driver(reader, use_nvml=True)`` returns a dict shaped like
``k3fleet.models.facts.DriverFacts``. The parse functions are pure and raise
``ValueError`` with a one-line explanation on output they do not understand; the
collector turns that into ``unknown`` + reason, never an exception.

The two GPU sources are module_utils of their own, imported only when asked: k3fleet_nvml
once NVML bindings load (pynvml, else k3fleet_nvml_lib on the driver's libnvidia-ml.so.1),
k3fleet_smi when NVML did not answer. A node compiles the ones it uses.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, parse_proc_modules
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_gpu_common import VERSION_RE, normalize_bus_id
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    COMMANDS,
    FILES,
    XID_HISTORY_BOOTS,
    journalctl_kernel_boot_argv,
)


def parse_proc_version(text: str) -> dict[str, Any]:
    """Parse /proc/driver/nvidia/version.

    Returns ``{"version", "flavour", "arch", "raw"}``. The version is found by
    pattern after "Kernel Module": the open flavour inserts "for <arch>" there, so
    "the token after Module" is the architecture on open modules, not the version.
    """
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        raise ValueError("/proc/driver/nvidia/version is empty")
    first = lines[0].strip()
    if not first.startswith("NVRM version:"):
        raise ValueError(f"/proc/driver/nvidia/version: first line is not 'NVRM version:': {first[:120]!r}")
    marker = first.find("Kernel Module")
    if marker < 0:
        raise ValueError(f"/proc/driver/nvidia/version: no 'Kernel Module' in {first[:120]!r}")
    flavour = "open" if "Open Kernel Module" in first else "proprietary"
    arch_match = re.search(r"Kernel Module for (\S+)", first) or re.search(r"NVIDIA UNIX (\S+) Kernel Module", first)
    version_match = VERSION_RE.search(first, marker + len("Kernel Module"))
    if not version_match:
        raise ValueError(f"/proc/driver/nvidia/version: no driver version after 'Kernel Module' in "
                         f"{first[:120]!r}")
    return {
        "version": version_match.group(1),
        "flavour": flavour,
        "arch": arch_match.group(1) if arch_match else None,
        "raw": first,
    }


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus." (pid= and name=
# are absent on some codes and drivers; NVIDIA Xid catalogue, docs/facts.md section 14).
_XID_RE = re.compile(r"NVRM: Xid \((PCI:[0-9A-Fa-f:.]+)\): (\d+),\s*(.*?)\s*$")

_XID_PID_RE = re.compile(r"^pid=(?:'?<unknown>'?|(\d+)),\s*(?:name=[^,]*,\s*)?")

_LOG_TIME_RE = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]|^(\S+T\S+|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s")

_FALLEN_RE = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")

MAX_XID_EVENTS = 64


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """Every "NVRM: Xid" line of a kernel log (dmesg, journalctl -k, syslog), oldest first.

    Keeps the last MAX_XID_EVENTS lines: a GPU in trouble can repeat one Xid thousands of times,
    and the newest are the ones that say what state it is in now.
    """
    events: list[dict[str, Any]] = []
    lines = (text or "").splitlines()
    for n, line in enumerate(lines):
        match = _XID_RE.search(line)
        if not match:
            # Newer drivers report a lost GPU in three lines without an Xid ("NVRM: The NVIDIA GPU
            # 0000:b3:00.0 ... has fallen off the bus": NVIDIA/NVSentinel issue 155): that is Xid 79.
            lost = _FALLEN_RE.search(line)
            if lost and "fallen off the bus" in " ".join(lines[n:n + 3]):
                tm = _LOG_TIME_RE.match(line)
                bus = lost.group(1).rsplit(".", 1)[0]
                events.append({"code": 79, "pci": f"PCI:{bus}", "pid": None,
                               "text": "GPU has fallen off the bus (reported without an Xid line)",
                               "time": (tm.group(1) or tm.group(2)) if tm else None})
            continue
        rest = match.group(3)
        pid = None
        pm = _XID_PID_RE.match(rest)
        if pm:
            pid = int(pm.group(1)) if pm.group(1) else None
            rest = rest[pm.end():]
        tm = _LOG_TIME_RE.match(line)
        events.append({"code": int(match.group(2)), "pci": match.group(1), "pid": pid,
                       "text": rest[:160] or None, "time": (tm.group(1) or tm.group(2)) if tm else None})
    return events[-MAX_XID_EVENTS:]


# Azure's link-flap check greps the log for "ib.*lost carrier" (azurehpc-health-checks
# customTests/azure_ib_link_flapping.nhc, docs/facts.md section 14): an IPoIB interface losing its carrier.
_CARRIER_RE = re.compile(r"\b(ib[\w.]*):?\s.*?lost carrier", re.I)

MAX_CARRIER_EVENTS = 32


def parse_carrier_lost(text: str) -> list[dict[str, Any]]:
    """The "ib...: lost carrier" lines of a kernel log or journal, oldest first (the last MAX_CARRIER_EVENTS)."""
    events = []
    for line in (text or "").splitlines():
        match = _CARRIER_RE.search(line)
        if match:
            tm = _LOG_TIME_RE.match(line)
            events.append({"iface": match.group(1), "time": (tm.group(1) or tm.group(2)) if tm else None})
    return events[-MAX_CARRIER_EVENTS:]


def collect_kernel_log(reader: NodeReader) -> dict[str, Any]:
    """KernelLog facts: the Xid events of this boot, from dmesg or else the journal's kernel messages."""
    reasons = []
    for name in ("dmesg", "journalctl_kernel"):
        res = reader.run(COMMANDS[name])
        if res.ok and res.stdout.strip():
            return {"status": "ok", "reason": None, "source": name.split("_", 1)[0],
                    "xid": parse_xid_lines(res.stdout), "ib_carrier_lost": parse_carrier_lost(res.stdout)}
        detail = (res.stderr or res.stdout).strip().splitlines()
        reasons.append(f"{' '.join(COMMANDS[name][:2])}: "
                       f"{detail[0][:160] if detail else res.reason() or 'no output'}")
    return {"status": "unknown", "reason": "; ".join(reasons), "source": None, "xid": []}


_BOOT_RE = re.compile(r"^\s*(-?\d+)\s+([0-9a-f]{32})\s+(.*?)\s*$")


def parse_list_boots(text: str) -> list[dict[str, Any]]:
    """``journalctl --list-boots``: ``[{"offset", "boot_id", "span"}]`` oldest first. Lines of another shape
    (systemd 253's column header) are skipped."""
    boots = []
    for line in (text or "").splitlines():
        match = _BOOT_RE.match(line)
        if match:
            boots.append({"offset": int(match.group(1)), "boot_id": match.group(2), "span": match.group(3)[:120]})
    return boots


def collect_xid_history(reader: NodeReader) -> dict[str, Any]:
    """XidHistory facts: the Xid lines of the last XID_HISTORY_BOOTS earlier boots, from the journal.

    Returns ``{"status", "reason", "boots_listed", "boots"}``; ``boots`` holds, newest first, each earlier
    boot read (``offset``, ``boot_id``, ``span``, ``xid``). A journal that keeps no earlier boot (volatile
    storage) is ``ok`` with no boots: nothing earlier to judge, said in ``boots_listed``.
    """
    res = reader.run(COMMANDS["journalctl_boots"])
    if not res.ok:
        return {"status": "unknown", "reason": res.reason(), "boots_listed": None, "boots": []}
    listed = parse_list_boots(res.stdout)
    earlier = sorted((b for b in listed if b["offset"] < 0), key=lambda b: -b["offset"])[:XID_HISTORY_BOOTS]
    boots = []
    reasons = []
    for boot in earlier:
        log = reader.run(journalctl_kernel_boot_argv(boot["offset"]))
        if not log.ok:
            reasons.append(f"boot {boot['offset']}: {log.reason() or 'no output'}")
            continue
        boots.append(dict(boot, xid=parse_xid_lines(log.stdout)))
    status = "ok" if boots or not earlier else "unknown"
    return {"status": status, "reason": "; ".join(reasons) or None, "boots_listed": len(listed), "boots": boots}


def load_pynvml() -> tuple[Any, str | None]:
    """Import pynvml if the node has it: ``(module, None)`` or ``(None, reason)``."""
    try:
        import pynvml  # optional dependency, absent on many nodes
    except ImportError as exc:
        return None, f"pynvml not importable: {exc}"
    except Exception as exc:  # a broken install is a fact, not a crash
        return None, f"pynvml import failed: {type(exc).__name__}: {exc}"
    return pynvml, None


def load_nvml() -> tuple[Any, str | None, str | None]:
    """NVML bindings: pynvml when it imports, else k3fleet's own binding (k3fleet_nvml_lib) on
    libnvidia-ml.so.1. Returns ``(bindings, name, None)``, name "pynvml" or "k3fleet", or
    ``(None, None, reason)`` when neither loads (the library is not on this node)."""
    nv, import_problem = load_pynvml()
    if nv is not None:
        return nv, "pynvml", None
    # Imported here: a node whose pynvml imports never compiles the binding.
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml_lib import open_library

    lib, load_problem = open_library()
    if lib is None:
        return None, None, f"{load_problem} ({import_problem})"
    return lib, "k3fleet", None


_GRDMA_LINE = re.compile(r"^GrdmaPciTopoCheckOverride:\s*(\d+)\s*$", re.M)
_GRDMA_DWORD = re.compile(r"\bGrdmaPciTopoCheckOverride=(\w+)")


def parse_grdma_override(text: str) -> bool:
    """Whether /proc/driver/nvidia/params sets GrdmaPciTopoCheckOverride to 1: its own "Name: 1" line (the
    form NVIDIA/aicr checks) or inside RegistryDwords ("...;GrdmaPciTopoCheckOverride=1;...")."""
    line = _GRDMA_LINE.search(text or "")
    if line:
        return line.group(1) != "0"
    dword = _GRDMA_DWORD.search(text or "")
    return dword is not None and dword.group(1) not in ("0", "0x0")


def kernel_module_facts(reader: NodeReader) -> dict[str, Any]:
    """The loaded nvidia kernel module: loaded, version, flavour, first line.

    /proc/driver/nvidia/version exists only while nvidia.ko is loaded, so its
    absence means "not loaded"; /proc/modules corroborates when readable (some
    kernels are built without it). Adds ``reason`` when the file is unreadable
    or not understood.
    """
    km: dict[str, Any] = {"loaded": None, "version": None, "flavour": None, "arch": None, "raw": None}
    modules_text = reader.read_cached(FILES["proc_modules"])
    in_modules = None if modules_text is None else "nvidia" in parse_proc_modules(modules_text)
    # A small read size: procfs handlers may refuse to allocate a multi-megabyte read buffer.
    text = reader.read(FILES["proc_driver_version"], limit=64 * 1024)
    if text is None:
        if reader.exists(FILES["proc_driver_version"]):
            km["loaded"] = True if in_modules is None else in_modules
            km["reason"] = reader.read_error(FILES["proc_driver_version"])
        else:
            km["loaded"] = bool(in_modules)
            if in_modules:
                km["reason"] = f"{FILES['proc_driver_version']} missing although /proc/modules lists nvidia"
        return km
    km["loaded"] = True
    params = reader.read(FILES["proc_driver_params"], limit=256 * 1024)
    km["grdma_topo_override"] = None if params is None else parse_grdma_override(params)
    try:
        parsed = parse_proc_version(text)
    except ValueError as exc:
        first = (text.splitlines() or [""])[0]
        km["raw"] = first[:300] or None
        km["reason"] = str(exc)
        return km
    km.update(version=parsed["version"], flavour=parsed["flavour"], arch=parsed["arch"], raw=parsed["raw"])
    return km


_TEGRA_RELEASE_RE = re.compile(r"^#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+(?:\.\d+)*)")


def parse_nv_tegra_release(text: str) -> str | None:
    """ "# R35 (release), REVISION: 3.1, GCID: ..." -> "35.3.1" (the L4T release); None otherwise."""
    for line in (text or "").splitlines():
        match = _TEGRA_RELEASE_RE.match(line.strip())
        if match:
            return f"{match.group(1)}.{match.group(2)}"
    return None


def platform_facts(reader: NodeReader, km: dict[str, Any]) -> dict[str, Any]:
    """Whether the node is a data-center driver platform or a Jetson (Tegra, L4T) board.

    On Jetson the kernel module's version is the L4T release (35.3.1, JetPack 5) or a Tegra
    driver (540.4.0, JetPack 6): neither is a driver branch the target's matrix knows
    (docs/facts.md section 10). Evidence, strongest first: /etc/nv_tegra_release, a device tree
    naming nvidia,tegra*, a module version that is not a three-digit branch. Returns
    ``{"kind": "tegra" | "discrete" | None, "l4t_release", "evidence"}``.
    """
    out: dict[str, Any] = {"kind": None, "l4t_release": None, "evidence": None}
    release_text = reader.read(FILES["nv_tegra_release"], limit=16 * 1024)
    if release_text:
        first = next((ln.strip() for ln in release_text.splitlines() if ln.strip()), "")
        out.update(kind="tegra", l4t_release=parse_nv_tegra_release(release_text),
                   evidence=f"{FILES['nv_tegra_release']}: {first[:160]}")
        return out
    compatible = reader.read(FILES["device_tree_compatible"], limit=16 * 1024)
    tegra = [c for c in (compatible or "").split("\0") if c.strip().startswith("nvidia,tegra")]
    if tegra:
        out.update(kind="tegra", evidence=f"device tree compatible: {tegra[-1].strip()[:80]}")
        return out
    out.update(classify_driver_platform(km.get("version"), km.get("arch"), km.get("raw")))
    return out


# Data-center driver versions: a three-digit branch, a two- or three-digit minor, an optional
# two-digit patch (535.154.05, 550.127.05, 580.95.05, 610.43.02); docs/facts.md section 10.
DATA_CENTER_VERSION_RE = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")

# Jetson's Tegra drivers (JetPack 6: 540.2.0, 540.4.0): one-digit minor and patch.
TEGRA_DRIVER_RE = re.compile(r"^\d{3}\.\d\.\d+$")

# The L4T build host of /proc/driver/nvidia/version on Jetson ("(buildbrain@mobile-u64-6289-d7000)");
# data-center builds name dvs-builder hosts.
L4T_BUILD_HOST_RE = re.compile(r"\(buildbrain@mobile-[^)]*\)")


def classify_driver_platform(version: str | None, arch: str | None, raw: str | None) -> dict[str, Any]:
    """Platform facts from the loaded module's version line alone (no Tegra files read).

    A version under 100 is an L4T release (35.3.1); a Tegra driver (540.4.0) on aarch64 or from the L4T
    build host is a Jetson; a data-center shaped version is discrete; anything else is on no
    data-center branch and no known platform (kind "unknown"). Returns ``{"kind", "l4t_release",
    "evidence"}``; kind None when there is no version.
    """
    out: dict[str, Any] = {"kind": None, "l4t_release": None, "evidence": None}
    if not version:
        return out
    major = version.split(".", 1)[0]
    where = arch or "unknown arch"
    l4t_host = bool(raw and L4T_BUILD_HOST_RE.search(raw))
    if major.isdigit() and int(major) < 100:
        out.update(kind="tegra", l4t_release=version,
                   evidence=f"kernel module version {version} ({where}) is an L4T release, not a driver branch")
    elif TEGRA_DRIVER_RE.match(version) and (arch == "aarch64" or l4t_host):
        shown = "built by the L4T build host" if l4t_host else "on aarch64"
        out.update(kind="tegra",
                   evidence=f"kernel module version {version} ({shown}) is a Jetson Tegra driver, not a "
                            "data-center branch")
    elif l4t_host:
        out.update(kind="tegra", evidence=f"kernel module {version} was built by the L4T build host "
                                          f"({L4T_BUILD_HOST_RE.search(raw or '').group(0)})")  # type: ignore[union-attr]
    elif DATA_CENTER_VERSION_RE.match(version):
        out["kind"] = "discrete"
    else:
        out.update(kind="unknown", evidence=f"driver version {version} ({where}) has the shape of no "
                                            "data-center branch (NNN.NN[.NN])")
    return out


def nvml_not_asked(nvml: dict[str, Any]) -> bool:
    """NVML was never asked: no bindings loaded the library (nvidia-smi's own account of NVML is then the
    better one)."""
    return nvml["status"] == "library_not_found" and nvml.get("bindings") is None


def reserved_memory_from_smi(reader: NodeReader, gpus: list[dict[str, Any]]) -> str | None:
    """Where NVML answered only its v1 memory call (used includes the driver's reserved memory), Used and
    Reserved from ``nvidia-smi -q -d MEMORY``; a note naming the GPUs left with the v1 figure."""
    if not any(g.get("memory_source") == "nvml_v1" for g in gpus):
        return None
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_smi import apply_smi_memory

    res = reader.run(COMMANDS["nvidia_smi_q_memory"])
    if not res.ok:
        return f"GPU used memory includes the driver's reserved memory (nvidia-smi -q -d MEMORY: {res.reason()})"
    return apply_smi_memory(gpus, res.stdout)


def collect_driver(reader: NodeReader, use_nvml: bool = True) -> dict[str, Any]:
    """Driver and GPU facts (``DriverFacts`` shape).

    NVML answers first when ``use_nvml`` is true: through pynvml when it imports, else
    through k3fleet's own binding on libnvidia-ml.so.1 (``nvml.bindings`` says which);
    when no library loads (``library_not_found``), or after an NVML failure, nvidia-smi
    is asked. ``source`` names the one that gave the GPU list. When NVML could not be
    asked, an NVML init failure that nvidia-smi prints ("Failed to initialize NVML:
    Driver/library version mismatch") is recorded as the nvml status, since it is
    NVML's own answer.

    status: ``ok`` with a GPU list; ``absent`` when no NVIDIA kernel module is
    loaded; ``unknown`` (+reason) when the driver is loaded (or may be) but no
    source could list the GPUs.
    """
    km = kernel_module_facts(reader)
    facts: dict[str, Any] = {
        "status": "unknown",
        "reason": None,
        "kernel_module": {k: km.get(k) for k in ("loaded", "version", "flavour", "arch", "raw",
                                                 "grdma_topo_override")},
        "platform": platform_facts(reader, km),
        "nvml": {"status": "skipped", "error": None, "bindings": None},
        "source": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "gpu_count": None,
        "gpus": [],
    }
    reasons = []
    if km.get("reason"):
        reasons.append(km["reason"])

    nvml_answered = False
    unloaded = None
    if use_nvml:
        nv, bindings, load_problem = load_nvml()
        if nv is None:
            facts["nvml"] = {"status": "library_not_found", "error": load_problem, "bindings": None}
            # Said in the reason only when no source answered (below): nvml.error carries it.
            unloaded = (len(reasons), f"NVML: {load_problem}")
        else:
            # Imported here: a node without the NVML library never compiles the NVML source.
            from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import collect_nvml

            got = collect_nvml(nv)
            facts["nvml"] = dict(got["nvml"], bindings=bindings)
            if got["nvml"]["status"] == "ok":
                nvml_answered = True
                facts.update(source="nvml", driver_version=got["driver_version"],
                             cuda_driver_version=got["cuda_driver_version"], gpus=got["gpus"])
                if got["note"]:
                    reasons.append(got["note"])
                note = reserved_memory_from_smi(reader, got["gpus"])
                if note:
                    reasons.append(note)
            else:
                reasons.append(f"NVML: {got['nvml']['error']}")

    if not nvml_answered:
        # Imported here: a node whose NVML answers never compiles the nvidia-smi source.
        from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_smi import collect_smi

        smi = collect_smi(reader)
        if smi["ok"]:
            facts.update(source="nvidia-smi", driver_version=smi["driver_version"],
                         cuda_driver_version=smi["cuda_driver_version"], gpus=smi["gpus"])
        if smi["reason"]:
            reasons.append(smi["reason"])
        if smi["failure"] and (facts["nvml"]["status"] == "skipped" or nvml_not_asked(facts["nvml"])):
            facts["nvml"] = {"status": smi["failure"], "error": f"via nvidia-smi: {smi['reason']}",
                             "bindings": None}

    if facts["gpus"]:
        from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_smi import collect_topology

        facts["topology"] = collect_topology(reader)
    if km["loaded"] is not False:
        facts["kernel_log"] = collect_kernel_log(reader)
        facts["kernel_log"]["history"] = collect_xid_history(reader)
    if unloaded is not None and not facts["source"]:
        reasons.insert(*unloaded)
    if facts["source"]:
        facts["gpu_count"] = len(facts["gpus"])
        facts["status"] = "ok"
        # A partial answer (e.g. no CUDA version) keeps its reason as a note.
        facts["reason"] = "; ".join(reasons) or None
    elif km["loaded"] is False:
        facts["status"] = "absent"
        not_loaded = f"NVIDIA kernel module not loaded ({FILES['proc_driver_version']} absent)"
        facts["reason"] = "; ".join([not_loaded, *reasons])
    else:
        facts["status"] = "unknown"
        facts["reason"] = "; ".join(reasons) or "no source listed the GPUs"
    return facts


__all__ = [
    "classify_driver_platform",
    "collect_driver",
    "collect_kernel_log",
    "collect_xid_history",
    "kernel_module_facts",
    "load_nvml",
    "load_pynvml",
    "normalize_bus_id",
    "parse_carrier_lost",
    "parse_list_boots",
    "parse_nv_tegra_release",
    "parse_proc_modules",
    "parse_proc_version",
    "parse_xid_lines",
    "platform_facts",
]
