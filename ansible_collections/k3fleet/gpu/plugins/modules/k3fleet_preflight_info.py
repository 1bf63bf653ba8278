#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_preflight_info
short_description: Read whether a GPU node may go through the driver change, right before its drain
description:
  - Lists the processes that hold C(/dev/nvidia*) and sorts them into the services the night stops
    (nvidia-persistenced, DCGM's nv-hostengine, nv-fabricmanager), the scheduler's jobs (the drain waits for
    them) and the others, which keep the driver module from being unloaded.
  - Reads the MIG GPU instances, the free space under O(space_paths), the kernel headers of the running
    kernel (needed when O(dkms)), whether C(apt-cache madison) offers every package of O(packages) at its
    version, and the NVIDIA Container Toolkit's version (C(nvidia-ctk --version)).
  - Judges them against the policy (O(min_free_mb), O(min_container_toolkit), O(allow_mig)) and returns the
    problems that block the host, each with its check, what was found and the fix.
  - Read-only. Never reports a change.
version_added: "0.1.0"
options:
  packages:
    description: The packages the change installs, each C(NAME=UPSTREAM_VERSION).
    type: list
    elements: str
    default: []
  space_paths:
    description: Where the packages are downloaded and unpacked and where DKMS builds.
    type: list
    elements: path
    default: [/var/cache/apt/archives, /var/lib/dkms, /usr/lib/modules]
  min_free_mb:
    description: Free space each of O(space_paths) needs.
    type: int
    default: 2048
  dkms:
    description: DKMS builds the module on this node, so the running kernel's headers must be there.
    type: bool
    default: false
  min_container_toolkit:
    description: The oldest NVIDIA Container Toolkit allowed when one is installed; empty for no check.
    type: str
    default: ""
  min_container_toolkit_source:
    description: Why, shown in the problem.
    type: str
    default: ""
  allow_mig:
    description: Let MIG GPU instances pass (the reboot destroys them).
    type: bool
    default: false
seealso:
  - module: k3fleet.gpu.k3fleet_packages_info
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read whether the node may be changed
  k3fleet.gpu.k3fleet_preflight_info:
    packages: [nvidia-driver-580-server=580.95.05]
    dkms: false
  register: preflight

- name: Stop a node that may not
  ansible.builtin.fail:
    msg: "{{ preflight.k3fleet.problems | map(attribute='found') | join('; ') }}"
  when: preflight.k3fleet.problems | length > 0
"""

RETURN = r"""
k3fleet:
  description: What was read and what blocks the host.
  returned: always
  type: dict
  contains:
    holders:
      description: Processes with an open C(/dev/nvidia*) (pid, comm, devices, cgroup, kind V(service), V(job) or
        V(other)); null when C(/proc) cannot be listed.
      returned: always
      type: list
      elements: dict
      sample:
        - {pid: 812, comm: nvidia-persistenced, devices: [/dev/nvidiactl], cgroup: "0::/system.slice/x", kind: service}
    services:
      description: The units of the services that hold the GPUs, with their ActiveState.
      returned: always
      type: list
      elements: dict
      sample: [{unit: nvidia-persistenced.service, active: active}]
    mig:
      description: MIG GPU instances by GPU.
      returned: always
      type: dict
      sample: {}
    disk:
      description: Per path, the free MB of its filesystem.
      returned: always
      type: list
      elements: dict
      sample: [{path: /var/lib/dkms, measured: /var/lib, available_mb: 40211, reason: null}]
    kernel:
      description: The running kernel release.
      returned: always
      type: str
      sample: 6.8.0-51-generic
    headers:
      description: The running kernel's build directory and whether it is there.
      returned: always
      type: dict
      sample: {path: /lib/modules/6.8.0-51-generic/build, present: true}
    dkms:
      description: O(dkms) as given.
      returned: always
      type: bool
      sample: false
    repository:
      description: The packages asked for, those not offered at their version, and what is offered.
      returned: always
      type: dict
      sample:
        wanted: [[nvidia-driver-580-server, 580.95.05]]
        missing: []
        offered: ["nvidia-driver-580-server 580.95.05-0ubuntu1"]
    toolkit:
      description: The NVIDIA Container Toolkit's version and the line it came from; null when not installed.
      returned: always
      type: dict
      sample: {version: 1.17.8, line: "NVIDIA Container Toolkit CLI version 1.17.8"}
    problems:
      description: What blocks the host (check, found, fix); empty when it may be changed.
      returned: always
      type: list
      elements: dict
      sample: []
    reasons:
      description: What could not be read.
      returned: always
      type: list
      elements: str
      sample: []
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_preflight import collect, judge


def main() -> None:
    module = ReaderModule(
        packages=dict(type="list", elements="str", default=[]),
        space_paths=dict(type="list", elements="path", default=["/var/cache/apt/archives", "/var/lib/dkms",
                                                                "/usr/lib/modules"]),
        min_free_mb=dict(type="int", default=2048),
        dkms=dict(type="bool", default=False),
        min_container_toolkit=dict(type="str", default=""),
        min_container_toolkit_source=dict(type="str", default=""),
        allow_mig=dict(type="bool", default=False),
    )
    reader = module.checked_reader("k3fleet_preflight_info")
    p = module.params
    packages = []
    for item in p["packages"]:
        name, sep, version = item.partition("=")
        if not sep or not name or not version:
            module.fail_json(msg="k3fleet_preflight_info: package %r is not NAME=VERSION" % item)
        packages.append([name, version.rstrip("-*")])
    facts = collect(reader, packages, p["space_paths"], p["dkms"])
    facts["problems"] = judge(facts, {"min_free_mb": p["min_free_mb"], "packages": packages,
                                      "min_container_toolkit": p["min_container_toolkit"],
                                      "min_container_toolkit_source": p["min_container_toolkit_source"],
                                      "allow_mig": p["allow_mig"]})
    module.exit_read(facts)


if __name__ == "__main__":
    main()
