"""Thin adapters: raw captured text -> the shapes the audit's collectors produce.

Each adapter reads one kind of capture and calls the collectors' own pure parse functions
(``ansible_collections/k3fleet/gpu/plugins/module_utils``) wherever one exists for that text; where the capture is a
different rendering of the same fact (the plain ``nvidia-smi`` table instead of its CSV query,
``ibstat`` instead of sysfs), the adapter only re-spells it into the collector's input, so the
same parser and the same verdict rules judge it (docs/decision.md "Triage").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_container as ctr
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_driver as drv
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_fabricmanager as fmu
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_packages as pkg
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_probe as prb
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_rdma as rdma
from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_smi as smi
from k3fleet.bounds import loads_json

FM_UNIT = "nvidia-fabricmanager.service"


class CaptureError(ValueError):
    """The capture is of the sniffed kind but cannot be read; str() is one line."""


# -- nvidia-smi ------------------------------------------------------------------------------------

# "| NVIDIA-SMI 575.57.08   Driver Version: 575.57.08   CUDA Version: 12.9 |" and R610's
# "KMD Version: 610.43.02   CUDA UMD Version: 13.3".
_SMI_HEAD = re.compile(r"NVIDIA-SMI\s+(\S+)\s+(?:Driver|KMD) Version:\s*(\S+)\s+CUDA(?: UMD)? Version:\s*(\S+)")
# First row of a GPU block: "|   0  NVIDIA H100 80GB HBM3   On  |   00000000:18:00.0 Off |   0 |".
_SMI_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s")
# Its second row: "| N/A   30C    P0   100W /  700W |   1MiB /  81559MiB |   0%   Default |".
_SMI_MEM = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
# The first row's last cell is "Volatile Uncorr. ECC": a count, or N/A where ECC is off or absent.
_SMI_ECC = re.compile(r"\|\s*(\S+)\s*\|\s*$")
# A process row: "|    0   N/A  N/A   443   C   python3   103010MiB |"; the memory may be cut ("10301...").
_SMI_PROC = re.compile(r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(C\+G|C|G)\s+(.*?)\s+(\d+MiB|\S*\.\.\.|N/A)\s*\|$")


def driver_from_smi_table(text: str) -> dict[str, Any]:
    """The plain ``nvidia-smi`` table -> DriverFacts (as ``collect_smi`` would fill them)."""
    head = _SMI_HEAD.search(text)
    if head is None:
        raise CaptureError("no 'NVIDIA-SMI ... Driver Version ... CUDA Version' header line")
    lines = text.splitlines()
    gpus: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        m = _SMI_GPU.match(line.strip())
        if not m:
            continue
        mem = _SMI_MEM.search(lines[i + 1]) if i + 1 < len(lines) else None
        ecc = _SMI_ECC.search(line.strip())
        volatile = int(ecc.group(1)) if ecc and ecc.group(1).isdigit() else None
        gpus.append({"index": int(m.group(1)), "name": m.group(2).strip(), "persistence_mode": m.group(3) == "On",
                     "pci_bus_id": drv.normalize_bus_id(m.group(4)),
                     "memory_total_mib": int(mem.group(2)) if mem else None,
                     "memory_used_mib": int(mem.group(1)) if mem else None,
                     # The table shows only the volatile count; the lifetime one is in -q.
                     "ecc": {"mode": None, "volatile_uncorrected": volatile, "aggregate_uncorrected": None,
                             "reason": None if volatile is not None else
                             f"Volatile Uncorr. ECC reads {ecc.group(1) if ecc else 'nothing'}"
                             + (" (ECC disabled)" if ecc and ecc.group(1) == "Off" else "")}})
    _smi_table_processes(lines, gpus)
    cuda = head.group(3)
    return {"status": "ok", "reason": None, "source": "nvidia-smi", "driver_version": head.group(2),
            "cuda_driver_version": cuda if re.match(r"^\d+\.\d+$", cuda) else None,
            "nvml": {"status": "skipped", "error": None}, "gpu_count": len(gpus), "gpus": gpus}


def _smi_table_processes(lines: list[str], gpus: list[dict[str, Any]]) -> None:
    """The "Processes:" table into each GPU's ``processes``: [] for "No running processes found", left
    None (unknown) when the excerpt has no process table."""
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("| Processes:")), None)
    if start is None:
        return
    by_index = {g["index"]: g for g in gpus}
    for g in gpus:
        g["processes"] = []
    for line in lines[start + 1:]:
        m = _SMI_PROC.match(line.strip())
        if not m or int(m.group(1)) not in by_index:
            continue
        used = m.group(5)
        by_index[int(m.group(1))]["processes"].append({
            "pid": int(m.group(2)), "type": m.group(3), "name": m.group(4).strip()[:200] or None,
            "used_memory_mib": int(used[:-3]) if used.endswith("MiB") else None})


_Q_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_Q_FIELD = re.compile(r"^\s{4}(Product Name|Persistence Mode|Minor Number|GPU UUID)\s*:\s*(.*?)\s*$")
_Q_TOTAL = re.compile(r"^\s{8}Total\s*:\s*(\d+)\s*MiB")


def driver_from_smi_q(text: str) -> dict[str, Any]:
    """``nvidia-smi -q`` -> DriverFacts: the header through ``parse_smi_q_cuda``, per-GPU fabric
    state through ``apply_smi_fabric``, the GPU list from each block's first fields."""
    try:
        header = smi.parse_smi_q_cuda(text)
    except ValueError as exc:
        raise CaptureError(str(exc)) from exc
    gpus: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    in_fb = False
    for line in text.splitlines():
        m = _Q_GPU.match(line)
        if m:
            cur = {"index": len(gpus), "pci_bus_id": drv.normalize_bus_id(m.group(1)), "name": None,
                   "persistence_mode": None, "memory_total_mib": None, "uuid": None}
            gpus.append(cur)
            in_fb = False
            continue
        if cur is None:
            continue
        f = _Q_FIELD.match(line)
        if f:
            key, value = f.groups()
            if key == "Product Name":
                cur["name"] = value
            elif key == "Persistence Mode":
                cur["persistence_mode"] = {"Enabled": True, "Disabled": False}.get(value)
            elif key == "Minor Number" and value.isdigit():
                cur["index"] = int(value)
            elif key == "GPU UUID":
                cur["uuid"] = value
        if line.startswith("    FB Memory Usage"):
            in_fb = True
        elif in_fb:
            t = _Q_TOTAL.match(line)
            if t:
                cur["memory_total_mib"] = int(t.group(1))
                in_fb = False
    note = smi.apply_smi_fabric(gpus, text) if gpus else None
    return {"status": "ok" if gpus else "unknown", "reason": note, "source": "nvidia-smi",
            "driver_version": header.get("driver_version"), "cuda_driver_version": header.get("cuda_version"),
            "nvml": {"status": "skipped", "error": None}, "gpu_count": len(gpus) if gpus else None, "gpus": gpus}


