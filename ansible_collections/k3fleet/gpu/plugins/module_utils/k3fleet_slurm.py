# -*- coding: utf-8 -*-
# Stdlib only: shipped inside AnsiballZ to whichever host runs the Slurm client commands.
# Nodes may run an older Python than the controller, so the Ansible module_utils idioms stay.
# ruff: noqa: UP001, UP009, UP010, UP031
"""Drain and resume one Slurm node on behalf of a k3fleet change, and read its state.

The drain reason is the change's lease (k3fleet_lease; docs/change-night.md "Lease"): its first
word ``k3fleet:<change-id>`` says which change holds the node. The rule that keeps this safe
comes from LBNL NHC's node-mark-online: a node is only ever resumed when the drain reason on it
is ours. A node held by another change is never drained, changed or resumed by this one
(``held``). A node drained by anyone else (an operator, a health check) is leased on top of
their reason, which is kept and put back when the change is done (``adopt`` / ``restore``); it
is never resumed. Down or failed nodes without a drain are left as they are.

Slurm has no compare-and-set for a drain: after setting the reason the drain reads it back
after ``settle`` seconds, so that of two controllers racing for one node only the one whose
reason stayed goes on; the other reports the node as held.

Parsing is in pure functions (``status_from_scontrol``, ``status_from_sinfo_json``,
``plan_drain``, ``plan_resume``) tested against recorded real output; ``SlurmNode`` runs the
commands through the shared ``NodeReader``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import CommandResult, NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_lease import lease_owner, previous_reason
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import (
    normalize_slurm_state,
    parse_scontrol_nodes,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import (
    scontrol_show_node_argv,
    squeue_active_argv,
)

# scontrol appends "[user@time]" to a reason; sinfo --json gives user and time as fields.
_STAMP_RE = re.compile(r"\s*\[([^\]\s@]+)@([^\]\s]+)\]\s*$")
_NO_REASON = ("", "(null)", "none", "None")
# Base states in which a node cannot run jobs at all, so a drain there is complete.
_IDLE_ENOUGH = ("drained", "down", "fail")


def sinfo_json_argv() -> list[str]:
    return ["sinfo", "--json"]


def drain_argv(node: str, reason: str) -> list[str]:
    # One argv element per key=value: no shell, so the reason may hold spaces and colons.
    return ["scontrol", "update", "nodename=%s" % node, "state=drain", "reason=%s" % reason]


def resume_argv(node: str) -> list[str]:
    return ["scontrol", "update", "nodename=%s" % node, "state=resume"]


def scancel_argv(job_ids: Sequence[object]) -> list[str]:
    return ["scancel"] + [str(j) for j in job_ids]


# The validated marker (docs/change-night.md "Validated for the scheduler"): the node's Comment, which a
# scheduler admin and job filters can read (scontrol show node; sinfo -o %E shows reasons, not comments).
# The Kubernetes label of the same meaning is k3fleet.io/validated=<driver>.
VALIDATED_KEY = "k3fleet.io/validated"
_MARK_RE = re.compile(r"k3fleet\.io/validated=\S+(?: \([^)]*\))?(?: \| )?")


def comment_argv(node: str, comment: str) -> list[str]:
    # One argv element: no shell, so the comment may hold spaces and '|'.
    return ["scontrol", "update", "nodename=%s" % node, "comment=%s" % comment]


def validated_marker(driver: str | None, change_id: str | None) -> str:
    """``k3fleet.io/validated=580.95.05 (CHG-1042)``: the driver the node was verified on, and by which change."""
    return "%s=%s (%s)" % (VALIDATED_KEY, driver, change_id)


def strip_marker(comment: str | None) -> str:
    """The node's comment without a k3fleet marker (what someone else wrote stays)."""
    return _MARK_RE.sub("", comment or "").strip()


def with_marker(comment: str | None, marker: str) -> str:
    """The comment with ``marker`` first and anyone else's text kept after ``|``."""
    theirs = strip_marker(comment)
    return "%s | %s" % (marker, theirs) if theirs else marker


