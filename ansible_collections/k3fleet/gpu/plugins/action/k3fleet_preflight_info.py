# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""k3fleet.gpu.k3fleet_preflight_info: Ansible's normal action; on the node each payload source compiles once.

plugins/plugin_utils/k3fleet_action.py says how; the module's arguments and result are unchanged.
"""

from __future__ import annotations

from ansible_collections.k3fleet.gpu.plugins.plugin_utils.k3fleet_action import K3fleetModuleAction


class ActionModule(K3fleetModuleAction):
    """Ansible's normal action for k3fleet_preflight_info (see K3fleetModuleAction)."""
