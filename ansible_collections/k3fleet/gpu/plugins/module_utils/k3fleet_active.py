# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Active checks of ``audit --active LEVEL``: DCGM's diagnostic, NCCL all-reduce, ib_write_bw per rail,
and (``full``, a second play) all_reduce_perf across a pair of nodes through the target's launcher.

They load the GPUs and the HCAs, so they never run on a node whose GPUs another process holds (the
driver facts' compute processes and memory in use, as ``gpu.in_use`` reads them): the section then
says why it was skipped. Each tool runs under its own timeout from the target file; a tool that is
not installed is reported as such, which the verdict reads as unknown, never as a pass
(docs/facts.md section 17). Parsers read the tools' text output as their documentation and public
runs show it (k3fleet/lab/active_data/SOURCES.md).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import CommandResult, NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    IB_WRITE_BW_PORT,
    all_reduce_perf_argv,
    dcgmi_diag_argv,
    ib_write_bw_argv,
    nccl_pair_argv,
)

_SECTION = re.compile(r"^[|+]-{3,}\s+([A-Za-z][A-Za-z /]*?)\s+-{2,}")
_RESULT = re.compile(r"^(Pass|Fail|Warn|Skip)(?:\s*-\s*(?:GPUs?:\s*)?([\d, ]+|All))?\s*$", re.IGNORECASE)
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+(-?\d+\s+)?([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+"
                  r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s*$")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)")
_RANK = re.compile(r"^#?\s*Rank\s+\d+\s")
_IB_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(Gb|MB)/sec\]\s+BW average\[(?:Gb|MB)/sec\]")
# Loopback on one device takes a few seconds; the server waits this long for its client.
IB_SERVER_HEAD_START = 1.0


# -- dcgmi diag -------------------------------------------------------------------------------


def parse_dcgmi_diag(text: str | None) -> dict[str, Any]:
    """``dcgmi diag -r N`` table (or its ``-j`` JSON) -> ``{"metadata", "tests": [...], "result"}``.

    Each test: section, name, result (pass / fail / warn / skip, the worst of its lines),
    ``failed_gpus`` and the Warning / Info lines after it. ``result`` None: no test was read.
    """
    start = (text or "").lstrip()
    if start.startswith("{"):
        try:
            data = json.loads(start)
        except ValueError:
            data = None
        if isinstance(data, dict):
            return parse_dcgmi_diag_json(data)
    section = None
    metadata: dict[str, str] = {}
    tests: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        head = _SECTION.match(line)
        if head:
            section = head.group(1).strip()
            current = None
            continue
        if not line.startswith("|") or "====" in line:
            continue
        raw_cells = line.strip("|").split("|")
        cells = [c.strip() for c in raw_cells]
        if len(cells) != 2:
            continue
        name, value = cells
        # dcgmi wraps a long text at the column's width, mid-word: a segment that fills the column
        # continues on the next line without a space.
        width = len(raw_cells[1]) - 3
        if name == "Diagnostic" and value == "Result":
            continue
        if section == "Metadata":
            metadata[name] = value
            continue
        if name in ("Info", "Warning", "Error"):
            if current is not None:
                current["details"].append({"kind": name.lower(), "text": value, "full": len(value) >= width})
            continue
        result = _RESULT.match(value)
        if name == "" and current is not None:
            if result:
                _add_result(current, result)
            elif current["details"]:
                last = current["details"][-1]
                last["text"] += value if last.pop("full", False) else " " + value
                last["full"] = len(value) >= width
            continue
        if result and name:
            current = {"section": section, "name": name, "results": [], "failed_gpus": [], "details": []}
            tests.append(current)
            _add_result(current, result)
    for t in tests:
        words = [pair[0] for pair in t.pop("results")]
        t["result"] = next((w for w in ("fail", "warn", "pass", "skip") if w in words), None)
        for d in t["details"]:
            d.pop("full", None)
            d["text"] = " ".join(d["text"].split())[:400]
    overall = None
    if tests:
        words = [t["result"] for t in tests]
        overall = "fail" if "fail" in words else ("warn" if "warn" in words else "pass")
    return {"metadata": metadata, "tests": tests, "result": overall, "format": "table" if tests else None}


