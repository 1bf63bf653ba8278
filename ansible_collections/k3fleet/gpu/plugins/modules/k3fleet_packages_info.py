#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_packages_info
short_description: Report installed NVIDIA driver packages, holds, DKMS and unattended upgrades
description:
  - Lists the installed NVIDIA driver, utils, compute, Fabric Manager, DKMS, kernel-module and
    nvidia-container-toolkit packages with their versions and hold state, through C(dpkg-query)
    (Debian, Ubuntu) or C(rpm) (RHEL and derivatives), whichever is on the node.
  - A package counts as held when C(apt-mark hold) marked it, or when C(dnf versionlock) lists it.
  - Derives the driver branch and version from the installed driver package, the Fabric Manager
    version, whether unattended upgrades are installed and on, whether the kernel module comes
    from DKMS and whether DKMS built it for the running kernel.
  - Output that cannot be read or understood makes RV(k3fleet.status) V(unknown) with a reason.
  - Read-only. Never reports a change.
version_added: "0.1.0"
seealso:
  - module: k3fleet.gpu.k3fleet_driver_info
  - module: k3fleet.gpu.k3fleet_fabricmanager_info
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read the NVIDIA packages of every GPU node
  k3fleet.gpu.k3fleet_packages_info:
  register: pkgs

- name: Warn when the driver package is not held
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }}: {{ item.name }} {{ item.version }} is not held"
  loop: "{{ pkgs.k3fleet.packages | selectattr('role', 'equalto', 'driver') | rejectattr('held') }}"
  loop_control:
    label: "{{ item.name }}"
"""

RETURN = r"""
k3fleet:
  description: Package facts (the PackageFacts section of the k3fleet host facts schema).
  returned: always
  type: dict
  contains:
    status:
      description: V(ok) when NVIDIA packages were listed, V(absent) when there is no package manager or no
        NVIDIA package, V(unknown) when the listing could not be read or understood.
      returned: always
      type: str
      sample: ok
    reason:
      description: Why the status is not V(ok), or what secondary fact could not be read.
      returned: always
      type: str
      sample: "dkms: command not found"
    manager:
      description: V(dpkg) or V(rpm).
      returned: always
      type: str
      sample: dpkg
    running_kernel:
      description: The running kernel release.
      returned: always
      type: str
      sample: 6.8.0-51-generic
    packages:
      description: Installed NVIDIA packages.
      returned: always
      type: list
      elements: dict
      sample:
        - name: nvidia-driver-580-server-open
          version: 580.95.05-0ubuntu1
          held: true
          role: driver
          branch: "580"
          flavour: open
      contains:
        name:
          description: Package name without the architecture qualifier.
          returned: always
          type: str
          sample: nvidia-driver-580-server-open
        version:
          description: Installed package version as the package manager prints it.
          returned: always
          type: str
          sample: 580.95.05-0ubuntu1
        held:
          description: Held by C(apt-mark hold) or locked by C(dnf versionlock).
          returned: always
          type: bool
          sample: true
        role:
          description: One of V(driver), V(utils), V(compute), V(fabricmanager), V(dkms), V(kernel_modules),
            V(toolkit), V(other).
          returned: always
          type: str
          sample: driver
        branch:
          description: Driver branch; the installed version decides over the name (transitional packages).
          returned: always
          type: str
          sample: "580"
        flavour:
          description: V(open) or V(proprietary) when the name decides it, else null.
          returned: always
          type: str
          sample: open
    driver_branch:
      description: Branch of the package that states the installed driver.
      returned: always
      type: str
      sample: "580"
    driver_version:
      description: Upstream version of that package.
      returned: always
      type: str
      sample: 580.95.05
    fabricmanager_version:
      description: Upstream version of the installed Fabric Manager package.
      returned: always
      type: str
      sample: 580.95.05
    unattended_upgrades_installed:
      description: unattended-upgrades (dpkg) or dnf-automatic (rpm) is installed.
      returned: always
      type: bool
      sample: true
    unattended_upgrades_enabled:
      description: APT::Periodic::Unattended-Upgrade is on (dpkg) or dnf-automatic.timer is enabled or active (rpm).
      returned: always
      type: bool
      sample: false
    dkms_used:
      description: An NVIDIA DKMS package is installed or C(dkms status) lists an nvidia module.
      returned: always
      type: bool
      sample: true
    dkms_modules:
      description: NVIDIA modules from C(dkms status).
      returned: always
      type: list
      elements: dict
      sample:
        - name: nvidia
          version: 580.95.05
          kernel: 6.8.0-45-generic
          arch: x86_64
          status: installed
    dkms_built_for_running_kernel:
      description: DKMS installed an nvidia module for the running kernel; null when DKMS is not used or unknown.
      returned: always
      type: bool
      sample: true
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import collect_packages


def main() -> None:
    module = ReaderModule()
    reader = module.checked_reader("k3fleet_packages_info")
    facts = guard("packages", collect_packages, reader)
    module.exit_read(facts)


if __name__ == "__main__":
    main()
