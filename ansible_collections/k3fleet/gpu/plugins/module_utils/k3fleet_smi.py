# Stdlib only: shipped to nodes inside AnsiballZ.
"""nvidia-smi as a GPU source: the GPU list of its CSV query, ``nvidia-smi -q`` (the CUDA version, each
GPU's fabric state and health, memory in use, compute processes, ECC, remapped rows, clock events,
PCIe link) and the failure texts nvidia-smi prints for NVML.

``collect_smi(reader)`` is what collect_driver asks when NVML did not answer, and only then imports
this module: a node whose NVML answers never compiles it. The parse functions are pure and raise
``ValueError`` with a one-line explanation on output they do not understand.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_gpu_common import (
    VERSION_RE,
    fabric_status_name,
    gpu_notes,
    is_na,
    normalize_bus_id,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS

# The --query-gpu fields of COMMANDS["nvidia_smi_query"], in order.
SMI_QUERY_FIELDS = tuple(
    COMMANDS["nvidia_smi_query"][1].split("=", 1)[1].split(",")
)

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


def _smi_int(value: str, field: str, line_no: int) -> int | None:
    if is_na(value):
        return None
    # Without "nounits" memory reads "81559 MiB".
    match = re.match(r"^(\d+)(?: MiB)?$", value.strip())
    if not match:
        raise ValueError(f"nvidia-smi CSV line {line_no}: {field} is not a number: {value!r}")
    return int(match.group(1))


def _smi_bool(value: str, field: str, line_no: int) -> bool | None:
    if is_na(value):
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
    import csv  # only nodes without NVML parse nvidia-smi's CSV

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
                if is_na(value):
                    row[field] = None
                elif re.match(r"^\d+\.\d+$", value):
                    row[field] = value
                else:
                    raise ValueError(f"nvidia-smi CSV line {line_no}: compute_cap is not major.minor: "
                                     f"{value!r}")
            elif field == "driver_version":
                # R610 annotates its deprecated version fields ("610.43.02 [Deprecated; ...]").
                row[field] = None if is_na(value) else strip_annotation(value)
            else:
                row[field] = None if is_na(value) else value
        rows.append(row)
    if not rows:
        raise ValueError("nvidia-smi CSV output has no GPU rows")
    return rows


_ANNOTATION_RE = re.compile(r"\s*\[[^\]]*\]\s*$")


def strip_annotation(value: str) -> str:
    """ "610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]" -> "610.57.04".

    R610's nvidia-smi keeps the old header lines with a bracketed deprecation note after the
    value (docs/facts.md section 12); a bare "[N/A]" stays as it is, it is the value.
    """
    stripped = _ANNOTATION_RE.sub("", value)
    return stripped if stripped else value.strip()


# Header labels, newest spelling first: R610 prints "KMD Version" / "CUDA UMD Version" and keeps the
# deprecated "Driver Version" / "CUDA Version" lines beside them (docs/facts.md section 12).
_DRIVER_LABELS = ("KMD Version", "Driver Version")

_CUDA_LABELS = ("CUDA UMD Version", "CUDA Version")

_HEADER_LINE_RE = re.compile(r"^(KMD Version|Driver Version|CUDA UMD Version|CUDA Version)\s*:\s*(.*?)\s*$")


def parse_smi_q_cuda(text: str) -> dict[str, str | None]:
    """Read the driver and the maximum CUDA version from the header of ``nvidia-smi -q``.

    Reads both layouts: "Driver Version" / "CUDA Version" (up to R595) and R610's
    "KMD Version" / "CUDA UMD Version", preferring the new spelling when both are printed and
    dropping a bracketed deprecation note after a value. The CUDA version is the driver's
    maximum supported CUDA. A value that is not a version (vGPU hosts print "Not Found")
    becomes None. Raises ValueError when no such line is present.
    """
    seen: dict[str, str] = {}
    for line in (text or "").splitlines():
        match = _HEADER_LINE_RE.match(line.strip())
        if match and match.group(1) not in seen:
            seen[match.group(1)] = strip_annotation(match.group(2))
    if not seen:
        raise ValueError("nvidia-smi -q output has no 'Driver Version', 'KMD Version' or 'CUDA Version' line")
    driver = cuda = None
    for label in _DRIVER_LABELS:
        value = seen.get(label)
        if value is not None and VERSION_RE.fullmatch(value):
            driver = value
            break
    for label in _CUDA_LABELS:
        value = seen.get(label)
        if value is not None and re.fullmatch(r"\d+\.\d+", value):
            cuda = value
            break
    return {"driver_version": driver, "cuda_version": cuda}


# nvidia-smi -q "Fabric" > "State" texts -> nvmlGpuFabricState_t names (FABRIC_STATES).
SMI_FABRIC_STATES = {
    "not supported": "not_supported",
    "not started": "not_started",
    "in progress": "in_progress",
    "completed": "completed",
}

_GPU_BLOCK_RE = re.compile(r"^GPU\s+(\S+)\s*$")


def parse_smi_q_blocks(text: str) -> dict[str, list[list[Any]]]:
    """The GPU blocks of ``nvidia-smi -q`` as trees, keyed by normalised bus id.

    Each line ``Key : value`` (or a section title ``Key``) becomes a node ``[key, value, children]``
    (value None for a section title); a line indented deeper than the one before it is that
    line's child. Nesting is read from the indentation, never from column widths (they differ
    between driver releases: 42 characters up to R565, 55 on R580.159), and a key this parser
    has never seen is kept like any other, so new fields never break parsing. Lines at column 0
    that are not "GPU <bus id>" (the header, foreign log lines) neither open nor close a block.
    Raises ValueError when the text has no GPU block at all.
    """
    blocks: dict[str, list[list[Any]]] = {}
    stack: list[tuple[int, list[list[Any]]]] = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            match = _GPU_BLOCK_RE.match(line)
            bus = normalize_bus_id(match.group(1)) if match else None
            if bus is not None:
                root: list[list[Any]] = []
                blocks[bus] = root
                stack = [(-1, root)]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = stripped.partition(":")
        node: list[Any] = [key.strip(), value.strip() if sep else None, []]
        stack[-1][1].append(node)
        stack.append((indent, node[2]))
    if not blocks:
        raise ValueError("nvidia-smi -q output has no 'GPU <bus id>' block")
    return blocks


def _child(nodes: list[list[Any]] | None, key: str) -> list[Any] | None:
    want = key.lower()
    for node in nodes or ():
        if node[0].lower() == want:
            return node
    return None


def _fabric_entry(block: list[list[Any]]) -> dict[str, str | None]:
    entry: dict[str, str | None] = {"state": None, "status": None, "note": "no Fabric section"}
    fabric = _child(block, "Fabric")
    if fabric is None:
        return entry
    state_node = _child(fabric[2], "State")
    if state_node is None or state_node[1] is None:
        entry["note"] = "Fabric section has no State line"
    else:
        value = state_node[1]
        state = SMI_FABRIC_STATES.get(value.lower())
        entry["state"] = state
        if state is not None:
            entry["note"] = None
        elif is_na(value):
            entry["note"] = "State N/A"
        else:
            entry["note"] = f"unrecognised State {value[:60]!r}"
    status_node = _child(fabric[2], "Status")
    if status_node is not None and status_node[1] is not None:
        entry["status"] = fabric_status_name(status_node[1])
    return entry


def _smi_fabric_domain(fabric: list[Any] | None) -> tuple[str | None, int | None]:
    """(ClusterUUID, CliqueId) of one GPU's "Fabric" section; None where N/A or not printed.

    GPUs of one multi-node NVLink domain share a non-zero ClusterUUID; a single HGX board prints the
    zero UUID and clique 0 (docs/facts.md section 15).
    """
    if fabric is None:
        return None, None
    uuid = (_child(fabric[2], "ClusterUUID") or [None, None])[1]
    clique = (_child(fabric[2], "CliqueId") or [None, None])[1]
    uuid = None if uuid is None or is_na(uuid) else uuid.strip().lower()
    return uuid, (int(clique.strip()) if clique is not None and clique.strip().isdigit() else None)


def parse_smi_q_fabric(text: str) -> dict[str, dict[str, str | None]]:
    """Per-GPU "Fabric" State and Status from ``nvidia-smi -q``, keyed by normalised bus id.

    Each GPU block maps to ``{"state", "status", "note"}``: ``state`` is a FABRIC_STATES name or
    None, ``status`` the Status text in snake_case (None for "N/A"), and ``note`` says why
    ``state`` is None: the driver printed "N/A" (no fabric on this board, or the query failed),
    the block has no Fabric section (older driver, or the output was cut), or a State text this
    parser does not know. Only the Fabric section's own State counts, never a "State" elsewhere.
    Raises ValueError when the text has no GPU block at all.
    """
    return {bus: _fabric_entry(block) for bus, block in parse_smi_q_blocks(text).items()}


# nvidia-smi -q "Fabric" > "Health" labels -> (FabricHealth field, kind). Summary and the named
# conditions are snake_case names, the rest True/False (docs/facts.md section 9).
SMI_FABRIC_HEALTH_FIELDS = {
    "summary": ("summary", "name"),
    "bandwidth": ("bandwidth", "name"),
    "route recovery in progress": ("route_recovery_in_progress", "bool"),
    "route unhealthy": ("route_unhealthy", "bool"),
    "access timeout recovery": ("access_timeout_recovery", "bool"),
    "incorrect configuration": ("incorrect_configuration", "name"),
    "partition assigned": ("partition_assigned", "bool"),
    "gfm state": ("gfm_state", "name"),
}


def _health_value(kind: str, text: str) -> tuple[bool, Any]:
    """(understood, value) of one Health line; N/A is understood as None."""
    if is_na(text):
        return True, None
    if kind == "bool":
        low = text.strip().lower()
        if low in ("true", "yes"):
            return True, True
        if low in ("false", "no"):
            return True, False
        return False, None
    return True, fabric_status_name(text)


def parse_fabric_health(nodes: list[list[Any]]) -> dict[str, Any]:
    """A ``Fabric`` > ``Health`` section as FabricHealth data.

    Known labels fill their field (None for N/A); a label this parser does not know, or a value
    it cannot read, is kept verbatim under ``other`` so the verdict can show it. Never raises.
    """
    health: dict[str, Any] = {field: None for field, _kind in SMI_FABRIC_HEALTH_FIELDS.values()}
    health["other"] = {}
    for key, value, _children in nodes:
        if value is None:
            continue
        spec = SMI_FABRIC_HEALTH_FIELDS.get(" ".join(key.lower().split()))
        understood, parsed = _health_value(spec[1], value) if spec else (False, None)
        if spec is not None and understood:
            health[spec[0]] = parsed
        elif not is_na(value):
            health["other"][key[:80]] = value[:120]
    return health


def _mib(text: str | None) -> int | None:
    """ "21602 MiB" -> 21602; None for N/A and text that is not a MiB figure."""
    if text is None or is_na(text):
        return None
    match = re.match(r"^(\d+)\s*MiB$", text.strip())
    return int(match.group(1)) if match else None


def parse_smi_q_processes(node: list[Any] | None) -> list[dict[str, Any]] | None:
    """The ``Processes`` section of one GPU block: [] for "None", None when the section is missing.

    Each "Process ID" line carries Type, Name and Used GPU Memory as its children
    (tests/fixtures/driver: the RTX 4090 capture of 535.154.05).
    """
    if node is None:
        return None
    out: list[dict[str, Any]] = []
    for key, value, children in node[2]:
        if key.lower() != "process id":
            continue
        proc_type = _child(children, "Type")
        name = _child(children, "Name")
        used = _child(children, "Used GPU Memory")
        out.append({
            "pid": int(value) if value and value.isdigit() else None,
            "type": None if proc_type is None or proc_type[1] is None or is_na(proc_type[1]) else proc_type[1],
            "name": None if name is None or not name[1] else name[1][:200],
            "used_memory_mib": _mib(used[1]) if used is not None else None,
        })
    return out


def smi_q_memory(block: list[list[Any]]) -> dict[str, Any]:
    """Used and Reserved of a GPU block's "FB Memory Usage" (Reserved printed since R470; an idle R580
    H200 shows Reserved 616 MiB, Used 0 MiB: tests/fixtures/gpu_health/h200_r580/health-q-mem.txt)."""
    memory = _child(block, "FB Memory Usage")
    if memory is None:
        return {"memory_used_mib": None, "memory_reserved_mib": None, "memory_source": None}
    used = _child(memory[2], "Used")
    reserved = _child(memory[2], "Reserved")
    return {"memory_used_mib": _mib(used[1]) if used is not None else None,
            "memory_reserved_mib": _mib(reserved[1]) if reserved is not None else None,
            "memory_source": "nvidia-smi"}


def apply_smi_memory(gpus: list[dict[str, Any]], text: str) -> str | None:
    """Used and Reserved from ``nvidia-smi -q -d MEMORY`` onto GPUs whose NVML answered only the v1 memory
    call (used counts reserved there), by bus id. Returns a note naming GPUs left with the v1 figure."""
    try:
        blocks = parse_smi_q_blocks(text)
    except ValueError as exc:
        return f"GPU used memory includes the driver's reserved memory (nvidia-smi -q -d MEMORY: {exc})"
    left: dict[str, list[Any]] = {}
    for gpu in gpus:
        if gpu.get("memory_source") != "nvml_v1":
            continue
        bus = normalize_bus_id(gpu.get("pci_bus_id"))
        block = blocks.get(bus) if bus is not None else None
        memory = smi_q_memory(block) if block is not None else None
        if memory is None or memory["memory_used_mib"] is None:
            left.setdefault("not in nvidia-smi -q -d MEMORY", []).append(gpu.get("index"))
            continue
        gpu.update(memory)
    return gpu_notes("GPU used memory includes the driver's reserved memory: ", left)


def apply_smi_q(gpus: list[dict[str, Any]], text: str) -> tuple[str | None, str | None]:
    """Fill the CSV GPUs from ``nvidia-smi -q`` by bus id: fabric state, status and health,
    memory in use and compute processes.

    Returns ``(fabric note, usage note)``: one line each naming the GPUs whose fabric state, or
    whose memory use and processes, stay unknown and why; None when nothing is missing.
    """
    try:
        blocks = parse_smi_q_blocks(text)
    except ValueError as exc:
        return f"GPU fabric state unknown: {exc}", f"GPU memory use and processes unknown: {exc}"
    fabric_why: dict[str, list[Any]] = {}
    usage_why: dict[str, list[Any]] = {}
    for gpu in gpus:
        bus = normalize_bus_id(gpu.get("pci_bus_id"))
        block = blocks.get(bus) if bus is not None else None
        if block is None:
            missing = "bus id not in nvidia-smi -q" if bus is not None else "no PCI bus id to match -q by"
            fabric_why.setdefault(missing, []).append(gpu.get("index"))
            usage_why.setdefault(missing, []).append(gpu.get("index"))
            continue
        entry = _fabric_entry(block)
        gpu["fabric_state"] = entry["state"]
        gpu["fabric_status"] = entry["status"]
        if entry["note"]:
            fabric_why.setdefault(entry["note"], []).append(gpu.get("index"))
        fabric = _child(block, "Fabric")
        health = _child(fabric[2], "Health") if fabric is not None else None
        gpu["fabric_health"] = parse_fabric_health(health[2]) if health is not None else None
        gpu["fabric_cluster_uuid"], gpu["fabric_clique_id"] = _smi_fabric_domain(fabric)
        gpu.update(smi_q_memory(block))
        gpu["processes"] = parse_smi_q_processes(_child(block, "Processes"))
        gpu.update(smi_q_health(block))
        if gpu["memory_used_mib"] is None and gpu["processes"] is None:
            usage_why.setdefault("no FB Memory Usage or Processes section", []).append(gpu.get("index"))
    return (gpu_notes("GPU fabric state unknown: ", fabric_why),
            gpu_notes("GPU memory use and processes unknown: ", usage_why))


def _count(text: str | None) -> int | None:
    """ "0" -> 0, "4" -> 4; None for N/A and anything that is not a count."""
    if text is None or is_na(text):
        return None
    match = re.match(r"^(\d+)", text.strip())
    return int(match.group(1)) if match else None


def _yes_no(text: str | None) -> bool | None:
    low = (text or "").strip().lower()
    if low in ("yes", "true"):
        return True
    if low in ("no", "false"):
        return False
    return None


def _uncorrectable_sum(node: list[Any] | None) -> tuple[int | None, bool]:
    """Sum of the uncorrectable counters under one ECC Errors timescale (Volatile or Aggregate).

    R450+ lists "SRAM Uncorrectable" / "DRAM Uncorrectable" (R550+ splits SRAM into "Parity" and
    "SEC-DED"); older drivers a "Double Bit" section with a "Total". Returns (sum, any counter seen);
    the sum is None when every counter printed N/A.
    """
    if node is None:
        return None, False
    total: int | None = None
    seen = False
    for key, value, children in node[2]:
        low = key.lower()
        if "uncorrectable" in low and value is not None:
            seen = True
            n = _count(value)
            if n is not None:
                total = (total or 0) + n
        elif low == "double bit":
            seen = True
            n = _count((_child(children, "Total") or [None, None])[1])
            if n is not None:
                total = (total or 0) + n
    return total, seen


def _correctable_sum(node: list[Any] | None) -> int | None:
    """Sum of the correctable counters under one ECC Errors timescale ("SRAM Correctable", "DRAM
    Correctable"; older drivers a "Single Bit" section with a "Total"); None when none printed a count."""
    if node is None:
        return None
    total: int | None = None
    for key, value, children in node[2]:
        low = key.lower()
        n = None
        if low.endswith("correctable") and "uncorrectable" not in low:
            n = _count(value)
        elif low == "single bit":
            n = _count((_child(children, "Total") or [None, None])[1])
        if n is not None:
            total = (total or 0) + n
    return total


def parse_smi_q_ecc(block: list[list[Any]]) -> dict[str, Any] | None:
    """GpuEcc from a GPU block's "ECC Mode" and "ECC Errors"; None when neither section is printed."""
    mode_node = _child(block, "ECC Mode")
    errors = _child(block, "ECC Errors")
    if mode_node is None and errors is None:
        return None
    current = (_child(mode_node[2], "Current") or [None, None])[1] if mode_node is not None else None
    mode = {"enabled": "enabled", "disabled": "disabled"}.get((current or "").strip().lower())
    volatile, seen_v = _uncorrectable_sum(_child(errors[2], "Volatile") if errors is not None else None)
    aggregate, seen_a = _uncorrectable_sum(_child(errors[2], "Aggregate") if errors is not None else None)
    reason = None
    if volatile is None and aggregate is None:
        if mode == "disabled":
            reason = "ECC is disabled on this GPU"
        elif seen_v or seen_a:
            reason = "ECC error counters read N/A"
        else:
            reason = "no ECC error counters in nvidia-smi -q"
    corrected: dict[str, int | None] = {"volatile_corrected": None, "aggregate_corrected": None}
    if errors is not None:
        corrected = {"volatile_corrected": _correctable_sum(_child(errors[2], "Volatile")),
                     "aggregate_corrected": _correctable_sum(_child(errors[2], "Aggregate"))}
    return {"mode": mode, "volatile_uncorrected": volatile, "aggregate_uncorrected": aggregate, **corrected,
            "reason": reason}


def parse_smi_q_remapped(block: list[list[Any]]) -> dict[str, Any] | None:
    """GpuRemappedRows from "Remapped Rows" (Ampere and newer) and "Retired Pages" (older GPUs)."""
    rows = _child(block, "Remapped Rows")
    pages = _child(block, "Retired Pages")
    if rows is None and pages is None:
        return None
    out: dict[str, Any] = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None,
                           "retired_pages_pending": None, "reason": None}
    if rows is not None:
        if rows[1] is not None and is_na(rows[1]):
            out["reason"] = "Remapped Rows N/A (no row remapping on this GPU)"
        kids = rows[2]
        out["correctable"] = _count((_child(kids, "Correctable Error") or [None, None])[1])
        out["uncorrectable"] = _count((_child(kids, "Uncorrectable Error") or [None, None])[1])
        out["pending"] = _yes_no((_child(kids, "Pending") or [None, None])[1])
        out["failure"] = _yes_no((_child(kids, "Remapping Failure Occurred") or [None, None])[1])
    if pages is not None:
        pending = _child(pages[2], "Pending Page Blacklist") or _child(pages[2], "Pending Page Retirement")
        out["retired_pages_pending"] = _yes_no(pending[1]) if pending is not None else None
    if out["pending"] is None and out["failure"] is None and out["retired_pages_pending"] is None:
        out["reason"] = out["reason"] or "remapped rows and retired pages read N/A"
    return out


