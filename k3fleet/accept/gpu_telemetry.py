"""GPU telemetry while a probe runs: a DCGM exporter's ``/metrics`` page read per GPU.

The common production source is NVIDIA's ``dcgm-exporter`` (port 9400, ``/metrics``): per GPU, framebuffer
memory used and free (``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_FB_FREE``, MiB), power
(``DCGM_FI_DEV_POWER_USAGE``, W) and utilisation (``DCGM_FI_DEV_GPU_UTIL``, percent; an exporter running
the profiling counter set may expose ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, a ratio, instead). Series of a
MIG instance (``GPU_I_ID``) are not the whole GPU's and are skipped. A GPU is named by its ``Hostname``
(when labelled) and ``gpu`` index. Names, units and the fixture's source: docs/acceptance-load.md
"GPU telemetry". The lab's simulator serves the same names at ``/dcgm/metrics``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from k3fleet.accept.metrics import MetricsSnapshot

# Reading -> the DCGM field the exporter names it by.
FIELDS = {"used_mib": "DCGM_FI_DEV_FB_USED", "free_mib": "DCGM_FI_DEV_FB_FREE",
          "power_w": "DCGM_FI_DEV_POWER_USAGE", "util_pct": "DCGM_FI_DEV_GPU_UTIL"}
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
READINGS = tuple(FIELDS)


def gpu_key(labels: Mapping[str, str]) -> str | None:
    gpu = labels.get("gpu")
    if gpu is None:
        return None
    host = labels.get("Hostname") or labels.get("hostname")
    return f"{host}/{gpu}" if host else str(gpu)


def gpus_of(snap: MetricsSnapshot) -> dict[str, dict[str, float]]:
    """Per GPU (``host/index`` or ``index``), the readings the page has: ``used_mib``, ``free_mib``,
    ``power_w``, ``util_pct``. Empty when the page has no DCGM GPU series."""
    out: dict[str, dict[str, float]] = {}

    def take(name: str, reading: str, scale: float = 1.0) -> None:
        for labels, value in snap.series(name):
            key = gpu_key(labels)
            if key is None or "GPU_I_ID" in labels or value != value:  # a MIG instance, or NaN
                continue
            out.setdefault(key, {})[reading] = round(value * scale, 3)

    for reading, name in FIELDS.items():
        take(name, reading)
    for labels, value in snap.series(GR_ENGINE_ACTIVE):
        key = gpu_key(labels)
        if key is not None and "GPU_I_ID" not in labels and value == value and "util_pct" not in out.get(key, {}):
            out.setdefault(key, {})["util_pct"] = round(value * 100.0, 3)
    return out


def phase_curves(samples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[list[float | None]]]]:
    """The GPU samples of a run as one curve per phase and GPU: rows of ``[t_s, used_mib, free_mib, power_w,
    util_pct]`` (``None`` where the exporter had no such reading)."""
    out: dict[str, dict[str, list[list[float | None]]]] = {}
    for s in samples:
        gpus = s.get("gpus")
        if not isinstance(gpus, Mapping):
            continue
        phase = str(s.get("phase") or "idle")
        for key, r in gpus.items():
            out.setdefault(phase, {}).setdefault(str(key), []).append(
                [s.get("t_s"), *(r.get(k) for k in READINGS)])
    return out


def peaks(curves: Mapping[str, Mapping[str, Sequence[Sequence[float | None]]]]) -> dict[str, dict[str, Any]]:
    """Per phase: each GPU's highest memory used and power, and its lowest free memory."""
    out: dict[str, dict[str, Any]] = {}
    for phase, gpus in curves.items():
        row: dict[str, Any] = {}
        for key, points in gpus.items():
            used = [p[1] for p in points if p[1] is not None]
            free = [p[2] for p in points if p[2] is not None]
            power = [p[3] for p in points if p[3] is not None]
            row[key] = {"used_mib_max": max(used) if used else None, "free_mib_min": min(free) if free else None,
                        "power_w_max": max(power) if power else None}
        out[phase] = row
    return out
