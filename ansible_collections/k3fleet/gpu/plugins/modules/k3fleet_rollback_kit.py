#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_rollback_kit
short_description: Keep the exact driver packages a node runs on the node itself, with their sha256
description:
  - With I(state=present), fetches every package of I(packages) (the driver-branch packages of a change's
    snapshot, at the versions installed now) into I(directory), one C(.deb) each, and records each file's name,
    version, architecture, hold, size and sha256 in C(kit.json) there (written whole, fsync'd). A rollback installs
    from these files when the repository no longer offers the versions (docs/change-night.md "Rollback kit").
  - Each file comes from the kit itself when it is already there with its recorded sha256, else from apt's cache
    (C(/var/cache/apt/archives)) when the file there is that exact package, else from the node's repositories
    (C(apt-get download NAME:ARCH=VERSION)). C(dpkg-deb --field) must name the package, version and architecture
    asked for.
  - Fails, naming each package and apt's own words, when any package cannot be had; the kit's C(kit.json) is then
    not written, so an incomplete kit is never taken for a complete one.
  - With I(state=absent), removes I(directory) and everything in it.
  - Debian and Ubuntu (dpkg and apt) only; a node without C(dpkg-deb) and C(apt-get) fails with one line.
version_added: "0.1.0"
seealso:
  - module: k3fleet.gpu.k3fleet_rollback_kit_info
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
options:
  directory:
    description:
      - The kit's directory on the node, one per change (the role uses
        C(/var/lib/k3fleet/rollback-kit/<change-id>)).
    type: path
    required: true
  packages:
    description:
      - The packages to keep, each C({name, version, arch, held}) (C(arch) may be null; dpkg is asked). Entries of a
        snapshot's package list are accepted as they are; only those with a driver C(branch) are kept.
      - Required with I(state=present).
    type: list
    elements: dict
  change_id:
    description: The change the kit is for, recorded in C(kit.json).
    type: str
  state:
    description: C(present) makes (or completes) the kit; C(absent) removes it.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    description: Nothing is fetched or written; the result says what would be fetched and what cannot be had.
  diff_mode:
    support: none
    description: No diff is shown; the result names the files the kit holds and what was fetched.
  idempotent:
    support: full
    description: A kit whose files all have their recorded sha256 is kept as it is and reported unchanged.
"""

EXAMPLES = r"""
- name: Keep the packages this node runs before change CHG-1042 touches it
  k3fleet.gpu.k3fleet_rollback_kit:
    directory: /var/lib/k3fleet/rollback-kit/CHG-1042
    change_id: CHG-1042
    packages: "{{ snapshot.packages }}"
    timeout: 1200
  register: kit
"""

RETURN = r"""
k3fleet:
  description: The kit as it is now.
  returned: always
  type: dict
  contains:
    path:
      description: The kit's directory.
      returned: always
      type: str
      sample: /var/lib/k3fleet/rollback-kit/CHG-1042
    packages:
      description: Each kept package with its file, size, sha256 and where it came from (kit, apt-cache, repository).
      returned: always
      type: list
      elements: dict
      sample:
        - name: nvidia-driver-575-server
          version: 575.57.08-0ubuntu1
          arch: amd64
          held: true
          file: nvidia-driver-575-server_575.57.08-0ubuntu1_amd64.deb
          size: 3124
          sha256: 5f0c3b0e0f5c6d8f9a3e8d8f2b8c6a1e0d4b7c9a2f1e3d5c7b9a0c2e4f6a8b0c
          source: repository
    fetched:
      description: What was fetched (or, in check mode, would be), one line each.
      returned: always
      type: list
      elements: str
      sample: ["nvidia-driver-575-server:amd64=575.57.08-0ubuntu1 from a repository"]
    problems:
      description: Each package that could not be had, with apt's own words. Empty unless the module failed.
      returned: always
      type: list
      elements: str
      sample: []
    complete:
      description: Every package is in the kit (in check mode, could be fetched).
      returned: always
      type: bool
      sample: true
"""

import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY, checked_reader, reader_spec
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_rollback_kit import kit_packages, make_kit

ARGUMENT_SPEC = reader_spec(
    directory=dict(type="path", required=True),
    packages=dict(type="list", elements="dict"),
    change_id=dict(type="str"),
    state=dict(type="str", choices=["present", "absent"], default="present"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_if=[("state", "present", ["packages"])])
    reader = checked_reader(module, "k3fleet_rollback_kit")
    p = module.params
    where = reader.join_root(p["directory"])
    if p["state"] == "absent":
        there = os.path.isdir(where)
        if there and not module.check_mode:
            shutil.rmtree(where)
        empty = {"path": p["directory"], "packages": [], "fetched": [], "problems": [], "complete": False}
        module.exit_json(changed=there, **{RESULT_KEY: empty})
    for tool in ("apt-get", "dpkg-deb", "dpkg-query"):
        if reader.which(tool) is None:
            module.fail_json(msg="rollback kit: %s is not on the node's PATH: only dpkg/apt nodes can keep a kit "
                                 "(docs/change-night.md \"Rollback kit\")" % tool)
    try:
        wanted = kit_packages(p["packages"])
    except ValueError as exc:
        module.fail_json(msg="rollback kit: %s" % exc)
    if not wanted:
        module.fail_json(msg="rollback kit: no driver-branch package given: nothing to keep")
    try:
        result = make_kit(reader, p["directory"], wanted, check_mode=module.check_mode, change_id=p["change_id"],
                          made_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    except (IOError, OSError) as exc:
        module.fail_json(msg="rollback kit %s: %s" % (p["directory"], exc))
    result["complete"] = not result["problems"]
    if result["problems"]:
        module.fail_json(msg="rollback kit %s cannot be made: %s" % (p["directory"], "; ".join(result["problems"])),
                         **{RESULT_KEY: result})
    changed = bool(result.pop("changed")) or (module.check_mode and bool(result["fetched"]))
    module.exit_json(changed=changed, **{RESULT_KEY: result})


if __name__ == "__main__":
    main()
