# Stdlib only: shipped to nodes inside AnsiballZ. pynvml is optional and imported by collect_driver.
"""NVML as a GPU source, through pynvml (nvidia-ml-py) where the node has it: the GPUs, their fabric
state and health, compute processes, ECC, remapped rows, clock events and PCIe link.

``collect_nvml(nv)`` is what collect_driver asks first once pynvml imports, and only then imports
this module: a node without pynvml never compiles it. NVML failures are status values, never raised.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_gpu_common import fabric_status_name, gpu_notes

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


# nvmlGpuFabricInfo healthMask: (field, shift, width, {value: meaning}); value 0 is "not supported"
# and reads as None. Bit layout and values are nvidia-ml-py's NVML_GPU_FABRIC_HEALTH_MASK_*
# constants (docs/facts.md section 9).
_TRUE_FALSE = {1: True, 2: False}

FABRIC_HEALTH_MASK = (
    ("bandwidth", 0, 0x3, {1: "degraded", 2: "full"}),
    ("route_recovery_in_progress", 2, 0x3, _TRUE_FALSE),
    ("route_unhealthy", 4, 0x3, _TRUE_FALSE),
    ("access_timeout_recovery", 6, 0x3, _TRUE_FALSE),
    ("incorrect_configuration", 8, 0xF, {1: "none", 2: "incorrect_sysguid", 3: "incorrect_chassis_sn",
                                         4: "no_partition", 5: "insufficient_nvlinks",
                                         6: "incompatible_gpu_fw", 7: "invalid_location",
                                         8: "gpu_state_invalid"}),
    ("partition_assigned", 12, 0x3, _TRUE_FALSE),
    ("gfm_state", 14, 0x3, {1: "connected", 2: "disconnected"}),
)

# nvmlGpuFabricInfo_v3_t healthSummary.
FABRIC_HEALTH_SUMMARY = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}


def decode_fabric_health(mask: int, summary: int | None) -> dict[str, Any]:
    """FabricHealth data from NVML's healthMask (v2+) and healthSummary (v3; None before v3).

    A field value the table does not know is kept under ``other`` rather than guessed.
    """
    health: dict[str, Any] = {"summary": None, "other": {}, "mask": mask}
    for field, shift, width, values in FABRIC_HEALTH_MASK:
        raw = (mask >> shift) & width
        health[field] = values.get(raw)
        if raw and raw not in values:
            health["other"][field] = f"unknown value {raw}"
    if summary is not None:
        health["summary"] = FABRIC_HEALTH_SUMMARY.get(summary)
        if summary and summary not in FABRIC_HEALTH_SUMMARY:
            health["other"]["summary"] = f"unknown value {summary}"
    return health


def _fabric_struct(nv: Any) -> tuple[Any, bool] | None:
    """The newest fabric info struct the bindings offer: (struct class, carries healthSummary)."""
    v3 = getattr(nv, "c_nvmlGpuFabricInfo_v3_t", None)
    if v3 is not None:
        return v3, True
    v_t = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    return (v_t, False) if v_t is not None else None


def _fabric_info(nv: Any, handle: Any, domain: dict[str, Any] | None = None,
                 ) -> tuple[str | None, str | None, dict[str, Any] | None]:
    """(fabric_state, fabric_status, fabric_health) of one GPU through NVML.

    Asks with the v3 struct (health summary) first; a driver that does not know v3 answers with a
    version mismatch, and the v2 struct (health mask only) is tried next. Once registration completed,
    ``domain`` (when given) gets the GPU's NVLink domain: ``cluster_uuid`` and ``clique_id``.
    """
    import ctypes  # only needed when NVML is in use

    getter = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    first = _fabric_struct(nv)
    if getter is None or first is None:
        return None, None, None  # bindings older than the fabric API
    candidates = [first]
    v_t = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    if first[0] is not v_t and v_t is not None:
        candidates.append((v_t, False))
    info = None
    has_summary = False
    for struct, with_summary in candidates:
        attempt = struct()
        try:
            getter(handle, ctypes.byref(attempt))
        except nv.NVMLError as exc:
            name = type(exc).__name__
            if name == "NVMLError_NotSupported":
                return "not_supported", None, None
            if name == "NVMLError_GpuIsLost":
                raise
            if name != "NVMLError_ArgumentVersionMismatch":
                return None, None, None
            continue
        info, has_summary = attempt, with_summary
        break
    if info is None:
        return None, None, None
    state = FABRIC_STATES.get(int(info.state))
    status = None
    # NVML: the status "must be checked only if state returns complete"; nvidia-smi prints N/A before.
    if state == "completed" and hasattr(info, "status"):
        status = _nvml_return_name(nv, int(info.status))
        if domain is not None and hasattr(info, "clusterUuid"):
            u = bytes(bytearray(info.clusterUuid)).hex()
            domain["cluster_uuid"] = "-".join((u[:8], u[8:12], u[12:16], u[16:20], u[20:]))
            domain["clique_id"] = int(info.cliqueId) if hasattr(info, "cliqueId") else None
    health = None
    if hasattr(info, "healthMask"):
        summary = int(info.healthSummary) if has_summary and hasattr(info, "healthSummary") else None
        health = decode_fabric_health(int(info.healthMask), summary)
    return state, status, health


_PROCESS_SKIP = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")


def _nvml_processes(nv: Any, handle: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(compute processes, why unknown) of one GPU. A driver or bindings without the call, or
    without permission, leave the list unknown (None) with the reason: never read as "none"."""
    getter = getattr(nv, "nvmlDeviceGetComputeRunningProcesses", None)
    if getter is None:
        return None, "bindings lack nvmlDeviceGetComputeRunningProcesses"
    # Bindings newer than the driver raise their own mismatch error (not an NVMLError) when the
    # library lacks the call's versioned entry point: the list is unknown, NVML itself still answers.
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    try:
        procs = getter(handle)
    except nv.NVMLError as exc:
        if type(exc).__name__ == "NVMLError_GpuIsLost":
            raise
        return None, _nvml_message(exc)
    except Exception as exc:
        if mismatch is None or not isinstance(exc, mismatch):
            raise
        return None, f"{type(exc).__name__}: {exc}"
    out: list[dict[str, Any]] = []
    namer = getattr(nv, "nvmlSystemGetProcessName", None)
    for proc in procs or ():
        pid = getattr(proc, "pid", None)
        used = getattr(proc, "usedGpuMemory", None)
        name = None
        if namer is not None and pid is not None:
            # A process may exit between the listing and this call; its name is then just unknown.
            with contextlib.suppress(nv.NVMLError):
                name = _text(namer(pid))
        out.append({"pid": int(pid) if pid is not None else None, "type": "C", "name": name,
                    "used_memory_mib": int(used) // (1024 * 1024) if isinstance(used, int) else None})
    return out, None


def _nvml_gpu(nv: Any, index: int, notes: dict[str, list[Any]]) -> dict[str, Any]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    gpu: dict[str, Any] = {"index": index}
    gpu["name"] = _text(nv.nvmlDeviceGetName(handle))
    gpu["uuid"] = _text(nv.nvmlDeviceGetUUID(handle))
    gpu.update(nvml_memory(nv, handle))
    gpu["persistence_mode"] = int(nv.nvmlDeviceGetPersistenceMode(handle)) == 1
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
    gpu["compute_capability"] = f"{int(major)}.{int(minor)}"
    gpu["pci_bus_id"] = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
    domain: dict[str, Any] = {}
    gpu["fabric_state"], gpu["fabric_status"], gpu["fabric_health"] = _fabric_info(nv, handle, domain)
    gpu["fabric_cluster_uuid"], gpu["fabric_clique_id"] = domain.get("cluster_uuid"), domain.get("clique_id")
    gpu["processes"], why = _nvml_processes(nv, handle)
    if why:
        notes.setdefault(why, []).append(index)
    gpu.update(nvml_health(nv, handle))
    gpu["nvlink"] = nvml_nvlink(nv, handle)
    return gpu


MIB = 1024 * 1024


def nvml_memory(nv: Any, handle: Any) -> dict[str, Any]:
    """Total, used and reserved memory as the driver means them (docs/facts.md section 5).

    The v2 call (``nvmlDeviceGetMemoryInfo`` with ``version=nvmlMemory_v2``) holds the driver's reserved
    memory apart from what processes use: an idle H200 on R580 reads used 0, reserved 615 MiB there,
    while the v1 call counts the reserved 615 MiB as used (tests/fixtures/gpu_health/h200_r580). A driver
    or bindings without v2 leave the v1 figure with ``memory_source`` "nvml_v1" (used includes reserved),
    which the collector then replaces with ``nvidia-smi -q -d MEMORY``'s Used and Reserved.
    """
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            memory = nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except nv.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_GpuIsLost":
                raise
        except TypeError:
            pass  # bindings whose call takes no version: the v1 answer below
        else:
            reserved = getattr(memory, "reserved", None)
            used = getattr(memory, "used", None)
            return {"memory_total_mib": int(memory.total) // MIB,
                    "memory_used_mib": None if used is None else int(used) // MIB,
                    "memory_reserved_mib": None if reserved is None else int(reserved) // MIB,
                    "memory_source": "nvml_v2"}
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    used = getattr(memory, "used", None)
    return {"memory_total_mib": int(memory.total) // MIB,
            "memory_used_mib": int(used) // MIB if used is not None else None,
            "memory_reserved_mib": None, "memory_source": "nvml_v1"}


# nvmlNvLinkErrorCounter_t names, as dcgm-exporter and nvidia-smi nvlink -e call them (docs/facts.md
# section 14).
NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                   ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3))


