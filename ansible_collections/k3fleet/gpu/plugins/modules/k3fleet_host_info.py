#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: k3fleet contributors
# Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_host_info
short_description: Collect every k3fleet fact of a GPU node in one round trip
version_added: "0.1.0"
description:
  - Runs all k3fleet collectors (driver and GPUs, packages, Fabric Manager, IMEX, RDMA, NCCL, container,
    scheduler) in one module call, so an audit costs one round trip per host whatever the number of checks.
  - Read-only. A collector that cannot read something reports C(status=unknown) with a reason instead of failing.
  - The result is plain JSON under the C(k3fleet) key, versioned by C(schema_version); the controller validates it.
options:
  image:
    description:
      - Serving image whose metadata is inspected (and, with I(probe), run).
      - The target file's C(image.ref) (docs/facts.md); the audit playbook passes it. There is no
        default of its own, so the image is named in one place, the target.
      - Without it the image is not inspected (C(container.image) is null); the change night's
        state reads, which do not need the image, leave it out.
    type: str
  runtime:
    description: Container runtime to use; C(auto) takes the first of docker, podman, nerdctl found.
    type: str
    choices: [auto, docker, podman, nerdctl]
    default: auto
  probe:
    description:
      - Run the serving image with all GPUs and no network and report whether CUDA initialises.
      - Starts a throw-away container (C(--rm)); nothing persistent changes.
    type: bool
    default: false
  active:
    description:
      - Active checks (docs/facts.md section 17); C(quick) runs dcgmi diag at the quick level, C(full) adds
        all_reduce_perf within the node and a loopback ib_write_bw per active rail.
      - Never on a node whose GPUs another process holds (the section says why); each tool under its own
        timeout from I(active_spec).
    type: str
    choices: [none, quick, full]
    default: none
  active_spec:
    description:
      - What the active checks run and for how long, from the target file (the controller passes it).
    type: dict
  counter_interval:
    description:
      - Least seconds between the two samples of the error counters (InfiniBand ports, NVLink links, PCIe
        replays) the module reads at the start and the end of its visit; 0 takes the visit's own length.
        The controller passes the target's C(health.counter_interval_s).
    type: float
    default: 0
  use_nvml:
    description: Query NVML first (through pynvml when it imports, else through the collection's own binding to
      libnvidia-ml.so.1); when false, or when no NVML library loads, nvidia-smi is used.
    type: bool
    default: true
  env_files:
    description: Environment files of the serving unit to read NCCL and GLOO settings from.
    type: list
    elements: path
    default: []
  lspci:
    description: Inspect PCIe ACS with C(lspci -vvv) when lspci exists.
    type: bool
    default: true
  slurm_node:
    description: Slurm node name of this host; defaults to its short hostname.
    type: str
  host:
    description: Inventory name recorded in the facts (pass C(inventory_hostname)).
    type: str
  facts_format:
    description:
      - C(dict) returns the facts as a mapping under C(k3fleet). C(json) returns the same facts as one JSON
        text under C(k3fleet_json) instead (the audit play's form; the k3fleet controller and the play's
        C(from_json) read it).
      - On the controller Ansible copies and walks a module result node by node several times in its main
        process (the registered copy, each callback's copy, the conversion to native types); a host's facts
        are about 800 nodes, one text is one (docs/scale.md, "The controller's share").
    type: str
    choices: [dict, json]
    default: dict
notes:
  - Each option the task leaves out is taken from its variable where that is defined, so the audit play
    passes none itself; C(host) from C(inventory_hostname), C(image) from C(k3fleet_image), C(runtime) from
    C(k3fleet_container_runtime), C(timeout) from C(k3fleet_command_timeout), every other option I(x) from
    C(k3fleet_x). Then from the play's C(k3fleet_audit_defaults) (playbooks/vars/audit_defaults.yml), the image
    from its target file, and C(budget) is 0.8 of C(k3fleet_host_timeout). An option the task gives wins.
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Collect all k3fleet facts of this node
  k3fleet.gpu.k3fleet_host_info:
    image: vllm/vllm-openai:kimi-k3
  register: __k3fleet_host

- name: Read a containerised view of the host, probing CUDA in the serving image
  k3fleet.gpu.k3fleet_host_info:
    root: /host
    probe: true
"""

RETURN = r"""
k3fleet:
  description: Host facts (schema C(schema_version)); see the k3fleet HostFacts JSON Schema.
  returned: when facts_format is dict (the default)
  type: dict
  contains:
    schema_version:
      description: Version of the facts schema.
      returned: always
      type: str
      sample: "1.0"
    host:
      description: Inventory name of the host.
      returned: always
      type: str
      sample: gpu-a01
    driver:
      description: Loaded kernel module, NVML state, driver and CUDA versions, GPUs.
      returned: always
      type: dict
      sample: {"status": "ok", "source": "nvml", "driver_version": "580.95.05", "cuda_driver_version": "13.0"}
    packages:
      description: Installed NVIDIA packages, versions, holds, unattended upgrades, DKMS.
      returned: always
      type: dict
      sample: {"status": "ok", "manager": "dpkg", "driver_branch": "580"}
    fabricmanager:
      description: NVSwitch presence, Fabric Manager unit state and version match.
      returned: always
      type: dict
      sample: {"status": "ok", "required": true, "version_matches_driver": true}
    imex:
      description:
        - IMEX on multi-node NVLink racks (GB200/GB300 NVL72) - the nvidia-imex unit, its config and node list,
          the channel devices and the domain as C(nvidia-imex-ctl -N) reports it; C(status=absent) where
          IMEX is not installed.
      returned: always
      type: dict
      sample: {"status": "ok", "installed": true, "channels": [0], "domain_state": "UP"}
    rdma:
      description: RDMA devices and ports, nvidia_peermem, PCIe ACS.
      returned: always
      type: dict
      sample: {"status": "ok", "active_ports": 8}
    nccl:
      description: NCCL_* and GLOO_* settings with their sources.
      returned: always
      type: dict
      sample: {"status": "ok", "settings": {"NCCL_IB_HCA": {"value": "mlx5", "source": "/etc/nccl.conf"}}}
    container:
      description:
        - Runtime, toolkit, serving image metadata and the optional CUDA probe.
        - C(workloads) lists other tenants' running containers and the GPUs' compute processes with their
          CUDA and any cuda-compat package (docs/facts.md section 16).
      returned: always
      type: dict
      sample: {"status": "ok", "image": {"ref": "vllm/vllm-openai:kimi-k3", "cuda_version": "13.0.2"}}
    active:
      description: Results of the active checks (dcgmi diag, all_reduce_perf, ib_write_bw); only with I(active).
      returned: when active is quick or full
      type: dict
    scheduler:
      description: Scheduler node state as seen from the node.
      returned: always
      type: dict
      sample: {"status": "ok", "kind": "slurm", "state": "idle"}
    commands:
      description: Every command run, with rc, error and duration (evidence).
      returned: always
      type: list
      elements: dict
      sample: [{"argv": ["nvidia-smi", "-q", "-d", "COMPUTE"], "rc": 0, "error": null, "duration": 0.05}]
k3fleet_json:
  description: The facts of C(k3fleet) as one JSON text, in place of C(k3fleet).
  returned: when facts_format is json
  type: str
  sample: '{"schema_version": "1.0", "host": "gpu-a01", "driver": {"status": "ok"}}'
"""

import json

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_host import collect_host
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_JSON_KEY, ReaderModule


def main() -> None:
    module = ReaderModule(
        image=dict(type="str"),
        runtime=dict(type="str", default="auto", choices=["auto", "docker", "podman", "nerdctl"]),
        probe=dict(type="bool", default=False),
        active=dict(type="str", default="none", choices=["none", "quick", "full"]),
        active_spec=dict(type="dict"),
        counter_interval=dict(type="float", default=0.0),
        use_nvml=dict(type="bool", default=True),
        env_files=dict(type="list", elements="path", default=[]),
        lspci=dict(type="bool", default=True),
        slurm_node=dict(type="str"),
        host=dict(type="str"),
        facts_format=dict(type="str", default="dict", choices=["dict", "json"]),
    )
    p = module.params
    reader = module.reader()
    facts = collect_host(reader, host=p["host"] or "",
                         image=p["image"], use_nvml=p["use_nvml"], runtime=p["runtime"], probe=p["probe"],
                         env_files=p["env_files"], lspci=p["lspci"], slurm_node=p["slurm_node"],
                         active=p["active"], active_spec=p["active_spec"],
                         counter_interval=p["counter_interval"])
    if p["facts_format"] == "json":
        module.exit_json(changed=False, **{RESULT_JSON_KEY: json.dumps(facts, separators=(",", ":"))})
    module.exit_read(facts)


if __name__ == "__main__":
    main()
