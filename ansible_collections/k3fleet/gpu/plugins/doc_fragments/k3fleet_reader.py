# -*- coding: utf-8 -*-
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""Options every k3fleet_*_info module shares (k3fleet_module.READER_ARGS), documented once."""

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
"""