def nvml_nvlink(nv: Any, handle: Any) -> dict[str, Any]:
    """NVLink links of one GPU: how many it has, which are up, and each link's error counters.

    A GPU without NVLink answers "not supported" on link 0 (the real H200 in a VM:
    tests/fixtures/gpu_health/h200_r580/health-nvml-py.txt): that is ``links: 0``, "no links", never
    "all links healthy". Links are asked until the GPU answers "invalid argument" or "not supported"
    past its last one.
    """
    out: dict[str, Any] = {"links": None, "active": [], "inactive": [], "errors": {}, "source": "nvml",
                           "reason": None}
    state = getattr(nv, "nvmlDeviceGetNvLinkState", None)
    if state is None:
        out["reason"] = "bindings lack nvmlDeviceGetNvLinkState"
        return out
    counter = getattr(nv, "nvmlDeviceGetNvLinkErrorCounter", None)
    top = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    links = 0
    for link in range(top):
        try:
            up = int(state(handle, link))
        except nv.NVMLError as exc:
            name = type(exc).__name__
            if name == "NVMLError_GpuIsLost":
                raise
            if name in ("NVMLError_NotSupported", "NVMLError_InvalidArgument"):
                break
            out["reason"] = f"NVLink {link}: {_nvml_message(exc)}"
            break
        links += 1
        (out["active"] if up == 1 else out["inactive"]).append(link)
        if counter is None:
            continue
        errors: dict[str, int] = {}
        for field, const, default in NVLINK_COUNTERS:
            value, _why = _nvml_try(nv, counter, handle, link, getattr(nv, const, default))
            if value is not None:
                errors[field] = int(value)
        if errors:
            out["errors"][str(link)] = errors
    out["links"] = links if out["reason"] is None or links else None
    return out


