# Stdlib only: shipped to nodes inside AnsiballZ.
"""k3fleet's own NVML binding: libnvidia-ml.so.1 through ctypes, for the nodes without pynvml.

libnvidia-ml.so.1 comes with every NVIDIA driver's user-space libraries; nvidia-ml-py (``pynvml``),
a pip package, is on few nodes. collect_driver asks pynvml when it imports, else this binding, else
nvidia-smi (two processes, each far more CPU than the whole module). ``open_library()`` loads the
library and returns an ``Nvml``: the part of pynvml's interface that k3fleet_nvml.collect_nvml
calls, under pynvml's names and with the behaviour collect_nvml relies on:

- a call that does not return NVML_SUCCESS raises ``NVMLError(code)``, an instance of the
  ``NVMLError_<Name>`` class of that nvmlReturn_t (``NVMLError_GpuIsLost`` for 15, and so on, the
  names pynvml gives them and NVML_ERROR_STATUS matches); ``str()`` of one is the library's own
  ``nvmlErrorString`` text, "NVML Error with code N" when there is none;
- a symbol the installed library does not export (an older driver) raises
  ``NVMLError_FunctionNotFound``, what NVML itself answers for a function it lacks; where NVML
  renamed or versioned a call with the same layout, the newest entry point the library exports is
  used (``nvmlDeviceGetComputeRunningProcesses_v3`` then ``_v2``, the clock event reasons under
  their R535 name then the older "throttle" one);
- strings are ``str``; structures NVML fills are returned with their fields as attributes.

Signatures, structure layouts and return codes are those of NVIDIA's NVML API reference
(docs/facts.md section 5). Nothing here is loaded until ``open_library`` is called.
"""

from __future__ import annotations

import ctypes
from typing import Any

# The name every NVML client loads (the driver's soname); a path loads that file instead.
LIBRARY = "libnvidia-ml.so.1"

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_FUNCTION_NOT_FOUND = 13

# nvmlEccCounterType_t and nvmlMemoryErrorType_t (the uncorrected type is the one collect_nvml counts).
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
# nvmlNvLinkErrorCounter_t (nvml.h): the data-link layer's replay, recovery and CRC counters per link.
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
# NVML_NVLINK_MAX_LINKS of nvml.h since R570 (18 before; a GPU answers "invalid argument" past its last).
NVML_NVLINK_MAX_LINKS = 36

# What NVML writes into an unsigned long long it has no value for (usedGpuMemory under WDDM).
NVML_VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

# Buffer sizes of the NVML header (the _V2 sizes are the larger ones, valid for every driver).
SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
DEVICE_NAME_BUFFER_SIZE = 96
DEVICE_UUID_BUFFER_SIZE = 96
PROCESS_NAME_BUFFER_SIZE = 1024
PCI_BUS_ID_BUFFER_SIZE = 32
PCI_BUS_ID_LEGACY_BUFFER_SIZE = 16
GPU_FABRIC_UUID_LEN = 16

# nvmlReturn_t -> the NVMLError_<Name> class name (NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost).
RETURN_NAMES = {
    1: "Uninitialized", 2: "InvalidArgument", 3: "NotSupported", 4: "NoPermission",
    5: "AlreadyInitialized", 6: "NotFound", 7: "InsufficientSize", 8: "InsufficientPower",
    9: "DriverNotLoaded", 10: "Timeout", 11: "IrqIssue", 12: "LibraryNotFound", 13: "FunctionNotFound",
    14: "CorruptedInforom", 15: "GpuIsLost", 16: "ResetRequired", 17: "OperatingSystem",
    18: "LibRmVersionMismatch", 19: "InUse", 20: "Memory", 21: "NoData", 22: "VgpuEccNotSupported",
    23: "InsufficientResources", 24: "FreqNotSupported", 25: "ArgumentVersionMismatch", 26: "Deprecated",
    27: "NotReady", 28: "GpuNotFound", 29: "InvalidState", 30: "ResetTypeNotSupported", 999: "Unknown",
}


class NVMLError(Exception):
    """An nvmlReturn_t other than success. ``NVMLError(code)`` builds the subclass of that code;
    ``value`` is the code."""

    code: int | None = None
    value: int = 0
    # The library last opened: its nvmlErrorString names the codes.
    library: Any = None

    def __new__(cls, value: int | None = None) -> NVMLError:
        klass = ERROR_CLASSES.get(value, cls) if cls is NVMLError and value is not None else cls
        error = Exception.__new__(klass)
        error.value = (klass.code or 0) if value is None else value
        return error

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value if value is None else value)

    def __str__(self) -> str:
        text = error_string(NVMLError.library, self.value)
        return text if text else "NVML Error with code %d" % self.value


def error_string(library: Any, code: int) -> str | None:
    """The library's own text for an nvmlReturn_t (nvmlErrorString), or None."""
    if library is None:
        return None
    try:
        fn = library.nvmlErrorString
    except AttributeError:
        return None
    fn.restype = ctypes.c_char_p
    raw = fn(ctypes.c_int(code))
    return raw.decode("utf-8", "replace") if raw else None


