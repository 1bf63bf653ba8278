#!/usr/bin/python3
"""Stand-in nvidia-smi for the k3fleet testbed (package nvidia-utils-<branch>-server).

Everything it prints comes from libnvidia-ml.so.1 through ctypes, so it agrees with
what pynvml sees on the same node, fails the same way (driver not loaded, driver/library
version mismatch) and exits with nvidia-smi's documented return codes.

Supported: the summary table (no arguments), -L, --version, -q [-d DISPLAY] [-i INDEX]
and --query-gpu=FIELDS --format=csv[,noheader][,nounits]. The -q blocks carry GPU health (PCIe link,
clock event reasons, ECC, retired pages, remapped rows) in the layout of R565's output.
"""

import ctypes
import signal
import sys
import time

# nvidia-smi return codes (nvidia-smi(1), "RETURN VALUE"); 18 is what it returns on a
# driver/library version mismatch (observed, see the reference notes of the stand-in).
RC_OK, RC_INVALID_ARG, RC_NOT_FOUND, RC_DRIVER_NOT_LOADED = 0, 2, 6, 9
RC_LIB_NOT_FOUND, RC_MISMATCH, RC_OTHER = 12, 18, 255

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
FABRIC_STATES = {0: "N/A", 1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_COMPLETED = 3
# nvmlMemoryErrorType_t and nvmlEccCounterType_t (nvml.h).
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
# nvmlClocksEventReasons bits in the order and with the labels of R565's -q "Clocks Event Reasons"
# (the 8x H100 capture in tests/fixtures/driver); the hardware slowdowns nest under "HW Slowdown".
CLOCK_EVENT_ROWS = (
    ("Idle", 0x1, 8), ("Applications Clocks Setting", 0x2, 8), ("SW Power Cap", 0x4, 8),
    ("HW Slowdown", 0x8, 8), ("HW Thermal Slowdown", 0x40, 12), ("HW Power Brake Slowdown", 0x80, 12),
    ("Sync Boost", 0x10, 8), ("SW Thermal Slowdown", 0x20, 8), ("Display Clock Setting", 0x100, 8),
)
NVLINK_MAX_LINKS = 36

MSG_NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                  "Make sure that the latest NVIDIA driver is installed and running.")
MSG_NO_LIBRARY = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
                  "that the NVIDIA Display Driver is properly installed and present in your system.\n"
                  "Please also try adding directory that contains libnvidia-ml.so to your system PATH.")


class NvmlError(Exception):
    def __init__(self, code, text):
        super().__init__(text)
        self.code = code


class PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint),
                ("pciSubSystemId", ctypes.c_uint), ("busId", ctypes.c_char * 32)]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t: nvidia-smi's "Reserved" and "Used" are its reserved and used fields."""
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class FabricInfoV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]


FABRIC_INFO_V2 = (2 << 24) | ctypes.sizeof(FabricInfoV2)