def clock_event_name(label: str) -> str:
    """ "HW Power Brake Slowdown" -> "hw_power_brake_slowdown" (nvidia-smi's clock event labels)."""
    return re.sub(r"[^a-z0-9]+", "_", label.strip().lower()).strip("_")


def parse_smi_q_throttle(block: list[list[Any]]) -> dict[str, Any] | None:
    """GpuThrottle from "Clocks Event Reasons" (R535 on) or "Clocks Throttle Reasons" (older)."""
    node = _child(block, "Clocks Event Reasons") or _child(block, "Clocks Throttle Reasons")
    if node is None:
        return None
    active: list[str] = []
    known = False

    def walk(nodes: list[list[Any]]) -> None:
        nonlocal known
        for key, value, children in nodes:
            low = (value or "").strip().lower()
            if low in ("active", "not active"):
                known = True
                if low == "active":
                    active.append(clock_event_name(key))
            walk(children)

    walk(node[2])
    return {"active": active, "mask": None, "reason": None if known else "clock event reasons read N/A"}


def _link_number(text: str | None) -> int | None:
    """ "16x" -> 16, "5" -> 5; None for N/A."""
    if text is None or is_na(text):
        return None
    match = re.match(r"^(\d+)\s*x?$", text.strip(), re.I)
    return int(match.group(1)) if match else None


