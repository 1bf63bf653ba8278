# Stdlib only: shipped to nodes inside AnsiballZ. pynvml is optional and imported lazily.
"""Driver and GPU facts: loaded kernel module, NVML (or nvidia-smi), per-GPU details.

``collect_driver(reader, use_nvml=True)`` returns a dict shaped like
``k3fleet.models.facts.DriverFacts``. The parse functions are pure and raise
``ValueError`` with a one-line explanation on output they do not understand; the
collector turns that into ``unknown`` + reason, never an exception.
"""

from __future__ import annotations

import contextlib
import csv
import re
from typing import Any

try:
    from ansible.module_utils.k3fleet_cmd import NodeReader
    from ansible.module_utils.k3fleet_sources import COMMANDS, FILES
except ImportError:  # imported from the controller package (unit tests, lab)
    from k3fleet.ansible.module_utils.k3fleet_cmd import NodeReader
    from k3fleet.ansible.module_utils.k3fleet_sources import COMMANDS, FILES

# The --query-gpu fields of COMMANDS["nvidia_smi_query"], in order.
SMI_QUERY_FIELDS = tuple(
    COMMANDS["nvidia_smi_query"][1].split("=", 1)[1].split(",")
)

# NVML error classes (pynvml names, FACTS.md section 5) -> nvml.status values.
NVML_ERROR_STATUS = {
    "NVMLError_LibraryNotFound": "library_not_found",
    "NVMLError_DriverNotLoaded": "driver_not_loaded",
    "NVMLError_LibRmVersionMismatch": "lib_rm_version_mismatch",
    "NVMLError_NoPermission": "no_permission",
    "NVMLError_GpuIsLost": "gpu_is_lost",
}

# nvmlGpuFabricState_t values (FACTS.md section 5).
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

# nvidia-smi failure texts -> the NVML status they stand for. nvidia-smi is an NVML
# client: "Failed to initialize NVML: ..." is NVML's own init failure, reported for it.
_SMI_FAILURES = (
    (re.compile(r"Driver/library version mismatch", re.I), "lib_rm_version_mismatch"),
    # Seen with both ' and a typographic apostrophe in "couldn't".
    (re.compile(r"couldn.t communicate with the NVIDIA driver", re.I), "driver_not_loaded"),
    (re.compile(r"NVML Shared Library Not Found|libnvidia-ml\.so", re.I), "library_not_found"),
    (re.compile(r"Insufficient Permissions|No permission", re.I), "no_permission"),
    (re.compile(r"GPU is lost", re.I), "gpu_is_lost"),
    (re.compile(r"Failed to initialize NVML", re.I), "error"),
)

_VERSION_RE = re.compile(r"(?<![\w.])(\d+\.\d+(?:\.\d+)*)(?![\w.])")
_NA_VALUES = ("", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]",
              "[insufficient permissions]", "[gpu is lost]")


# -- pure parsers ----------------------------------------------------------------


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
    version_match = _VERSION_RE.search(first, marker + len("Kernel Module"))
    if not version_match:
        raise ValueError(f"/proc/driver/nvidia/version: no driver version after 'Kernel Module' in "
                         f"{first[:120]!r}")
    return {
        "version": version_match.group(1),
        "flavour": flavour,
        "arch": arch_match.group(1) if arch_match else None,
        "raw": first,
    }


def parse_proc_modules(text: str) -> dict[str, dict[str, Any]]:
    """Parse /proc/modules into ``{name: {"size", "refcount", "state"}}``.

    Lines that are not module lines (a short read) are skipped: presence is all
    the collector needs, and a half line cannot name a module reliably.
    """
    modules = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[1].isdigit():
            continue
        modules[parts[0]] = {
            "size": int(parts[1]),
            "refcount": int(parts[2]) if parts[2].isdigit() else None,
            "state": parts[4],
        }
    return modules


def _na(value: str) -> bool:
    return value.strip().lower() in _NA_VALUES


def _smi_int(value: str, field: str, line_no: int) -> int | None:
    if _na(value):
        return None
    # Without "nounits" memory reads "81559 MiB".
    match = re.match(r"^(\d+)(?: MiB)?$", value.strip())
    if not match:
        raise ValueError(f"nvidia-smi CSV line {line_no}: {field} is not a number: {value!r}")
    return int(match.group(1))


def _smi_bool(value: str, field: str, line_no: int) -> bool | None:
    if _na(value):
        return None
    low = value.strip().lower()
    if low in ("enabled", "on", "1"):
        return True
    if low in ("disabled", "off", "0"):
        return False
    raise ValueError(f"nvidia-smi CSV line {line_no}: {field} is not Enabled/Disabled: {value!r}")


