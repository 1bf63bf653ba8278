# Stdlib only: shipped to nodes inside AnsiballZ. pynvml is optional and imported lazily.
"""Driver and GPU facts: loaded kernel module, NVML (or nvidia-smi), per-GPU details.

``collect_driver(reader, use_nvml=True)`` returns a dict shaped like
``k3fleet.models.facts.DriverFacts``. The parse functions are pure and raise
``ValueError`` with a one-line explanation on output they do not understand; the
collector turns that into ``unknown`` + reason, never an exception.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, parse_proc_modules
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

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
                if _na(value):
                    row[field] = None
                elif re.match(r"^\d+\.\d+$", value):
                    row[field] = value
                else:
                    raise ValueError(f"nvidia-smi CSV line {line_no}: compute_cap is not major.minor: "
                                     f"{value!r}")
            elif field == "driver_version":
                # R610 annotates its deprecated version fields ("610.43.02 [Deprecated; ...]").
                row[field] = None if _na(value) else strip_annotation(value)
            else:
                row[field] = None if _na(value) else value
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
        if value is not None and _VERSION_RE.fullmatch(value):
            driver = value
            break
    for label in _CUDA_LABELS:
        value = seen.get(label)
        if value is not None and re.fullmatch(r"\d+\.\d+", value):
            cuda = value
            break
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
        elif _na(value):
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
    uuid = None if uuid is None or _na(uuid) else uuid.strip().lower()
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
    if _na(text):
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
    health: dict[str, Any] = {field: None for field, _ in SMI_FABRIC_HEALTH_FIELDS.values()}
    health["other"] = {}
    for key, value, _children in nodes:
        if value is None:
            continue
        spec = SMI_FABRIC_HEALTH_FIELDS.get(" ".join(key.lower().split()))
        understood, parsed = _health_value(spec[1], value) if spec else (False, None)
        if spec is not None and understood:
            health[spec[0]] = parsed
        elif not _na(value):
            health["other"][key[:80]] = value[:120]
    return health


def _mib(text: str | None) -> int | None:
    """ "21602 MiB" -> 21602; None for N/A and text that is not a MiB figure."""
    if text is None or _na(text):
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
            "type": None if proc_type is None or proc_type[1] is None or _na(proc_type[1]) else proc_type[1],
            "name": None if name is None or not name[1] else name[1][:200],
            "used_memory_mib": _mib(used[1]) if used is not None else None,
        })
    return out


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


def _notes(prefix: str, why: dict[str, list[Any]]) -> str | None:
    if not why:
        return None
    return prefix + "; ".join(f"GPU {_index_ranges(indices)}: {note}" for note, indices in why.items())


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
        memory = _child(block, "FB Memory Usage")
        used = _child(memory[2], "Used") if memory is not None else None
        gpu["memory_used_mib"] = _mib(used[1]) if used is not None else None
        gpu["processes"] = parse_smi_q_processes(_child(block, "Processes"))
        gpu.update(smi_q_health(block))
        if gpu["memory_used_mib"] is None and gpu["processes"] is None:
            usage_why.setdefault("no FB Memory Usage or Processes section", []).append(gpu.get("index"))
    return (_notes("GPU fabric state unknown: ", fabric_why),
            _notes("GPU memory use and processes unknown: ", usage_why))


# -- GPU health (docs/facts.md section 14) ----------------------------------------------------------


def _count(text: str | None) -> int | None:
    """ "0" -> 0, "4" -> 4; None for N/A and anything that is not a count."""
    if text is None or _na(text):
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
    return {"mode": mode, "volatile_uncorrected": volatile, "aggregate_uncorrected": aggregate, "reason": reason}


def parse_smi_q_remapped(block: list[list[Any]]) -> dict[str, Any] | None:
    """GpuRemappedRows from "Remapped Rows" (Ampere and newer) and "Retired Pages" (older GPUs)."""
    rows = _child(block, "Remapped Rows")
    pages = _child(block, "Retired Pages")
    if rows is None and pages is None:
        return None
    out: dict[str, Any] = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None,
                           "retired_pages_pending": None, "reason": None}
    if rows is not None:
        if rows[1] is not None and _na(rows[1]):
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
    if text is None or _na(text):
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
    return {"gen_current": gc, "gen_max": gm, "width_current": wc, "width_max": wm, "reason": reason}


def smi_q_health(block: list[list[Any]]) -> dict[str, Any]:
    """The health fields of one ``nvidia-smi -q`` GPU block (ecc, remapped_rows, throttle, pcie)."""
    return {"ecc": parse_smi_q_ecc(block), "remapped_rows": parse_smi_q_remapped(block),
            "throttle": parse_smi_q_throttle(block), "pcie": parse_smi_q_pcie(block)}


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


def collect_kernel_log(reader: NodeReader) -> dict[str, Any]:
    """KernelLog facts: the Xid events of this boot, from dmesg or else the journal's kernel messages."""
    reasons = []
    for name in ("dmesg", "journalctl_kernel"):
        res = reader.run(COMMANDS[name])
        if res.ok and res.stdout.strip():
            return {"status": "ok", "reason": None, "source": name.split("_", 1)[0],
                    "xid": parse_xid_lines(res.stdout)}
        detail = (res.stderr or res.stdout).strip().splitlines()
        reasons.append(f"{' '.join(COMMANDS[name][:2])}: "
                       f"{detail[0][:160] if detail else res.reason() or 'no output'}")
    return {"status": "unknown", "reason": "; ".join(reasons), "source": None, "xid": []}


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
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    gpu["memory_total_mib"] = int(memory.total) // (1024 * 1024)
    used = getattr(memory, "used", None)
    gpu["memory_used_mib"] = int(used) // (1024 * 1024) if used is not None else None
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
    return gpu


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
    mode, _ = _nvml_try(nv, getattr(nv, "nvmlDeviceGetEccMode", None), handle)
    current = mode[0] if isinstance(mode, (list, tuple)) and mode else None
    ecc = {"mode": None if current is None else ("enabled" if int(current) == 1 else "disabled"),
           "volatile_uncorrected": None if volatile is None else int(volatile),
           "aggregate_uncorrected": None if aggregate is None else int(aggregate),
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
        result["note"] = _notes("GPU compute processes unknown: ", process_notes)
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
        "fabric_health": None,
        "fabric_cluster_uuid": None,
        "fabric_clique_id": None,
        "memory_used_mib": None,
        "processes": None,
        "ecc": None,
        "remapped_rows": None,
        "throttle": None,
        "pcie": None,
    }


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
    try:
        parsed = parse_proc_version(text)
    except ValueError as exc:
        first = (text.splitlines() or [""])[0]
        km["raw"] = first[:300] or None
        km["reason"] = str(exc)
        return km
    km.update(version=parsed["version"], flavour=parsed["flavour"], arch=parsed["arch"], raw=parsed["raw"])
    return km