def split_stamp(reason: str | None) -> tuple[str | None, str | None, str | None]:
    """``"text [root@2026-11-29T17:18:53]"`` -> ``("text", "root", "2026-11-29T17:18:53")``."""
    if reason is None:
        return None, None, None
    match = _STAMP_RE.search(reason)
    if not match:
        return reason.strip(), None, None
    return reason[:match.start()].strip(), match.group(1), match.group(2)


def _status(node: str, raw_state: str | None, reason: str | None, reason_user: str | None,
            reason_time: str | None, source: str) -> dict[str, Any] | None:
    state, flags = normalize_slurm_state(raw_state or "")
    if state is None:
        return None
    text, stamp_user, stamp_time = split_stamp(reason)
    if text in _NO_REASON:
        text = None
    drain = "drain" in flags or state in ("drained", "draining")
    return {
        "node": node,
        "state": state,
        "raw_state": raw_state,
        "flags": flags,
        "drain": drain,
        # Out of service for jobs, whoever put it there: drained, draining, down or failed.
        "unavailable": drain or state in ("down", "fail", "failing"),
        "reason": text,
        "reason_user": reason_user or stamp_user,
        "reason_time": reason_time or stamp_time,
        "source": source,
        "jobs_running": None,
        "job_ids": None,
    }


def status_from_scontrol(text: str | None, node: str) -> dict[str, Any]:
    """The node's status from ``scontrol show node NODE --oneliner``; raises ValueError when absent."""
    records = [r for r in parse_scontrol_nodes(text) if r.get("NodeName") == node]
    if not records:
        raise ValueError("no NodeName=%s record in scontrol output %r" % (node, (text or "").strip()[:160]))
    fields = records[0]
    status = _status(node, fields.get("State"), fields.get("Reason"), None, None, "scontrol")
    if status is None:
        raise ValueError("scontrol record of %s has no State field" % node)
    comment = fields.get("Comment")
    status["comment"] = None if comment in _NO_REASON else comment
    return status