def parse_smi_q_pcie(block: list[list[Any]]) -> dict[str, Any] | None:
    """GpuPcieLink from "PCI" > "GPU Link Info": PCIe Generation and Link Width, Max and Current."""
    pci = _child(block, "PCI")
    link = _child(pci[2], "GPU Link Info") if pci is not None else None
    if link is None:
        return None
    gen = _child(link[2], "PCIe Generation")
    width = _child(link[2], "Link Width")

    def pair(node: list[Any] | None) -> tuple[int | None, int | None]:
        if node is None:
            return None, None
        return (_link_number((_child(node[2], "Current") or [None, None])[1]),
                _link_number((_child(node[2], "Max") or [None, None])[1]))

    gc, gm = pair(gen)
    wc, wm = pair(width)
    reason = None if None not in (gc, gm, wc, wm) else "PCIe link generation or width read N/A"
    # "Replays Since Reset" sits beside "GPU Link Info" in the PCI section (R580 H200: tests/fixtures/
    # gpu_health/h200_r580/nvidia-smi-q.txt).
    replays = _count((_child(pci[2], "Replays Since Reset") or [None, None])[1]) if pci is not None else None
    return {"gen_current": gc, "gen_max": gm, "width_current": wc, "width_max": wm, "replay_counter": replays,
            "reason": reason}