# -- platform ---------------------------------------------------------------------

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
        "kernel_module": {k: km[k] for k in ("loaded", "version", "flavour", "arch", "raw")},
        "platform": platform_facts(reader, km),
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
                if got["note"]:
                    reasons.append(got["note"])
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

    if km["loaded"] is not False:
        facts["kernel_log"] = collect_kernel_log(reader)
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
    "FABRIC_HEALTH_MASK",
    "FABRIC_HEALTH_SUMMARY",
    "FABRIC_STATES",
    "NVML_ERROR_STATUS",
    "SMI_FABRIC_HEALTH_FIELDS",
    "SMI_FABRIC_STATES",
    "SMI_QUERY_FIELDS",
    "apply_smi_fabric",
    "apply_smi_q",
    "classify_driver_platform",
    "classify_smi_failure",
    "clock_event_name",
    "clock_events_from_mask",
    "collect_driver",
    "collect_kernel_log",
    "collect_nvml",
    "collect_smi",
    "cuda_version_from_int",
    "decode_fabric_health",
    "fabric_status_name",
    "kernel_module_facts",
    "load_pynvml",
    "normalize_bus_id",
    "nvml_error_status",
    "nvml_health",
    "parse_fabric_health",
    "parse_nv_tegra_release",
    "parse_proc_modules",
    "parse_proc_version",
    "parse_smi_csv",
    "parse_smi_q_blocks",
    "parse_smi_q_cuda",
    "parse_smi_q_ecc",
    "parse_smi_q_fabric",
    "parse_smi_q_pcie",
    "parse_smi_q_processes",
    "parse_smi_q_remapped",
    "parse_smi_q_throttle",
    "parse_xid_lines",
    "platform_facts",
    "smi_q_health",
    "strip_annotation",
]
