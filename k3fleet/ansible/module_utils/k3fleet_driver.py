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

# NVML error classes (pynvml names, docs/facts.md section 5) -> nvml.status values.
NVML_ERROR_STATUS = {
    "NVMLError_LibraryNotFound": "library_not_found",
    "NVMLError_DriverNotLoaded": "driver_not_loaded",
    "NVMLError_LibRmVersionMismatch": "lib_rm_version_mismatch",
    "NVMLError_NoPermission": "no_permission",
    "NVMLError_GpuIsLost": "gpu_is_lost",
}

# nvmlGpuFabricState_t values (docs/facts.md section 5).
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


_BUS_ID_RE = re.compile(r"^(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")


def normalize_bus_id(value: str | None) -> str | None:
    """A PCI address in nvidia-smi's form: "0000:18:00.0" and "18:00.0" -> "00000000:18:00.0".

    nvidia-smi and NVML print an 8-digit upper-case domain, lspci and sysfs a 4-digit lower-case
    one, old nvidia-smi releases 4 digits; the same GPU must compare equal in all of them.
    Returns None for text that is not a PCI address.
    """
    match = _BUS_ID_RE.match((value or "").strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function}"


def fabric_status_name(text: str | None) -> str | None:
    """nvidia-smi's fabric "Status" text in snake_case ("Insufficient Resources" ->
    "insufficient_resources"); None for "N/A" and empty text."""
    if text is None or _na(text):
        return None
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_") or None


# nvidia-smi -q "Fabric" > "State" texts -> nvmlGpuFabricState_t names (FABRIC_STATES).
SMI_FABRIC_STATES = {
    "not supported": "not_supported",
    "not started": "not_started",
    "in progress": "in_progress",
    "completed": "completed",
}

_GPU_BLOCK_RE = re.compile(r"^GPU\s+(\S+)\s*$")


def parse_smi_q_fabric(text: str) -> dict[str, dict[str, str | None]]:
    """Per-GPU "Fabric" State and Status from ``nvidia-smi -q``, keyed by normalised bus id.

    Each GPU block ("GPU 00000000:18:00.0" at column 0) maps to ``{"state", "status",
    "note"}``: ``state`` is a FABRIC_STATES name or None, ``status`` the Status text in
    snake_case (None for "N/A"), and ``note`` says why ``state`` is None: the driver printed
    "N/A" (no fabric on this board, or the query failed), the block has no Fabric section
    (older driver, or the output was cut), or a State text this parser does not know.
    Nesting is read from the indentation, never from column widths (they differ between
    driver releases), so a "State" elsewhere in the block is not mistaken for the fabric's.
    Raises ValueError when the text has no GPU block at all.
    """
    gpus: dict[str, dict[str, str | None]] = {}
    current: str | None = None
    sections: list[tuple[int, str]] = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            match = _GPU_BLOCK_RE.match(line)
            bus = normalize_bus_id(match.group(1)) if match else None
            if bus is not None:
                current = bus
                sections = []
                gpus[bus] = {"state": None, "status": None, "note": "no Fabric section"}
            # Header lines and foreign log lines at column 0 neither open nor close a GPU block.
            continue
        if current is None:
            continue
        while sections and sections[-1][0] >= indent:
            sections.pop()
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        if not sep:
            sections.append((indent, key))
            if [name for _, name in sections] == ["Fabric"]:
                gpus[current]["note"] = "Fabric section has no State line"
            continue
        if [name for _, name in sections] != ["Fabric"]:
            continue
        value = value.strip()
        entry = gpus[current]
        if key == "State":
            state = SMI_FABRIC_STATES.get(value.lower())
            entry["state"] = state
            if state is not None:
                entry["note"] = None
            elif _na(value):
                entry["note"] = "State N/A"
            else:
                entry["note"] = f"unrecognised State {value[:60]!r}"
        elif key == "Status":
            entry["status"] = fabric_status_name(value)
    if not gpus:
        raise ValueError("nvidia-smi -q output has no 'GPU <bus id>' block")
    return gpus


