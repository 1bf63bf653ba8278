"""Node health as deep as gpud and DCGM: memory used and reserved apart, NVLink links, counters sampled
twice, Xid history with actions. Parsers and rules run on recorded real outputs (tests/fixtures/gpu_health/
SOURCES.md names each source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nodetree import fake_command, fixtures, node

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_driver as drv
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


# -- Xid history of earlier boots ------------------------------------------------------------------------


def test_parse_list_boots_of_systemd_246_and_253() -> None:
    boots = drv.parse_list_boots(health("journal_list_boots_systemd17326.txt"))
    assert [(b["offset"], b["boot_id"][:8]) for b in boots] == [(-2, "9ed94632"), (-1, "132fe52e"), (0, "bde6e48d")]
    # systemd 253 prints a column header (and the boot id with no dashes): the header is skipped.
    newer = "IDX BOOT ID                          FIRST ENTRY                 LAST ENTRY\n" + \
        health("journal_list_boots_systemd17326.txt")
    assert len(drv.parse_list_boots(newer)) == 3


def test_xid_history_reads_the_earlier_boots_kernel_logs(tmp_path: Path) -> None:
    # Boot -1 logged the Xid 79 of NVSentinel issue 155; boot -2 the Xid 94 of gpud pull request 1174.
    fake_command(tmp_path / "bin", "journalctl", [
        ("--list-boots*", health("journal_list_boots_systemd17326.txt"), "", 0),
        ("-k?-b?-1?*", health("xid79_line_nvsentinel155.txt"), "", 0),
        ("-k?-b?-2?*", health("xid94_line_gpud1174.txt"), "", 0),
    ])
    got = drv.collect_xid_history(node(tmp_path))
    assert (got["status"], got["boots_listed"]) == ("ok", 3)
    assert [(b["offset"], [x["code"] for x in b["xid"]]) for b in got["boots"]] == [(-1, [79]), (-2, [94])]


def test_xid_history_of_a_volatile_journal_is_nothing_earlier(tmp_path: Path) -> None:
    only_this = health("journal_list_boots_systemd17326.txt").splitlines()[-1] + "\n"
    fake_command(tmp_path / "bin", "journalctl", [("--list-boots*", only_this, "", 0)])
    got = drv.collect_xid_history(node(tmp_path))
    assert (got["status"], got["boots_listed"], got["boots"]) == ("ok", 1, [])


def test_xid_history_without_journalctl_is_unknown(tmp_path: Path) -> None:
    got = drv.collect_xid_history(node(tmp_path))
    assert got["status"] == "unknown" and "journalctl: command not found" in got["reason"]


def test_xid_history_reads_at_most_three_earlier_boots(tmp_path: Path) -> None:
    span = "Mon 2020-10-12 21:43:58 CEST—Mon 2020-10-12 21:45:42 CEST"
    many = "".join(f"{-n} {n:032x} {span}\n" for n in range(6, -1, -1))
    fake_command(tmp_path / "bin", "journalctl", [("--list-boots*", many, "", 0), ("-k?-b?*", "", "", 0)])
    reader = node(tmp_path)
    got = drv.collect_xid_history(reader)
    assert [b["offset"] for b in got["boots"]] == [-1, -2, -3]
    assert len([c for c in reader.commands if c["argv"][:2] == ["journalctl", "-k"]]) == 3
