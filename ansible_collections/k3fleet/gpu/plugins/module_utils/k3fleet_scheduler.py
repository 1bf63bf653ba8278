# -*- coding: utf-8 -*-
# Stdlib only: this file is shipped to every node inside the AnsiballZ payload.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""This node's state in the workload scheduler (Slurm), as the change night needs it.

The drain step must know whether the node is already drained, by whom (the
reason), and whether jobs still run on it. Kubernetes node state is read from
the API by the controller, never on the node, so only Slurm is collected here.
"""

from __future__ import annotations

import re
import socket
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader, unknown
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    FILES,
    HOSTNAME_LIMIT,
    scontrol_show_node_argv,
    squeue_running_argv,
)

_KEY_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_:]*)=(.*)$")
# Slurm appends "[user@timestamp]" to a reason; the reason itself may hold spaces and '='.
_REASON_RE = re.compile(r"(?:^|\s)Reason=(.*?\[[^\]\s]*@[^\]\s]*\])")
# sinfo-style suffixes (not responding, powered down, ...) that may trail a state word.
_STATE_SUFFIXES = "*~#!%$@^-"
_BUSY_BASES = ("ALLOCATED", "MIXED", "COMPLETING")
_JOB_ID_RE = re.compile(r"^\d+(?:[_+][0-9\[\]\-,%]+)?$")


def _split_records(text: str | None) -> list[str]:
    """One string per node: ``--oneliner`` gives a line each; the default form is indented continuation lines."""
    records: list[str] = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("NodeName=") and not line[:1].isspace():
            records.append(line.strip())
        elif records:
            records[-1] += " " + line.strip()
    return records


def parse_scontrol_record(record: str) -> dict[str, str]:
    """``Key=Value`` fields of one ``scontrol show node`` record.

    Values may contain spaces (``OS=Linux 5.15.0-91-generic #101-Ubuntu SMP``):
    a token that is not ``Key=...`` continues the previous value. ``Reason`` is
    cut out first, up to its ``[user@time]`` stamp, because free text may hold
    anything.
    """
    fields = {}
    match = _REASON_RE.search(record)
    if match:
        fields["Reason"] = match.group(1).strip()
        record = record[:match.start()] + " " + record[match.end():]
    key = None
    for token in record.split():
        kv = _KEY_RE.match(token)
        if kv:
            key = kv.group(1)
            if key == "Reason" and "Reason" in fields:
                key = None
                continue
            fields[key] = kv.group(2)
        elif key is not None:
            fields[key] = (fields[key] + " " + token).strip()
    return fields


def parse_scontrol_nodes(text: str | None) -> list[dict[str, str]]:
    return [parse_scontrol_record(r) for r in _split_records(text)]


def normalize_slurm_state(raw: str | None) -> tuple[str | None, list[str]]:
    """``"IDLE+DRAIN"`` -> ``("drained", ["drain"])``; ``"MIXED+DRAIN"`` -> ``("draining", ...)``.

    DOWN wins over everything; DRAIN on a node with work is ``draining``, on an
    idle one ``drained`` (Slurm's own sinfo words); FAIL likewise ``failing`` /
    ``fail``. Other flags (NOT_RESPONDING, MAINT, RESERVED, CLOUD, POWERED_DOWN,
    ...) are returned lower-cased beside the state.
    """
    parts = [p for p in (raw or "").strip().upper().split("+") if p]
    if not parts:
        return None, []
    base = parts[0].rstrip(_STATE_SUFFIXES)
    flags = [p.rstrip(_STATE_SUFFIXES) for p in parts[1:]]
    if (raw or "").strip().endswith("*") and "NOT_RESPONDING" not in flags:
        flags.append("NOT_RESPONDING")
    lowered = [f.lower() for f in flags]
    if base == "DOWN":
        return "down", lowered
    if base in ("DRAINED", "DRAINING"):
        return base.lower(), lowered
    if "DRAIN" in flags:
        return ("draining" if base in _BUSY_BASES else "drained"), lowered
    if "FAIL" in flags:
        return ("failing" if base in _BUSY_BASES else "fail"), lowered
    return base.lower(), lowered


def count_running_jobs(text: str | None) -> int | None:
    """Job count from ``squeue --noheader --format %A`` (one id per line); ``None`` if a line is not an id."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if any(not _JOB_ID_RE.match(line) for line in lines):
        return None
    return len(lines)


def short_hostname(reader: NodeReader) -> tuple[str, str]:
    text = reader.read_cached(FILES["hostname"], limit=HOSTNAME_LIMIT)
    name = text.strip().splitlines()[0].strip() if text and text.strip() else ""
    source = FILES["hostname"]
    if not name:
        name, source = socket.gethostname(), "gethostname()"
    return name.split(".", 1)[0], source


def collect_scheduler(reader: NodeReader, node: str | None = None) -> dict[str, Any]:
    """Slurm state of this node (``models.facts.SchedulerFacts``).

    ``node`` is the Slurm NodeName; it defaults to the short hostname (from
    /etc/hostname under the reader's root, else the process's hostname), which
    is wrong where NodeName differs from the host name: pass it then.
    """
    if reader.which("scontrol") is None:
        return {"status": "absent", "reason": "scontrol not on PATH %s: no Slurm client on this node" % reader.path,
                "kind": "none", "node": node, "state": None, "jobs_running": None}
    if node:
        node_source = "argument"
    else:
        node, node_source = short_hostname(reader)
    out: dict[str, Any] = {"status": "ok", "reason": None, "kind": "slurm", "node": node, "node_source": node_source,
                           "state": None, "jobs_running": None}

    res = reader.run_cached(scontrol_show_node_argv(node))
    text = (res.stdout or "") + "\n" + (res.stderr or "")
    if res.error:
        return unknown(res.reason(), kind="slurm", node=node, node_source=node_source)
    if re.search(r"Node %s not found" % re.escape(node), text):
        return unknown("Slurm has no node named %r (scontrol: Node %s not found); pass node= with the "
                       "Slurm NodeName" % (node, node), kind="slurm", node=node, node_source=node_source)
    records = [r for r in parse_scontrol_nodes(res.stdout) if r.get("NodeName") == node]
    if res.rc != 0 or not records:
        detail = res.reason() if res.rc != 0 else "no NodeName=%s record in %r" % (node, res.stdout.strip()[:120])
        return unknown("scontrol show node %s: %s" % (node, detail), kind="slurm", node=node,
                       node_source=node_source)
    fields = records[0]
    raw_state = fields.get("State")
    out["state"], out["state_flags"] = normalize_slurm_state(raw_state)
    out["raw_state"] = raw_state
    reason = fields.get("Reason")
    out["reason"] = reason if reason and reason not in ("(null)", "none") else None
    if out["state"] is None:
        out.update(unknown("scontrol show node %s: no State field" % node, kind="slurm", node=node))

    jobs = reader.run_cached(squeue_running_argv(node))
    if not jobs.ok:
        out["jobs_reason"] = jobs.reason()
    else:
        out["jobs_running"] = count_running_jobs(jobs.stdout)
        if out["jobs_running"] is None:
            out["jobs_reason"] = "squeue output is not one job id per line: %r" % jobs.stdout.strip()[:120]
    return out
