# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes.
"""The change night's preflight on one node, read right before its drain (docs/change-night.md
"Preflight"): can the driver module be unloaded, is there room for the packages and a DKMS build,
are the kernel headers there when DKMS builds, does the repository resolve the target versions, is the
NVIDIA Container Toolkit one that may run with the target driver.

``collect`` reads (files through the NodeReader, statvfs, three fixed commands); ``judge`` is pure: facts and
policy in, the problems that block the host out, each with its check, what was found and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader

# Services that hold the GPUs' device files while they run, by the process name the kernel reports
# (/proc/PID/comm, at most 15 characters) and their unit; the night stops them by rebooting the node
# (docs/change-night.md "Preflight"). DCGM's host engine is nv-hostengine (unit nvidia-dcgm).
SERVICES = (
    ("nvidia-persistenced", "nvidia-persistenced.service"),
    ("nv-hostengine", "nvidia-dcgm.service"),
    ("nv-fabricmanager", "nvidia-fabricmanager.service"),
)
SERVICE_UNITS = tuple(unit for _comm, unit in SERVICES)
SYSTEMCTL_SHOW = ["systemctl", "show", "--no-pager", "-p", "Id,ActiveState,MainPID"] + list(SERVICE_UNITS)
APT_CACHE_MADISON = ["apt-cache", "madison"]
NVIDIA_CTK_VERSION = ["nvidia-ctk", "--version"]
# cgroup paths of the scheduler's work: a process inside one leaves with its job when the drain
# waits for it (Slurm's cgroup v1 and v2 layouts name job_<id>; kubelet's name kubepods).
_JOB_CGROUP = re.compile(r"(/slurm[^/]*/uid_\d+/job_\d+|/slurmstepd\.scope/job_\d+|/job_\d+/step_|kubepods)")
_DEVICE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
_CTK_VERSION = re.compile(r"version\s+v?(\d+(?:\.\d+)+)")
MAX_HOLDERS = 64


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def device_holders(reader: NodeReader) -> list[dict[str, Any]] | None:
    """Every process with an open /dev/nvidia* file: pid, name, devices, cgroup and its kind (service: the
    night stops it; job: the drain waits for it; other: nothing of the night ends it)."""
    procs = reader.listdir("/proc")
    if procs is None:
        return None
    found = []
    for pid in sorted((p for p in procs if p.isdigit()), key=int):
        devices = set()
        fd_dir = reader.resolve("/proc/%s/fd" % pid)
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _DEVICE.match(target):
                devices.add(target)
        if not devices:
            continue
        comm = (reader.read("/proc/%s/comm" % pid, limit=64) or "").strip()
        cgroup = (reader.read("/proc/%s/cgroup" % pid, limit=4096) or "").strip()
        found.append({"pid": int(pid), "comm": comm, "devices": sorted(devices), "cgroup": cgroup,
                      "kind": classify_holder(comm, cgroup)})
        if len(found) >= MAX_HOLDERS:
            break
    return found


def classify_holder(comm: str, cgroup: str | None) -> str:
    # The kernel keeps 15 characters of a process name (proc(5), TASK_COMM_LEN 16 with its NUL):
    # nvidia-persistenced is "nvidia-persiste" there, nv-fabricmanager "nv-fabricmanage".
    if comm in [c[:15] for c, _unit in SERVICES]:
        return "service"
    if _JOB_CGROUP.search(cgroup or ""):
        return "job"
    return "other"


def parse_systemctl_show(text: str | None) -> list[dict[str, str]]:
    """``systemctl show -p Id,ActiveState,MainPID U1 U2 ...``: blocks separated by blank lines."""
    units = []
    for block in re.split(r"\n\s*\n", (text or "").strip()):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units.append({"unit": props["Id"], "active": props.get("ActiveState", "")})
    return units


def mig_instances(reader: NodeReader) -> dict[str, list[str]]:
    """GPU instances by GPU, from the driver's capability files (/proc/driver/nvidia/capabilities/gpuN/mig/giM)."""
    base = "/proc/driver/nvidia/capabilities"
    out = {}
    for gpu in reader.glob_names(base, "gpu"):
        gis = reader.glob_names("%s/%s/mig" % (base, gpu), "gi")
        if gis:
            out[gpu] = gis
    return out