def _index_ranges(indices: list[Any]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    numbers = sorted(i for i in indices if isinstance(i, int))
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    parts += [str(i) for i in indices if not isinstance(i, int)]
    return ",".join(parts)


def apply_smi_fabric(gpus: list[dict[str, Any]], text: str) -> str | None:
    """Fill ``fabric_state``/``fabric_status`` of the CSV GPUs from ``nvidia-smi -q`` by bus id.

    Returns a one-line note naming the GPUs whose fabric state stays unknown and why, or
    None when every GPU got a state.
    """
    try:
        fabric = parse_smi_q_fabric(text)
    except ValueError as exc:
        return f"GPU fabric state unknown: {exc}"
    why: dict[str, list[Any]] = {}
    for gpu in gpus:
        bus = normalize_bus_id(gpu.get("pci_bus_id"))
        entry = fabric.get(bus) if bus is not None else None
        if entry is None:
            missing = "bus id not in nvidia-smi -q" if bus is not None else "no PCI bus id to match -q by"
            why.setdefault(missing, []).append(gpu.get("index"))
            continue
        gpu["fabric_state"] = entry["state"]
        gpu["fabric_status"] = entry["status"]
        if entry["note"]:
            why.setdefault(entry["note"], []).append(gpu.get("index"))
    if not why:
        return None
    return "GPU fabric state unknown: " + "; ".join(
        f"GPU {_index_ranges(indices)}: {note}" for note, indices in why.items())


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


def _nvml_return_name(nv: Any, code: int) -> str:
    """An nvmlReturn_t as the snake_case of the text nvidia-smi prints for it ("Success")."""
    if code == 0:
        return "success"
    try:
        exc = nv.NVMLError(code)
    except Exception:  # bindings that cannot even build the error still leave the number
        return f"nvml_return_{code}"
    try:
        # pynvml knows the common texts and asks the library for the rest.
        text = str(exc)
    except Exception:  # a broken library must not turn a status into a crash
        text = ""
    if text and not text.startswith("NVML Error with code"):
        return fabric_status_name(text) or f"nvml_return_{code}"
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        # NVMLError_InsufficientResources -> insufficient_resources
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name[len("NVMLError_"):]).lower()
    return f"nvml_return_{code}"


def _fabric_info(nv: Any, handle: Any) -> tuple[str | None, str | None]:
    """(fabric_state, fabric_status) of one GPU through NVML."""
    import ctypes  # only needed when NVML is in use

    info_type = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    getter = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    if info_type is None or getter is None:
        return None, None  # bindings older than the fabric API
    info = info_type()
    try:
        getter(handle, ctypes.byref(info))
    except nv.NVMLError as exc:
        if type(exc).__name__ == "NVMLError_NotSupported":
            return "not_supported", None
        if type(exc).__name__ == "NVMLError_GpuIsLost":
            raise
        return None, None
    state = FABRIC_STATES.get(int(info.state))
    status = None
    # NVML: the status "must be checked only if state returns complete"; nvidia-smi prints N/A before.
    if state == "completed" and hasattr(info, "status"):
        status = _nvml_return_name(nv, int(info.status))
    return state, status


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
    gpu["fabric_state"], gpu["fabric_status"] = _fabric_info(nv, handle)
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
        "fabric_status": None,
    }


def collect_smi(reader: NodeReader) -> dict[str, Any]:
    """Query nvidia-smi (COMMANDS nvidia_smi_query and nvidia_smi_q).

    The CSV lists the GPUs; ``-q`` adds the CUDA version from its header and each GPU's
    fabric state and status, matched to the CSV rows by PCI bus id.

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
    notes = []
    if q.ok:
        try:
            header = parse_smi_q_cuda(q.stdout)
        except ValueError as exc:
            notes.append(f"CUDA version unknown: {exc}")
        else:
            out["cuda_driver_version"] = header["cuda_version"]
            out["driver_version"] = out["driver_version"] or header["driver_version"]
        fabric_note = apply_smi_fabric(out["gpus"], q.stdout)
        if fabric_note:
            notes.append(fabric_note)
    else:
        notes.append(f"CUDA version and GPU fabric state unknown: {q.reason()}")
    out["reason"] = "; ".join(notes) or None
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
    "SMI_FABRIC_STATES",
    "SMI_QUERY_FIELDS",
    "apply_smi_fabric",
    "classify_smi_failure",
    "collect_driver",
    "collect_nvml",
    "collect_smi",
    "cuda_version_from_int",
    "fabric_status_name",
    "kernel_module_facts",
    "load_pynvml",
    "normalize_bus_id",
    "nvml_error_status",
    "parse_proc_modules",
    "parse_proc_version",
    "parse_smi_csv",
    "parse_smi_q_cuda",
    "parse_smi_q_fabric",
]
