#!/usr/bin/python
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)

from __future__ import annotations

DOCUMENTATION = r"""
module: k3fleet_driver_info
short_description: Report the loaded NVIDIA driver and the GPUs it sees
description:
  - Reads the loaded kernel module from C(/proc/driver/nvidia/version) (open or proprietary flavour)
    and C(/proc/modules).
  - Lists the GPUs through NVML when O(use_nvml=true), through C(pynvml) when it imports and otherwise
    through the collection's own binding to the driver's C(libnvidia-ml.so.1); without that library,
    or after an NVML failure, through C(nvidia-smi). RV(k3fleet.source) names the one that answered,
    RV(k3fleet.nvml.bindings) what asked NVML.
  - Per GPU it also reports the NVLink fabric state, status and health (NVML's health mask and summary, or the
    C(Fabric) > C(Health) block of C(nvidia-smi -q)), the memory in use and the compute processes; reads both
    the old C(Driver Version) / C(CUDA Version) header and R610's C(KMD Version) / C(CUDA UMD Version).
  - Tells a Jetson (Tegra, L4T) board from a data-center driver platform (RV(k3fleet.platform)).
  - NVML failures such as C(Driver/library version mismatch) are reported as data in
    RV(k3fleet.nvml.status), never as a module failure. Output that cannot be read or understood
    makes RV(k3fleet.status) V(unknown) with a reason.
  - Read-only. Never reports a change.
version_added: "0.1.0"
options:
  use_nvml:
    description:
      - Ask NVML first, through C(pynvml) when it imports, else through the collection's own binding to
        C(libnvidia-ml.so.1).
      - When V(false) only C(nvidia-smi) is asked and RV(k3fleet.nvml.status) reads V(skipped); when no
        C(libnvidia-ml.so.1) loads it reads V(library_not_found) and C(nvidia-smi) is asked.
    type: bool
    default: true
seealso:
  - module: k3fleet.gpu.k3fleet_packages_info
  - module: k3fleet.gpu.k3fleet_fabricmanager_info
extends_documentation_fragment:
  - k3fleet.gpu.k3fleet_reader
"""

EXAMPLES = r"""
- name: Read the driver and GPUs of every GPU node
  k3fleet.gpu.k3fleet_driver_info:
  register: driver

- name: Stop when the node runs an old driver branch
  ansible.builtin.assert:
    that:
      - driver.k3fleet.kernel_module.version is version('580', '>=')
    fail_msg: "{{ inventory_hostname }} runs {{ driver.k3fleet.kernel_module.version }}, R580 or newer is needed"

- name: Read a host's view from inside a container, nvidia-smi only
  k3fleet.gpu.k3fleet_driver_info:
    root: /host
    use_nvml: false
"""

