#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_container_info
short_description: Report the container runtime, NVIDIA Container Toolkit and the serving image's CUDA needs
description:
  - Finds the container runtimes on the node (docker, podman, nerdctl) with their versions and the
    NVIDIA Container Toolkit version (C(nvidia-ctk --version)).
  - Inspects the serving image without pulling it; reports whether it is present, its id and digest,
    C(CUDA_VERSION), C(NVIDIA_REQUIRE_CUDA) and the vLLM version recorded in the image.
  - With I(probe=true), starts one throw-away container from the image (all GPUs, no network,
    C(--rm)) and asks PyTorch to initialise CUDA. A too-old host driver is recognised from its
    error text (requirement error, CUDA error 35, error 803/804, PyTorch "driver too old").
  - Never changes anything persistent on the node. A fact that cannot be read is reported as
    C(unknown) with a reason, never as a task failure.
version_added: "0.1.0"
options:
  image:
    description:
      - Image reference of the serving image, as the serving unit runs it.
      - The target file's C(image.ref) (docs/facts.md); there is no default of its own, so the
        image is named in one place, the target.
    type: str
    required: true
  runtime:
    description:
      - Container runtime to use. C(auto) picks the first of docker, podman, nerdctl on the search path.
    type: str
    choices: [auto, docker, podman, nerdctl]
    default: auto
  probe:
    description:
      - Start a container from I(image) and check that CUDA initialises in it. Takes up to six times
        I(timeout) and needs the GPUs to be free enough to create a CUDA context.
    type: bool
    default: false
attributes:
  check_mode:
    description:
      - Read-only; runs the same way in check mode. The probe starts a container that is removed when
        it exits (C(--rm), C(--network none)); it leaves nothing persistent, so it also runs in check mode.
seealso:
  - name: CUDA compatibility
    link: https://docs.nvidia.com/deploy/cuda-compatibility/
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Inspect the serving image on every node
  k3fleet.gpu.k3fleet_container_info:
    image: vllm/vllm-openai:kimi-k3
  register: container

- name: Prove CUDA initialises in the serving image after the driver change
  k3fleet.gpu.k3fleet_container_info:
    image: vllm/vllm-openai:kimi-k3
    probe: true
    timeout: 60
  register: probe

- name: Stop when CUDA does not initialise
  ansible.builtin.assert:
    that: probe.k3fleet.container.probe.ok
    fail_msg: >-
      {{ inventory_hostname }}: CUDA did not initialise in {{ probe.k3fleet.container.image.ref }}:
      {{ probe.k3fleet.container.probe.failure }} {{ probe.k3fleet.container.probe.message }}
"""

RETURN = r"""
k3fleet:
  description: The collected facts, the only key the k3fleet controller reads.
  returned: always
  type: dict
  contains:
    container:
      description: Container facts (schema C(ContainerFacts)).
      returned: always
      type: dict
      contains:
        status:
          description: C(ok), C(unknown) (see I(reason)) or C(absent) (no usable runtime).
          returned: always
          type: str
          sample: ok
        reason:
          description: Why the status is not C(ok).
          returned: always
          type: str
          sample: null
        runtime:
          description: The runtime used, or null when none was found.
          returned: always
          type: dict
          sample: {name: docker, version: 28.2.2}
        runtimes:
          description: Every runtime found on the search path, with its version.
          returned: always
          type: list
          elements: dict
          sample: [{name: docker, version: 28.2.2}, {name: podman, version: 4.3.1}]
        toolkit_version:
          description: NVIDIA Container Toolkit version, from C(nvidia-ctk) or the package database.
          returned: always
          type: str
          sample: 1.17.8
        image:
          description: Facts of the serving image; C(present) is false when it is not on the node.
          returned: when a runtime was found
          type: dict
          sample:
            ref: vllm/vllm-openai:kimi-k3
            present: true
            id: sha256:f37691f675bb82f734f606de8af90e777d3f80a20b120e699fd43fd10e60b8d7
            digest: sha256:6d8429e38e3747723ca07ee1b17972e09bb9c51c4032b266f24fb1cc3b22ed8f
            cuda_version: 13.0.2
            nvidia_require_cuda: cuda>=13.0 brand=unknown,driver>=535,driver<536
            vllm_version: 0.23.0
        probe:
          description: Result of the CUDA-init probe; C(ran) is false unless I(probe=true).
          returned: always
          type: dict
          sample:
            ran: true
            ok: false
            cuda_init: null
            visible_gpus: null
            failure: requirement_error
            message: "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0"
    commands:
      description: Every command run, with exit status and duration, for the evidence package.
      returned: always
      type: list
      elements: dict
      sample:
        - argv: [docker, image, inspect, vllm/vllm-openai:kimi-k3]
          rc: 0
          error: null
          stderr: ""
          duration: 0.12
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_container import collect_container
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule


def main() -> None:
    module = ReaderModule(
        image=dict(type="str", required=True),
        runtime=dict(type="str", default="auto", choices=["auto", "docker", "podman", "nerdctl"]),
        probe=dict(type="bool", default=False),
    )
    image = (module.params["image"] or "").strip()
    if not image or any(ch.isspace() for ch in image):
        module.fail_json(msg="image must be one image reference without spaces, got %r" % module.params["image"])
    reader = module.reader()
    container = guard("container", collect_container, reader, image, runtime=module.params["runtime"],
                      probe=module.params["probe"])
    module.exit_read({"container": container, "commands": reader.commands})


if __name__ == "__main__":
    main()
