# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""RDMA fabric state (InfiniBand / RoCE ports, GPUDirect, PCIe ACS) and NCCL settings.

Two collectors live here because both answer "will NCCL find a fast, correctly
configured path between GPUs": ``collect_rdma`` reads the ports the kernel
exposes, ``collect_nccl`` reads what the serving process will be told.
Parsing is kept in pure functions so the same code is tested against recorded
sysfs values, ``/proc/modules`` and ``lspci -vvv`` output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, parse_proc_modules, unknown
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

# Port attributes the kernel publishes under /sys/class/infiniband/<dev>/ports/<n>/.
PORT_FILES = ("state", "phys_state", "rate", "link_layer")
# IB_PORT_ACTIVE in the kernel's enum ib_port_state (drivers/infiniband/core/sysfs.c prints "4: ACTIVE").
PORT_ACTIVE_CODE = 4

# GPUDirect RDMA peer-memory modules: nvidia_peermem ships with the driver (R470+);
# nv_peer_mem is the older MLNX_OFED module that does the same job.
PEERMEM_MODULE = "nvidia_peermem"
LEGACY_PEERMEM_MODULE = "nv_peer_mem"

_CODED_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)b/sec\b", re.IGNORECASE)
_RATE_SCALE = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}
# lspci prints a device header at column 0: "[domain:]bus:dev.fn Class: Vendor ...".
_LSPCI_HEADER_RE = re.compile(r"^((?:[0-9a-fA-F]{4,}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.*)$")
_ACSCTL_RE = re.compile(r"^\s*ACSCtl:\s*(.*)$")
_ACCESS_DENIED = "<access denied>"

# NCCL reads these; UCX_NET_DEVICES matters when NCCL goes through the UCX net plugin.
NCCL_KEY_PREFIXES = ("NCCL_", "GLOO_")
NCCL_EXTRA_KEYS = ("UCX_NET_DEVICES",)
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- pure parsers -------------------------------------------------------------


def parse_coded_value(text: str | None) -> tuple[int | None, str | None]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``; anything else -> ``(None, None)``."""
    if text is None:
        return None, None
    match = _CODED_RE.match(text.strip())
    if not match:
        return None, None
    return int(match.group(1)), match.group(2)


def parse_rate_gbps(text: str | None) -> float | None:
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``; unparseable -> ``None``."""
    if text is None:
        return None
    match = _RATE_RE.match(text)
    if not match:
        return None
    return float(match.group(1)) * _RATE_SCALE[match.group(2).upper()]


def parse_port(port: int | str, values: Mapping[str, str | None]) -> dict[str, Any]:
    """One port (its number, or its sysfs directory name) from its raw sysfs file contents (``None`` for a file
    that could not be read)."""
    state_code, state = parse_coded_value(values.get("state"))
    phys_code, phys_state = parse_coded_value(values.get("phys_state"))
    rate = values.get("rate")
    link_layer = values.get("link_layer")
    return {
        "port": int(port),
        "state": state,
        "state_code": state_code,
        "phys_state": phys_state,
        "phys_state_code": phys_code,
        "rate": rate.strip() if rate else None,
        "rate_gbps": parse_rate_gbps(rate),
        "link_layer": link_layer.strip() if link_layer and link_layer.strip() else None,
    }


def _split_lspci_devices(text: str) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        match = _LSPCI_HEADER_RE.match(line)
        if match and not line[:1].isspace():
            current = {"bdf": match.group(1), "header": match.group(2), "lines": []}
            devices.append(current)
        elif current is not None:
            current["lines"].append(line)
    return devices


def _is_bridge(header: str) -> bool:
    # "PCI bridge: ..." or, with -nn, "PCI bridge [0604]: ..."; host bridges carry no ACS of interest.
    return header.startswith("PCI bridge")


def parse_lspci_acs(text: str | None) -> dict[str, Any]:
    """PCIe ACS state from ``lspci -vvv``.

    Returns ``acs_checked`` (whether the answer can be trusted), ``acs_reason``,
    ``acs_enabled_bridges`` (bridges whose ACSCtl shows ``SrcValid+``, which
    forces peer-to-peer traffic up through the root complex) and ``acs_devices``
    (every device that printed an ACSCtl line).
    """
    devices = _split_lspci_devices(text or "")
    result: dict[str, Any] = {"acs_checked": False, "acs_reason": None, "acs_enabled_bridges": [], "acs_devices": []}
    if not devices:
        result["acs_reason"] = "lspci -vvv printed no PCI devices to check for ACS"
        return result
    denied = []
    garbled = []
    for dev in devices:
        ctl = None
        for line in dev["lines"]:
            match = _ACSCTL_RE.match(line)
            if match:
                ctl = match.group(1)
            elif _ACCESS_DENIED in line:
                denied.append(dev["bdf"])
        if ctl is None:
            continue
        flags = ctl.split()
        if "SrcValid+" not in flags and "SrcValid-" not in flags:
            # A cut-off line ("ACSCtl:\tSrcVal") must not read as "ACS off".
            garbled.append("%s %r" % (dev["bdf"], ctl.strip()[:40]))
            continue
        src_valid = "SrcValid+" in flags
        result["acs_devices"].append({"bdf": dev["bdf"], "src_valid": src_valid})
        if src_valid and _is_bridge(dev["header"]):
            result["acs_enabled_bridges"].append(dev["bdf"])
    if denied:
        # Without root lspci hides extended capabilities: absence of ACSCtl proves nothing.
        result["acs_reason"] = ("lspci -vvv could not read the capabilities of %d device(s) "
                                "(\"Capabilities: %s\", first %s); run it as root to check ACS"
                                % (len(denied), _ACCESS_DENIED, denied[0]))
        return result
    if garbled:
        result["acs_reason"] = "lspci -vvv ACSCtl line(s) without a SrcValid flag (truncated output?): %s" % (
            ", ".join(garbled[:3]))
        return result
    result["acs_checked"] = True
    return result