def driver_from_smi_failure(text: str) -> dict[str, Any]:
    """nvidia-smi's own failure text ("Failed to initialize NVML: ...") -> the NVML status it names."""
    status, message = smi.classify_smi_failure(text)
    return {"status": "unknown", "reason": f"nvidia-smi failed: {message}", "source": None,
            "nvml": {"status": status, "error": f"via nvidia-smi: {message}"}}


def kernel_module_from_proc(text: str) -> dict[str, Any]:
    try:
        parsed = drv.parse_proc_version(text)
    except ValueError as exc:
        raise CaptureError(str(exc)) from exc
    return {"loaded": True, "version": parsed["version"], "flavour": parsed["flavour"], "raw": parsed["raw"]}


# -- Fabric Manager ------------------------------------------------------------------------------------

_LOADED = re.compile(r"^\s*Loaded:\s*(\S+)(?:\s*\(([^)]*)\))?")
_ACTIVE = re.compile(r"^\s*Active:\s*(\S+)")
_FM_FAILED = re.compile(r"nvidia-fabricmanager(?:\.service)?: (?:Control process exited, code=exited, "
                        r"status=[1-9]|Failed with result|Main process exited, code=exited, status=[1-9])|"
                        r"\" failed! Exit code: [1-9]")
# Fabric Manager's own refusal, with or without a journal prefix: "fabric manager NVIDIA GPU driver interface
# version 530.30.02 don't match with driver version 530.41.03" (gpu-operator issue 544; "doesn't match" in
# later releases; siderolabs/pkgs issue 720 without a prefix).
FM_VERSION_MISMATCH = re.compile(r"fabric manager NVIDIA GPU driver interface version\s+(\d+(?:\.\d+)+)\s+"
                                 r"(?:don.t|doesn.t|does not) match with (?:the )?driver version\s+(\d+(?:\.\d+)+)",
                                 re.I)