class Nvml:
    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    def check(self, rc):
        if rc != 0:
            raise NvmlError(rc, self.lib.nvmlErrorString(rc).decode())

    def text(self, fn, *args, size=96):
        buf = ctypes.create_string_buffer(size)
        self.check(getattr(self.lib, fn)(*args, buf, ctypes.c_uint(size)))
        return buf.value.decode()

    def out(self, fn, ctype, *args):
        value = ctype()
        self.check(getattr(self.lib, fn)(*args, ctypes.byref(value)))
        return value.value

    def library_version(self):
        """major.minor of the library itself, as nvidia-smi prints it on a mismatch."""
        full = self.text("nvmlSystemGetNVMLVersion", size=80)
        return ".".join(full.split(".")[1:3])

    def init(self):
        self.check(self.lib.nvmlInitWithFlags(ctypes.c_uint(0)))

    def gpus(self):
        count = self.out("nvmlDeviceGetCount_v2", ctypes.c_uint)
        handles = []
        for index in range(count):
            handle = ctypes.c_void_p()
            self.check(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)))
            handles.append(handle)
        return handles

    def describe(self, handle):
        pci = PciInfo()
        self.check(self.lib.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)))
        memory = MemoryV2(version=(2 << 24) | ctypes.sizeof(MemoryV2))
        self.check(self.lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory)))
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)))
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self.check(self.lib.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)))
        return {
            "index": self.out("nvmlDeviceGetIndex", ctypes.c_uint, handle),
            "name": self.text("nvmlDeviceGetName", handle),
            "uuid": self.text("nvmlDeviceGetUUID", handle),
            "persistence": self.out("nvmlDeviceGetPersistenceMode", ctypes.c_int, handle),
            "compute_mode": self.out("nvmlDeviceGetComputeMode", ctypes.c_int, handle),
            "bus_id": pci.busId.decode(),
            "pci_device_id": pci.pciDeviceId,
            "pci_subsystem_id": pci.pciSubSystemId,
            "pci_bus": pci.bus, "pci_device": pci.device, "pci_domain": pci.domain,
            "memory_total_mib": memory.total // (1024 * 1024),
            "memory_used_mib": memory.used // (1024 * 1024),
            "memory_reserved_mib": memory.reserved // (1024 * 1024),
            "memory_free_mib": memory.free // (1024 * 1024),
            "compute_cap": f"{major.value}.{minor.value}",
            "mig_current": current.value, "mig_pending": pending.value,
            **self.fabric(handle),
            "nvlinks_active": self.active_links(handle),
            **self.health(handle),
        }

    def health(self, handle):
        """ECC, row remapping, clock events and the PCIe link, each from its NVML call."""
        ecc = {}
        for scope, counter in (("volatile", NVML_VOLATILE_ECC), ("aggregate", NVML_AGGREGATE_ECC)):
            for kind, error_type in (("corrected", NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                     ("uncorrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                count = ctypes.c_ulonglong()
                self.check(self.lib.nvmlDeviceGetTotalEccErrors(handle, ctypes.c_int(error_type),
                                                                ctypes.c_int(counter), ctypes.byref(count)))
                ecc[f"{scope}_{kind}"] = count.value
        current, pending = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvmlDeviceGetEccMode(handle, ctypes.byref(current), ctypes.byref(pending)))
        rows = [ctypes.c_uint() for _ in range(4)]
        self.check(self.lib.nvmlDeviceGetRemappedRows(handle, *[ctypes.byref(r) for r in rows]))
        reasons = self.out("nvmlDeviceGetCurrentClocksEventReasons", ctypes.c_ulonglong, handle)
        return {
            "ecc": ecc, "ecc_current": current.value, "ecc_pending": pending.value,
            "remapped": [r.value for r in rows], "clock_events": reasons,
            "pcie_gen": self.out("nvmlDeviceGetCurrPcieLinkGeneration", ctypes.c_uint, handle),
            "pcie_gen_max": self.out("nvmlDeviceGetMaxPcieLinkGeneration", ctypes.c_uint, handle),
            "pcie_width": self.out("nvmlDeviceGetCurrPcieLinkWidth", ctypes.c_uint, handle),
            "pcie_width_max": self.out("nvmlDeviceGetMaxPcieLinkWidth", ctypes.c_uint, handle),
            "pcie_replays": self.out("nvmlDeviceGetPcieReplayCounter", ctypes.c_uint, handle),
        }

    def fabric(self, handle):
        """The GPU's fabric probe; a board without one answers Not Supported and prints N/A."""
        info = FabricInfoV2(version=FABRIC_INFO_V2)
        try:
            self.check(self.lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info)))
        except NvmlError as exc:
            if exc.code != NVML_ERROR_NOT_SUPPORTED:
                raise
            return {"fabric_state": None, "fabric_status": None, "clique": None, "cluster_uuid": None}
        u = bytes(info.clusterUuid).hex()
        return {"fabric_state": info.state, "fabric_status": info.status, "clique": info.cliqueId,
                "cluster_uuid": "-".join((u[:8], u[8:12], u[12:16], u[16:20], u[20:]))}

    def error_string(self, code):
        return self.lib.nvmlErrorString(code).decode()

    def active_links(self, handle):
        active = 0
        for link in range(NVLINK_MAX_LINKS):
            state = ctypes.c_int()
            if self.lib.nvmlDeviceGetNvLinkState(handle, ctypes.c_uint(link), ctypes.byref(state)) != 0:
                break
            active += 1 if state.value else 0
        return active

    def driver(self):
        version = self.text("nvmlSystemGetDriverVersion", size=80)
        cuda = self.out("nvmlSystemGetCudaDriverVersion_v2", ctypes.c_int)
        return version, f"{cuda // 1000}.{(cuda % 1000) // 10}"


def enabled(flag):
    return "Enabled" if flag else "Disabled"


