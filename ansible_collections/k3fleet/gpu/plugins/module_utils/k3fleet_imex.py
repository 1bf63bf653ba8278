# Stdlib only: shipped to nodes inside AnsiballZ.
"""IMEX facts: the nvidia-imex unit, its config and node list, the channel devices, the domain's state.

IMEX (Internode Memory Exchange) runs on every compute node of a multi-node NVLink domain (GB200/GB300
NVL72 racks); without it GPU memory cannot be shared across the nodes' OS instances, so a multi-node
NVLink all-to-all backend has no transport (docs/facts.md section 15).

``collect_imex(reader)`` returns a dict shaped like ``k3fleet.models.facts.ImexFacts``. Files first
(the config, the node list, the channel device directory); the one command, ``nvidia-imex-ctl -N``,
runs only where the tool is installed, and the unit's state comes from the ``systemctl show`` every
audit runs anyway. What cannot be read is ``unknown`` with a reason, never a pass.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, settled
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_fabricmanager import unit_state
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import (
    parse_systemctl_show,
    systemctl_show_problem,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import COMMANDS, FILES

UNIT = "nvidia-imex.service"
CTL = "nvidia-imex-ctl"
# The config keys k3fleet keeps (the IMEX guide's "IMEX Service Config Options"); the rest is not judged.
CONFIG_KEYS = ("IMEX_NODE_CONFIG_FILE", "SERVER_PORT", "BIND_INTERFACE_IP", "IMEX_CMD_ENABLED", "IMEX_CMD_PORT",
               "IMEX_WAIT_FOR_QUORUM", "IMEX_ENABLE_AUTH_ENCRYPTION")
# An IMEX config and a node list are a few KiB; a rack's node list is 18 lines.
CONFIG_LIMIT = 256 * 1024
# Links reported by name when the connectivity table shows them not Connected; the count says the rest.
MAX_LINKS = 64
_CHANNEL = re.compile(r"^channel(\d+)$")
# "Node #0   - 172.31.48.81    - READY                - Version: 570.172" (tests/fixtures/imex); more " - Key: value"
# parts (-H adds the host name) are read by their key.
_NODE = re.compile(r"^Node\s+#(\d+)\s+[-*]\s+(\S+)\s+-\s+(\S+)(.*)$")
_DOMAIN = re.compile(r"^Domain State:\s*(\S+)")


# -- pure parsers ----------------------------------------------------------------


def parse_config(text: str) -> dict[str, str]:
    """KEY=value lines of an IMEX config (comments and blanks skipped); every key, as written."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_node_list(text: str) -> list[str]:
    """The node list file: one IP address (or host name) per line, in IMEX node-index order."""
    out = []
    for line in (text or "").splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            out.append(entry)
    return out


def parse_imex_ctl_nodes(text: str) -> dict[str, Any]:
    """``nvidia-imex-ctl -N``: the nodes with their state, the links not Connected, the domain state.

    Raises ValueError when the text holds neither a node line nor a domain state (not this command's
    output). The connectivity table's codes are the legend's: C Connected, N Never Connected,
    R Recovering, D Disconnected, I Invalid, A Authenticating, !V! / !M! version / node map mismatch.
    """
    nodes: list[dict[str, Any]] = []
    links: list[str] = []
    link_count = 0
    columns: list[int] | None = None
    domain = None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _NODE.match(line)
        if m:
            node: dict[str, Any] = {"index": int(m.group(1)), "address": m.group(2), "status": m.group(3),
                                    "version": None, "hostname": None}
            for part in re.split(r"\s+-\s+", " " + m.group(4).strip()):
                key, value = (part.split(":", 1) + [""])[:2]
                if key.strip() == "Version":
                    node["version"] = value.strip() or None
                elif key.strip() == "Hostname":
                    node["hostname"] = value.strip() or None
            nodes.append(node)
            continue
        if line.startswith("Nodes From"):
            columns = [int(t) for t in line.split() if t.isdigit()]
            continue
        m = _DOMAIN.match(line)
        if m:
            domain = m.group(1)
            columns = None
            continue
        if columns is not None:
            cells = line.split()
            if not cells[0].isdigit():
                columns = None
                continue
            row = int(cells[0])
            for pos, code in enumerate(cells[1:len(columns) + 1]):
                col = columns[pos]
                if code != "C":
                    link_count += 1
                    if len(links) < MAX_LINKS:
                        links.append("%d->%d %s" % (row, col, code))
    if not nodes and domain is None:
        first = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
        raise ValueError("%s -N printed no node status: %r" % (CTL, first[:160]))
    return {"nodes": nodes, "domain_state": domain, "links_not_connected": links,
            "links_not_connected_count": link_count}


