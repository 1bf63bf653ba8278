#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: k3fleet_journal
short_description: Append one stage transition of one host to a k3fleet change journal
description:
  - Appends one JSON line C({ts, run, change_id, host, stage, detail, snapshot}) to the journal file of a change
    run and flushes it to disk (fsync) before returning, so an interrupted night can be resumed or rolled back
    from the journal alone.
  - Run it on the controller (delegated to C(localhost)); concurrent writers (forks) are serialised with a file
    lock, and every line is written whole.
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
    choices: [snapshot, draining, drained, upgrading, rebooting, verifying, returned, failed, rolled_back]
  detail:
    description: Anything that explains the transition (versions, drain decision, failed task and message).
    type: raw
    default: {}
  snapshot:
    description:
      - The host's pre-change state (packages with versions and holds, services, scheduler state). Given with
        I(stage=snapshot); rollback restores from it.
    type: dict
attributes:
  check_mode:
    support: full
    description: In check mode nothing is written; the line that would be written is returned.
  diff_mode:
    support: none
  idempotent:
    support: none
    description: Every call appends a line; a journal is a history, not a state.
"""

EXAMPLES = r"""
- name: Journal that the host is being drained
  k3fleet_journal:
    path: "{{ k3fleet_journal }}"
    run: "{{ k3fleet_run_id }}"
    change_id: "{{ k3fleet_change_id }}"
    host: "{{ inventory_hostname }}"
    stage: draining
  delegate_to: localhost
  changed_when: false
"""

RETURN = r"""
k3fleet:
  description: The journal line, as written.
  returned: always
  type: dict
  contains:
    line:
      description: The JSON object appended.
      returned: always
      type: dict
      sample: {"ts": "2026-11-29T21:04:11.532Z", "run": "20261129T210000Z-change-1a2b3c", "change_id": "CHG-1042",
               "host": "gpu017", "stage": "draining", "detail": {}}
    written:
      description: False in check mode.
      returned: always
      type: bool
      sample: true
ansible_facts:
  description: C(k3fleet_stage), the stage just journaled.
  returned: always
  type: dict
  sample: {"k3fleet_stage": "draining"}
"""

import datetime
import fcntl
import json
import os

from ansible.module_utils.basic import AnsibleModule

try:
    from ansible.module_utils.k3fleet_module import RESULT_KEY
except ImportError:  # imported from the controller package (unit tests)
    from k3fleet.ansible.module_utils.k3fleet_module import RESULT_KEY

STAGES = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned", "failed",
          "rolled_back"]


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def append_line(path, line):
    """Append one whole line and make it durable: file data, and the directory entry when the file is new."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory)
    created = not os.path.exists(path)
    data = (json.dumps(line, sort_keys=False, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # Forks write for different hosts at once; a snapshot line can exceed PIPE_BUF.
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if created:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    run=dict(type="str", required=True),
    change_id=dict(type="str", required=True),
    host=dict(type="str", required=True),
    stage=dict(type="str", required=True, choices=STAGES),
    detail=dict(type="raw", default={}),
    snapshot=dict(type="dict"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    line = {"ts": now_utc(), "run": p["run"], "change_id": p["change_id"], "host": p["host"], "stage": p["stage"],
            "detail": p["detail"] if p["detail"] is not None else {}}
    if p["snapshot"] is not None:
        line["snapshot"] = p["snapshot"]
    written = False
    if not module.check_mode:
        try:
            append_line(p["path"], line)
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot append stage %s of host %s to journal %s: %s" % (
                p["stage"], p["host"], p["path"], exc.strerror or exc))
        written = True
    module.exit_json(changed=written, ansible_facts={"k3fleet_stage": p["stage"]},
                     **{RESULT_KEY: {"line": line, "written": written}})


if __name__ == "__main__":
    main()
