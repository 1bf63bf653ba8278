"""The Fabric Manager collector's parsers (nv-fabricmanager --version, systemd unit states, version match) and
its NVSwitch count from procfs or device nodes, on recorded output.

Fixture sources: tests/unit/fixtures/fabricmanager/SOURCES.md. The collector as a whole, against the controller's
model, is tested in the repository (tests/unit/test_collect_fabricmanager.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_fabricmanager as fmc
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import parse_systemctl_show
from ansible_collections.k3fleet.gpu.tests.unit.plugins import nodes
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import fixture as _fixture


def fixture(name: str) -> str:
    return _fixture("fabricmanager", name)


def node(tmp_path: Path, switches: list[str] | None = None, dev: list[str] | None = None) -> NodeReader:
    return nodes.nvswitch_node(tmp_path, switches=switches, dev=dev)


# Real listings, turned into the names a node tree needs.
HGX_A100_SWITCHES = fixture("nvswitch_devices_ls.txt").split()
DEV_WITH_CTL_ONLY = [line.split()[-1].rsplit("/", 1)[1] for line in fixture("dev_nv_listing.txt").splitlines()]


# -- parsers ---------------------------------------------------------------------------


def test_parse_fm_version() -> None:
    assert fmc.parse_fm_version(fixture("nv_fabricmanager_version.txt")) == "450.102.04"


@pytest.mark.parametrize(("name", "unit", "expected"), [
    ("systemctl_show_fm_failed.txt", "nvidia-fabricmanager.service",
     {"installed": True, "active": "failed", "enabled": "enabled"}),
    ("systemctl_show_fm_failed.txt", "nvidia-persistenced.service",
     {"installed": True, "active": "active", "enabled": "enabled"}),
    ("systemctl_show_fm_not_found.txt", "nvidia-fabricmanager.service",
     {"installed": False, "active": "inactive", "enabled": "not-found"}),
    ("systemctl_show_fm_not_found.txt", "nvidia-other.service",
     {"installed": None, "active": None, "enabled": None}),
])
def test_unit_state(name: str, unit: str, expected: dict[str, Any]) -> None:
    assert fmc.unit_state(parse_systemctl_show(fixture(name)), unit) == expected


@pytest.mark.parametrize(("fm", "driver", "match"), [
    ("580.95.05", "580.95.05", True),
    ("580.95.05-1", "580.95.05", True),
    ("580.95.05-0ubuntu1", "580.95.05", True),
    ("580.95.05-1.el9", "580.95.05", True),
    ("580.82.07", "580.95.05", False),
    ("575.57.08", "580.95.05", False),
    (None, "580.95.05", None),
    ("580.95.05", None, None),
])
def test_versions_match_exactly(fm: str | None, driver: str | None, match: bool | None) -> None:
    assert fmc.versions_match(fm, driver) is match


# -- NVSwitch presence ----------------------------------------------------------------------


def test_nvswitch_from_procfs(tmp_path: Path) -> None:
    assert fmc.nvswitch_facts(node(tmp_path, switches=HGX_A100_SWITCHES)) == (
        True, 6, "/proc/driver/nvidia-nvswitch/devices")


def test_nvswitch_procfs_dir_empty(tmp_path: Path) -> None:
    assert fmc.nvswitch_facts(node(tmp_path, switches=[])) == (False, 0, "/proc/driver/nvidia-nvswitch/devices")


def test_nvswitch_control_node_is_not_a_switch(tmp_path: Path) -> None:
    assert "nvidia-nvswitchctl" in DEV_WITH_CTL_ONLY
    assert fmc.nvswitch_facts(node(tmp_path, dev=DEV_WITH_CTL_ONLY)) == (None, None, None)


def test_nvswitch_device_nodes_fallback(tmp_path: Path) -> None:
    names = [*DEV_WITH_CTL_ONLY, "nvidia-nvswitch0", "nvidia-nvswitch1", "nvidia-nvswitch2", "nvidia-nvswitch3"]
    assert fmc.nvswitch_facts(node(tmp_path, dev=names)) == (True, 4, "/dev/nvidia-nvswitch*")