def channel_numbers(names: list[str]) -> list[int]:
    return sorted(int(m.group(1)) for m in (_CHANNEL.match(n) for n in names) if m)


# -- collector -----------------------------------------------------------------------


def _read_file(reader: NodeReader, path: str) -> tuple[str | None, str | None]:
    """(text, why not read): a missing file is (None, None), an unreadable one (None, reason)."""
    text = reader.read(path, limit=CONFIG_LIMIT)
    if text is not None:
        return text, None
    if not reader.exists(path):
        return None, None
    return None, reader.read_error(path) or "%s: cannot be read" % path


def collect_imex(reader: NodeReader) -> dict[str, Any]:
    """IMEX facts (``ImexFacts`` shape).

    status ``absent``: no unit, no config file and no nvidia-imex-ctl (IMEX is not installed);
    ``unknown`` (+reason) when something installed could not be read; else ``ok``.
    """
    facts: dict[str, Any] = {
        "status": "unknown", "reason": None, "installed": None,
        "unit": {"installed": None, "active": None, "enabled": None},
        "config_path": FILES["imex_config"], "config_present": None, "config": {},
        "nodes_file": None, "nodes_file_present": None, "node_list": [],
        "channels": None, "domain_state": None, "nodes": [], "links_not_connected": [],
        "links_not_connected_count": None, "ctl_reason": None,
    }
    problems: list[str] = []

    res = reader.run_cached(COMMANDS["systemctl_show"])
    problem = systemctl_show_problem(res)
    if problem:
        problems.append("%s state unknown: %s" % (UNIT, problem))
    else:
        facts["unit"] = unit_state(parse_systemctl_show(res.stdout), UNIT)

    text, why = _read_file(reader, FILES["imex_config"])
    if why:
        problems.append(why)
    else:
        facts["config_present"] = text is not None
    config = parse_config(text or "")
    facts["config"] = {k: config[k] for k in CONFIG_KEYS if k in config}
    nodes_file = config.get("IMEX_NODE_CONFIG_FILE") or FILES["imex_nodes_config"]
    facts["nodes_file"] = nodes_file
    text, why = _read_file(reader, nodes_file)
    if why:
        problems.append(why)
    else:
        facts["nodes_file_present"] = text is not None
        facts["node_list"] = parse_node_list(text or "")

    names = reader.listdir(FILES["imex_channels_dir"])
    facts["channels"] = channel_numbers(names) if names is not None else []

    ctl = reader.which(CTL)
    installed = facts["unit"]["installed"] is True or bool(facts["config_present"]) or ctl is not None
    facts["installed"] = installed
    if not installed:
        if facts["unit"]["installed"] is None and problem:
            # systemd could not be asked and nothing else is there: whether a unit exists is unknown.
            facts["installed"] = None
            facts["reason"] = "; ".join(problems)
            return facts
        facts["status"] = "absent"
        facts["reason"] = "IMEX not installed (no %s, no %s, no %s)" % (UNIT, FILES["imex_config"], CTL)
        return facts

    if ctl is None:
        facts["ctl_reason"] = "%s: command not found" % CTL
    else:
        out = reader.run(COMMANDS["imex_ctl_nodes"])
        if out.ok or (out.error is None and out.stdout.strip()):
            try:
                facts.update(parse_imex_ctl_nodes(out.stdout))
            except ValueError as exc:
                facts["ctl_reason"] = str(exc) if out.ok else out.reason()
        else:
            # Exit 255: the tool could not read its node config (docs/facts.md section 15).
            facts["ctl_reason"] = out.reason()
    if facts["ctl_reason"]:
        problems.append("IMEX domain status unknown: %s" % facts["ctl_reason"])
    return settled(facts, problems)


__all__ = [
    "CONFIG_KEYS",
    "UNIT",
    "channel_numbers",
    "collect_imex",
    "parse_config",
    "parse_imex_ctl_nodes",
    "parse_node_list",
]
