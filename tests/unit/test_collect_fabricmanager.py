"""Fabric Manager collector: NVSwitch presence, the systemd unit, version against the loaded driver, its facts
against the controller's FabricManagerFacts. Its parsers and the NVSwitch count are tested with the collection
(ansible_collections/k3fleet/gpu/tests/unit/plugins/module_utils/test_k3fleet_fabricmanager.py).

Fixture sources: tests/fixtures/fabricmanager/SOURCES.md (a link to the collection's
tests/unit/fixtures/fabricmanager, one copy; and driver/, packages/ SOURCES.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nodetree import fake_command

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_fabricmanager as fmc
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_driver import parse_proc_version
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import nvswitch_node
from k3fleet.models.facts import FabricManagerFacts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(name: str, area: str = "fabricmanager") -> str:
    return (FIXTURES / area / name).read_text(encoding="utf-8")


def node(tmp_path: Path, files: dict[str, str] | None = None, switches: list[str] | None = None,
         dev: list[str] | None = None) -> NodeReader:
    return nvswitch_node(tmp_path, files, switches, dev)


# Real listings, turned into the names a node tree needs.
HGX_A100_SWITCHES = fixture("nvswitch_devices_ls.txt").split()
DEV_WITH_CTL_ONLY = [line.split()[-1].rsplit("/", 1)[1] for line in fixture("dev_nv_listing.txt").splitlines()]


def systemctl(tmp_path: Path, name: str) -> None:
    if name.endswith(".stderr"):
        fake_command(tmp_path / "bin", "systemctl", [("show*", "", fixture(name), 1)])
    else:
        fake_command(tmp_path / "bin", "systemctl", [("show*", fixture(name), "", 0)])


def driver_loaded(version_fixture: str) -> dict[str, Any]:
    parsed = parse_proc_version(fixture(version_fixture, "driver"))
    return {"kernel_module": {"loaded": True, "version": parsed["version"], "flavour": parsed["flavour"]}}


def packages(fm: str | None, driver: str | None = None) -> dict[str, Any]:
    return {"status": "ok", "manager": "dpkg", "fabricmanager_version": fm, "driver_version": driver}


def fm_facts(tmp_path: Path, unit: str, driver: dict[str, Any], pkgs: dict[str, Any], **node_kw: Any) -> dict[str, Any]:
    """The collector's facts, validated, on ``node(**node_kw)`` whose systemctl replays the fixture ``unit``."""
    reader = node(tmp_path, **node_kw)
    systemctl(tmp_path, unit)
    facts = fmc.collect_fabricmanager(reader, driver=driver, packages=pkgs)
    FabricManagerFacts.model_validate(facts)
    return facts


# -- parsers on other tools' output (the collection's tests have the rest) ---------------


def test_parse_fm_version_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="printed no version: 'Failed to initialize NVML"):
        fmc.parse_fm_version(fixture("nvidia_smi_mismatch.txt", "driver"))


# -- the collector -------------------------------------------------------------------------


def test_hgx_fabric_manager_matches_driver(tmp_path: Path) -> None:
    facts = fm_facts(tmp_path, "systemctl_show_fm_failed.txt", {"kernel_module": {"version": "450.102.04"}},
                     packages("450.102.04"), switches=HGX_A100_SWITCHES)
    assert facts["status"] == "ok"
    assert (facts["nvswitch_present"], facts["nvswitch_count"], facts["required"]) == (True, 6, True)
    assert facts["unit"] == {"installed": True, "active": "failed", "enabled": "enabled"}
    assert facts["version_matches_driver"] is True


def test_version_from_binary_mismatching_loaded_driver(tmp_path: Path) -> None:
    fake_command(tmp_path / "bin", "nv-fabricmanager", [("--version", fixture("nv_fabricmanager_version.txt"), "", 0)])
    facts = fm_facts(tmp_path, "systemctl_show_fm_failed.txt", driver_loaded("proc_version_open_x86_64.txt"),
                     packages(None, "565.57.01"), switches=HGX_A100_SWITCHES)
    assert facts["version"] == "450.102.04"
    assert facts["driver_version"] == "565.57.01"
    assert facts["version_matches_driver"] is False
    assert facts["status"] == "ok"