def free_mb(stat: os.statvfs_result) -> int:
    """Free MB for an unprivileged writer (f_bavail, as df's "Available") of an os.statvfs result."""
    return int(stat.f_bavail * stat.f_frsize // (1024 * 1024))


def parse_madison(text: str | None) -> list[list[str]]:
    """``apt-cache madison P...`` rows: [package, version, source]."""
    rows = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 2 and parts[0] and parts[1]:
            rows.append(parts[:3])
    return rows


def offered(rows: list[list[str]], name: str, version: str) -> bool:
    """Whether a row offers ``name`` at the upstream ``version`` (any Debian revision, optional epoch)."""
    pattern = re.compile(r"^([0-9]+:)?%s-[^-\s]+$" % re.escape(version))
    return any(r[0] == name and pattern.match(r[1]) for r in rows)


def _existing(reader: NodeReader, path: str) -> str:
    """The path, or its nearest existing parent (a DKMS tree not created yet is on its parent's filesystem)."""
    while path not in ("", "/") and not reader.exists(path):
        path = os.path.dirname(path)
    return path or "/"


def collect(reader: NodeReader, packages: list[list[str]], space_paths: list[str], dkms: bool,
            statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> dict[str, Any]:
    """Read the node. ``packages``: [[name, upstream version]] the change installs."""
    facts: dict[str, Any] = {
        "holders": device_holders(reader), "services": None, "mig": mig_instances(reader), "disk": [], "kernel": None,
        "headers": None, "dkms": bool(dkms), "repository": None, "toolkit": None, "reasons": []}
    res = reader.run(SYSTEMCTL_SHOW)
    if res.ok:
        facts["services"] = parse_systemctl_show(res.stdout)
    else:
        facts["reasons"].append("services: %s" % res.reason())
    for path in space_paths:
        where = _existing(reader, path)
        try:
            facts["disk"].append({"path": path, "measured": where,
                                  "available_mb": free_mb(statvfs(reader.resolve(where))), "reason": None})
        except OSError as exc:
            facts["disk"].append({"path": path, "measured": where, "available_mb": None,
                                  "reason": "statvfs %s: %s" % (where, exc.strerror or exc)})
    release = (reader.read("/proc/sys/kernel/osrelease", limit=256) or "").strip()
    facts["kernel"] = release or None
    if release:
        build = "/lib/modules/%s/build" % release
        facts["headers"] = {"path": build, "present": reader.exists(build)}
    if packages:
        res = reader.run(APT_CACHE_MADISON + sorted(set(n for n, _v in packages)))
        if res.rc is not None:
            rows = parse_madison(res.stdout)
            facts["repository"] = {"wanted": [list(p) for p in packages],
                                   "missing": [list(p) for p in packages if not offered(rows, p[0], p[1])],
                                   "offered": ["%s %s" % (r[0], r[1]) for r in rows][:40]}
        else:
            facts["reasons"].append("repository: %s" % res.reason())
    res = reader.run(NVIDIA_CTK_VERSION)
    if res.ok:
        m = _CTK_VERSION.search(res.stdout)
        facts["toolkit"] = {"version": m.group(1) if m else None, "line": res.stdout.strip().splitlines()[0][:200]}
    return facts


def judge(facts: dict[str, Any], policy: dict[str, Any]) -> list[dict[str, str]]:
    """The problems that block the host before its drain: [{check, found, fix}]. Pure."""
    problems = []

    def block(check: str, found: str, fix: str) -> None:
        problems.append({"check": check, "found": found, "fix": fix})

    holders = facts.get("holders")
    if holders is None:
        block("module.holders", "the processes could not be listed (/proc unreadable)",
              "run the night with a user that can read /proc")
    else:
        others = [h for h in holders if h["kind"] == "other"]
        if others:
            block("module.in_use", "the driver cannot be unloaded: %s hold %s, and they are no job of the scheduler "
                  "and no service the night stops" % (
                      ", ".join("pid %d (%s)" % (h["pid"], h["comm"] or "?") for h in others[:8]),
                      ", ".join(sorted(set(d for h in others for d in h["devices"])))),
                  "stop them (or run them as scheduler jobs, which the drain waits for), then run the night again")
    mig = facts.get("mig") or {}
    if mig and not policy.get("allow_mig"):
        layout = "; ".join("%s: %s" % (g, ", ".join(v)) for g, v in sorted(mig.items()))
        block("module.mig", "MIG GPU instances exist (%s); reloading the driver destroys them" % layout,
              "destroy them (nvidia-smi mig -dci, -dgi) and record the layout to recreate after the change")
    min_mb = int(policy.get("min_free_mb") or 0)
    for d in facts.get("disk") or []:
        if d["available_mb"] is None:
            block("disk.free", "free space under %s unknown (%s)" % (d["path"], d["reason"]),
                  "make the path readable for the night's user")
        elif d["available_mb"] < min_mb:
            block("disk.free", "%d MB free under %s (%s), need at least %d MB for the packages%s" % (
                d["available_mb"], d["path"], d["measured"], min_mb, " and a DKMS build" if facts.get("dkms") else ""),
                "free space (apt-get clean, old kernels, logs), then run the night again")
    if facts.get("dkms"):
        headers = facts.get("headers")
        if not headers or not headers["present"]:
            block("kernel.headers", "DKMS builds the module, and there are no headers for the running kernel %s "
                  "(%s missing)" % (facts.get("kernel") or "?", headers["path"] if headers else "/lib/modules/?/build"),
                  "install linux-headers-%s, then run the night again" % (facts.get("kernel") or "$(uname -r)"))
    repo = facts.get("repository")
    if repo is None and policy.get("packages"):
        block("repository.target", "the repository could not be asked (%s)" % "; ".join(facts.get("reasons") or []),
              "make apt-cache work on the node")
    elif repo and repo["missing"]:
        wanted = ", ".join("%s=%s" % (n, v) for n, v in repo["missing"])
        offered = "; ".join(repo["offered"][:12]) or "nothing"
        block("repository.target", "the repository does not offer %s (offered: %s)" % (wanted, offered),
              "add the repository that carries the target version, or pick a target version it has")
    toolkit = facts.get("toolkit")
    minimum = policy.get("min_container_toolkit")
    if toolkit and minimum:
        have = _version_tuple(toolkit.get("version"))
        if not have or have < _version_tuple(minimum):
            block("container.toolkit", "NVIDIA Container Toolkit %s (%s), need %s or newer (%s)" % (
                toolkit.get("version") or "of unknown version", toolkit.get("line"), minimum,
                policy.get("min_container_toolkit_source") or "the target"),
                "upgrade nvidia-container-toolkit before the driver change")
    return problems
