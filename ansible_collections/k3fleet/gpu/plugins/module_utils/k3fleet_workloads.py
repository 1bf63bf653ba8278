# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Other tenants' CUDA work on a node: the containers and processes using its GPUs.

Before a driver change the question is whether the CUDA work already on the node keeps working
on the new branch (docs/facts.md section 16). This reads, in the same module call as every other
collector: the running containers (``<runtime> ps`` and one ``inspect`` of all of them) with the
CUDA their environment asks for (``CUDA_VERSION``, ``NVIDIA_REQUIRE_CUDA``), the forward-
compatibility package NVIDIA's images carry (``NV_CUDA_COMPAT_PACKAGE``) and whether a compat
directory is on their library path; NVML's compute processes (already in the driver facts) with
the container each one runs in (its cgroup) and the libcuda / libcudart it loaded (its memory map);
and the host's ``cuda-compat-*`` packages (already in the package facts). Nothing is started.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    PROC_PID_FILES,
    container_inspect_argv,
    container_ps_argv,
)

_ID = re.compile(r"^[0-9a-f]{12,64}$")
# A container's id in a cgroup path: docker-<id>.scope, libpod-<id>.scope, /docker/<id>, cri-containerd-<id>.
_CGROUP_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")
# "/usr/local/cuda-12.9/compat/libcuda.so.575.57.08", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
_LIBCUDA = re.compile(r"(/\S*/libcuda\.so\.(\d{3}\.\d+(?:\.\d+)?))$")
_LIBCUDART = re.compile(r"/\S*/libcudart\.so\.(\d+\.\d+(?:\.\d+)?)$")
_COMPAT_DIR = re.compile(r"(?:^|:)([^:]*/compat)/?(?::|$)")
_NOT_GPU = ("", "void", "none")
MAX_PROCESSES = 256


def parse_container_ids(text: str | None) -> list[str]:
    """``ps --quiet --no-trunc`` -> the ids, in order, without repeats; lines that are no id are skipped."""
    seen: list[str] = []
    for line in (text or "").splitlines():
        word = line.strip().lower()
        if _ID.match(word) and word not in seen:
            seen.append(word)
    return seen


def _env(config: object) -> dict[str, str]:
    env: dict[str, str] = {}
    listed = config.get("Env") if isinstance(config, dict) else None
    for item in listed if isinstance(listed, list) else []:
        if isinstance(item, str) and "=" in item:
            key, _sep, value = item.partition("=")
            env[key] = value
    return env


def _uses_gpu(host_config: object, env: dict[str, str]) -> bool | None:
    """Whether the runtime gives the container GPUs, or None when its configuration does not say."""
    hc: dict[str, Any] = host_config if isinstance(host_config, dict) else {}
    for req in hc.get("DeviceRequests") or []:
        if not isinstance(req, dict):
            continue
        caps = req.get("Capabilities") or []
        flat = [c for group in caps if isinstance(group, list) for c in group]
        if req.get("Driver") == "nvidia" or "gpu" in flat:
            return True
    for dev in hc.get("Devices") or []:
        if isinstance(dev, dict) and "nvidia" in "%s %s" % (dev.get("PathOnHost"), dev.get("PathInContainer")):
            return True
        if isinstance(dev, str) and "nvidia" in dev:
            return True
    if hc.get("Runtime") == "nvidia" and env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower() not in _NOT_GPU:
        return True
    if "Runtime" in hc or "DeviceRequests" in hc:
        return False
    return None


