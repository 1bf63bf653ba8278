# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes.
"""Options every k3fleet_*_info module shares, and the reader built from them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import DEFAULT_TIMEOUT, NodeReader

# The key every module puts its result under; the controller reads nothing else.
RESULT_KEY = "k3fleet"
# The same facts as one JSON text (k3fleet_host_info's facts_format=json; the audit play's form).
RESULT_JSON_KEY = "k3fleet_json"

READER_ARGS = dict(
    root=dict(type="path", default="/"),
    procfs=dict(type="path"),
    sysfs=dict(type="path"),
    path=dict(type="str"),
    timeout=dict(type="float", default=DEFAULT_TIMEOUT),
    budget=dict(type="float"),
)


def reader_spec(**options: Any) -> dict[str, Any]:
    """An info module's argument_spec: the reader options every one shares, then its own ``options``."""
    spec = dict(READER_ARGS)
    spec.update(options)
    return spec


def reader_from_params(params: Mapping[str, Any]) -> NodeReader:
    return NodeReader(root=params.get("root") or "/", path=params.get("path"),
                      procfs=params.get("procfs"), sysfs=params.get("sysfs"),
                      timeout=params.get("timeout") or DEFAULT_TIMEOUT, budget=params.get("budget"))


def checked_reader(module: Any, name: str) -> NodeReader:
    """The reader for module's options; fails the module first when its root prefix is not a directory,
    because under a missing root every file would read as absent, a false report."""
    root = module.params["root"]
    if not os.path.isdir(root):
        module.fail_json(msg="%s: root %r is not a directory on %s" % (name, root, os.uname()[1]))
    return reader_from_params(module.params)


class ReaderModule(AnsibleModule):
    """An info module: the shared reader options and its own ``options``, check mode supported because it
    only reads; it builds its reader from those options and exits with its facts under the one result key."""

    def __init__(self, **options: Any) -> None:
        super().__init__(argument_spec=reader_spec(**options), supports_check_mode=True)

    def reader(self) -> NodeReader:
        return reader_from_params(self.params)

    def checked_reader(self, name: str) -> NodeReader:
        return checked_reader(self, name)

    def exit_read(self, facts: Mapping[str, Any]) -> None:
        self.exit_json(changed=False, **{RESULT_KEY: facts})