_JSON_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip",
                "skipped": "skip", "not run": "skip"}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_dcgmi_diag_json(data: dict[str, Any]) -> dict[str, Any]:
    """``dcgmi diag -j`` (DCGM 3.x "DCGM GPU Diagnostic", 4.x "DCGM Diagnostic": test_categories > tests >
    results per entity, each with its warnings' ``error_id``, ``error_severity``, ``error_category``) in
    the shape of :func:`parse_dcgmi_diag`, each test with its ``codes``."""
    root = data.get("DCGM Diagnostic") or data.get("DCGM GPU Diagnostic") or {}
    metadata = {str(k): str(v) for k, v in (data.get("metadata") or {}).items() if not isinstance(v, (dict, list))}
    tests: list[dict[str, Any]] = []
    for cat in root.get("test_categories") or []:
        for test in cat.get("tests") or []:
            t: dict[str, Any] = {"section": cat.get("category"), "name": str(test.get("name") or "?"),
                                 "result": None, "failed_gpus": [], "details": [], "codes": []}
            words: list[str] = []
            for res in test.get("results") or []:
                word = _JSON_STATUS.get(str(res.get("status") or "").strip().lower())
                gpu = _int(res.get("entity_id", res.get("gpu_id")))
                if word:
                    words.append(word)
                if word == "fail" and gpu is not None and (res.get("entity_group") in (None, "GPU")):
                    t["failed_gpus"].append(gpu)
                for w in res.get("warnings") or []:
                    error_id = w.get("error_id")
                    if isinstance(error_id, dict):  # DCGM 3.x: {"code", "field_id"}
                        error_id = error_id.get("code")
                    text = " ".join(str(w.get("warning") or "").split())[:400]
                    t["details"].append({"kind": "warning", "text": text})
                    code = {"id": _int(error_id), "severity": _int(w.get("error_severity")),
                            "category": _int(w.get("error_category")), "gpu": gpu}
                    if code["id"] is not None:
                        t["codes"].append(code)
                for i in res.get("info") or []:
                    t["details"].append({"kind": "info", "text": " ".join(str(i).split())[:400]})
            summary = _JSON_STATUS.get(str((test.get("test_summary") or {}).get("status") or "").strip().lower())
            t["result"] = summary or next((w for w in ("fail", "warn", "pass", "skip") if w in words), None)
            tests.append(t)
    overall = None
    if tests:
        words = [t["result"] for t in tests]
        overall = "fail" if "fail" in words else ("warn" if "warn" in words else "pass")
    out = {"metadata": metadata, "tests": tests, "result": overall, "format": "json"}
    if root.get("runtime_error") or data.get("runtime_error"):
        out["runtime_error"] = str(root.get("runtime_error") or data.get("runtime_error"))[:400]
    return out


def _add_result(test: dict[str, Any], match: re.Match[str]) -> None:
    word = match.group(1).lower()
    test["results"].append((word, match.group(2)))
    if word == "fail" and match.group(2) and match.group(2).strip().lower() != "all":
        test["failed_gpus"].extend(int(x) for x in re.findall(r"\d+", match.group(2)))


# -- nccl-tests ----------------------------------------------------------------------------------


# -- the NCCL transport (NCCL_DEBUG=INFO lines; docs/facts.md section 6) -------------------------------------

# The environment the NCCL runs get: INFO lines name the network, the channels' transports and NVLS.
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

_NET_USING = re.compile(r"Using network (\S+)")
_NET_IB_USING = re.compile(r"NET/IB : Using (.*?)\s*(?:\[RO\])?\s*;\s*OOB")
_NET_SOCKET_USING = re.compile(r"NET/Socket : Using")
_IB_NO_DEVICE = re.compile(r"NET/IB : No device found")
_IB_HCA = re.compile(r"NCCL_IB_HCA set (?:by environment )?to (\S+)")
_GDR = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for (?:GPU \S+ / )?HCA (\d+) '([^']+)'")
_DMABUF = re.compile(r"DMA-BUF is available on GPU device")
_VIA = re.compile(r"\bvia (P2P/[\w ]+|NET/\w+|SHM|NVLS|CollNet\w*)(?:/[\w ]+)*\s*$")
_NVLS = re.compile(r"NVLS multicast support is (not )?available")
_MNNVL = re.compile(r"MNNVL busId \S+ fabric UUID (\S+) cliqueId (\S+) state (\d+)")


