#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_journal
short_description: Append one stage transition of one host to a k3fleet change journal
description:
  - Appends one JSON line C({ts, run, change_id, host, stage, detail, snapshot}) to the journal file of a change
    run and flushes it to disk (fsync) before returning, so an interrupted night can be resumed or rolled back
    from the journal alone.
  - Run it on the controller (delegated to C(localhost)); concurrent writers (forks) are serialised with a file
    lock, and every line is written whole. A line torn by a writer that died mid-line is terminated before the
    new line is written, never merged with it; the result reports where it starts (docs/change-night.md).
  - With I(gate), the line is written only when the change may take this host out of service now, that is when
    fewer than I(gate.max_unavailable) of the change's nodes are out, the failures so far are within
    I(gate.failure_budget) and the canary did not fail. The module waits for a slot while other hosts of the
    change hold them all. Decided and written under the journal's lock, so two hosts never take the last slot
    together.
  - Also sets the fact C(k3fleet_stage) on the host the task runs for, so later tasks know how far it got.
version_added: "0.1.0"
author:
  - k3fleet maintainers
options:
  path:
    description: The journal file (JSON lines). Created with its directory when missing.
    type: path
    required: true
  run:
    description: The run id (the run directory's name).
    type: str
    required: true
  change_id:
    description: The change id the run works for.
    type: str
    required: true
  host:
    description: The inventory host the transition is about.
    type: str
    required: true
  stage:
    description: The stage the host has reached.
    type: str
    required: true
    choices: [snapshot, draining, drained, upgrading, rebooting, verifying, returned, failed, rolled_back, held]
  detail:
    description: Anything that explains the transition (versions, drain decision, failed task and message).
    type: raw
    default: {}
  snapshot:
    description:
      - The host's pre-change state (packages with versions and holds, services, scheduler state). Given with
        I(stage=snapshot); rollback restores from it.
    type: dict
  gate:
    description:
      - Take a slot before writing the line (see the description). Keys C(max_unavailable) (int, at least 1),
        C(failure_budget) (int), C(canary) (host or null), C(wait_timeout) (seconds to wait for a slot),
        C(poll) (seconds between two looks, default 2).
      - When no slot is granted nothing is written; the result says why (C(k3fleet.granted) false).
    type: dict
attributes:
  check_mode:
    support: full
    description: In check mode nothing is written and every slot is granted; the line that would be written is returned.
  diff_mode:
    support: none
  idempotent:
    support: none
    description: Every call appends a line; a journal is a history, not a state.
"""

EXAMPLES = r"""
- name: Journal that the host is being drained
  k3fleet.gpu.k3fleet_journal:
    path: "{{ k3fleet_journal }}"
    run: "{{ k3fleet_run_id }}"
    change_id: "{{ k3fleet_change_id }}"
    host: "{{ inventory_hostname }}"
    stage: draining
  delegate_to: localhost
  changed_when: false

- name: Take a slot and journal the snapshot
  k3fleet.gpu.k3fleet_journal:
    path: "{{ k3fleet_journal }}"
    run: "{{ k3fleet_run_id }}"
    change_id: "{{ k3fleet_change_id }}"
    host: "{{ inventory_hostname }}"
    stage: snapshot
    snapshot: "{{ snapshot }}"
    gate: {max_unavailable: 2, failure_budget: 0, canary: gpu017, wait_timeout: 7200}
  delegate_to: localhost
  register: slot
"""

RETURN = r"""
k3fleet:
  description: The journal line, as written.
  returned: always
  type: dict
  contains:
    line:
      description: The JSON object appended (or that would have been).
      returned: always
      type: dict
      sample: {"ts": "2026-11-29T21:04:11.532Z", "run": "20261129T210000Z-change-1a2b3c", "change_id": "CHG-1042",
               "host": "gpu017", "stage": "draining", "detail": {}}
    written:
      description: False in check mode and when no slot was granted.
      returned: always
      type: bool
      sample: true
    granted:
      description: Whether the host may go out of service (always true without I(gate)).
      returned: always
      type: bool
      sample: true
    why:
      description: Why the slot was granted or refused (empty without I(gate)).
      returned: always
      type: str
      sample: "2 of 2 node(s) out of service"
    waited_s:
      description: Seconds spent waiting for a slot.
      returned: always
      type: float
      sample: 0.0
    torn_tail:
      description: The torn last line this append terminated first (byte offset and length), or null.
      returned: always
      type: dict
      sample: {"offset": 5120, "length": 83}
ansible_facts:
  description: C(k3fleet_stage), the stage just journaled (unchanged when no slot was granted).
  returned: when written or in check mode
  type: dict
  sample: {"k3fleet_stage": "draining"}
"""

import datetime
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_journal_format import STAGES, append_line, take_slot
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    run=dict(type="str", required=True),
    change_id=dict(type="str", required=True),
    host=dict(type="str", required=True),
    stage=dict(type="str", required=True, choices=list(STAGES)),
    detail=dict(type="raw", default={}),
    snapshot=dict(type="dict"),
    gate=dict(type="dict"),
)


def _check_gate(module: AnsibleModule, gate: Any) -> None:
    try:
        limit = int(gate.get("max_unavailable"))
        budget = int(gate.get("failure_budget") or 0)
        wait = float(gate.get("wait_timeout") or 0)
        poll = float(gate.get("poll") or 2.0)
    except (TypeError, ValueError):
        module.fail_json(msg="gate needs integer max_unavailable and failure_budget and numeric wait_timeout/poll, "
                             "got %r" % (gate,))
    if limit < 1 or budget < 0 or wait < 0 or poll <= 0:
        module.fail_json(msg="gate: max_unavailable must be at least 1, failure_budget and wait_timeout 0 or more, "
                             "poll positive; got %r" % (gate,))


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    line: dict[str, Any] = {"ts": now_utc(), "run": p["run"], "change_id": p["change_id"], "host": p["host"],
                            "stage": p["stage"], "detail": p["detail"] if p["detail"] is not None else {}}
    if p["snapshot"] is not None:
        line["snapshot"] = p["snapshot"]
    result: dict[str, Any] = {"line": line, "written": False, "granted": True, "why": "", "waited_s": 0.0,
                              "torn_tail": None}
    if p["gate"] is not None:
        _check_gate(module, p["gate"])
    if not module.check_mode:
        try:
            if p["gate"] is not None:
                granted, why, torn, waited, written = take_slot(p["path"], line, p["gate"], stamp=now_utc)
                result.update(line=written, granted=granted, why=why, waited_s=waited)
            else:
                torn = append_line(p["path"], line)
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot append stage %s of host %s to journal %s: %s" % (
                p["stage"], p["host"], p["path"], exc.strerror or exc))
        result["written"] = result["granted"]
        result["torn_tail"] = torn
        if torn:
            module.warn("journal %s: the torn line at byte %d (%d bytes) was terminated before this append" % (
                p["path"], torn["offset"], torn["length"]))
    kwargs = {"changed": result["written"], RESULT_KEY: result}
    if result["granted"]:
        kwargs["ansible_facts"] = {"k3fleet_stage": p["stage"]}
    module.exit_json(**kwargs)


if __name__ == "__main__":
    main()
