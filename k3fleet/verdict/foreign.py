"""Other tools' health evidence as the audit's findings: gpud's states and events, and ``dcgmi health -c -j``
(docs/facts.md section 14, "Other tools' evidence"). Pure: no I/O; the caller reads the file.

A team that already runs gpud or DCGM health watches keeps its daemon and gets one verdict: each
unhealthy state, event or incident becomes a finding under the check id the audit uses for the same
fault (an Xid is ``gpu.xid``, a PCIe replay incident ``gpu.pcie_replay``), with the tool, its component
or system and its own words in the evidence. What has no audit check of its own is ``external.health``.

Public API::

    sniff_foreign(data) -> "gpud_states" | "gpud_events" | "dcgm_health" | None
    foreign_findings(kind, data, host, target) -> [Finding]

Severity: a failure (gpud Unhealthy, a Fatal or Critical gpud event, a DCGM Failure) has the severity
of the check it maps to; a warning (gpud Degraded, a Warning event, a DCGM Warning) is a warning.
Healthy states, Info events and gpud's Initializing say nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k3fleet.models.findings import Finding, Severity
from k3fleet.models.target import Target
from k3fleet.verdict.check import Check, check, registered, render, template_values

CHECKS: tuple[Check, ...] = (
    check("external.health", "Another health tool's finding",
          "gpud or DCGM health watches on the node report a fault that no audit check covers (InfoROM, SM, "
          "PMU, the NCCL kernel log, a custom plugin).",
          "error",
          "Read the tool's own message in the evidence and follow its suggested action; re-run the tool "
          "(gpud states, dcgmi health -c) after the repair.",
          source="docs/facts.md section 14 (gpud api/v1 HealthState and Event; DCGM dcgmi/Health.cpp)"),
)

# gpud component -> the audit's check for the same fault (component names: leptonai/gpud
# components/accelerator/nvidia/*/component.go).
GPUD_COMPONENTS: dict[str, str] = {
    "accelerator-nvidia-error-xid": "gpu.xid",
    "accelerator-nvidia-error-sxid": "gpu.fabric_health",
    "accelerator-nvidia-ecc": "gpu.ecc",
    "accelerator-nvidia-remapped-rows": "gpu.remapped_rows",
    "accelerator-nvidia-nvlink": "gpu.nvlink",
    "accelerator-nvidia-infiniband": "rdma.port_state",
    "accelerator-nvidia-peermem": "rdma.peermem",
    "accelerator-nvidia-fabric-manager": "fabricmanager.active",
    "accelerator-nvidia-gpu-counts": "gpu.count",
    "accelerator-nvidia-persistence-mode": "gpu.persistence_mode",
    "accelerator-nvidia-hw-slowdown": "gpu.throttle",
    "accelerator-nvidia-clock-speed": "gpu.throttle",
    "accelerator-nvidia-temperature": "gpu.throttle",
    "accelerator-nvidia-power": "gpu.throttle",
}
# gpud's repair action for an Xid the application causes (api/v1 RepairActionTypeCheckUserAppAndGPU).
GPUD_APP_ACTION = "CHECK_USER_APP_AND_GPU"

# DCGM health system, as dcgmi names it (dcgmi/Health.cpp HelperSystemToString) -> the audit's check.
DCGM_SYSTEMS: dict[str, str] = {
    "PCIe system": "gpu.pcie_replay",
    "NVLINK system": "gpu.nvlink_errors",
    "Memory system": "gpu.ecc",
    "Thermal system": "gpu.throttle",
    "Power system": "gpu.throttle",
    "ConnectX system": "rdma.port_counters",
}
DCGM_REPORT = "Health Monitor Report"
DCGM_OVERALL = "Overall Health"

_FAILURE = {"Unhealthy", "Failure", "Fatal", "Critical"}
_WARNING = {"Degraded", "Warning"}


class ForeignError(ValueError):
    """The data is not the tool output it was taken for; the message says what is wrong."""


def sniff_foreign(data: Any) -> str | None:
    """Which tool output parsed JSON is: gpud's ``/v1/states`` or ``/v1/events`` list, or dcgmi's
    health report; None for anything else."""
    if isinstance(data, dict):
        header = data.get("header")
        body = data.get("body")
        if (isinstance(header, list) and DCGM_REPORT in header) or (isinstance(body, dict) and DCGM_OVERALL in body):
            return "dcgm_health"
        return None
    if isinstance(data, list) and data and all(isinstance(x, dict) and "component" in x for x in data):
        if all(isinstance(x.get("states"), list) for x in data):
            return "gpud_states"
        if all(isinstance(x.get("events"), list) for x in data):
            return "gpud_events"
    return None


def foreign_findings(kind: str, data: Any, host: str, target: Target) -> list[Finding]:
    """The findings in one tool output of ``kind`` (as :func:`sniff_foreign` names it), for ``host``."""
    if kind == "gpud_states":
        items = _gpud_states(data)
    elif kind == "gpud_events":
        items = _gpud_events(data)
    elif kind == "dcgm_health":
        items = _dcgm_health(data)
    else:
        raise ForeignError(f"not a health tool's output kind: {kind!r}")
    values = template_values(target)
    out: list[Finding] = []
    for check_id, level, message, evidence in items:
        entry = registered(check_id)
        severity: Severity = entry.severity if level == "fail" else "warning"
        out.append(Finding(check_id=check_id, severity=severity, kind="fail", host=host, message=message,
                           evidence=evidence, fix=render(entry.fix, values)))
    return out


_Item = tuple[str, str, str, dict[str, Any]]


def _level(health: Any) -> str | None:
    if health in _FAILURE:
        return "fail"
    if health in _WARNING:
        return "warn"
    return None


def _text(value: Any, limit: int = 400) -> str:
    """One line of a tool's own words, bounded."""
    text = " ".join(str(value).split()) if value is not None else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _gpud_check(component: str, actions: list[str]) -> str:
    check_id = GPUD_COMPONENTS.get(component, "external.health")
    if check_id == "gpu.xid" and actions and set(actions) == {GPUD_APP_ACTION}:
        # gpud asks to check the application first: the audit's application Xid, apart from node faults.
        return "gpu.xid_application"
    return check_id


