"""Node health as deep as gpud and DCGM: memory used and reserved apart, NVLink links, counters sampled
twice, Xid history with actions. Parsers and rules run on recorded real outputs (tests/fixtures/gpu_health/
SOURCES.md names each source)."""

from __future__ import annotations

from typing import Any

import pytest
from nodetree import fixtures

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_smi as smi

HEALTH, health = fixtures("gpu_health")


@pytest.mark.parametrize(("name", "expected"), [
    # The real H200 in a VM has no NVLink: nvlink -s printed nothing, exit 0. That is no links.
    ("h200_r580/health-nvlink-s.txt", {}),
    ("nvlink_s_v100_inactive_azhpc73.txt", {3: {"links": 6, "active": [0, 1, 2, 4], "inactive": [3, 5]}}),
    ("nvlink_s_gb200_k8s_test_infra371.txt", {0: {"links": 18, "active": list(range(18)), "inactive": []}}),
])
def test_parse_nvlink_status(name: str, expected: dict[int, Any]) -> None:
    assert smi.parse_nvlink_status(health(name)) == expected


def test_parse_nvlink_status_rejects_text_before_any_gpu() -> None:
    with pytest.raises(ValueError, match="line before any GPU"):
        smi.parse_nvlink_status("Failed to initialize NVML: Driver/library version mismatch\n")


def test_smi_q_memory_reads_used_and_reserved_of_the_real_h200() -> None:
    # nvidia-smi -q -d MEMORY on the idle H200: Reserved 616 MiB, Used 0 MiB (NVML's v1 call said 615 used).
    block = next(iter(smi.parse_smi_q_blocks(health("h200_r580/health-q-mem.txt")).values()))
    assert smi.smi_q_memory(block) == {"memory_used_mib": 0, "memory_reserved_mib": 616,
                                       "memory_source": "nvidia-smi"}


def test_apply_smi_memory_replaces_only_the_v1_figures() -> None:
    gpus = [{"index": 0, "pci_bus_id": "00000000:00:06.0", "memory_used_mib": 615, "memory_reserved_mib": None,
             "memory_source": "nvml_v1"},
            {"index": 1, "pci_bus_id": "00000000:00:07.0", "memory_used_mib": 0, "memory_reserved_mib": 615,
             "memory_source": "nvml_v2"}]
    assert smi.apply_smi_memory(gpus, health("h200_r580/health-q-mem.txt")) is None
    assert [(g["memory_used_mib"], g["memory_reserved_mib"], g["memory_source"]) for g in gpus] == [
        (0, 616, "nvidia-smi"), (0, 615, "nvml_v2")]
    left = [{"index": 4, "pci_bus_id": "00000000:1B:00.0", "memory_used_mib": 615, "memory_source": "nvml_v1"}]
    assert smi.apply_smi_memory(left, health("h200_r580/health-q-mem.txt")) == (
        "GPU used memory includes the driver's reserved memory: GPU 4: not in nvidia-smi -q -d MEMORY")