# --query-gpu fields: name -> (header, function of the GPU dict, unit suffix)
QUERY_FIELDS = {
    "index": ("index", lambda g, d: str(g["index"]), ""),
    "name": ("name", lambda g, d: g["name"], ""),
    "gpu_name": ("name", lambda g, d: g["name"], ""),
    "uuid": ("uuid", lambda g, d: g["uuid"], ""),
    "gpu_uuid": ("uuid", lambda g, d: g["uuid"], ""),
    "driver_version": ("driver_version", lambda g, d: d[0], ""),
    "count": ("count", lambda g, d: str(d[2]), ""),
    "memory.total": ("memory.total [MiB]", lambda g, d: str(g["memory_total_mib"]), " MiB"),
    "memory.used": ("memory.used [MiB]", lambda g, d: str(g["memory_used_mib"]), " MiB"),
    "memory.free": ("memory.free [MiB]", lambda g, d: str(g["memory_free_mib"]), " MiB"),
    "persistence_mode": ("persistence_mode", lambda g, d: enabled(g["persistence"]), ""),
    "pci.bus_id": ("pci.bus_id", lambda g, d: g["bus_id"], ""),
    "gpu_bus_id": ("pci.bus_id", lambda g, d: g["bus_id"], ""),
    "pci.device_id": ("pci.device_id", lambda g, d: "0x{:08X}".format(g["pci_device_id"]), ""),
    "pci.sub_device_id": ("pci.sub_device_id", lambda g, d: "0x{:08X}".format(g["pci_subsystem_id"]), ""),
    "compute_cap": ("compute_cap", lambda g, d: g["compute_cap"], ""),
    "compute_mode": ("compute_mode", lambda g, d: "Default", ""),
    "mig.mode.current": ("mig.mode.current", lambda g, d: enabled(g["mig_current"]), ""),
}


def query(nvml, spec, fmt, gpus):
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for field in fields:
        if field not in QUERY_FIELDS:
            print(f'Field "{field}" is not a valid field to query.')
            print()
            return RC_INVALID_ARG
    options = [o.strip() for o in fmt.split(",")]
    if not options or options[0] != "csv":
        print(f'"{fmt}" is not a valid format.')
        return RC_INVALID_ARG
    driver = (*nvml.driver(), len(gpus))
    if "noheader" not in options:
        print(", ".join(QUERY_FIELDS[f][0] for f in fields))
    for gpu in gpus:
        cells = []
        for field in fields:
            _, get, unit = QUERY_FIELDS[field]
            cells.append(get(gpu, driver) + ("" if "nounits" in options else unit))
        print(", ".join(cells))
    return RC_OK


def full_row(text):
    return "| " + text.ljust(88) + "|"