_FM_STARTED = re.compile(r"systemd\[\d+\]: Started (?:nvidia-fabricmanager\.service|NVIDIA fabric manager)")
_FM_STOPPED = re.compile(r"systemd\[\d+\]: (?:Stopped|nvidia-fabricmanager\.service: Deactivated)")


def fabricmanager_unit(text: str) -> dict[str, Any]:
    """``systemctl status``, ``systemctl show`` or the unit's journal -> UnitState via ``unit_state``.

    ``systemctl show`` goes through the collectors' own ``parse_systemctl_show``; the other two are
    re-spelt into its properties (LoadState, ActiveState, UnitFileState) first. A journal has no state
    line: the last start, stop or failure it records is the state it shows.
    """
    if re.search(r"^ActiveState=", text, re.M):
        units = pkg.parse_systemctl_show(text)
        if FM_UNIT not in units and len(units) == 1:
            units = {FM_UNIT: next(iter(units.values()))}
        return fmu.unit_state(units)
    props: dict[str, str] = {}
    for line in text.splitlines():
        m = _LOADED.match(line)
        if m:
            props["LoadState"] = m.group(1)
            parts = [p.strip() for p in (m.group(2) or "").split(";")]
            if len(parts) > 1 and parts[1]:
                props["UnitFileState"] = parts[1]
            continue
        m = _ACTIVE.match(line)
        if m:
            props["ActiveState"] = m.group(1)
    if "ActiveState" not in props:
        state = None
        for line in text.splitlines():
            # Fabric Manager exits when the versions differ: its refusal is a failed start.
            if _FM_FAILED.search(line) or FM_VERSION_MISMATCH.search(line):
                state = "failed"
            elif _FM_STARTED.search(line):
                state = "active"
            elif _FM_STOPPED.search(line):
                state = "inactive"
        if state is None:
            raise CaptureError("no unit state, start, stop or failure of nvidia-fabricmanager in the text")
        props["ActiveState"] = state
        props.setdefault("LoadState", "loaded")
    return fmu.unit_state({FM_UNIT: props})


def fabricmanager_mismatch(text: str) -> tuple[str, str] | None:
    """(Fabric Manager version, driver version) when the text holds Fabric Manager's refusal line."""
    m = FM_VERSION_MISMATCH.search(" ".join(text.split()))
    return (m.group(1), m.group(2)) if m else None


def kernel_log_from_text(text: str) -> dict[str, Any]:
    """A pasted kernel log (dmesg, journalctl -k, syslog) -> KernelLog via the collector's Xid parser."""
    events = drv.parse_xid_lines(text)
    if not events:
        raise CaptureError("no 'NVRM: Xid' line and no GPU that fell off the bus")
    return {"status": "ok", "reason": None, "source": "capture", "xid": events}


def fabricmanager_version(text: str) -> str | None:
    try:
        return fmu.parse_fm_version(text)
    except ValueError:
        return None


# -- InfiniBand ----------------------------------------------------------------------------------------

# IB port states by name (IBTA: 1 Down, 2 Init(ializing), 3 Armed, 4 Active; physical 2 Polling,
# 3 Disabled, 5 LinkUp): the codes sysfs prints in front of the name.
_STATE = {"down": (1, "DOWN"), "initializing": (2, "INIT"), "init": (2, "INIT"), "armed": (3, "ARMED"),
          "active": (4, "ACTIVE")}
_PHYS = {"sleep": (1, "Sleep"), "polling": (2, "Polling"), "disabled": (3, "Disabled"),
         "portconfigurationtraining": (4, "PortConfigurationTraining"), "linkup": (5, "LinkUp"),
         "linkerrorrecovery": (6, "LinkErrorRecovery"), "phytest": (7, "Phy Test")}


def _coded(table: dict[str, tuple[int, str]], name: str) -> str | None:
    hit = table.get(name.replace(" ", "").replace("_", "").lower())
    return f"{hit[0]}: {hit[1]}" if hit else None


PortValues = dict[str, str | None]


