#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_fabricmanager_info
short_description: Report NVSwitch presence, the Fabric Manager unit and its version against the driver
description:
  - Counts NVSwitches from C(/proc/driver/nvidia-nvswitch/devices), or from C(/dev/nvidia-nvswitch<N>)
    device nodes when that directory is missing. Fabric Manager is required when an NVSwitch is present.
  - Reads C(nvidia-fabricmanager.service) from C(systemctl show) (installed, active, enabled).
  - Takes the Fabric Manager version from its package, else from C(nv-fabricmanager --version), and
    compares it exactly with the loaded driver version (Fabric Manager refuses to run otherwise).
  - Runs the driver and package collectors itself for that comparison (the driver part through
    C(nvidia-smi), not NVML).
  - Output that cannot be read or understood makes RV(k3fleet.status) V(unknown) with a reason; a node
    without systemd reports the unit states as unknown.
  - Read-only. Never reports a change.
version_added: "0.1.0"
seealso:
  - module: k3fleet.gpu.k3fleet_driver_info
  - module: k3fleet.gpu.k3fleet_packages_info
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read Fabric Manager state of every GPU node
  k3fleet.gpu.k3fleet_fabricmanager_info:
  register: fm

- name: Fabric Manager must match the driver on NVSwitch systems
  ansible.builtin.assert:
    that:
      - not fm.k3fleet.required or fm.k3fleet.version_matches_driver
    fail_msg: >-
      {{ inventory_hostname }}: Fabric Manager {{ fm.k3fleet.version }} does not match driver
      {{ fm.k3fleet.driver_version }}; install nvidia-fabricmanager at exactly the driver version
"""

RETURN = r"""
k3fleet:
  description: Fabric Manager facts (the FabricManagerFacts section of the k3fleet host facts schema).
  returned: always
  type: dict
  contains:
    status:
      description: V(ok), V(absent) when Fabric Manager is not installed at all, V(unknown) when NVSwitch
        presence, the unit state or the installed version could not be established.
      returned: always
      type: str
      sample: ok
    reason:
      description: Why the status is not V(ok).
      returned: always
      type: str
      sample: "nvidia-fabricmanager.service state unknown: systemd not running: System has not been booted with
        systemd as init system (PID 1). Can't operate."
    nvswitch_present:
      description: Whether the node has NVSwitches; null when it cannot be told (driver not loaded).
      returned: always
      type: bool
      sample: true
    nvswitch_count:
      description: Number of NVSwitches.
      returned: always
      type: int
      sample: 4
    required:
      description: Fabric Manager is required (an NVSwitch is present).
      returned: always
      type: bool
      sample: true
    unit:
      description: State of nvidia-fabricmanager.service.
      returned: always
      type: dict
      sample:
        installed: true
        active: active
        enabled: enabled
      contains:
        installed:
          description: The unit file exists (LoadState is not V(not-found)).
          returned: always
          type: bool
          sample: true
        active:
          description: ActiveState (V(active), V(inactive), V(failed), V(activating)).
          returned: always
          type: str
          sample: failed
        enabled:
          description: UnitFileState (V(enabled), V(disabled), V(masked), V(static)), or V(not-found).
          returned: always
          type: str
          sample: enabled
    version:
      description: Installed Fabric Manager version (upstream part).
      returned: always
      type: str
      sample: 580.82.07
    driver_version:
      description: Loaded driver version it is compared with (kernel module, else NVML/nvidia-smi, else package).
      returned: always
      type: str
      sample: 580.95.05
    version_matches_driver:
      description: Exact equality of the two versions; null when either is unknown.
      returned: always
      type: bool
      sample: false
    imex:
      description:
        - IMEX as the audit reads it (the nvidia-imex unit, config, node list, channels and C(nvidia-imex-ctl -N)
          domain state; C(status=absent) where IMEX is not installed). The change night's verify reads it again
          after the reboot (docs/change-night.md "Verify steps").
      returned: always
      type: dict
      sample: {"status": "absent", "reason": "IMEX not installed"}
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import collect_driver
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_fabricmanager import collect_fabricmanager
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_imex import collect_imex
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import collect_packages


def main() -> None:
    module = ReaderModule()
    reader = module.checked_reader("k3fleet_fabricmanager_info")
    driver = guard("driver", collect_driver, reader, use_nvml=False)
    packages = guard("packages", collect_packages, reader)
    facts = guard("fabricmanager", collect_fabricmanager, reader, driver=driver, packages=packages)
    facts = dict(facts, imex=guard("imex", collect_imex, reader))
    module.exit_read(facts)


if __name__ == "__main__":
    main()