def _field_key(header_cell: str) -> str:
    # "memory.total [MiB]" -> "memory.total"
    return header_cell.split("[", 1)[0].strip()


def parse_smi_csv(text: str, fields: tuple[str, ...] = SMI_QUERY_FIELDS) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    Returns one dict per GPU keyed by the query field names, with index and
    memory.total as int, persistence_mode as bool, "[N/A]"-style values as None.
    A header line (``--format=csv``) is recognised and skipped. Raises ValueError
    on a row with the wrong number of fields or a value of the wrong kind, which
    is what truncated output looks like.
    """
    rows = []
    reader = csv.reader((text or "").splitlines(), skipinitialspace=True)
    line_no = 0
    for cells in reader:
        line_no += 1
        if not cells or not "".join(cells).strip():
            continue
        if line_no == 1 and tuple(_field_key(c) for c in cells) == tuple(fields):
            continue
        if len(cells) != len(fields):
            raise ValueError(f"nvidia-smi CSV line {line_no} has {len(cells)} fields, expected "
                             f"{len(fields)} ({','.join(fields)}): {', '.join(cells)[:160]!r}")
        row: dict[str, Any] = {}
        for pos, field in enumerate(fields):
            value = cells[pos].strip()
            if field in ("index", "memory.total"):
                row[field] = _smi_int(value, field, line_no)
            elif field == "persistence_mode":
                row[field] = _smi_bool(value, field, line_no)
            elif field == "compute_cap":
                if _na(value):
                    row[field] = None
                elif re.match(r"^\d+\.\d+$", value):
                    row[field] = value
                else:
                    raise ValueError(f"nvidia-smi CSV line {line_no}: compute_cap is not major.minor: "
                                     f"{value!r}")
            else:
                row[field] = None if _na(value) else value
        rows.append(row)
    if not rows:
        raise ValueError("nvidia-smi CSV output has no GPU rows")
    return rows


def parse_smi_q_cuda(text: str) -> dict[str, str | None]:
    """Read "Driver Version" and "CUDA Version" from the header of ``nvidia-smi -q``.

    The CUDA version is the driver's maximum supported CUDA. A value that is not
    a version (vGPU hosts print "Not Found") becomes None. R610 headers call the
    fields "KMD Version" and "CUDA UMD Version"; both spellings are accepted.
    Raises ValueError when neither field is present.
    """
    driver = cuda = None
    found = False
    for line in (text or "").splitlines():
        match = re.match(r"^\s*(Driver|KMD) Version\s*:\s*(.*?)\s*$", line)
        if match:
            found = True
            driver = match.group(2) if _VERSION_RE.fullmatch(match.group(2)) else None
            continue
        match = re.match(r"^\s*CUDA(?: UMD)? Version\s*:\s*(.*?)\s*$", line)
        if match:
            found = True
            cuda = match.group(1) if re.fullmatch(r"\d+\.\d+", match.group(1)) else None
    if not found:
        raise ValueError("nvidia-smi -q output has no 'Driver Version' or 'CUDA Version' line")
    return {"driver_version": driver, "cuda_version": cuda}


def classify_smi_failure(text: str) -> tuple[str, str]:
    """Map nvidia-smi's failure text to an NVML status and a one-line message."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    message = " ".join(lines[:2])[:300] if lines else "no output"
    for pattern, status in _SMI_FAILURES:
        if pattern.search(text or ""):
            return status, message
    return "error", message