def parse_containers_inspect(text: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """``<runtime> container inspect ID...`` -> ``(containers, problem)``; ``problem`` None when read."""
    try:
        data = json.loads(text or "")
    except ValueError as exc:
        return [], "container inspect: output is not JSON (%s)" % exc
    if not isinstance(data, list):
        return [], "container inspect: expected a JSON list, got %s" % type(data).__name__
    out: list[dict[str, Any]] = []
    for item in data:
        if not isinstance(item, dict):
            continue
        raw_config, raw_state = item.get("Config"), item.get("State")
        config: dict[str, Any] = raw_config if isinstance(raw_config, dict) else {}
        env = _env(config)
        state: dict[str, Any] = raw_state if isinstance(raw_state, dict) else {}
        pid = state.get("Pid")
        ident = item.get("Id") or item.get("ID")
        name = item.get("Name")
        image = config.get("Image") if isinstance(config.get("Image"), str) else item.get("ImageName")
        compat_dir = _COMPAT_DIR.search(env.get("LD_LIBRARY_PATH", ""))
        out.append({
            "id": ident.lower() if isinstance(ident, str) else None,
            "name": name.lstrip("/") if isinstance(name, str) else None,
            "image": image if isinstance(image, str) else None,
            "image_id": item.get("Image") if isinstance(item.get("Image"), str) else None,
            "pid": pid if isinstance(pid, int) and pid > 0 else None,
            "uses_gpu": _uses_gpu(item.get("HostConfig"), env),
            "cuda_version": env.get("CUDA_VERSION", "").strip() or None,
            "nvidia_require_cuda": " ".join(env.get("NVIDIA_REQUIRE_CUDA", "").split()) or None,
            "compat_package": env.get("NV_CUDA_COMPAT_PACKAGE", "").strip() or None,
            "compat_on_path": compat_dir.group(1) if compat_dir else None,
            "gpu_pids": [],
        })
    return out, None


def container_of_cgroup(text: str | None, ids: Collection[str]) -> str | None:
    """The id (of ``ids``) a process's /proc/<pid>/cgroup names, or None."""
    for match in _CGROUP_ID.finditer(text or ""):
        if match.group(1) in ids:
            return match.group(1)
    return None


def parse_maps(text: str | None) -> dict[str, Any]:
    """The libcuda and libcudart a process mapped: ``{"libcuda", "libcuda_version", "libcuda_compat",
    "cudart_version"}`` (values None when not mapped)."""
    out: dict[str, Any] = {"libcuda": None, "libcuda_version": None, "libcuda_compat": None, "cudart_version": None}
    for line in (text or "").splitlines():
        path = line.rsplit(None, 1)[-1] if line.strip() else ""
        found = _LIBCUDA.search(path)
        if found and out["libcuda"] is None:
            out["libcuda"], out["libcuda_version"] = found.group(1), found.group(2)
            out["libcuda_compat"] = "/compat/" in found.group(1)
        rt = _LIBCUDART.search(path)
        if rt and out["cudart_version"] is None:
            out["cudart_version"] = rt.group(1)
    return out


def _gpu_processes(driver: object) -> dict[int, dict[str, Any]] | None:
    """{pid: process dict} of NVML's compute processes over every GPU, or None when not read."""
    gpus = (driver or {}).get("gpus") if isinstance(driver, dict) else None
    if not isinstance(gpus, list) or not gpus:
        return None
    procs: dict[int, dict[str, Any]] = {}
    read = False
    for gpu in gpus:
        listed = gpu.get("processes") if isinstance(gpu, dict) else None
        if listed is None:
            continue
        read = True
        for p in listed:
            pid = p.get("pid") if isinstance(p, dict) else None
            if not isinstance(pid, int) or len(procs) >= MAX_PROCESSES:
                continue
            entry = procs.setdefault(pid, {"pid": pid, "name": p.get("name"), "gpus": [],
                                           "used_memory_mib": 0})
            entry["gpus"].append(gpu.get("index"))
            entry["used_memory_mib"] += p.get("used_memory_mib") or 0
    return procs if read else None


def collect_workloads(reader: NodeReader, container: dict[str, Any] | None, driver: object,
                      packages: dict[str, Any] | None) -> dict[str, Any]:
    """WorkloadFacts: containers, GPU processes and host compat packages (docs/facts.md section 16)."""
    out: dict[str, Any] = {"status": "ok", "reason": None, "containers": [], "processes": [], "compat_packages": []}
    problems: list[str] = []
    for pkg in (packages or {}).get("packages") or []:
        if isinstance(pkg, dict) and pkg.get("role") == "compat":
            out["compat_packages"].append({"name": pkg.get("name"), "version": pkg.get("version"),
                                           "branch": pkg.get("branch")})
    if (packages or {}).get("status") != "ok":
        problems.append("packages not read: %s" % ((packages or {}).get("reason") or "unknown"))

    runtime = ((container or {}).get("runtime") or {}).get("name")
    if runtime:
        res = reader.run_cached(container_ps_argv(runtime))
        if not res.ok:
            problems.append(res.reason())
        else:
            ids = parse_container_ids(res.stdout)
            if ids:
                res = reader.run(container_inspect_argv(runtime, ids))
                if not res.ok:
                    problems.append(res.reason())
                else:
                    found, problem = parse_containers_inspect(res.stdout)
                    if problem:
                        problems.append(problem)
                    out["containers"] = found

    procs = _gpu_processes(driver)
    if procs is None:
        problems.append("the GPUs' compute processes were not read")
    container_ids = set(c["id"] for c in out["containers"] if c["id"])
    by_id = dict((c["id"], c) for c in out["containers"] if c["id"])
    for pid, entry in sorted((procs or {}).items()):
        cgroup = reader.read(PROC_PID_FILES["cgroup"] % pid, limit=65536)
        entry["container_id"] = container_of_cgroup(cgroup, container_ids) if cgroup is not None else None
        maps = reader.read(PROC_PID_FILES["maps"] % pid)
        entry["maps_read"] = maps is not None
        entry.update(parse_maps(maps))
        if entry["container_id"]:
            by_id[entry["container_id"]]["gpu_pids"].append(pid)
            by_id[entry["container_id"]]["uses_gpu"] = True
        out["processes"].append(entry)
    if problems:
        out["status"] = "unknown"
        out["reason"] = "; ".join(problems)
    return out