def _nvml_try(nv: Any, fn: Any, *args: Any) -> tuple[Any, str | None]:
    """(value, None) or (None, why): a call the driver or bindings do not support is data, not a crash;
    a lost GPU still raises (the caller reports the whole GPU)."""
    if fn is None:
        return None, "bindings lack the call"
    try:
        return fn(*args), None
    except nv.NVMLError as exc:
        if type(exc).__name__ == "NVMLError_GpuIsLost":
            raise
        return None, _nvml_message(exc)


# nvmlClocksEventReasons bits (nvml.h; older bindings call them ClocksThrottleReasons).
CLOCK_EVENT_BITS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)


def clock_events_from_mask(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_BITS if mask & bit]


def nvml_health(nv: Any, handle: Any) -> dict[str, Any]:
    """ECC, remapped rows, clock events and the PCIe link of one GPU through NVML.

    Each call may answer NotSupported (an old GPU, a vGPU, bindings without the call): that field is
    None with the reason, read as unknown by the verdict.
    """
    unc = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    ecc_getter = getattr(nv, "nvmlDeviceGetTotalEccErrors", None)
    volatile, why_v = _nvml_try(nv, ecc_getter, handle, unc, getattr(nv, "NVML_VOLATILE_ECC", 0))
    aggregate, why_a = _nvml_try(nv, ecc_getter, handle, unc, getattr(nv, "NVML_AGGREGATE_ECC", 1))
    mode, _why = _nvml_try(nv, getattr(nv, "nvmlDeviceGetEccMode", None), handle)
    current = mode[0] if isinstance(mode, (list, tuple)) and mode else None
    corr = getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    c_volatile, _why = _nvml_try(nv, ecc_getter, handle, corr, getattr(nv, "NVML_VOLATILE_ECC", 0))
    c_aggregate, _why = _nvml_try(nv, ecc_getter, handle, corr, getattr(nv, "NVML_AGGREGATE_ECC", 1))
    ecc = {"mode": None if current is None else ("enabled" if int(current) == 1 else "disabled"),
           "volatile_uncorrected": None if volatile is None else int(volatile),
           "aggregate_uncorrected": None if aggregate is None else int(aggregate),
           "volatile_corrected": None if c_volatile is None else int(c_volatile),
           "aggregate_corrected": None if c_aggregate is None else int(c_aggregate),
           "reason": None if volatile is not None or aggregate is not None else (why_v or why_a)}
    rows, why_r = _nvml_try(nv, getattr(nv, "nvmlDeviceGetRemappedRows", None), handle)
    remapped: dict[str, Any] = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None,
                                "retired_pages_pending": None, "reason": why_r}
    if isinstance(rows, (list, tuple)) and len(rows) >= 4:
        remapped.update(correctable=int(rows[0]), uncorrectable=int(rows[1]), pending=bool(rows[2]),
                        failure=bool(rows[3]), reason=None)
    events = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask, why_t = _nvml_try(nv, events, handle)
    throttle = {"active": clock_events_from_mask(int(mask)) if mask is not None else [],
                "mask": None if mask is None else int(mask), "reason": why_t}
    link: dict[str, Any] = {"reason": None}
    whys = []
    for field, call in (("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                        ("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
                        ("width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
        value, why = _nvml_try(nv, getattr(nv, call, None), handle)
        link[field] = None if value is None else int(value)
        if why:
            whys.append(f"{call}: {why}")
    replay, why = _nvml_try(nv, getattr(nv, "nvmlDeviceGetPcieReplayCounter", None), handle)
    link["replay_counter"] = None if replay is None else int(replay)
    link["reason"] = "; ".join(whys) or None
    return {"ecc": ecc, "remapped_rows": remapped, "throttle": throttle, "pcie": link}


def collect_nvml(nv: Any) -> dict[str, Any]:
    """Query NVML through the pynvml module ``nv``.

    Returns ``{"nvml": {"status", "error"}, "driver_version", "cuda_driver_version",
    "gpus", "note"}``; ``note`` names the GPUs whose compute processes could not be listed,
    and why. NVML failures are reported as status values, never raised; a GPU that is lost
    mid-query is kept with its index and the status says so.
    nvmlShutdown always runs once nvmlInit succeeded.
    """
    result: dict[str, Any] = {"nvml": {"status": "ok", "error": None}, "driver_version": None,
                              "cuda_driver_version": None, "gpus": [], "note": None}
    process_notes: dict[str, list[Any]] = {}
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
                result["gpus"].append(_nvml_gpu(nv, index, process_notes))
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
        result["note"] = gpu_notes("GPU compute processes unknown: ", process_notes)
        # Shutting down a half-initialised library has nothing left to report.
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
    return result
