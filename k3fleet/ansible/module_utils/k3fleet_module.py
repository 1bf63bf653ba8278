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



def reader_from_params(params):
    return NodeReader(root=params.get("root") or "/", path=params.get("path"),
                      procfs=params.get("procfs"), sysfs=params.get("sysfs"),
                      timeout=params.get("timeout") or DEFAULT_TIMEOUT, budget=params.get("budget"))