ERROR_CLASSES: dict[int, type[NVMLError]] = {
    code: type("NVMLError_" + name, (NVMLError,), {"code": code, "__module__": __name__})
    for code, name in RETURN_NAMES.items()
}

ERRORS_BY_NAME = {klass.__name__: klass for klass in ERROR_CLASSES.values()}


def versioned(struct: type[ctypes.Structure], version: int) -> int:
    """The version word of a versioned NVML struct: (version << 24) | its size (NVML_STRUCT_VERSION)."""
    return (version << 24) | ctypes.sizeof(struct)


class MemoryInfo(ctypes.Structure):
    """nvmlMemory_t: bytes."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryInfoV2(ctypes.Structure):
    """nvmlMemory_v2_t: bytes, with the driver's reserved memory apart from ``used``."""

    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)."""

    _fields_ = [("busIdLegacy", ctypes.c_char * PCI_BUS_ID_LEGACY_BUFFER_SIZE), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint),
                ("pciSubSystemId", ctypes.c_uint), ("busId", ctypes.c_char * PCI_BUS_ID_BUFFER_SIZE)]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t, the layout of nvmlDeviceGetComputeRunningProcesses_v3 and of _v2
    (nvmlProcessInfo_v2_t)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


# nvmlGpuFabricInfo_v2_t; v3 adds healthSummary at the end.
FABRIC_V2_FIELDS: list[tuple[str, Any]] = [
    ("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * GPU_FABRIC_UUID_LEN), ("status", ctypes.c_int),
    ("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint),
]


class GpuFabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t, its version word set: what nvmlDeviceGetGpuFabricInfoV fills."""

    _fields_ = FABRIC_V2_FIELDS

    def __init__(self) -> None:
        super().__init__()
        self.version = versioned(GpuFabricInfoV2, 2)


class GpuFabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (v2 and the healthSummary byte), its version word set."""

    _fields_ = FABRIC_V2_FIELDS + [("healthSummary", ctypes.c_ubyte)]

    def __init__(self) -> None:
        super().__init__()
        self.version = versioned(GpuFabricInfoV3, 3)


class Record:
    """A structure NVML filled, as plain attributes: character arrays as str, NVML_VALUE_NOT_AVAILABLE
    as None."""

    def __init__(self, struct: ctypes.Structure, names: list[str]) -> None:
        for name in names:
            value = getattr(struct, name)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            elif value == NVML_VALUE_NOT_AVAILABLE:
                value = None
            setattr(self, name, value)

    def __repr__(self) -> str:
        return "Record(%s)" % ", ".join("%s=%r" % item for item in sorted(vars(self).items()))


class Nvml:
    """One opened libnvidia-ml.so.1 under pynvml's names (the subset collect_nvml calls)."""

    NVMLError = NVMLError
    c_nvmlGpuFabricInfoV_t = GpuFabricInfoV2
    c_nvmlGpuFabricInfo_v3_t = GpuFabricInfoV3
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_MEMORY_ERROR_TYPE_CORRECTED = NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_NVLINK_ERROR_DL_REPLAY = NVML_NVLINK_ERROR_DL_REPLAY
    NVML_NVLINK_ERROR_DL_RECOVERY = NVML_NVLINK_ERROR_DL_RECOVERY
    NVML_NVLINK_ERROR_DL_CRC_FLIT = NVML_NVLINK_ERROR_DL_CRC_FLIT
    NVML_NVLINK_ERROR_DL_CRC_DATA = NVML_NVLINK_ERROR_DL_CRC_DATA
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    # pynvml's name for the v2 memory struct's version word (nvmlMemory_v2 = 0x02000028).
    nvmlMemory_v2 = (2 << 24) | ctypes.sizeof(MemoryInfoV2)

    def __init__(self, library: Any, path: str) -> None:
        self.library = library
        self.path = path
        self.functions: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        # The error classes under pynvml's names too (nv.NVMLError_GpuIsLost); anything else pynvml
        # has and this binding does not is missing, as collect_nvml's getattr(nv, name, None) expects.
        if name in ERRORS_BY_NAME:
            return ERRORS_BY_NAME[name]
        raise AttributeError(name)

    def function(self, *names: str) -> Any:
        """The first of ``names`` the library exports; NVMLError_FunctionNotFound when it has none."""
        for name in names:
            fn = self.functions.get(name)
            if fn is None:
                fn = getattr(self.library, name, None)
                if fn is None:
                    continue
                self.functions[name] = fn
            return fn
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

    def call(self, names: tuple[str, ...], *args: Any) -> None:
        ret = self.function(*names)(*args)
        if ret != NVML_SUCCESS:
            raise NVMLError(ret)

    def text(self, name: str, size: int, *args: Any) -> str:
        buf = ctypes.create_string_buffer(size)
        self.call((name,), *args, buf, ctypes.c_uint(size))
        return buf.value.decode("utf-8", "replace")

    def uint(self, name: str, handle: Any, *more: str) -> int:
        value = ctypes.c_uint()
        self.call((name, *more), handle, ctypes.byref(value))
        return value.value

    # -- initialisation ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.call(("nvmlInit_v2",))

    def nvmlShutdown(self) -> None:
        self.call(("nvmlShutdown",))

    # -- system --------------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.text("nvmlSystemGetDriverVersion", SYSTEM_DRIVER_VERSION_BUFFER_SIZE)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        value = ctypes.c_int()
        self.call(("nvmlSystemGetCudaDriverVersion_v2",), ctypes.byref(value))
        return value.value

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        return self.text("nvmlSystemGetProcessName", PROCESS_NAME_BUFFER_SIZE, ctypes.c_uint(pid))

    # -- devices -------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        count = ctypes.c_uint()
        self.call(("nvmlDeviceGetCount_v2",), ctypes.byref(count))
        return count.value

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self.call(("nvmlDeviceGetHandleByIndex_v2",), ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self.text("nvmlDeviceGetName", DEVICE_NAME_BUFFER_SIZE, handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.text("nvmlDeviceGetUUID", DEVICE_UUID_BUFFER_SIZE, handle)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Record:
        """pynvml's call: the v1 struct, or with ``version`` (nvmlMemory_v2) the v2 struct that holds
        reserved memory apart from used."""
        if not version:
            info = MemoryInfo()
            self.call(("nvmlDeviceGetMemoryInfo",), handle, ctypes.byref(info))
            return Record(info, ["total", "free", "used"])
        info2 = MemoryInfoV2()
        info2.version = version
        self.call(("nvmlDeviceGetMemoryInfo_v2",), handle, ctypes.byref(info2))
        return Record(info2, ["version", "total", "reserved", "free", "used"])

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        mode = ctypes.c_int()
        self.call(("nvmlDeviceGetPersistenceMode",), handle, ctypes.byref(mode))
        return mode.value

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call(("nvmlDeviceGetCudaComputeCapability",), handle, ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Record:
        info = PciInfo()
        self.call(("nvmlDeviceGetPciInfo_v3",), handle, ctypes.byref(info))
        return Record(info, ["busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId"])

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        """``info``: a reference to a GpuFabricInfoV2/V3 (``ctypes.byref``), filled in place."""
        self.call(("nvmlDeviceGetGpuFabricInfoV",), handle, info)
        return NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Record]:
        """NVML's two calls: the count with no array (success: none running), then the array, sized
        with room for processes that start in between."""
        names = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
        fn = self.function(*names)
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == NVML_SUCCESS:
            return []
        if ret != NVML_ERROR_INSUFFICIENT_SIZE:
            raise NVMLError(ret)
        count.value = count.value * 2 + 5
        infos = (ProcessInfo * count.value)()
        ret = fn(handle, ctypes.byref(count), infos)
        if ret != NVML_SUCCESS:
            raise NVMLError(ret)
        out = []
        for info in infos[:count.value]:
            # usedGpuMemory reads None where NVML has no value (NVML_VALUE_NOT_AVAILABLE).
            out.append(Record(info, ["pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"]))
        return out

    # -- health --------------------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        count = ctypes.c_ulonglong()
        self.call(("nvmlDeviceGetTotalEccErrors",), handle, ctypes.c_int(error_type), ctypes.c_int(counter_type),
                  ctypes.byref(count))
        return count.value

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        current, pending = ctypes.c_int(), ctypes.c_int()
        self.call(("nvmlDeviceGetEccMode",), handle, ctypes.byref(current), ctypes.byref(pending))
        return [current.value, pending.value]

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        corr, unc, pending, failure = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        self.call(("nvmlDeviceGetRemappedRows",), handle, ctypes.byref(corr), ctypes.byref(unc),
                  ctypes.byref(pending), ctypes.byref(failure))
        return corr.value, unc.value, pending.value, failure.value

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        mask = ctypes.c_ulonglong()
        self.call(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
                  handle, ctypes.byref(mask))
        return mask.value

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self.uint("nvmlDeviceGetPcieReplayCounter", handle)

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        active = ctypes.c_int()
        self.call(("nvmlDeviceGetNvLinkState",), handle, ctypes.c_uint(link), ctypes.byref(active))
        return active.value

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        value = ctypes.c_ulonglong()
        self.call(("nvmlDeviceGetNvLinkErrorCounter",), handle, ctypes.c_uint(link), ctypes.c_int(counter),
                  ctypes.byref(value))
        return value.value

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self.uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self.uint("nvmlDeviceGetMaxPcieLinkGeneration", handle)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self.uint("nvmlDeviceGetCurrPcieLinkWidth", handle)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self.uint("nvmlDeviceGetMaxPcieLinkWidth", handle)


def open_library(path: str | None = None) -> tuple[Nvml | None, str | None]:
    """Load libnvidia-ml.so.1 (or the library at ``path``): ``(Nvml, None)``, or ``(None, reason)``
    when the loader finds none (no driver user-space libraries on this node)."""
    name = path or LIBRARY
    try:
        library = ctypes.CDLL(name)
    except OSError as exc:
        return None, str(exc) or f"{name} could not be loaded"
    NVMLError.library = library
    return Nvml(library, name), None