def _actions(state: Mapping[str, Any]) -> list[str]:
    suggested = state.get("suggested_actions")
    acts = suggested.get("repair_actions") if isinstance(suggested, Mapping) else None
    return [str(a) for a in acts] if isinstance(acts, list) else []


def _gpud_items(data: Any, what: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(component, entry) for every entry of gpud's ``what`` ("states" or "events") list per component."""
    if not isinstance(data, list):
        raise ForeignError(f"gpud {what}: a JSON list of components expected")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for comp in data:
        if not isinstance(comp, Mapping):
            continue
        component = str(comp.get("component") or "?")
        entries = comp.get(what)
        if not isinstance(entries, list):
            raise ForeignError(f"gpud {what}: component {component} has no {what} list")
        out += [(component, e) for e in entries if isinstance(e, Mapping)]
    return out


def _gpud_states(data: Any) -> list[_Item]:
    """``GET /v1/states``: ``[{component, states: [{name, health, reason, error, suggested_actions}]}]``."""
    items: list[_Item] = []
    for component, state in _gpud_items(data, "states"):
        health = state.get("health")
        level = _level(health)
        if level is None:
            continue
        actions = _actions(state)
        why = _text(state.get("reason") or state.get("error") or "no reason given")
        said = f" (gpud suggests {', '.join(actions)})" if actions else ""
        items.append((_gpud_check(component, actions), level, f"gpud {component}: {health}: {why}{said}",
                      {"source": "gpud", "component": component, "name": state.get("name"), "health": health,
                       "reason": _text(state.get("reason")), "error": _text(state.get("error")),
                       "repair_actions": actions}))
    return items


def _gpud_events(data: Any) -> list[_Item]:
    """``GET /v1/events``: ``[{component, startTime, endTime, events: [{time, name, type, message}]}]``."""
    items: list[_Item] = []
    for component, ev in _gpud_items(data, "events"):
        level = _level(ev.get("type"))
        if level is None:
            continue
        message = _text(ev.get("message") or ev.get("name") or "no message")
        items.append((GPUD_COMPONENTS.get(component, "external.health"), level,
                      f"gpud {component} event at {ev.get('time') or '?'}: {ev.get('type')}: {message}",
                      {"source": "gpud", "component": component, "name": ev.get("name"), "type": ev.get("type"),
                       "time": ev.get("time"), "message": message}))
    return items


def _children(node: Any) -> Mapping[str, Any]:
    kids = node.get("children") if isinstance(node, Mapping) else None
    return kids if isinstance(kids, Mapping) else {}


def _dcgm_health(data: Any) -> list[_Item]:
    """``dcgmi health -c -j``: ``body`` holds ``Overall Health`` and, per entity group (``GPU``...), each
    entity's health with ``Errors`` per system, each system's health in ``value`` and its messages in
    ``overflow`` (the layout dcgmi/DcgmiOutput.cpp writes)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("body"), Mapping):
        raise ForeignError("dcgmi health: no 'body' object (give the output of dcgmi health -c -j)")
    body = data["body"]
    overall = body.get(DCGM_OVERALL)
    overall_value = overall.get("value") if isinstance(overall, Mapping) else None
    items: list[_Item] = []
    for group, node in body.items():
        if group == DCGM_OVERALL:
            continue
        for entity, ent in _children(node).items():
            errors = _children(ent).get("Errors")
            for system, sysnode in _children(errors).items():
                if not isinstance(sysnode, Mapping):
                    continue
                health = sysnode.get("value")
                level = _level(health)
                if level is None:
                    continue
                parts = sysnode.get("overflow")
                message = _text(" ".join(str(p) for p in parts) if isinstance(parts, list) else "no message")
                check_id = DCGM_SYSTEMS.get(str(system), "external.health")
                items.append((check_id, level, f"DCGM health {group} {entity} {system}: {health}: {message}",
                              {"source": "dcgm", "entity_group": group, "entity": entity, "system": system,
                               "health": health, "message": message, "overall": overall_value}))
    if not items and _level(overall_value) is not None:
        items.append(("external.health", _level(overall_value) or "fail",
                      f"DCGM health: overall {overall_value} without an incident named",
                      {"source": "dcgm", "overall": overall_value}))
    return items
