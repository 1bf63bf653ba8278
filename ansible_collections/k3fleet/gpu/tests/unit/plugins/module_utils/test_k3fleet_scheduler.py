"""The Slurm collector's parsers against recorded scontrol / squeue output, and the node's short name.

Sources of every fixture: tests/unit/fixtures/scheduler/SOURCES.md. The collector as a whole, against
the controller's model, is tested in the repository (tests/unit/test_collect_scheduler.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_scheduler import (
    count_running_jobs,
    normalize_slurm_state,
    parse_scontrol_nodes,
    short_hostname,
)
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import fixture as _fixture

DRAIN_REASON = "k3fleet CHG-1042 R575->R580 driver change [root@2026-11-29T17:17:55]"


def fixture(name: str) -> str:
    return _fixture("scheduler", name)


def reader_for(tmp_path: Path, hostname: str) -> NodeReader:
    """A node whose /etc/hostname says hostname."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "hostname").write_text(hostname)
    return NodeReader(root=str(root), path=str(tmp_path / "bin"), timeout=60.0)


# -- pure parsers ----------------------------------------------------------------


@pytest.mark.parametrize("name, node, state, reason", [
    ("scontrol_gpu01_mixed_slurm2205.txt", "gpu01", "MIXED", None),
    ("scontrol_gpu02_allocated_slurm2205.txt", "gpu02", "ALLOCATED", None),
    ("scontrol_gpu01_mixed_drain_slurm2205.txt", "gpu01", "MIXED+DRAIN", DRAIN_REASON),
    ("scontrol_gpu02_allocated_drain_slurm2205.txt", "gpu02", "ALLOCATED+DRAIN", DRAIN_REASON),
    ("scontrol_gpu02_idle_drain_slurm2205.txt", "gpu02", "IDLE+DRAIN", DRAIN_REASON),
    ("scontrol_gn0101_idle_drain_twcc.txt", "gn0101.twcc.ai", "IDLE+DRAIN", "node-switch [root@2018-11-23T12:49:03]"),
    ("scontrol_med0304_mixed_drain_bih.txt", "med0304", "MIXED+DRAIN",
     "deep power-off required for PSU [root@2020-07-17T13:21:02]"),
    ("scontrol_a256_t4_01_mixed_aau.txt", "a256-t4-01", "MIXED", None),
])
def test_parse_scontrol_nodes(name: str, node: str, state: str, reason: str | None) -> None:
    records = parse_scontrol_nodes(fixture(name))
    assert len(records) == 1
    fields = records[0]
    assert fields["NodeName"] == node
    assert fields["State"] == state
    assert fields.get("Reason") == reason


@pytest.mark.parametrize("name, key, value", [
    ("scontrol_gpu01_mixed_slurm2205.txt", "OS", "Linux 6.18.44-fc-v857 #1 SMP PREEMPT_DYNAMIC @0"),
    ("scontrol_gpu01_mixed_slurm2205.txt", "CfgTRES", "cpu=2,mem=1000M,billing=2"),
    ("scontrol_gn0101_idle_drain_twcc.txt", "AllocTRES", ""),
    ("scontrol_gpu01_mixed_drain_slurm2205.txt", "AllocTRES", "cpu=1,mem=1000M"),
    ("scontrol_gn0101_idle_drain_twcc.txt", "Gres", "gpu:8"),
    ("scontrol_med0304_mixed_drain_bih.txt", "OS",
     "Linux 3.10.0-1127.13.1.el7.x86_64 #1 SMP Tue Jun 23 15:46:38 UTC 2020"),
])
def test_parse_scontrol_values_with_spaces_and_equals(name: str, key: str, value: str) -> None:
    assert parse_scontrol_nodes(fixture(name))[0][key] == value


def test_parse_scontrol_several_records() -> None:
    text = "\n".join(fixture(n) for n in ("scontrol_gpu01_mixed_slurm2205.txt", "scontrol_med0304_mixed_drain_bih.txt",
                                          "scontrol_gpu02_idle_drain_slurm2205.txt"))
    assert [r["NodeName"] for r in parse_scontrol_nodes(text)] == ["gpu01", "med0304", "gpu02"]


@pytest.mark.parametrize("raw, state, flags", [
    ("IDLE", "idle", []),
    ("MIXED", "mixed", []),
    ("ALLOCATED", "allocated", []),
    ("IDLE+DRAIN", "drained", ["drain"]),
    ("MIXED+DRAIN", "draining", ["drain"]),
    ("ALLOCATED+DRAIN", "draining", ["drain"]),
    ("COMPLETING+DRAIN", "draining", ["drain"]),
    ("DOWN+DRAIN+NOT_RESPONDING", "down", ["drain", "not_responding"]),
    ("DOWN*", "down", ["not_responding"]),
    ("IDLE*", "idle", ["not_responding"]),
    ("IDLE+CLOUD+POWERED_DOWN", "idle", ["cloud", "powered_down"]),
    ("MIXED+FAIL", "failing", ["fail"]),
    ("IDLE+FAIL", "fail", ["fail"]),
    ("DRAINED", "drained", []),
    ("", None, []),
])
def test_normalize_slurm_state(raw: str, state: str | None, flags: list[str]) -> None:
    assert normalize_slurm_state(raw) == (state, flags)


@pytest.mark.parametrize("text, expected", [
    (fixture("squeue_gpu01_running_slurm2205.txt"), 1),
    (fixture("squeue_gpu02_none_slurm2205.txt"), 0),
    ("1\n2\n3_4\n5+0\n", 4),
    (fixture("scontrol_gpu01_mixed_slurm2205.txt"), None),  # not squeue output at all
])
def test_count_running_jobs(text: str, expected: int | None) -> None:
    assert count_running_jobs(text) == expected


@pytest.mark.parametrize("content, expected", [
    ("gpu01\n", "gpu01"),
    ("gpu010.cluster.example\n", "gpu010"),
])
def test_short_hostname_from_etc_hostname(tmp_path: Path, content: str, expected: str) -> None:
    assert short_hostname(reader_for(tmp_path, hostname=content)) == (expected, "/etc/hostname")


def test_short_hostname_falls_back_to_the_process(tmp_path: Path) -> None:
    name, source = short_hostname(reader_for(tmp_path, hostname=""))
    assert source == "gethostname()" and name and "." not in name
