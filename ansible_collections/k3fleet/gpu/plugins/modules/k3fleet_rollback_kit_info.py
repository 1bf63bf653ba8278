#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_rollback_kit_info
short_description: Say where a rollback's exact driver packages can come from, and whether a kit can be made
description:
  - For each package of I(packages) (a change's snapshot, driver-branch packages at exact versions), whether a
    repository of the node still offers that version (C(apt-cache policy) lists a source other than dpkg's
    status file for it).
  - With I(kit) (the kit as the change journal recorded it), checks each kit file on the node against the sha256
    the journal recorded, and says where a rollback would install from now (RV(k3fleet.source)), C(repository)
    when it offers every version, else C(kit) when every file is there with its recorded sha256, else null with
    the reason in RV(k3fleet.why).
  - With I(directory), also says whether a kit could be made there now (RV(k3fleet.can_make)), that is, each
    package is in apt's cache as that exact file, or a repository offers it for C(apt-get download) (asked with
    C(--print-uris), nothing is fetched). This is the pre-flight check "the rollback kit can be made"
    (docs/change-night.md "Rollback kit").
  - Read-only. Never reports a change.
version_added: "0.1.0"
notes:
  - The repository's answer is only as fresh as the node's package lists; the rollback role runs
    C(apt-get update) before asking.
seealso:
  - module: k3fleet.gpu.k3fleet_rollback_kit
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
options:
  packages:
    description: The packages, each C({name, version, arch, held}). Entries without a driver C(branch) are left out.
    type: list
    elements: dict
    required: true
  kit:
    description: The kit as the journal recorded it, C({path, packages}), with each package's C(file) and C(sha256).
    type: dict
  directory:
    description: Where a kit would be made. Given, the result says whether it can be (RV(k3fleet.can_make)).
    type: path
"""

EXAMPLES = r"""
- name: Can this node's rollback kit be made before the change?
  k3fleet.gpu.k3fleet_rollback_kit_info:
    packages: "{{ snapshot.packages }}"
    directory: /var/lib/k3fleet/rollback-kit/CHG-1042
  register: kit_check

- name: Where would a rollback install from?
  k3fleet.gpu.k3fleet_rollback_kit_info:
    packages: "{{ snapshot.packages }}"
    kit: "{{ snapshot.rollback_kit }}"
  register: kit_source
"""

RETURN = r"""
k3fleet:
  description: Where the packages can come from.
  returned: always
  type: dict
  contains:
    packages:
      description: Each package with C(repository) (a repository offers that version).
      returned: always
      type: list
      elements: dict
      sample: [{name: nvidia-driver-575-server, version: 575.57.08-0ubuntu1, arch: null, held: true, repository: false}]
    repository:
      description: A repository offers every version.
      returned: always
      type: bool
      sample: false
    kit:
      description: The recorded kit checked on the node (C(recorded), C(complete), C(verified), C(problems), C(files)).
      returned: always
      type: dict
      sample:
        path: /var/lib/k3fleet/rollback-kit/CHG-1042
        recorded: true
        complete: true
        verified: true
        problems: []
    source:
      description: Where a rollback installs from now, C(repository) or C(kit); null when from neither.
      returned: always
      type: str
      sample: kit
    why:
      description: One line that says why that source (or why none).
      returned: always
      type: str
      sample: >-
        the repository does not offer nvidia-driver-575-server=575.57.08-0ubuntu1; every kit file has its
        recorded sha256
    can_make:
      description: With I(directory), whether a kit could be made there now; null without it.
      returned: always
      type: bool
      sample: true
    problems:
      description: With I(directory), each package a kit could not get, with apt's own words.
      returned: always
      type: list
      elements: str
      sample:
        - >-
          nvidia-driver-575-server=575.57.08-0ubuntu1: E: Can't find a source to download version
          '575.57.08-0ubuntu1' of 'nvidia-driver-575-server:amd64'
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_rollback_kit import inspect, kit_packages, make_kit


def main() -> None:
    module = ReaderModule(
        packages=dict(type="list", elements="dict", required=True),
        kit=dict(type="dict"),
        directory=dict(type="path"),
    )
    reader = module.checked_reader("k3fleet_rollback_kit_info")
    p = module.params
    try:
        wanted = kit_packages(p["packages"])
    except ValueError as exc:
        module.fail_json(msg="rollback kit: %s" % exc)
    result = inspect(reader, wanted, kit=p["kit"])
    result.update(can_make=None, problems=[])
    if p["directory"]:
        missing = [t for t in ("apt-get", "dpkg-deb", "dpkg-query") if reader.which(t) is None]
        if missing:
            result.update(can_make=False, problems=["%s is not on the node's PATH: only dpkg/apt nodes can keep a "
                                                    "kit" % ", ".join(missing)])
        else:
            made = make_kit(reader, p["directory"], wanted, check_mode=True)
            result.update(can_make=not made["problems"] and bool(wanted), problems=made["problems"])
    module.exit_read(result)


if __name__ == "__main__":
    main()