def summary(nvml, gpus):
    version, cuda = nvml.driver()
    out = [time.strftime("%a %b %e %H:%M:%S %Y") + "       "]
    out.append("+" + "-" * 89 + "+")
    out.append(f"| NVIDIA-SMI {version:<23}Driver Version: {version:<15}CUDA Version: {cuda:<9}|")
    out.append("|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "|")
    out.append("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    out.append("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    out.append("|                                         |                        |               MIG M. |")
    out.append("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|")
    for gpu in gpus:
        persistence = "On" if gpu["persistence"] else "Off"
        # The stand-in has no sensors: an idle HGX board's typical readings.
        out.append(f"|{gpu['index']:>4}  {gpu['name']:<31}{persistence:<3} |   {gpu['bus_id']:<16} Off |"
                   f"{gpu['ecc']['volatile_uncorrected']:>21} |")
        temp, power = f"{30 + gpu['index'] % 4}C", f"{75 + gpu['index'] % 3}W"
        used, total = f"{gpu['memory_used_mib']}MiB", f"{gpu['memory_total_mib']}MiB"
        out.append(f"| N/A   {temp:>3}    P0{power:>16} /  700W |{used:>11} / {total:>9} |"
                   f"{'0%':>8}{'Default':>13} |")
        out.append(f"|{'':41}|{'':24}|{enabled(gpu['mig_current']):>21} |")
        out.append("+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+")
    out.append("")
    out.append("+" + "-" * 89 + "+")
    out.append(full_row("Processes:"))
    out.append(full_row(" GPU   GI   CI        PID   Type   Process name                              GPU Memory"))
    out.append(full_row("       ID   ID                                                               Usage"))
    out.append("|" + "=" * 89 + "|")
    out.append(full_row(" No running processes found"))
    out.append("+" + "-" * 89 + "+")
    print("\n".join(out))
    return RC_OK


def q_line(key, value, indent=0):
    return "{}{}: {}".format(" " * indent, key.ljust(42 - indent), value)


def details(nvml, gpus, displays, attached):
    version, cuda = nvml.driver()
    out = ["", "==============NVSMI LOG==============", "",
           q_line("Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")),
           q_line("Driver Version", version), q_line("CUDA Version", cuda), "",
           q_line("Attached GPUs", str(attached))]
    show_all = not displays
    for gpu in gpus:
        out.append("GPU {}".format(gpu["bus_id"]))
        if show_all:
            out.append(q_line("Product Name", gpu["name"], 4))
            out.append(q_line("Persistence Mode", enabled(gpu["persistence"]), 4))
            out.append("    MIG Mode")
            out.append(q_line("Current", enabled(gpu["mig_current"]), 8))
            out.append(q_line("Pending", enabled(gpu["mig_pending"]), 8))
            out.append(q_line("GPU UUID", gpu["uuid"], 4))
            out.append(q_line("Minor Number", str(gpu["index"]), 4))
            out.append("    PCI")
            out.append(q_line("Bus", "0x{:02X}".format(gpu["pci_bus"]), 8))
            out.append(q_line("Device", "0x{:02X}".format(gpu["pci_device"]), 8))
            out.append(q_line("Domain", "0x{:04X}".format(gpu["pci_domain"]), 8))
            out.append(q_line("Device Id", "0x{:08X}".format(gpu["pci_device_id"]), 8))
            out.append(q_line("Bus Id", gpu["bus_id"], 8))
            out.append(q_line("Sub System Id", "0x{:08X}".format(gpu["pci_subsystem_id"]), 8))
            out += link_rows(gpu)
        if show_all or "PERFORMANCE" in displays:
            out.append("    Clocks Event Reasons")
            out += [q_line(label, "Active" if gpu["clock_events"] & bit else "Not Active", indent)
                    for label, bit, indent in CLOCK_EVENT_ROWS]
        if show_all or "MEMORY" in displays:
            out.append("    FB Memory Usage")
            out.append(q_line("Total", f"{gpu['memory_total_mib']} MiB", 8))
            out.append(q_line("Reserved", f"{gpu['memory_reserved_mib']} MiB", 8))
            out.append(q_line("Used", f"{gpu['memory_used_mib']} MiB", 8))
            out.append(q_line("Free", f"{gpu['memory_free_mib']} MiB", 8))
        if show_all or "COMPUTE" in displays:
            out.append(q_line("Compute Mode", "Default", 4))
        if show_all or "ECC" in displays:
            out += ecc_rows(gpu)
        if show_all or "PAGE_RETIREMENT" in displays:
            # Ampere and newer remap rows instead of retiring pages: N/A, as the H100 capture prints it.
            out += ["    Retired Pages", q_line("Single Bit ECC", "N/A", 8), q_line("Double Bit ECC", "N/A", 8),
                    q_line("Pending Page Blacklist", "N/A", 8)]
        if show_all or "ROW_REMAPPER" in displays:
            corr, unc, pending, failure = gpu["remapped"]
            out += ["    Remapped Rows", q_line("Correctable Error", str(corr), 8),
                    q_line("Uncorrectable Error", str(unc), 8), q_line("Pending", yes_no(pending), 8),
                    q_line("Remapping Failure Occurred", yes_no(failure), 8)]
        if show_all:
            # After Compute Mode, as in a real -q; the status counts only once registration completed.
            done = gpu["fabric_state"] == FABRIC_COMPLETED
            out.append("    Fabric")
            out.append(q_line("State", FABRIC_STATES.get(gpu["fabric_state"], "N/A"), 8))
            out.append(q_line("Status", nvml.error_string(gpu["fabric_status"]) if done else "N/A", 8))
            out.append(q_line("CliqueId", str(gpu["clique"]) if done else "N/A", 8))
            out.append(q_line("ClusterUUID", gpu["cluster_uuid"] if done else "N/A", 8))
            out.append("        Health")
            out.append(q_line("Bandwidth", "N/A", 12))
            out.append(q_line("Processes", "None", 4))
        out.append("")
    print("\n".join(out))
    return RC_OK


def yes_no(flag):
    return "Yes" if flag else "No"


def link_rows(gpu):
    """PCI > GPU Link Info in the nesting of the H100 capture."""
    return ["        GPU Link Info", "            PCIe Generation",
            q_line("Max", str(gpu["pcie_gen_max"]), 16), q_line("Current", str(gpu["pcie_gen"]), 16),
            q_line("Device Current", str(gpu["pcie_gen"]), 16), q_line("Device Max", str(gpu["pcie_gen_max"]), 16),
            q_line("Host Max", str(gpu["pcie_gen_max"]), 16),
            "            Link Width", q_line("Max", f"{gpu['pcie_width_max']}x", 16),
            q_line("Current", f"{gpu['pcie_width']}x", 16),
            # Beside GPU Link Info, as a real R580 H200 prints it (tests/fixtures/gpu_health/h200_r580).
            q_line("Replays Since Reset", str(gpu["pcie_replays"]), 8)]


def ecc_rows(gpu):
    """ECC Mode and ECC Errors as R565 prints them: NVML's totals land on the DRAM counters, whose
    SRAM split NVML's total call does not give."""
    ecc = gpu["ecc"]
    out = ["    ECC Mode", q_line("Current", enabled(gpu["ecc_current"]), 8),
           q_line("Pending", enabled(gpu["ecc_pending"]), 8), "    ECC Errors"]
    for scope in ("volatile", "aggregate"):
        out += ["        " + scope.capitalize(), q_line("SRAM Correctable", "0", 12),
                q_line("SRAM Uncorrectable Parity", "0", 12), q_line("SRAM Uncorrectable SEC-DED", "0", 12),
                q_line("DRAM Correctable", str(ecc[f"{scope}_corrected"]), 12),
                q_line("DRAM Uncorrectable", str(ecc[f"{scope}_uncorrected"]), 12)]
        if scope == "aggregate":
            out.append(q_line("SRAM Threshold Exceeded", "No", 12))
    return out


def option_value(argv, i, inline, name):
    """The value of option ``name``: after '=' or the next argument. Returns (value, new index)."""
    if inline is not None:
        return inline, i
    if i + 1 >= len(argv):
        raise ValueError(f"Option {name} requires a value.")
    return argv[i + 1], i + 1


def parse(argv):
    opts = {"mode": "summary", "query": None, "format": "", "displays": [], "index": None}
    i = 0
    while i < len(argv):
        arg, inline = argv[i], None
        if arg.startswith("--") and "=" in arg:
            arg, inline = arg.split("=", 1)
        if arg in ("-q", "--query"):
            opts["mode"] = "details"
        elif arg in ("-L", "--list-gpus"):
            opts["mode"] = "list"
        elif arg == "--version":
            opts["mode"] = "version"
        elif arg == "--query-gpu":
            opts["query"], i = option_value(argv, i, inline, arg)
            opts["mode"] = "query"
        elif arg == "--format":
            opts["format"], i = option_value(argv, i, inline, arg)
        elif arg in ("-d", "--display"):
            value, i = option_value(argv, i, inline, arg)
            opts["displays"] = [d.strip().upper() for d in value.split(",")]
        elif arg in ("-i", "--id"):
            opts["index"], i = option_value(argv, i, inline, arg)
        else:
            raise ValueError('Invalid combination of input arguments. Please run "nvidia-smi -h" for help.')
        i += 1
    return opts


def run(argv):
    try:
        opts = parse(argv)
    except ValueError as exc:
        print(exc)
        return RC_INVALID_ARG
    try:
        nvml = Nvml()
    except OSError:
        print(MSG_NO_LIBRARY)
        return RC_LIB_NOT_FOUND
    try:
        nvml.init()
    except NvmlError as exc:
        if exc.code == NVML_ERROR_DRIVER_NOT_LOADED:
            print(MSG_NOT_LOADED)
            return RC_DRIVER_NOT_LOADED
        if exc.code == NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            print("Failed to initialize NVML: Driver/library version mismatch")
            print(f"NVML library version: {nvml.library_version()}")
            return RC_MISMATCH
        print(f"Failed to initialize NVML: {exc}")
        return RC_OTHER
    try:
        if opts["mode"] == "version":
            version, cuda = nvml.driver()
            print(f"NVIDIA-SMI version  : {version}")
            print(f"NVML version        : {nvml.library_version()}")
            print(f"DRIVER version      : {version}")
            print(f"CUDA Version        : {cuda}")
            return RC_OK
        gpus = [nvml.describe(h) for h in nvml.gpus()]
        # -q reports every attached GPU in its header, even when -i selects fewer.
        attached = len(gpus)
        if opts["index"] is not None:
            wanted = {s.strip() for s in opts["index"].split(",")}
            gpus = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted or g["bus_id"] in wanted]
            if not gpus:
                print("No devices were found")
                return RC_NOT_FOUND
        if opts["mode"] == "list":
            for gpu in gpus:
                print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
            return RC_OK
        if opts["mode"] == "query":
            return query(nvml, opts["query"], opts["format"], gpus)
        if opts["mode"] == "details":
            return details(nvml, gpus, opts["displays"], attached)
        if not gpus:
            print("No devices were found")
            return RC_NOT_FOUND
        return summary(nvml, gpus)
    except NvmlError as exc:
        print(f"Unable to query the GPUs: {exc}")
        return RC_OTHER
    finally:
        nvml.lib.nvmlShutdown()


if __name__ == "__main__":
    # Like the real binary: a reader that closes the pipe (nvidia-smi | head) ends it quietly.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(run(sys.argv[1:]))