def smi_q_health(block: list[list[Any]]) -> dict[str, Any]:
    """The health fields of one ``nvidia-smi -q`` GPU block (ecc, remapped_rows, throttle, pcie)."""
    return {"ecc": parse_smi_q_ecc(block), "remapped_rows": parse_smi_q_remapped(block),
            "throttle": parse_smi_q_throttle(block), "pcie": parse_smi_q_pcie(block)}


def apply_smi_fabric(gpus: list[dict[str, Any]], text: str) -> str | None:
    """:func:`apply_smi_q`, returning only the note on fabric state."""
    return apply_smi_q(gpus, text)[0]


def classify_smi_failure(text: str) -> tuple[str, str]:
    """Map nvidia-smi's failure text to an NVML status and a one-line message."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    message = " ".join(lines[:2])[:300] if lines else "no output"
    for pattern, status in _SMI_FAILURES:
        if pattern.search(text or ""):
            return status, message
    return "error", message


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
        "fabric_health": None,
        "fabric_cluster_uuid": None,
        "fabric_clique_id": None,
        "memory_used_mib": None,
        "memory_reserved_mib": None,
        "memory_source": None,
        "nvlink": None,
        "processes": None,
        "ecc": None,
        "remapped_rows": None,
        "throttle": None,
        "pcie": None,
    }


_NVLINK_GPU_RE = re.compile(r"^GPU (\d+): ")
_NVLINK_LINK_RE = re.compile(r"^\s+Link (\d+): (.*?)\s*$")


def parse_nvlink_status(text: str) -> dict[int, dict[str, Any]]:
    """``nvidia-smi nvlink -s``: GPU index -> {"links", "active", "inactive"}.

    Each GPU prints "GPU n: <name> (UUID: ...)" then one "Link k: 25.781 GB/s" or "Link k: <inactive>"
    line per link (Azure/azhpc-diagnostics issue 73, a V100 with two inactive links). A GPU without
    NVLink prints nothing at all, and so does a node none of whose GPUs has NVLink (the real H200 in a
    VM: tests/fixtures/gpu_health/h200_r580/health-nvlink-s.txt): an empty answer is "no links".
    """
    out: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in (text or "").splitlines():
        gpu = _NVLINK_GPU_RE.match(line)
        if gpu:
            current = out.setdefault(int(gpu.group(1)), {"links": 0, "active": [], "inactive": []})
            continue
        link = _NVLINK_LINK_RE.match(line)
        if link and current is not None:
            current["links"] += 1
            value = link.group(2).strip().lower()
            (current["inactive"] if "inactive" in value or is_na(value) else current["active"]).append(
                int(link.group(1)))
        elif line.strip() and current is None:
            raise ValueError(f"nvidia-smi nvlink -s: line before any GPU: {line.strip()[:120]!r}")
    return out


def apply_nvlink_status(gpus: list[dict[str, Any]], res: Any) -> str | None:
    """Fill each GPU's ``nvlink`` from ``nvidia-smi nvlink -s``; a note when it could not be read."""
    if not res.ok:
        return f"NVLink state unknown: {res.reason()}"
    try:
        parsed = parse_nvlink_status(res.stdout)
    except ValueError as exc:
        return f"NVLink state unknown: {exc}"
    for gpu in gpus:
        index = gpu.get("index")
        missing: dict[str, Any] = {"links": 0, "active": [], "inactive": []}
        links = parsed.get(index, missing) if isinstance(index, int) else missing
        gpu["nvlink"] = dict(links, errors={}, source="nvidia-smi", reason=None)
    return None


