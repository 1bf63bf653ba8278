#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_nccl_pair_info
short_description: Measure NCCL all-reduce bandwidth between this GPU node and one partner node
description:
  - Runs nccl-tests' C(all_reduce_perf) across this node and its partner, one rank per GPU
    (C(-g 1)), through the launcher the target names (C(active.nccl_pair_launcher), C(mpirun) by
    default), and reports the bus bandwidth of the largest message, the ranks and any C(#wrong) results.
  - The second play of C(k3fleet audit --active full) (docs/facts.md section 17) runs it on the first
    node of each pair, with both nodes idle. Loads the GPUs and the RDMA rails of both nodes for up to
    the NCCL timeout; changes nothing on either node.
  - With one address (this node), runs C(all_reduce_perf) within the node over its I(gpus) GPUs instead
    (C(-g) I(gpus), no launcher), as the change night's verify runs it after the reboot
    (docs/change-night.md, Verify steps).
  - A launcher or C(all_reduce_perf) that is not installed is reported (C(ran=false) with a reason)
    and nothing runs; the controller reads that as unknown, never as a pass.
version_added: "0.1.0"
options:
  addresses:
    description:
      - The two nodes as the launcher reaches them, this node first (host names or IPv4 addresses); one
        (this node) runs the test within the node.
    type: list
    elements: str
    required: true
  log_lines:
    description:
      - Keep the last this many lines of the run's output, and the lines that decide it (NCCL warnings and
        errors, out of bounds, the average bus bandwidth, the network), in the result's C(log). 0 keeps none.
    type: int
    default: 0
  gpus:
    description: The GPUs on each node, which is the ranks per node.
    type: int
    required: true
  active_spec:
    description:
      - What runs and for how long, from the target file (the controller passes it).
      - C(nccl_pair_launcher), C(nccl_max_bytes) and C(nccl_timeout_s) are read.
    type: dict
    required: true
seealso:
  - name: nccl-tests
    description: all_reduce_perf and the bus bandwidth it reports.
    link: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Measure all-reduce bandwidth between gpu-a01 and gpu-a02 (run on gpu-a01)
  k3fleet.gpu.k3fleet_nccl_pair_info:
    addresses: [gpu-a01, gpu-a02]
    gpus: 8
    active_spec:
      nccl_pair_launcher: [mpirun, -H, "{hosts}", -np, "{ranks}", --bind-to, none, -x, NCCL_ALGO=Ring]
      nccl_max_bytes: 8G
      nccl_timeout_s: 600
  register: pair
"""

RETURN = r"""
k3fleet:
  description: The pair's result, the only key the k3fleet controller reads.
  returned: always
  type: dict
  contains:
    pair:
      description: The all_reduce_perf run across the two nodes (schema C(PairRun)).
      returned: always
      type: dict
      sample: {"ran": true, "rc": 0, "addresses": ["gpu-a01", "gpu-a02"], "gpus": 8, "ranks": 16,
               "max_bytes": 8589934592, "peak_busbw_gbs": 338.82, "wrong": 0, "out_of_bounds": 0}
    commands:
      description: Every command run, with exit status and duration, for the evidence package.
      returned: always
      type: list
      elements: dict
      sample: [{"argv": ["mpirun", "-H", "gpu-a01:8,gpu-a02:8"], "rc": 0, "error": null, "duration": 61.2}]
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_active import collect_node, collect_pair
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule

_SPEC_KEYS = ("nccl_pair_launcher", "nccl_max_bytes", "nccl_timeout_s")


def main() -> None:
    module = ReaderModule(
        addresses=dict(type="list", elements="str", required=True),
        gpus=dict(type="int", required=True),
        active_spec=dict(type="dict", required=True),
        log_lines=dict(type="int", default=0),
    )
    p = module.params
    spec = p["active_spec"]
    missing = [k for k in _SPEC_KEYS if k not in spec]
    launcher = spec.get("nccl_pair_launcher")
    if missing or not isinstance(launcher, list) or not launcher:
        module.fail_json(msg="active_spec needs %s (a non-empty launcher list)" % ", ".join(_SPEC_KEYS))
    reader = module.reader()
    keep = max(0, p["log_lines"] or 0)
    if len(p["addresses"] or []) == 1:
        pair = guard("pair", collect_node, reader, p["gpus"], spec, keep)
    else:
        pair = guard("pair", collect_pair, reader, p["addresses"], p["gpus"], spec, keep)
    module.exit_read({"pair": pair, "commands": reader.commands})


if __name__ == "__main__":
    main()