def is_nccl_key(key: str) -> bool:
    return key.startswith(NCCL_KEY_PREFIXES) or key in NCCL_EXTRA_KEYS


def _unquote(value: str) -> str:
    value = value.strip()
    quote = value[:1]
    if quote in ("'", '"'):
        # The value ends at the matching quote; a trailing " # comment" after it is dropped.
        end = 1
        while end < len(value):
            if value[end] == "\\" and quote == '"':
                end += 2
                continue
            if value[end] == quote:
                break
            end += 1
        inner = value[1:end]
        if quote == '"':
            inner = inner.replace('\\"', '"').replace("\\\\", "\\")
        return inner
    # An unquoted value ends at a " #" comment, as in shells and systemd environment files.
    hash_at = value.find(" #")
    if hash_at >= 0:
        value = value[:hash_at].rstrip()
    return value


def parse_env_lines(text: str | None) -> tuple[list[tuple[str, str]], int]:
    """``KEY=VALUE`` assignments in file order.

    Accepts the common subset of ``/etc/nccl.conf``, ``/etc/environment``
    (pam_env) and systemd ``EnvironmentFile=``/dotenv syntax: ``#`` comments,
    blank lines, an optional ``export`` prefix and single or double quotes.
    Returns ``(pairs, bad_lines)``; lines that are not assignments are counted,
    never raised.
    """
    pairs: list[tuple[str, str]] = []
    bad = 0
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith(";"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _ENV_KEY_RE.match(key):
            bad += 1
            continue
        pairs.append((key, _unquote(value)))
    return pairs, bad


def merge_nccl_settings(layers: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> dict[str, Any]:
    """Apply ``(source, pairs)`` layers, lowest precedence first; keep NCCL-relevant keys.

    A later layer overrides an earlier one; what it overrode is kept under
    ``shadowed`` so a report can show that, for example, ``NCCL_DEBUG=INFO`` in
    /etc/nccl.conf is masked by the unit's environment file.
    """
    settings: dict[str, Any] = {}
    for source, pairs in layers:
        for key, value in pairs:
            if not is_nccl_key(key):
                continue
            previous = settings.get(key)
            entry = {"value": value, "source": source}
            if previous is not None:
                shadowed = previous.pop("shadowed", [])
                shadowed.append(previous)
                entry["shadowed"] = shadowed
            settings[key] = entry
    return settings


# -- collectors -----------------------------------------------------------------


def _read_stripped(reader: NodeReader, path: str) -> str | None:
    text = reader.read(path, limit=4096)
    return text.strip() if text is not None else None


def _collect_ports(reader: NodeReader, dev_dir: str) -> tuple[list[dict[str, Any]], bool, list[str]]:
    ports_dir = dev_dir + "/ports"
    names = reader.listdir(ports_dir)
    ports = []
    unreadable = []
    for name in names or []:
        if not name.isdigit():
            continue
        base = "%s/%s" % (ports_dir, name)
        values = {}
        for attr in PORT_FILES:
            values[attr] = _read_stripped(reader, "%s/%s" % (base, attr))
            if values[attr] is None:
                unreadable.append("%s/%s" % (base, attr))
        ports.append(parse_port(name, values))
    ports.sort(key=lambda p: p["port"])
    return ports, names is None, unreadable


def collect_acs(reader: NodeReader) -> dict[str, Any]:
    """ACS fields of RdmaFacts from ``lspci -vvv``; a missing or failing lspci is a reason, not an error."""
    res = reader.run_cached(COMMANDS["lspci_vvv"])
    if not res.ok:
        return {"acs_checked": False, "acs_reason": res.reason(), "acs_enabled_bridges": [],
                "acs_devices": []}
    return parse_lspci_acs(res.stdout)


def collect_rdma(reader: NodeReader, lspci: bool = True) -> dict[str, Any]:
    """RDMA devices and ports, GPUDirect peer memory, PCIe ACS (``models.facts.RdmaFacts``).

    ``status`` is ``absent`` when the node has no ``/sys/class/infiniband``
    (no RDMA devices, or the IB core modules are not loaded); the peer-memory
    and ACS fields are still filled in, because ACS also breaks GPU
    peer-to-peer traffic inside a node.
    """
    ib_dir = FILES["infiniband_dir"]
    out: dict[str, Any] = {"status": "ok", "reason": None, "devices": [], "active_ports": 0,
                           "nvidia_peermem_loaded": None, "acs_checked": False, "acs_reason": None,
                           "acs_enabled_bridges": []}

    modules_text = reader.read_cached(FILES["proc_modules"])
    if modules_text is None:
        out["peermem_reason"] = reader.read_error(FILES["proc_modules"])
    else:
        loaded = parse_proc_modules(modules_text)
        out["nvidia_peermem_loaded"] = PEERMEM_MODULE in loaded
        out["legacy_nv_peer_mem_loaded"] = LEGACY_PEERMEM_MODULE in loaded

    if lspci:
        out.update(collect_acs(reader))
    else:
        out["acs_reason"] = "ACS check not requested (lspci=false)"

    names = reader.listdir(ib_dir)
    if names is None:
        out["status"] = "absent"
        out["reason"] = "%s does not exist: no RDMA devices (or ib_core/mlx5_ib not loaded)" % ib_dir
        return out
    if not names:
        out["status"] = "absent"
        out["reason"] = "%s is empty: no RDMA devices registered" % ib_dir
        return out

    problems = []
    for name in names:
        ports, missing, unreadable = _collect_ports(reader, "%s/%s" % (ib_dir, name))
        if missing:
            problems.append("%s/%s/ports: not readable" % (ib_dir, name))
        problems.extend(unreadable)
        out["devices"].append({"name": name, "ports": ports})
    out["active_ports"] = sum(1 for dev in out["devices"] for port in dev["ports"]
                              if port["state_code"] == PORT_ACTIVE_CODE)
    port_count = sum(len(dev["ports"]) for dev in out["devices"])
    states_read = sum(1 for dev in out["devices"] for port in dev["ports"] if port["state"] is not None)
    if port_count == 0 or states_read == 0:
        out["status"] = "unknown"
        out["reason"] = ("RDMA devices %s present but no port state could be read%s"
                         % (", ".join(names), (": " + problems[0]) if problems else ""))
    elif problems:
        out["unreadable"] = problems
    return out


def _resolve_env_file(spec: str) -> tuple[str, bool]:
    # systemd's "EnvironmentFile=-/path" marks a file whose absence is not an error.
    optional = spec.startswith("-")
    path = spec[1:] if optional else spec
    return path, optional


def collect_nccl(reader: NodeReader, env_files: Sequence[str] = (),
                 environ: Mapping[str, object] | None = None) -> dict[str, Any]:
    """NCCL_* / GLOO_* / UCX_NET_DEVICES settings with their source (``models.facts.NcclFacts``).

    Precedence, highest first, mirrors what the serving process sees:
    ``environ`` (the process environment; defaults to this process's
    ``os.environ``) > each file in ``env_files`` (later files override earlier
    ones, as with repeated systemd ``EnvironmentFile=``) > ``/etc/environment``
    (read by pam_env at login) > ``/etc/nccl.conf`` (read by NCCL itself only
    for variables not already in the environment).
    """
    if environ is None:
        environ = os.environ
    layers: list[tuple[str, str | None]] = []
    problems: list[str] = []

    conf_path = FILES["nccl_conf"]
    conf_text = reader.read(conf_path)
    nccl_conf_present = conf_text is not None or reader.exists(conf_path)
    if conf_text is None and nccl_conf_present:
        problems.append(reader.read_error(conf_path) or "%s: not readable" % conf_path)
    layers.append((conf_path, conf_text))

    etc_env = FILES["etc_environment"]
    layers.append((etc_env, reader.read(etc_env)))

    for spec in env_files or ():
        path, optional = _resolve_env_file(spec)
        text = reader.read(path)
        if text is None and not optional:
            problems.append(reader.read_error(path) or "%s: not readable" % path)
        layers.append((path, text))

    parsed: list[tuple[str, list[tuple[str, str]]]] = []
    bad_lines: dict[str, int] = {}
    for source, text in layers:
        if text is None:
            continue
        pairs, bad = parse_env_lines(text)
        if bad:
            bad_lines[source] = bad
        parsed.append((source, pairs))
    parsed.append(("env", [(k, v) for k, v in sorted(environ.items()) if isinstance(v, str)]))

    out: dict[str, Any] = {"status": "ok", "reason": None, "settings": merge_nccl_settings(parsed),
                           "nccl_conf_present": nccl_conf_present}
    if bad_lines:
        out["unparsed_lines"] = bad_lines
    if problems:
        out.update(unknown("environment file(s) could not be read: %s" % "; ".join(problems),
                           settings=out["settings"], nccl_conf_present=nccl_conf_present))
    return out