def _rdma_devices(text: str, device: str, port: str, field: Callable[[str, PortValues], None],
                  missing: str, finish: Callable[[PortValues], None] | None = None) -> list[dict[str, Any]]:
    """Device blocks (header ``device``), their port blocks (header ``port``), each port's lines
    read by ``field`` into the collectors' input and, after ``finish``, through ``parse_port``."""
    devices: list[dict[str, Any]] = []
    dev: dict[str, Any] | None = None
    current: tuple[int, PortValues] | None = None

    def close_port() -> None:
        nonlocal current
        if dev is not None and current is not None:
            if finish is not None:
                finish(current[1])
            dev["ports"].append(rdma.parse_port(*current))
        current = None

    for line in text.splitlines():
        s = line.strip()
        m = re.match(device, s)
        if m:
            close_port()
            dev = {"name": m.group(1), "ports": []}
            devices.append(dev)
            continue
        m = re.match(port, s)
        if m and dev is not None:
            close_port()
            current = (int(m.group(1)), {"state": None, "phys_state": None, "rate": None, "link_layer": None})
            continue
        if current is not None:
            field(s, current[1])
    close_port()
    if not devices:
        raise CaptureError(missing)
    return devices


def _ibstat_field(s: str, values: PortValues) -> None:
    if ":" not in s:
        return
    key, _, value = (x.strip() for x in s.partition(":"))
    if key == "State":
        values["state"] = _coded(_STATE, value)
    elif key == "Physical state":
        values["phys_state"] = _coded(_PHYS, value)
    elif key == "Rate" and re.match(r"^\d+(\.\d+)?$", value):
        values["rate"] = f"{value} Gb/sec"
    elif key == "Link layer":
        values["link_layer"] = value


def rdma_from_ibstat(text: str) -> list[dict[str, Any]]:
    """``ibstat`` -> RDMA devices, each port through the collectors' ``parse_port``."""
    return _rdma_devices(text, r"^CA '([^']+)'", r"^Port (\d+):$", _ibstat_field, "no \"CA '<device>'\" block")


def _ibv_devinfo_field(s: str, values: PortValues) -> None:
    m = re.match(r"^(state|phys_state|link_layer):\s*(.+?)\s*$", s)
    if not m:
        return
    key, value = m.groups()
    coded = re.match(r"^(?:PORT_|)([A-Z_]+)\s*\((\d+)\)$", value)
    if key == "state" and coded:
        name = _STATE.get(coded.group(1).lower(), (0, coded.group(1)))[1]
        values["state"] = f"{coded.group(2)}: {name}"
    elif key == "phys_state" and coded:
        name = _PHYS.get(coded.group(1).replace("_", "").lower(), (0, coded.group(1)))[1]
        values["phys_state"] = f"{coded.group(2)}: {name}"
    elif key == "link_layer":
        values["link_layer"] = value


def _link_up_when_active(values: PortValues) -> None:
    if values["phys_state"] is None and values["state"] == "4: ACTIVE":
        values["phys_state"] = "5: LinkUp"


def rdma_from_ibv_devinfo(text: str) -> list[dict[str, Any]]:
    """``ibv_devinfo`` (plain or -v) -> RDMA devices through ``parse_port``.

    The plain listing prints no physical state; a port whose logical state is ACTIVE has its
    physical link up (the logical state cannot leave Down without it), so LinkUp is taken then.
    """
    return _rdma_devices(text, r"^hca_id:\s*(\S+)", r"^port:\s*(\d+)$", _ibv_devinfo_field, "no 'hca_id:' block",
                         finish=_link_up_when_active)


# -- containers ----------------------------------------------------------------------------------------


def image_from_inspect(text: str) -> dict[str, Any]:
    """``docker|podman inspect`` of an image or a container -> ImageFacts via ``parse_image_inspect``."""
    try:
        data = loads_json(text)
    except ValueError as exc:
        raise CaptureError(f"not JSON: {exc}") from exc
    item = data[0] if isinstance(data, list) and data else data
    if not isinstance(item, dict):
        raise CaptureError("expected a JSON array of inspect objects")
    _check_inspect_types(item)
    config: dict[str, Any] = item["Config"] if isinstance(item.get("Config"), dict) else {}
    tags = _strings(item.get("RepoTags"))
    # A container's inspect names its image in Config.Image; an image's in RepoTags.
    digests = _strings(item.get("RepoDigests"))
    ref = (config.get("Image") if isinstance(config.get("Image"), str) and "State" in item else None) or \
        (tags[0] if tags else None) or (digests[0] if digests else None) or \
        (item["Id"] if isinstance(item.get("Id"), str) and item["Id"] else "image")
    image, problem = ctr.parse_image_inspect(ref, 0, json.dumps([item]), "")
    if problem:
        raise CaptureError(problem)
    return image