RETURN = r"""
k3fleet:
  description: Driver and GPU facts (the DriverFacts section of the k3fleet host facts schema).
  returned: always
  type: dict
  contains:
    status:
      description: V(ok) when the GPUs were listed, V(absent) when no NVIDIA kernel module is loaded,
        V(unknown) when the driver is (or may be) loaded but no source could list the GPUs.
      returned: always
      type: str
      sample: ok
    reason:
      description: Why the status is not V(ok), or notes on a partial answer (for example no CUDA version).
      returned: always
      type: str
      sample: "NVML: nvmlInit: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch."
    kernel_module:
      description: The loaded nvidia kernel module.
      returned: always
      type: dict
      sample:
        loaded: true
        version: "580.95.05"
        flavour: open
        arch: x86_64
        raw: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  ..."
      contains:
        loaded:
          description: Whether nvidia.ko is loaded.
          returned: always
          type: bool
          sample: true
        version:
          description: Version of the loaded module.
          returned: always
          type: str
          sample: "580.95.05"
        flavour:
          description: V(open) or V(proprietary) kernel modules.
          returned: always
          type: str
          sample: open
        arch:
          description: The module's architecture (V(x86_64), V(aarch64)).
          returned: always
          type: str
          sample: x86_64
        raw:
          description: First line of C(/proc/driver/nvidia/version).
          returned: always
          type: str
          sample: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  ..."
    platform:
      description: V(discrete) for a data-center driver platform, V(tegra) for a Jetson (L4T) board, with the
        L4T release and the evidence; kind null when no module is loaded.
      returned: always
      type: dict
      sample:
        kind: tegra
        l4t_release: "35.3.1"
        evidence: "kernel module version 35.3.1 (aarch64) is an L4T release, not a driver branch"
    nvml:
      description: How NVML answered.
      returned: always
      type: dict
      sample:
        status: ok
        error: null
        bindings: k3fleet
      contains:
        status:
          description: One of V(ok), V(skipped), V(not_installed), V(library_not_found), V(driver_not_loaded),
            V(lib_rm_version_mismatch), V(no_permission), V(gpu_is_lost), V(error).
          returned: always
          type: str
          sample: lib_rm_version_mismatch
        error:
          description: The NVML (or nvidia-smi) error text.
          returned: always
          type: str
          sample: "nvmlInit: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch."
        bindings:
          description: What asked NVML, V(pynvml) or V(k3fleet) (the collection's own binding); null when no
            bindings loaded C(libnvidia-ml.so.1) or NVML was not asked.
          returned: always
          type: str
          sample: k3fleet
    source:
      description: V(nvml) or V(nvidia-smi), whichever listed the GPUs; null when none did.
      returned: always
      type: str
      sample: nvml
    driver_version:
      description: Driver version reported by the source.
      returned: always
      type: str
      sample: "580.95.05"
    cuda_driver_version:
      description: The highest CUDA version the driver supports (not any container's runtime).
      returned: always
      type: str
      sample: "13.0"
    gpu_count:
      description: Number of GPUs listed; null when no source answered.
      returned: always
      type: int
      sample: 8
    gpus:
      description: One entry per GPU.
      returned: always
      type: list
      elements: dict
      sample:
        - index: 0
          name: NVIDIA H200
          uuid: GPU-1a4626a2-1754-c017-fdb7-6d7d682f4165
          memory_total_mib: 143771
          persistence_mode: true
          compute_capability: "9.0"
          pci_bus_id: "00000000:1B:00.0"
          fabric_state: completed
          fabric_status: success
          fabric_health:
            summary: healthy
            bandwidth: full
            route_recovery_in_progress: false
            route_unhealthy: false
            access_timeout_recovery: false
            incorrect_configuration: none
            partition_assigned: null
            gfm_state: null
            other: {}
          memory_used_mib: 0
          processes: []
    counters:
      description: >-
        The GPUs' error counters (NVLink per link, PCIe replays) read at the start and the end of one visit,
        each as [first, second] (docs/facts.md section 14). Only k3fleet_host_info samples them twice; this
        module leaves them out.
      returned: never by this module
      type: dict
      sample: {"interval_s": 2, "source": "nvml", "reason": null, "gpus": {"0": {"pcie_replay": [0, 0], "nvlink": {}}}}
    topology:
      description: >-
        nvidia-smi topo -m read: each GPU's nearest NIC and its PCIe distance (PIX, PXB, PHB, NODE, SYS), CPU and
        NUMA affinity (docs/facts.md section 6).
      returned: when GPUs were listed
      type: dict
      sample: {"status": "ok", "reason": null, "nics": ["mlx5_0"], "gpus": {"0": {"nearest_nic": "mlx5_0",
               "distance": "PIX", "cpu_affinity": "0-55", "numa": "0"}}}
    kernel_log:
      description: >-
        Xid events of the kernel log since boot (dmesg, else journalctl -k -b); status unknown when
        no log could be read (docs/facts.md section 14). The Xid lines of the last three earlier boots
        (journalctl --list-boots, journalctl -k -b -N) are in C(history); IPoIB "lost carrier" lines in
        C(ib_carrier_lost).
      returned: always
      type: dict
      sample: {"status": "ok", "reason": null, "source": "dmesg", "xid": []}
      contains:
        status:
          description: ok, or unknown when neither log could be read.
          returned: always
          type: str
          sample: ok
        reason:
          description: Why the log could not be read.
          returned: when status is unknown
          type: str
          sample: "dmesg: Operation not permitted"
        source:
          description: Where the lines came from.
          returned: when status is ok
          type: str
          sample: dmesg
        xid:
          description: One entry per Xid line (code, PCI address, pid, text, time).
          returned: always
          type: list
          elements: dict
          sample:
            - code: 79
              pci: "0000:3b:00"
              pid: null
              text: GPU has fallen off the bus.
              time: "[ 1234.567890]"
"""

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import guard
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import collect_driver
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import ReaderModule


def main() -> None:
    module = ReaderModule(use_nvml=dict(type="bool", default=True))
    reader = module.checked_reader("k3fleet_driver_info")
    facts = guard("driver", collect_driver, reader, use_nvml=module.params["use_nvml"])
    module.exit_read(facts)


if __name__ == "__main__":
    main()
