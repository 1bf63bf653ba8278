# -*- coding: utf-8 -*-
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""What every module built on k3fleet_module's reader shares, documented once: the options
(k3fleet_module.READER_ARGS), the single result key, the authors, and the read-only attributes (the
way community.docker's doc_fragments/attributes.py documents attributes once).

A module's own ``attributes`` entries override these: k3fleet_rollback_kit, which writes its kit,
declares all three itself. ``notes`` and ``author`` entries of a module add to these.
"""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  root:
    description:
      - Prefix under which node files are read (C(/etc/...), C(/proc/...), C(/sys/...)).
      - Use it for a containerised view of the host (for example C(/host)) or a simulated node.
    type: path
    default: /
  procfs:
    description: Where the node's C(/proc) is mounted. Defaults to I(root)/proc.
    type: path
  sysfs:
    description: Where the node's C(/sys) is mounted. Defaults to I(root)/sys.
    type: path
  path:
    description:
      - Search path for the commands the collectors run (C(nvidia-smi), C(dpkg-query), ...).
      - Defaults to the module's own C(PATH). Commands always run with C(LC_ALL=C).
    type: str
  timeout:
    description: Seconds before any single command is killed and reported as timed out.
    type: float
    default: 20
  budget:
    description:
      - Seconds for all commands of this module together; commands not started in time are reported as
        not run, and the module returns what it has rather than being killed by a task timeout.
    type: float
attributes:
  check_mode:
    description: Runs unchanged in check mode; it only reads.
    support: full
  diff_mode:
    description: Nothing is changed, so there is no diff.
    support: none
  idempotent:
    description: Reading the same node twice gives the same report and never a change.
    support: full
notes:
  - The module result is under the single key RV(k3fleet); the k3fleet controller reads nothing else.
author:
  - k3fleet contributors
"""
