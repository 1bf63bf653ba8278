# Stdlib only: shipped to nodes inside AnsiballZ.
"""What the driver collector and both GPU sources (NVML and nvidia-smi) share: N/A values, PCI bus
ids, status texts in snake_case, GPU index ranges in notes, the version pattern.

A module_util of its own so that a node compiles only the GPU source it asks: collect_driver
imports k3fleet_nvml when pynvml imports and k3fleet_smi when NVML did not answer.
"""

from __future__ import annotations

import re
from typing import Any

VERSION_RE = re.compile(r"(?<![\w.])(\d+\.\d+(?:\.\d+)*)(?![\w.])")

# What nvidia-smi prints where a value is missing, lower-cased.
NA_VALUES = ("", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]",
             "[insufficient permissions]", "[gpu is lost]")


def is_na(value: str) -> bool:
    return value.strip().lower() in NA_VALUES


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
    if text is None or is_na(text):
        return None
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_") or None


def index_ranges(indices: list[Any]) -> str:
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


def gpu_notes(prefix: str, why: dict[str, list[Any]]) -> str | None:
    if not why:
        return None
    return prefix + "; ".join(f"GPU {index_ranges(indices)}: {note}" for note, indices in why.items())
