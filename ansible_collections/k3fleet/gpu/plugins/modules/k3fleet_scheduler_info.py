#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_scheduler_info
short_description: Report this node's Slurm state, drain reason and running jobs
description:
  - When C(scontrol) is on the search path, reads C(scontrol show node NODE --oneliner) and returns the
    node state normalised to C(idle), C(mixed), C(allocated), C(draining) (drain set, jobs still
    running), C(drained), C(down), ..., the drain reason with its C([user@time]) stamp, and the number
    of running jobs from C(squeue).
  - Without C(scontrol) the node is reported with kind C(none) and status C(absent). Kubernetes node
    state is read by the controller from the API, not here.
  - Never changes anything. A fact that cannot be read is reported as C(unknown) with a reason, never
    as a task failure.
version_added: "0.1.0"
options:
  node:
    description:
      - Slurm NodeName of this host. Defaults to the short host name from C(/etc/hostname) under I(root).
      - Set it where the Slurm NodeName differs from the host name.
    type: str
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read the Slurm state of each GPU node
  k3fleet.gpu.k3fleet_scheduler_info:
  register: sched

- name: Use the Slurm NodeName where it differs from the host name
  k3fleet.gpu.k3fleet_scheduler_info:
    node: "{{ slurm_node_name }}"
  register: sched
"""

RETURN = r"""
k3fleet:
  description: The collected facts, the only key the k3fleet controller reads.
  returned: always
  type: dict
  contains:
    scheduler:
      description: Scheduler facts (schema C(SchedulerFacts)).
      returned: always
      type: dict
      contains:
        status:
          description: C(ok), C(unknown) (see I(reason)) or C(absent) (no C(scontrol)).
          returned: always
          type: str
          sample: ok
        kind:
          description: C(slurm), or C(none) when no scheduler client is installed.
          returned: always
          type: str
          sample: slurm
        node:
          description: The Slurm NodeName that was queried.
          returned: always
          type: str
          sample: gpu010
        state:
          description: Normalised node state.
          returned: when status is ok
          type: str
          sample: drained
        reason:
          description: The Slurm drain or down reason when status is C(ok), else why the status is not C(ok).
          returned: always
          type: str
          sample: "health_ps___blocked [root@2026-04-29T03:06:18]"
        jobs_running:
          description: Running jobs on the node; null when squeue failed.
          returned: when status is ok
          type: int
          sample: 0
    commands:
      description: Every command run, with exit status and duration, for the evidence package.
      returned: always
      type: list
      elements: dict
      sample:
        - argv: [scontrol, show, node, gpu010, --oneliner]
          rc: 0
          error: null
          stderr: ""
          duration: 0.03
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import collect_scheduler


def main() -> None:
    module = ReaderModule(node=dict(type="str"))
    node = (module.params["node"] or "").strip() or None
    if node is not None and any(ch.isspace() or ch == "," for ch in node):
        module.fail_json(msg="node must be one Slurm NodeName, got %r" % module.params["node"])
    reader = module.reader()
    scheduler = guard("scheduler", collect_scheduler, reader, node=node)
    module.exit_read({"scheduler": scheduler, "commands": reader.commands})


if __name__ == "__main__":
    main()
