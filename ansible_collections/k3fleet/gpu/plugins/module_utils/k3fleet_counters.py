# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes inside AnsiballZ. pynvml is optional and imported lazily.
"""Error counters sampled twice within one module visit, so the verdict judges their rate, not a total.

A total says what happened since the driver loaded or the port came up, possibly months ago; two samples
within one visit say what is happening now (docs/facts.md section 14). ``sample_counters`` reads, in one
go: the InfiniBand port counters in sysfs (symbol errors, link downed, receive errors, link error
recovery, buffer overruns), each GPU's NVLink error counters per link and its PCIe replay counter through
NVML, else the NVLink counters from ``nvidia-smi nvlink -e``. ``counter_facts`` turns a first and a second
sample into the driver and RDMA sections' ``counters``: per counter [first, second], and the whole
seconds between them.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

# /sys/class/infiniband/<dev>/ports/<n>/counters/<name> (the kernel's ib sysfs; docs/facts.md section 14).
IB_COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery",
               "excessive_buffer_overrun_errors")

# nvidia-smi nvlink -e: "Link 0: Replay Errors: 0" (stas00/ml-engineering debug.md, an H100).
_NVLINK_E_GPU_RE = re.compile(r"^GPU (\d+): ")
_NVLINK_E_RE = re.compile(r"^\s+Link (\d+): ([A-Za-z ]+?) Errors?: (\d+)\s*$")
_NVLINK_E_NAMES = {"replay": "replay", "recovery": "recovery", "crc": "crc", "crc flit": "crc_flit",
                   "crc data": "crc_data"}


def read_ib_counters(reader: NodeReader) -> dict[str, dict[str, int]]:
    """``{"mlx5_0/1": {counter: int}}`` for every port of every RDMA device; a counter that cannot be read
    is left out (older kernels lack some)."""
    out = {}
    ib_dir = FILES["infiniband_dir"]
    for dev in reader.listdir(ib_dir) or []:
        ports_dir = "%s/%s/ports" % (ib_dir, dev)
        for port in reader.listdir(ports_dir) or []:
            if not port.isdigit():
                continue
            values = {}
            for name in IB_COUNTERS:
                text = reader.read("%s/%s/counters/%s" % (ports_dir, port, name), limit=64)
                if text is not None and text.strip().isdigit():
                    values[name] = int(text.strip())
            if values:
                out["%s/%s" % (dev, port)] = values
    return out


def parse_nvlink_errors(text: str | None) -> dict[int, dict[str, dict[str, int]]]:
    """``nvidia-smi nvlink -e``: ``{gpu index: {link: {counter: int}}}``; nothing printed (a GPU without
    NVLink) is ``{}``."""
    out: dict[int, dict[str, dict[str, int]]] = {}
    current = None
    for line in (text or "").splitlines():
        gpu = _NVLINK_E_GPU_RE.match(line)
        if gpu:
            current = out.setdefault(int(gpu.group(1)), {})
            continue
        match = _NVLINK_E_RE.match(line)
        if match and current is not None:
            name = _NVLINK_E_NAMES.get(match.group(2).strip().lower())
            if name:
                current.setdefault(str(int(match.group(1))), {})[name] = int(match.group(3))
    return out


def _nvml_gpu_counters(nv: Any, handle: Any) -> dict[str, Any]:
    from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_nvml import nvml_nvlink

    out = {"pcie_replay": None, "nvlink": nvml_nvlink(nv, handle)["errors"]}
    getter = getattr(nv, "nvmlDeviceGetPcieReplayCounter", None)
    if getter is not None:
        # Not supported here: the replay rate stays unknown.
        with contextlib.suppress(nv.NVMLError):
            out["pcie_replay"] = int(getter(handle))
    return out


def read_gpu_counters(reader: NodeReader, use_nvml: bool = True
                      ) -> tuple[dict[int, dict[str, Any]] | None, str | None, str | None]:
    """``({gpu index: {"pcie_replay", "nvlink"}}, source, reason)`` through NVML, else ``nvidia-smi nvlink
    -e`` (NVLink only: the PCIe replay counter is then read once, from ``-q``)."""
    reasons = []
    if use_nvml:
        from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import load_nvml

        nv, _bindings, problem = load_nvml()
        if nv is not None:
            try:
                nv.nvmlInit()
            except Exception as exc:  # any NVML failure here only loses the sample
                reasons.append("NVML: %s" % exc)
            else:
                try:
                    return {i: _nvml_gpu_counters(nv, nv.nvmlDeviceGetHandleByIndex(i))
                            for i in range(int(nv.nvmlDeviceGetCount()))}, "nvml", None
                except Exception as exc:  # a lost GPU or bindings disagreement: the sample is unknown
                    reasons.append("NVML: %s: %s" % (type(exc).__name__, exc))
                finally:
                    # Nothing is left to report after a failed shutdown.
                    with contextlib.suppress(Exception):
                        nv.nvmlShutdown()
        else:
            reasons.append("NVML: %s" % problem)
    res = reader.run(COMMANDS["nvidia_smi_nvlink_errors"])
    if not res.ok:
        reasons.append(res.reason())
        return None, None, "; ".join(reasons)
    parsed = parse_nvlink_errors(res.stdout)
    return {i: {"pcie_replay": None, "nvlink": links} for i, links in parsed.items()}, "nvidia-smi", None


def sample_counters(reader: NodeReader, use_nvml: bool = True, rdma: bool = True) -> dict[str, Any]:
    """One sample of every counter the node has: ``{"at", "ib", "gpus", "gpu_source", "gpu_reason"}``."""
    gpus, source, reason = read_gpu_counters(reader, use_nvml=use_nvml)
    return {"at": time.time(), "ib": read_ib_counters(reader) if rdma else {}, "gpus": gpus,
            "gpu_source": source, "gpu_reason": reason}


def _pairs(first: dict[str, int], second: dict[str, int]) -> dict[str, list[int]]:
    """{name: [first, second]} for the counters both samples read."""
    return {name: [first[name], second[name]] for name in sorted(first) if name in second}


def counter_facts(first: dict[str, Any], second: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(driver counters, rdma counters)`` from two samples; ``interval_s`` is whole seconds, rounded up,
    so hosts of one kind audited together share it."""
    interval = max(1, math.ceil(second["at"] - first["at"]))
    ports = {}
    for port, values in sorted(second["ib"].items()):
        if port in first["ib"]:
            ports[port] = _pairs(first["ib"][port], values)
    rdma = {"interval_s": interval, "ports": ports}
    gpus = {}
    reason = second["gpu_reason"] or first["gpu_reason"]
    if first["gpus"] is not None and second["gpus"] is not None and first["gpu_source"] == second["gpu_source"]:
        for index, now in sorted(second["gpus"].items()):
            before = first["gpus"].get(index)
            if before is None:
                continue
            entry: dict[str, Any] = {"pcie_replay": None, "nvlink": {}}
            if before["pcie_replay"] is not None and now["pcie_replay"] is not None:
                entry["pcie_replay"] = [before["pcie_replay"], now["pcie_replay"]]
            for link, values in sorted(now["nvlink"].items(), key=lambda kv: int(kv[0])):
                if link in before["nvlink"]:
                    entry["nvlink"][link] = _pairs(before["nvlink"][link], values)
            gpus[str(index)] = entry
    elif reason is None:
        reason = "the two samples came from different sources"
    driver = {"interval_s": interval, "source": second["gpu_source"], "reason": reason, "gpus": gpus}
    return driver, rdma