def _epoch(value: object) -> Any:
    """22.05 gives an int; 23.02+ a ``{"set", "infinite", "number"}`` object."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) else None
    return value if isinstance(value, int) else None


def status_from_sinfo_json(text: str | None, node: str) -> dict[str, Any]:
    """The node's status from ``sinfo --json`` (22.05: state word + state_flags; 23.02+: state list).

    Raises ValueError on text that is not the JSON document or that lacks the node.
    """
    try:
        data = json.loads(text or "")
    except ValueError as exc:
        raise ValueError("sinfo --json printed no JSON (%s): %r" % (exc, (text or "").strip()[:160])) from exc
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ValueError("sinfo --json output has no nodes list")
    for entry in nodes:
        if not isinstance(entry, dict) or entry.get("name") != node:
            continue
        state = entry.get("state")
        if isinstance(state, list):
            words = [str(s) for s in state]
        else:
            words = [str(state or "")] + [str(f) for f in entry.get("state_flags") or []]
        raw = "+".join(w.upper() for w in words if w)
        changed = _epoch(entry.get("reason_changed_at"))
        # The same local-time form scontrol prints in its "[user@time]" stamp.
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(changed)) if changed else None
        status = _status(node, raw, entry.get("reason"), entry.get("reason_set_by_user") or None, when,
                         "sinfo_json")
        if status is None:
            raise ValueError("sinfo --json entry of %s has no state" % node)
        return status
    names = ", ".join(str(e.get("name")) for e in nodes if isinstance(e, dict))
    raise ValueError("node %s not in sinfo --json output (nodes: %s)" % (node, names or "none"))


def parse_job_ids(text: str | None) -> list[str]:
    """Job ids from ``squeue --noheader --format %A``; raises ValueError on a line that is not an id."""
    ids: list[str] = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        if not re.match(r"^\d+$", line):
            raise ValueError("squeue line is not a job id: %r" % line[:80])
        ids.append(line)
    return ids


def drain_complete(status: dict[str, Any]) -> bool:
    """No job can still be running: Slurm says drained (or down), and squeue agrees when it was asked."""
    if not status["unavailable"]:
        return False
    if status["state"] not in _IDLE_ENOUGH or "completing" in status["flags"]:
        # draining, failing, or a job's processes still being cleaned up: not yet safe.
        return False
    return status["jobs_running"] in (0, None)


def plan_drain(status: dict[str, Any], change_id: str | None) -> str:
    """What a drain request does to a node in ``status``.

    ``drain``: in service, we drain it. ``ours``: already drained for this change (a resumed
    night). ``held``: another change's lease is on it: never touched. ``adopt``: drained by
    someone else, we lease it on top of their reason (kept, restored afterwards). ``other``:
    down or failed without a drain, left exactly as it is.
    """
    if not status["unavailable"]:
        return "drain"
    owner = lease_owner(status["reason"], change_id)
    if owner == "ours" and status["drain"]:
        return "ours"
    if owner == "k3fleet":
        return "held"
    if owner == "other" and status["drain"]:
        return "adopt"
    return "other"


def plan_resume(status: dict[str, Any], change_id: str | None) -> str:
    """``resume`` or ``restore`` (a reason we adopted) only when the lease is ours; else
    ``not_drained`` or ``not_ours``."""
    if not status["unavailable"]:
        return "not_drained"
    if lease_owner(status["reason"], change_id) == "ours":
        return "restore" if previous_reason(status["reason"]) is not None else "resume"
    return "not_ours"


class SlurmError(Exception):
    """A Slurm client command failed or printed something that could not be read."""


class SlurmNode:
    """One Slurm node, read and changed through a NodeReader's command runner."""

    def __init__(self, reader: NodeReader, node: str, query: str = "scontrol") -> None:
        self.reader = reader
        self.node = node
        self.query = query

    def _run(self, argv: list[str], what: str) -> CommandResult:
        res = self.reader.run(argv)
        if not res.ok:
            raise SlurmError("%s of node %s failed: %s" % (what, self.node, res.reason()))
        return res

    def status(self, with_jobs: bool = True) -> dict[str, Any]:
        """Current status; raises SlurmError with the command's own words when it cannot be read."""
        if self.query == "sinfo_json":
            res = self._run(sinfo_json_argv(), "sinfo --json")
            parse = status_from_sinfo_json
        else:
            res = self.reader.run(scontrol_show_node_argv(self.node))
            text = (res.stdout or "") + (res.stderr or "")
            if res.error is None and re.search(r"Node %s not found" % re.escape(self.node), text):
                raise SlurmError("Slurm has no node named %s (scontrol: Node %s not found)" % (self.node, self.node))
            if not res.ok:
                raise SlurmError("reading node %s failed: %s" % (self.node, res.reason()))
            parse = status_from_scontrol
        try:
            status = parse(res.stdout, self.node)
        except ValueError as exc:
            raise SlurmError("reading node %s: %s" % (self.node, exc)) from exc
        if with_jobs:
            ids = self.running_jobs()
            status["job_ids"] = ids
            status["jobs_running"] = len(ids)
        return status

    def running_jobs(self) -> list[str]:
        res = self._run(squeue_active_argv(self.node), "listing running jobs")
        try:
            return parse_job_ids(res.stdout)
        except ValueError as exc:
            raise SlurmError("listing running jobs of node %s: %s" % (self.node, exc)) from exc

    def drain(self, reason: str) -> None:
        self._run(drain_argv(self.node, reason), "draining")

    def resume(self) -> None:
        self._run(resume_argv(self.node), "resuming")

    def set_comment(self, comment: str) -> None:
        self._run(comment_argv(self.node, comment), "setting the comment")

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._run(scancel_argv(job_ids), "cancelling jobs %s" % ",".join(job_ids))
