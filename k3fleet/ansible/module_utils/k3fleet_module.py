# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes.
"""Options every k3fleet_*_info module shares, and the reader built from them."""

from __future__ import absolute_import, division, print_function

try:
    from ansible.module_utils.k3fleet_cmd import DEFAULT_TIMEOUT, NodeReader
except ImportError:  # imported from the controller package (unit tests, lab)
    from k3fleet.ansible.module_utils.k3fleet_cmd import DEFAULT_TIMEOUT, NodeReader

__metaclass__ = type

# The key every module puts its result under; the controller reads nothing else.
RESULT_KEY = "k3fleet"

READER_ARGS = dict(
    root=dict(type="path", default="/"),
    procfs=dict(type="path"),
    sysfs=dict(type="path"),
    path=dict(type="str"),
    timeout=dict(type="float", default=DEFAULT_TIMEOUT),
    budget=dict(type="float"),
)

READER_DOC = r"""
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


def reader_from_params(params):
    return NodeReader(root=params.get("root") or "/", path=params.get("path"),
                      procfs=params.get("procfs"), sysfs=params.get("sysfs"),
                      timeout=params.get("timeout") or DEFAULT_TIMEOUT, budget=params.get("budget"))