def test_loaded_module_wins_over_package_version(tmp_path: Path) -> None:
    # After an upgrade without reboot the package says 580 while 575 is still loaded.
    facts = fm_facts(tmp_path, "systemctl_show_fm_failed.txt", {"kernel_module": {"version": "575.57.08"}},
                     packages("580.95.05", "580.95.05"), switches=HGX_A100_SWITCHES)
    assert facts["driver_version"] == "575.57.08"
    assert facts["version_matches_driver"] is False


def test_no_systemd_makes_unit_unknown(tmp_path: Path) -> None:
    facts = fm_facts(tmp_path, "systemctl_show_no_systemd.stderr", {"kernel_module": {"version": "450.102.04"}},
                     packages("450.102.04"), switches=HGX_A100_SWITCHES)
    assert facts["status"] == "unknown"
    assert facts["unit"] == {"installed": None, "active": None, "enabled": None}
    assert facts["reason"].startswith("nvidia-fabricmanager.service state unknown: systemd not running: "
                                      "System has not been booted with systemd")
    assert facts["version_matches_driver"] is True


def test_not_installed_without_nvswitch_is_absent(tmp_path: Path) -> None:
    facts = fm_facts(tmp_path, "systemctl_show_fm_not_found.txt",
                     {"kernel_module": {"loaded": True, "version": "580.95.05"}},
                     packages(None, "580.95.05"), switches=[])
    assert facts["status"] == "absent"
    assert facts["reason"] == "Fabric Manager not installed (no NVSwitch)"
    assert facts["required"] is False
    assert facts["unit"]["installed"] is False


def test_not_installed_with_nvswitch_is_absent_and_required(tmp_path: Path) -> None:
    facts = fm_facts(tmp_path, "systemctl_show_fm_not_found.txt",
                     {"kernel_module": {"loaded": True, "version": "580.95.05"}},
                     packages(None, "580.95.05"), switches=HGX_A100_SWITCHES)
    assert facts["status"] == "absent"
    assert facts["required"] is True
    assert facts["reason"] == "Fabric Manager not installed (NVSwitch present: 6)"


def test_driver_not_loaded_leaves_nvswitch_unknown(tmp_path: Path) -> None:
    facts = fm_facts(tmp_path, "systemctl_show_fm_failed.txt", {"kernel_module": {"loaded": False}},
                     packages("450.102.04", "450.102.04"), dev=DEV_WITH_CTL_ONLY)
    assert facts["nvswitch_present"] is None
    assert facts["required"] is None
    assert facts["status"] == "unknown"
    assert "NVSwitch presence unknown: NVIDIA driver not loaded" in facts["reason"]
    assert facts["driver_version"] == "450.102.04"  # from the package when nothing is loaded


def test_binary_with_garbage_output_is_unknown(tmp_path: Path) -> None:
    fake_command(tmp_path / "bin", "nv-fabricmanager",
                 [("--version", fixture("nvidia_smi_mismatch.txt", "driver"), "", 0)])
    facts = fm_facts(tmp_path, "systemctl_show_fm_failed.txt", {"kernel_module": {"version": "580.95.05"}},
                     packages(None, "580.95.05"), switches=HGX_A100_SWITCHES)
    assert facts["status"] == "unknown"
    assert facts["version"] is None
    assert "nv-fabricmanager --version printed no version" in facts["reason"]
    assert facts["version_matches_driver"] is None


def test_collects_driver_and_packages_itself(tmp_path: Path) -> None:
    listing = fixture("dpkg_query_ubuntu_510_held.txt", "packages")
    reader = node(tmp_path, files={"/proc/driver/nvidia/version": fixture("proc_version_proprietary_510.txt", "driver"),
                                   "/proc/sys/kernel/osrelease": "5.15.0-91-generic\n"},
                  switches=HGX_A100_SWITCHES)
    fake_command(tmp_path / "bin", "dpkg-query", [("*", listing, "", 0)])
    systemctl(tmp_path, "systemctl_show_fm_failed.txt")
    fake_command(tmp_path / "bin", "nv-fabricmanager", [("--version", fixture("nv_fabricmanager_version.txt"), "", 0)])
    facts = fmc.collect_fabricmanager(reader)
    FabricManagerFacts.model_validate(facts)
    assert facts["driver_version"] == "510.60.02"  # the loaded module, read from /proc
    assert facts["version"] == "450.102.04"
    assert facts["version_matches_driver"] is False
    assert facts["status"] == "ok"