def cuda_version_from_int(value: int) -> str:
    """13000 -> "13.0", 12090 -> "12.9" (NVML encodes 1000*major + 10*minor)."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def nvml_error_status(exc: BaseException) -> str:
    """The nvml.status for an NVMLError, matched by pynvml class name."""
    for klass in type(exc).__mro__:
        if klass.__name__ in NVML_ERROR_STATUS:
            return NVML_ERROR_STATUS[klass.__name__]
    return "error"


def _nvml_message(exc: BaseException) -> str:
    # NVMLError.__str__ may call into the C library; a broken library must not
    # turn an error report into a second error.
    try:
        text = str(exc)
    except Exception:  # any failure here only loses the message text
        text = ""
    code = getattr(exc, "value", None)
    name = type(exc).__name__
    if text:
        return f"{name}: {text}"
    return f"{name} (code {code})"


def _text(value: Any) -> str | None:
    # nvidia-ml-py 12.x returns bytes for some strings, 13.x returns str.
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode("utf-8", "replace")
    value = str(value).strip()
    return value or None


# -- NVML ------------------------------------------------------------------------


def load_pynvml() -> tuple[Any, str | None]:
    """Import pynvml if the node has it: ``(module, None)`` or ``(None, reason)``."""
    try:
        import pynvml  # optional dependency, absent on many nodes
    except ImportError as exc:
        return None, f"pynvml not importable: {exc}"
    except Exception as exc:  # a broken install is a fact, not a crash
        return None, f"pynvml import failed: {type(exc).__name__}: {exc}"
    return pynvml, None


def _fabric_state(nv: Any, handle: Any) -> str | None:
    import ctypes  # only needed when NVML is in use

    info_type = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    getter = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    if info_type is None or getter is None:
        return None  # bindings older than the fabric API
    info = info_type()
    try:
        getter(handle, ctypes.byref(info))
    except nv.NVMLError as exc:
        if type(exc).__name__ == "NVMLError_NotSupported":
            return "not_supported"
        if type(exc).__name__ == "NVMLError_GpuIsLost":
            raise
        return None
    return FABRIC_STATES.get(int(info.state))


def _nvml_gpu(nv: Any, index: int) -> dict[str, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    gpu: dict[str, Any] = {"index": index}
    gpu["name"] = _text(nv.nvmlDeviceGetName(handle))
    gpu["uuid"] = _text(nv.nvmlDeviceGetUUID(handle))
    gpu["memory_total_mib"] = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    gpu["persistence_mode"] = int(nv.nvmlDeviceGetPersistenceMode(handle)) == 1
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
    gpu["compute_capability"] = f"{int(major)}.{int(minor)}"
    gpu["pci_bus_id"] = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
    gpu["fabric_state"] = _fabric_state(nv, handle)
    return gpu


def collect_nvml(nv: Any) -> dict[str, Any]:
    """Query NVML through the pynvml module ``nv``.

    Returns ``{"nvml": {"status", "error"}, "driver_version", "cuda_driver_version",
    "gpus"}``. NVML failures are reported as status values, never raised; a GPU
    that is lost mid-query is kept with its index and the status says so.
    nvmlShutdown always runs once nvmlInit succeeded.
    """
    result: dict[str, Any] = {"nvml": {"status": "ok", "error": None}, "driver_version": None,
                              "cuda_driver_version": None, "gpus": []}
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        result["nvml"] = {"status": nvml_error_status(exc), "error": "nvmlInit: " + _nvml_message(exc)}
        return result
    try:
        result["driver_version"] = _text(nv.nvmlSystemGetDriverVersion())
        result["cuda_driver_version"] = cuda_version_from_int(int(nv.nvmlSystemGetCudaDriverVersion_v2()))
        count = int(nv.nvmlDeviceGetCount())
        for index in range(count):
            try:
                result["gpus"].append(_nvml_gpu(nv, index))
            except nv.NVMLError as exc:
                # One lost GPU must not hide the others.
                result["gpus"].append({"index": index})
                result["nvml"] = {"status": nvml_error_status(exc),
                                  "error": f"GPU {index}: {_nvml_message(exc)}"}
    except nv.NVMLError as exc:
        result["nvml"] = {"status": nvml_error_status(exc), "error": _nvml_message(exc)}
    except Exception as exc:  # bindings/library disagreement (missing symbol, ctypes error)
        result["nvml"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        # Shutting down a half-initialised library has nothing left to report.
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
    return result


# -- nvidia-smi ------------------------------------------------------------------


def _gpu_from_smi(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": row.get("index"),
        "name": row.get("name"),
        "uuid": row.get("uuid"),
        "memory_total_mib": row.get("memory.total"),
        "persistence_mode": row.get("persistence_mode"),
        "compute_capability": row.get("compute_cap"),
        "pci_bus_id": row.get("pci.bus_id"),
        "fabric_state": None,
    }


def collect_smi(reader: NodeReader) -> dict[str, Any]:
    """Query nvidia-smi (COMMANDS nvidia_smi_query and nvidia_smi_q).

    Returns ``{"ok", "reason", "failure", "driver_version", "cuda_driver_version",
    "gpus", "not_found"}``; ``failure`` is an NVML status when nvidia-smi reported an
    NVML init failure.
    """
    out: dict[str, Any] = {"ok": False, "reason": None, "failure": None, "driver_version": None,
                           "cuda_driver_version": None, "gpus": [], "not_found": False}
    res = reader.run_cached(COMMANDS["nvidia_smi_query"])
    if res.error == "not_found":
        out["not_found"] = True
        out["reason"] = res.reason()
        return out
    if not res.ok:
        if res.error is None:
            status, message = classify_smi_failure(res.stdout + "\n" + res.stderr)
            out["failure"] = status
            out["reason"] = f"nvidia-smi failed (exit {res.rc}): {message}"
        else:
            out["reason"] = res.reason()
        return out
    try:
        rows = parse_smi_csv(res.stdout)
    except ValueError as exc:
        out["reason"] = f"nvidia-smi --query-gpu output not understood: {exc}"
        return out
    out["gpus"] = [_gpu_from_smi(row) for row in rows]
    versions = [row.get("driver_version") for row in rows if row.get("driver_version")]
    out["driver_version"] = versions[0] if versions else None
    out["ok"] = True
    q = reader.run_cached(COMMANDS["nvidia_smi_q"])
    if q.ok:
        try:
            header = parse_smi_q_cuda(q.stdout)
        except ValueError as exc:
            out["reason"] = f"CUDA version unknown: {exc}"
        else:
            out["cuda_driver_version"] = header["cuda_version"]
            out["driver_version"] = out["driver_version"] or header["driver_version"]
    else:
        out["reason"] = f"CUDA version unknown: {q.reason()}"
    return out


# -- kernel module ---------------------------------------------------------------


def kernel_module_facts(reader: NodeReader) -> dict[str, Any]:
    """The loaded nvidia kernel module: loaded, version, flavour, first line.

    /proc/driver/nvidia/version exists only while nvidia.ko is loaded, so its
    absence means "not loaded"; /proc/modules corroborates when readable (some
    kernels are built without it). Adds ``reason`` when the file is unreadable
    or not understood.
    """
    km: dict[str, Any] = {"loaded": None, "version": None, "flavour": None, "raw": None}
    modules_text = reader.read(FILES["proc_modules"])
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
    try:
        parsed = parse_proc_version(text)
    except ValueError as exc:
        first = (text.splitlines() or [""])[0]
        km["raw"] = first[:300] or None
        km["reason"] = str(exc)
        return km
    km.update(version=parsed["version"], flavour=parsed["flavour"], raw=parsed["raw"])
    return km


# -- the collector -------------------------------------------------------------------


def collect_driver(reader: NodeReader, use_nvml: bool = True) -> dict[str, Any]:
    """Driver and GPU facts (``DriverFacts`` shape).

    NVML answers first when pynvml imports and ``use_nvml`` is true; otherwise, or
    after an NVML failure, nvidia-smi is asked. ``source`` names the one that gave
    the GPU list. When pynvml could not be used, an NVML init failure that
    nvidia-smi prints ("Failed to initialize NVML: Driver/library version
    mismatch") is recorded as the nvml status, since it is NVML's own answer.

    status: ``ok`` with a GPU list; ``absent`` when no NVIDIA kernel module is
    loaded; ``unknown`` (+reason) when the driver is loaded (or may be) but no
    source could list the GPUs.
    """
    km = kernel_module_facts(reader)
    facts: dict[str, Any] = {
        "status": "unknown",
        "reason": None,
        "kernel_module": {k: km[k] for k in ("loaded", "version", "flavour", "raw")},
        "nvml": {"status": "skipped", "error": None},
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
    if use_nvml:
        nv, import_problem = load_pynvml()
        if nv is None:
            facts["nvml"] = {"status": "not_installed", "error": import_problem}
        else:
            got = collect_nvml(nv)
            facts["nvml"] = got["nvml"]
            if got["nvml"]["status"] == "ok":
                nvml_answered = True
                facts.update(source="nvml", driver_version=got["driver_version"],
                             cuda_driver_version=got["cuda_driver_version"], gpus=got["gpus"])
            else:
                reasons.append(f"NVML: {got['nvml']['error']}")

    if not nvml_answered:
        smi = collect_smi(reader)
        if smi["ok"]:
            facts.update(source="nvidia-smi", driver_version=smi["driver_version"],
                         cuda_driver_version=smi["cuda_driver_version"], gpus=smi["gpus"])
        if smi["reason"]:
            reasons.append(smi["reason"])
        if smi["failure"] and facts["nvml"]["status"] in ("skipped", "not_installed"):
            facts["nvml"] = {"status": smi["failure"], "error": f"via nvidia-smi: {smi['reason']}"}

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
    "FABRIC_STATES",
    "NVML_ERROR_STATUS",
    "SMI_QUERY_FIELDS",
    "classify_smi_failure",
    "collect_driver",
    "collect_nvml",
    "collect_smi",
    "cuda_version_from_int",
    "kernel_module_facts",
    "load_pynvml",
    "nvml_error_status",
    "parse_proc_modules",
    "parse_proc_version",
    "parse_smi_csv",
    "parse_smi_q_cuda",
]