def parse_nccl_transport(text: str | None) -> dict[str, Any] | None:
    """What NCCL_DEBUG=INFO says about the transport of a run: ``{"network", "ib_devices", "ib_no_device",
    "ib_hca", "gdr_enabled", "gdr_disabled", "dmabuf", "channels", "nvls", "mnnvl_uuid"}``; None when the
    text has no NCCL INFO line at all (NCCL_DEBUG was not honoured)."""
    out: dict[str, Any] = {"network": None, "ib_devices": None, "ib_no_device": False, "socket": False,
                           "ib_hca": None, "gdr_enabled": [], "gdr_disabled": [], "dmabuf": False, "channels": {},
                           "nvls": None, "mnnvl_uuid": None}
    seen = False
    for line in (text or "").splitlines():
        if "NCCL INFO" not in line and "NET/" not in line and "NVLS" not in line and "MNNVL" not in line \
                and "Using network" not in line:
            continue
        seen = True
        m = _NET_USING.search(line)
        if m:
            out["network"] = m.group(1)
        m = _NET_IB_USING.search(line)
        if m:
            out["ib_devices"] = m.group(1).strip()
        if _IB_NO_DEVICE.search(line):
            out["ib_no_device"] = True
        if _NET_SOCKET_USING.search(line):
            out["socket"] = True
        m = _IB_HCA.search(line)
        if m:
            out["ib_hca"] = m.group(1)
        m = _GDR.search(line)
        if m:
            bucket = out["gdr_enabled"] if m.group(1) == "Enabled" else out["gdr_disabled"]
            if m.group(3) not in bucket:
                bucket.append(m.group(3))
        if _DMABUF.search(line):
            out["dmabuf"] = True
        m = _VIA.search(line)
        if m:
            kind = m.group(1).strip()
            out["channels"][kind] = out["channels"].get(kind, 0) + 1
        m = _NVLS.search(line)
        if m:
            available = m.group(1) is None
            out["nvls"] = available if out["nvls"] is None else (out["nvls"] and available)
        m = _MNNVL.search(line)
        if m:
            out["mnnvl_uuid"] = m.group(1)
    informative = (out["network"] or out["ib_devices"] or out["ib_no_device"] or out["socket"] or out["ib_hca"]
                   or out["gdr_enabled"] or out["gdr_disabled"] or out["dmabuf"] or out["channels"]
                   or out["nvls"] is not None or out["mnnvl_uuid"])
    if not seen or not informative:
        return None
    if out["network"] is None:
        # Older NCCL prints no "Using network": the channels' NET transport, else what NET/IB found.
        nets = [k.split("/", 1)[1] for k in out["channels"] if k.startswith("NET/")]
        if nets:
            out["network"] = nets[0]
        elif out["ib_devices"]:
            out["network"] = "IB"
        elif out["socket"] and out["ib_no_device"]:
            out["network"] = "Socket"
    return out


def parse_all_reduce_perf(text: str | None) -> dict[str, Any]:
    """``all_reduce_perf`` -> ranks, per-size rows, the peak busbw at the largest size, the average line.

    ``peak_busbw_gbs`` is the larger of out-of-place and in-place busbw of the largest message (the
    figure bandwidth floors are for; the average line spreads over every small size too).
    """
    rows: list[dict[str, Any]] = []
    ranks = 0
    wrong = 0
    for line in (text or "").splitlines():
        if _RANK.match(line.strip()):
            ranks += 1
            continue
        m = _ROW.match(line)
        if not m:
            continue
        size = int(m.group(1))
        row = {"size": size, "busbw_oop": float(m.group(6)), "busbw_ip": float(m.group(10))}
        for w in (m.group(7), m.group(11)):
            if w.isdigit():
                wrong += int(w)
        rows.append(row)
    avg = _AVG.search(text or "")
    oob = _OOB.search(text or "")
    top = max(rows, key=lambda r: r["size"]) if rows else None
    return {
        "ranks": ranks or None, "sizes": len(rows), "wrong": wrong,
        "max_bytes": top["size"] if top else None,
        "peak_busbw_gbs": max(top["busbw_oop"], top["busbw_ip"]) if top else None,
        "avg_busbw_gbs": float(avg.group(1)) if avg else None,
        "out_of_bounds": int(oob.group(1)) if oob else None,
        "transport": parse_nccl_transport(text),
    }


# -- perftest ------------------------------------------------------------------------------------


def parse_ib_write_bw(text: str | None) -> dict[str, Any]:
    """``ib_write_bw`` -> the average and peak of its largest message size in Gb/s (MB/sec converted)."""
    unit = None
    best = None
    for line in (text or "").splitlines():
        head = _IB_HEADER.search(line)
        if head:
            unit = head.group(1)
            continue
        if unit is None:
            continue
        parts = line.split()
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            try:
                peak, avg = float(parts[2]), float(parts[3])
            except ValueError:
                continue
            if best is None or int(parts[0]) >= best[0]:
                best = (int(parts[0]), peak, avg)
    if best is None:
        return {"bytes": None, "bw_avg_gbps": None, "bw_peak_gbps": None}
    factor = 1.0 if unit == "Gb" else 8.0 / 1000.0
    return {"bytes": best[0], "bw_avg_gbps": round(best[2] * factor, 3), "bw_peak_gbps": round(best[1] * factor, 3)}