# PCIe distances of `nvidia-smi topo -m`, nearest first (its legend: PIX at most one PCIe bridge, PXB several
# bridges, PHB through a host bridge, NODE across host bridges in one NUMA node, SYS across the SMP link).
TOPO_DISTANCES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_TOPO_SPLIT = re.compile(r"\t+| {2,}")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


def parse_topo_matrix(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m``: each GPU's nearest NIC and its PCIe distance, CPU and NUMA affinity.

    Returns ``{"nics": [name...], "gpus": {index: {"nearest_nic", "distance", "cpu_affinity", "numa"}}}``;
    NICs are named by the legend ("NIC0: mlx5_0") where it is printed. Raises ValueError without a header.
    """
    lines = [_ANSI_RE.sub("", ln) for ln in (text or "").splitlines()]
    header = next((ln for ln in lines if re.search(r"\bGPU0\b", ln) and not ln.startswith("GPU")), None)
    if header is None:
        raise ValueError("nvidia-smi topo -m: no header row with GPU0")
    cols = [c.strip() for c in _TOPO_SPLIT.split(header.strip()) if c.strip()]
    devices = [c for c in cols if re.match(r"^(GPU\d+|NIC\d+|mlx\S+|ib\S+)$", c)]
    legend = {m.group(1): m.group(2) for m in (_NIC_LEGEND_RE.match(ln) for ln in lines) if m}
    nics = [d for d in devices if not d.startswith("GPU")]
    out: dict[str, Any] = {"nics": [legend.get(n, n) for n in nics], "gpus": {}}
    for ln in lines:
        m = re.match(r"^GPU(\d+)\s", ln)
        if not m:
            continue
        cells = [c.strip() for c in _TOPO_SPLIT.split(ln.strip())][1:]
        rel = dict(zip(devices, cells[:len(devices)], strict=False))
        rest = [c for c in cells[len(devices):] if c]
        best = None
        for nic in nics:
            dist = rel.get(nic, "")
            if dist in TOPO_DISTANCES and (best is None or TOPO_DISTANCES.index(dist) < TOPO_DISTANCES.index(best[1])):
                best = (nic, dist)
        out["gpus"][str(int(m.group(1)))] = {
            "nearest_nic": legend.get(best[0], best[0]) if best else None, "distance": best[1] if best else None,
            "cpu_affinity": rest[0] if rest else None,
            "numa": rest[1] if len(rest) > 1 and not is_na(rest[1]) else None}
    return out


def collect_topology(reader: NodeReader) -> dict[str, Any]:
    """Topology facts from ``nvidia-smi topo -m``: status, reason, and :func:`parse_topo_matrix`'s fields."""
    res = reader.run(COMMANDS["nvidia_smi_topo"])
    if not res.ok:
        return {"status": "unknown", "reason": res.reason(), "nics": [], "gpus": {}}
    try:
        parsed = parse_topo_matrix(res.stdout)
    except ValueError as exc:
        return {"status": "unknown", "reason": str(exc), "nics": [], "gpus": {}}
    return dict(parsed, status="ok", reason=None)


def collect_smi(reader: NodeReader) -> dict[str, Any]:
    """Query nvidia-smi (COMMANDS nvidia_smi_query and nvidia_smi_q).

    The CSV lists the GPUs; ``-q`` adds the CUDA version from its header (old or R610 layout)
    and each GPU's fabric state, status and health, memory in use and compute processes,
    matched to the CSV rows by PCI bus id.

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
        notes.extend(note for note in apply_smi_q(out["gpus"], q.stdout) if note)
    else:
        notes.append(f"CUDA version, GPU fabric state, memory use and processes unknown: {q.reason()}")
    note = apply_nvlink_status(out["gpus"], reader.run(COMMANDS["nvidia_smi_nvlink_status"]))
    if note:
        notes.append(note)
    out["reason"] = "; ".join(notes) or None
    return out
