#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_rdma_info
short_description: Report RDMA ports, GPUDirect peer memory, PCIe ACS and NCCL settings of a GPU node
description:
  - Reads InfiniBand and RoCE devices and ports from C(/sys/class/infiniband) (state, physical state,
    rate, link layer), whether C(nvidia_peermem) is loaded (C(/proc/modules)), and PCIe ACS from
    C(lspci -vvv) (bridges whose ACSCtl shows C(SrcValid+) silently break GPU peer-to-peer traffic).
  - Collects every C(NCCL_*), C(GLOO_*) and C(UCX_NET_DEVICES) setting with the file or environment it
    comes from. Precedence, highest first, is the module's environment, then I(env_files) (later
    files win), then C(/etc/environment), then C(/etc/nccl.conf).
  - Never changes anything on the node. A fact that cannot be read is reported as C(unknown) with a
    reason, never as a task failure.
version_added: "0.1.0"
options:
  env_files:
    description:
      - Environment files the serving process is started with, for example the C(EnvironmentFile=)
        entries of the vLLM systemd unit, read under I(root).
      - A leading C(-) marks a file whose absence is not an error, as in systemd.
    type: list
    elements: str
    default: []
  lspci:
    description:
      - Run C(lspci -vvv) to check PCIe ACS. Without root, lspci hides the capabilities and ACS is
        reported as not checked, with the reason.
    type: bool
    default: true
notes:
  - The module's own environment stands for the serving process's environment; set it with the task's
    C(environment) keyword when the process gets variables from elsewhere.
seealso:
  - name: NCCL environment variables
    description: What each C(NCCL_*) setting does.
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
  - name: NCCL troubleshooting, PCI Access Control Services
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read RDMA and NCCL facts of the serving nodes
  k3fleet.gpu.k3fleet_rdma_info:
    env_files:
      - -/etc/default/vllm
  register: rdma

- name: Show the active IB/RoCE ports
  ansible.builtin.debug:
    msg: "{{ rdma.k3fleet.rdma.active_ports }} active ports, ACS bridges {{ rdma.k3fleet.rdma.acs_enabled_bridges }}"
"""

RETURN = r"""
k3fleet:
  description: The collected facts, the only key the k3fleet controller reads.
  returned: always
  type: dict
  contains:
    rdma:
      description: RDMA facts (schema C(RdmaFacts)).
      returned: always
      type: dict
      contains:
        status:
          description: C(ok), C(unknown) (see I(reason)) or C(absent) (no C(/sys/class/infiniband)).
          returned: always
          type: str
          sample: ok
        reason:
          description: Why the status is not C(ok).
          returned: always
          type: str
          sample: null
        devices:
          description: RDMA devices with their ports.
          returned: always
          type: list
          elements: dict
          sample:
            - name: mlx5_0
              ports:
                - port: 1
                  state: ACTIVE
                  state_code: 4
                  phys_state: LinkUp
                  phys_state_code: 5
                  rate: 400 Gb/sec (4X NDR)
                  rate_gbps: 400.0
                  link_layer: InfiniBand
        active_ports:
          description: Number of ports in state ACTIVE.
          returned: always
          type: int
          sample: 8
        nvidia_peermem_loaded:
          description: Whether the C(nvidia_peermem) module is loaded; null when C(/proc/modules) is unreadable.
          returned: always
          type: bool
          sample: true
        acs_checked:
          description: Whether ACS could be read for every PCI device.
          returned: always
          type: bool
          sample: true
        acs_reason:
          description: Why ACS was not checked.
          returned: always
          type: str
          sample: "lspci: command not found"
        acs_enabled_bridges:
          description: PCI bridges whose ACSCtl shows C(SrcValid+).
          returned: always
          type: list
          elements: str
          sample: ["00:01.1", "00:01.2"]
    nccl:
      description: NCCL facts (schema C(NcclFacts)).
      returned: always
      type: dict
      contains:
        status:
          description: C(ok), or C(unknown) when a listed environment file could not be read.
          returned: always
          type: str
          sample: ok
        settings:
          description: Each setting with its value, its source and, if any, the lower-precedence values it hides.
          returned: always
          type: dict
          sample:
            NCCL_SOCKET_IFNAME:
              value: eth0
              source: /etc/nccl.conf
        nccl_conf_present:
          description: Whether C(/etc/nccl.conf) exists.
          returned: always
          type: bool
          sample: true
    commands:
      description: Every command run, with exit status and duration, for the evidence package.
      returned: always
      type: list
      elements: dict
      sample:
        - argv: [lspci, -vvv]
          rc: 0
          error: null
          stderr: ""
          duration: 0.041
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_rdma import collect_nccl, collect_rdma


def main() -> None:
    module = ReaderModule(
        env_files=dict(type="list", elements="str", default=[]),
        lspci=dict(type="bool", default=True),
    )
    bad = [f for f in module.params["env_files"] if not f.lstrip("-").startswith("/")]
    if bad:
        module.fail_json(msg="env_files must be absolute node paths (optionally prefixed with -), got %s"
                         % ", ".join(repr(f) for f in bad))
    reader = module.reader()
    rdma = guard("rdma", collect_rdma, reader, lspci=module.params["lspci"])
    nccl = guard("nccl", collect_nccl, reader, env_files=module.params["env_files"])
    module.exit_read({"rdma": rdma, "nccl": nccl, "commands": reader.commands})


if __name__ == "__main__":
    main()