# -- collector -----------------------------------------------------------------------------------


def gpus_busy(driver: dict[str, Any] | None, util: float) -> str | None:
    """Why the GPUs count as in use (compute processes, memory held), or None when they are free."""
    gpus = (driver or {}).get("gpus") or []
    if not gpus:
        return "no GPUs were read"
    busy = []
    for g in gpus:
        procs = g.get("processes")
        used, total = g.get("memory_used_mib"), g.get("memory_total_mib")
        if procs is None and used is None:
            return "the GPUs' use could not be read"
        compute = any(p.get("type") is None or "C" in (p.get("type") or "") for p in procs or [])
        short = used is not None and total and total - used < util * total
        if compute or short:
            busy.append(str(g.get("index")))
    if busy:
        return "GPU %s in use (gpu.in_use): active checks never run on a serving node" % ",".join(busy)
    return None


# The lines of an NCCL run that decide its result (the change night's verify quotes them when it fails):
# NCCL's warnings and errors, the out-of-bounds and average lines, and the network it chose.
_DECISIVE = re.compile(r"NCCL WARN|[Ee]rror|ERROR|Out of bounds|Avg bus bandwidth|Using network|NET/Socket")
MAX_DECISIVE_LINES = 12


def log_lines(stdout: str | None, stderr: str | None, keep: int) -> dict[str, list[str]] | None:
    """``{"decisive": [...], "tail": [...]}``: the deciding lines (at most MAX_DECISIVE_LINES) and the last
    ``keep`` lines of the output, each at most 300 characters; None when ``keep`` is 0."""
    if not keep:
        return None
    lines = [ln.rstrip()[:300] for ln in ((stdout or "") + "\n" + (stderr or "")).splitlines() if ln.strip()]
    return {"decisive": [ln for ln in lines if _DECISIVE.search(ln)][:MAX_DECISIVE_LINES],
            "tail": lines[-int(keep):]}


def _tool(reader: NodeReader, argv: Sequence[str], timeout: float, parse: Callable[[str], Mapping[str, Any]],
          env: Mapping[str, str] | None = None, keep: int = 0) -> dict[str, Any]:
    if reader.which(argv[0]) is None:
        return {"ran": False, "reason": "%s: command not found" % argv[0]}
    res = reader.run(argv, timeout=timeout, env=env)
    out: dict[str, Any] = {"ran": True, "rc": res.rc, "error": res.error, "duration_s": round(res.duration, 1)}
    if keep:
        out["log"] = log_lines(res.stdout, res.stderr, keep)
    if res.error:
        out["reason"] = res.reason()
        return out
    out.update(parse(res.stdout))
    if res.rc != 0:
        out["reason"] = res.reason()
    return out