# The types Docker Engine's API gives the fields of an inspect that k3fleet reads or that show what the
# object is (docs.docker.com/reference/api/engine: ImageInspect, ContainerInspectResponse; podman's inspect
# keeps the names and types). null stands for a field not set. A field of another type is not an inspect
# someone pasted unchanged: it is refused by name instead of being read as absent.
_OBJ, _STR, _LIST, _NUM = "an object", "a string", "a list", "a number"
_INSPECT_TYPES: dict[str, str] = {
    "Id": _STR, "ID": _STR, "Created": _STR, "Image": _STR, "Name": _STR, "Architecture": _STR, "Os": _STR,
    "RepoTags": _LIST, "RepoDigests": _LIST, "Mounts": _LIST, "Config": _OBJ, "State": _OBJ,
    "HostConfig": _OBJ, "GraphDriver": _OBJ, "NetworkSettings": _OBJ, "Size": _NUM,
}
_CONFIG_TYPES: dict[str, str] = {"Env": _LIST, "Labels": _OBJ, "Image": _STR, "Cmd": _LIST, "Entrypoint": _LIST,
                                 "WorkingDir": _STR, "User": _STR}
_STRING_LISTS = frozenset({"RepoTags", "RepoDigests", "Config.Env", "Config.Cmd", "Config.Entrypoint"})


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {dict: _OBJ, list: _LIST, str: _STR, int: _NUM, float: _NUM}.get(type(value), type(value).__name__)


def _check_inspect_types(item: dict[str, Any]) -> None:
    """Every known field of an inspect object of its API type (or null), else CaptureError naming it."""
    fields = [(k, item[k], want) for k, want in _INSPECT_TYPES.items() if k in item]
    if isinstance(item.get("Config"), dict):
        fields += [(f"Config.{k}", item["Config"][k], want) for k, want in _CONFIG_TYPES.items()
                   if k in item["Config"]]
    for name, value, want in fields:
        if value is None:
            continue
        got = _type_name(value)
        if got != want:
            raise CaptureError(f"field {name} is {got} ({_shown(value)}), expected {want}")
        if name in _STRING_LISTS:
            bad = next((v for v in value if not isinstance(v, str)), None)
            if bad is not None:
                raise CaptureError(f"field {name} holds {_type_name(bad)} ({_shown(bad)}), expected strings only")
        elif name == "Config.Labels":
            bad_key = next((k for k, v in value.items() if not isinstance(v, str)), None)
            if bad_key is not None:
                raise CaptureError(f"field Config.Labels.{bad_key[:60]} is {_type_name(value[bad_key])}, "
                                   "expected a string")
        elif name == "Mounts":
            bad = next((v for v in value if not isinstance(v, dict)), None)
            if bad is not None:
                raise CaptureError(f"field Mounts holds {_type_name(bad)} ({_shown(bad)}), expected objects only")


def _shown(value: Any) -> str:
    if isinstance(value, dict | list):
        return "{...}" if isinstance(value, dict) else "[...]"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def probe_from_error(text: str) -> dict[str, Any]:
    """A container start error -> ProbeFacts, classified by the audit probe's own patterns."""
    if prb.classify_probe_failure(text)[0] is None:
        raise CaptureError("no known container start failure in the text")
    return prb.parse_probe_output(125, "", text)


_IMAGE_REF = re.compile(r"(?<![\w./:-])((?:[\w.-]+(?::\d+)?/)+[\w.-]+(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?)"
                        r"(?=\s|$|\")")


def runtime_named_in(text: str) -> str:
    for name in ("docker", "podman", "containerd", "cri-o", "nerdctl"):
        if re.search(rf"\b{name}\b", text, re.IGNORECASE):
            return name
    return "container runtime"


def image_named_in(text: str) -> str:
    """The image reference a start error names (``docker run ... vllm/vllm-openai:tag``), if any."""
    for m in _IMAGE_REF.finditer(text):
        ref = m.group(1)
        if not ref.startswith(("/", "usr/", "lib/", "proc/", "sys/", "dev/", "run/")) and ":" in ref:
            return ref
    return "(image not named in the capture)"