def _rails(rdma: dict[str, Any] | None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for dev in (rdma or {}).get("devices") or []:
        for port in dev.get("ports") or []:
            found.append({"device": dev.get("name"), "port": port.get("port"), "state": port.get("state"),
                          "rate_gbps": port.get("rate_gbps")})
    return found


def _ib_loopback(reader: NodeReader, device: str, port: int, timeout: float) -> dict[str, Any]:
    """Server and client of ``ib_write_bw`` on one device (loopback through the HCA)."""
    argv = ib_write_bw_argv(device, port)
    if reader.which(argv[0]) is None:
        return {"ran": False, "reason": "%s: command not found" % argv[0]}
    server: list[CommandResult] = []
    thread = threading.Thread(target=lambda: server.append(reader.run(argv, timeout=timeout)))
    thread.daemon = True
    thread.start()
    time.sleep(IB_SERVER_HEAD_START)
    out = _tool(reader, argv + ["127.0.0.1"], timeout, parse_ib_write_bw)
    thread.join(timeout + 5)
    if server and server[0].error and "reason" not in out:
        out["reason"] = "server: " + server[0].reason()
    return out


def collect_active(reader: NodeReader, level: str, spec: dict[str, Any], driver: dict[str, Any] | None,
                   rdma: dict[str, Any] | None, scheduler: dict[str, Any] | None = None) -> dict[str, Any]:
    """ActiveFacts for ``level`` (quick, full) with the controller's ``spec`` (levels, timeouts)."""
    out: dict[str, Any] = {"status": "ok", "reason": None, "level": level, "skipped": None, "dcgm": None,
                           "nccl": None, "ib_write_bw": []}
    why = gpus_busy(driver, float(spec.get("gpu_util", 0.9)))
    jobs = (scheduler or {}).get("jobs_running") if isinstance(scheduler, dict) else None
    if why is None and jobs:
        # A job the scheduler placed may not hold the GPUs yet; loading the node would still hurt it.
        why = "%s scheduler job(s) running on the node: active checks never run on a serving node" % jobs
    if why:
        out["skipped"] = why
        return out
    dlevel = int(spec["dcgm_level"][level])
    # -j: the failure codes; --expectedNumEntities: a GPU missing from DCGM's view fails the diagnostic.
    gpus = len((driver or {}).get("gpus") or []) or None
    out["dcgm"] = _tool(reader, dcgmi_diag_argv(dlevel, gpus),
                        float(spec["dcgm_timeout_s"][level]), parse_dcgmi_diag)
    out["dcgm"]["level"] = dlevel
    if level != "full":
        return out
    count = len((driver or {}).get("gpus") or [])
    out["nccl"] = _tool(reader, all_reduce_perf_argv(count, spec["nccl_max_bytes"]), float(spec["nccl_timeout_s"]),
                        parse_all_reduce_perf, env=NCCL_DEBUG_ENV)
    out["nccl"]["gpus"] = count
    for offset, rail in enumerate(r for r in _rails(rdma) if r["state"] == "ACTIVE"):
        result = _ib_loopback(reader, rail["device"], IB_WRITE_BW_PORT + offset, float(spec["ib_write_bw_timeout_s"]))
        result.update(rail)
        out["ib_write_bw"].append(result)
    return out


# -- between two nodes -------------------------------------------------------------------------

# A host name or IPv4 address as the launcher's host list takes it (``a:8,b:8``): nothing that
# would split or extend the list.
_ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def collect_node(reader: NodeReader, gpus: object, spec: dict[str, Any], keep: int = 0) -> dict[str, Any]:
    """all_reduce_perf within this node over its ``gpus`` GPUs (one process, ``-g gpus``) under the NCCL
    timeout, as the audit's full level runs it; with ``keep``, the deciding lines and the output's tail.

    An all_reduce_perf that is not installed is reported (``ran`` False) and never run."""
    if not isinstance(gpus, int) or gpus < 1:
        return {"ran": False, "reason": "the node's GPU count is unknown (%r)" % (gpus,), "gpus": gpus}
    out = _tool(reader, all_reduce_perf_argv(gpus, spec["nccl_max_bytes"]), float(spec["nccl_timeout_s"]),
                parse_all_reduce_perf, env=NCCL_DEBUG_ENV, keep=keep)
    out["gpus"] = gpus
    return out


def collect_pair(reader: NodeReader, addresses: Sequence[str] | None, gpus: object, spec: dict[str, Any],
                 keep: int = 0) -> dict[str, Any]:
    """all_reduce_perf over ``addresses`` (this node first, then its partner), ``gpus`` ranks on each,
    launched by the target's ``nccl_pair_launcher`` (mpirun) under the NCCL timeout.

    A launcher or all_reduce_perf that is not installed here is reported (``ran`` False) and never
    run; the partner's side fails inside the launcher, which the result's ``reason`` carries.
    """
    out: dict[str, Any] = {"ran": False, "reason": None, "addresses": list(addresses or []), "gpus": gpus}
    bad = [a for a in out["addresses"] if not _ADDRESS.match(str(a))]
    if len(out["addresses"]) != 2 or bad:
        out["reason"] = "a pair is two host names, got %s" % ", ".join(repr(a) for a in out["addresses"])
        return out
    if not isinstance(gpus, int) or gpus < 1:
        out["reason"] = "the GPUs per host are unknown (%r)" % (gpus,)
        return out
    argv = nccl_pair_argv(spec["nccl_pair_launcher"], out["addresses"], gpus, spec["nccl_max_bytes"])
    for tool in (argv[0], "all_reduce_perf"):
        if reader.which(tool) is None:
            out["reason"] = "%s: command not found" % tool
            return out
    # The launching node's ranks inherit NCCL_DEBUG=INFO: their lines name the network the pair used.
    result = _tool(reader, argv, float(spec["nccl_timeout_s"]), parse_all_reduce_perf, env=NCCL_DEBUG_ENV,
                   keep=keep)
    result.update({"addresses": out["addresses"], "gpus": gpus})
    return result
