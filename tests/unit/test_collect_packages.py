"""Package collector: dpkg/rpm listings, holds, branches, unattended upgrades and DKMS on recorded output,
against the controller's PackageFacts. The package names' classification and the parsers on the package
tools' own output are tested with the collection
(ansible_collections/k3fleet/gpu/tests/unit/plugins/module_utils/test_k3fleet_packages.py).

Fixture sources: tests/fixtures/packages/SOURCES.md (a link to the collection's tests/unit/fixtures/packages,
one copy; and driver/, fabricmanager/SOURCES.md for the other tools' output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nodetree import fake_command, node

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_packages as pk
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.models.facts import PackageFacts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(name: str, area: str = "packages") -> str:
    return (FIXTURES / area / name).read_text(encoding="utf-8")


def dpkg_node(tmp_path: Path, listing: str, kernel: str = "6.8.0-51-generic\n",
              files: dict[str, str] | None = None, dkms: str | None = None) -> NodeReader:
    reader = node(tmp_path, {"/proc/sys/kernel/osrelease": kernel, **(files or {})})
    fake_command(tmp_path / "bin", "dpkg-query", [("*", listing, "", 0)])
    if dkms is not None:
        fake_command(tmp_path / "bin", "dkms", [("status", dkms, "", 0)])
    return reader


def by_name(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # Multi-arch copies share a name; the first (native) one is enough here.
    out: dict[str, dict[str, Any]] = {}
    for p in facts["packages"]:
        out.setdefault(p["name"], p)
    return out


# -- the parsers on other tools' output (the collection's tests have the rest) -------------


@pytest.mark.parametrize(("text", "message"), [
    (fixture("dpkg_query_debian12_hold.txt")[:-30], "line 108 is not"),
    (fixture("rpm_query_rhel9_595.txt"), "line 1 is not"),
    (fixture("nvidia_smi_no_driver.txt", "driver"), "line 1 is not"),
])
def test_parse_dpkg_query_rejects_truncated_or_foreign(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pk.parse_dpkg_query(text)


def test_parse_dkms_status_rejects_foreign_text() -> None:
    with pytest.raises(ValueError, match="no module line"):
        pk.parse_dkms_status(fixture("nvidia_smi_mismatch.txt", "driver"))
    assert pk.parse_dkms_status("") == []


def test_parse_systemctl_show_blocks() -> None:
    units = pk.parse_systemctl_show(fixture("systemctl_show_fm_failed.txt", "fabricmanager"))
    assert list(units) == ["nvidia-fabricmanager.service", "nvidia-persistenced.service",
                           "unattended-upgrades.service", "dnf-automatic.timer"]
    assert units["nvidia-fabricmanager.service"] == {
        "Id": "nvidia-fabricmanager.service", "LoadState": "loaded", "ActiveState": "failed",
        "SubState": "failed", "UnitFileState": "enabled"}
    assert units["dnf-automatic.timer"]["UnitFileState"] == ""


# -- the collector ---------------------------------------------------------------------


def test_collect_packages_ubuntu_510_held_dkms(tmp_path: Path) -> None:
    reader = dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_510_held.txt"), kernel="5.11.0-36-generic\n",
                       dkms=fixture("dkms_status_old_format.txt"))
    facts = pk.collect_packages(reader)
    PackageFacts.model_validate(facts)
    assert facts["status"] == "ok"
    assert facts["manager"] == "dpkg"
    assert facts["running_kernel"] == "5.11.0-36-generic"
    assert (facts["driver_branch"], facts["driver_version"]) == ("510", "510.108.03")
    pkgs = by_name(facts)
    assert pkgs["nvidia-driver-510"]["held"] is True
    assert pkgs["nvidia-driver-510"]["flavour"] == "proprietary"
    assert pkgs["nvidia-dkms-510"]["role"] == "dkms"
    # Removed (rc) 515 packages and non-NVIDIA rows are not listed.
    assert "nvidia-dkms-515" not in pkgs
    assert "libcudnn8" not in pkgs
    assert facts["dkms_used"] is True
    assert facts["dkms_modules"][0]["version"] == "460.91.03"
    assert facts["dkms_built_for_running_kernel"] is True
    assert facts["unattended_upgrades_installed"] is False
    assert facts["unattended_upgrades_enabled"] is False
    assert facts["fabricmanager_version"] is None


def test_collect_packages_dkms_built_for_another_kernel(tmp_path: Path) -> None:
    reader = dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_510_held.txt"), kernel="5.15.0-91-generic\n",
                       dkms=fixture("dkms_status_new_format.txt"))
    facts = pk.collect_packages(reader)
    assert facts["dkms_used"] is True
    assert facts["dkms_built_for_running_kernel"] is False
    assert [m["name"] for m in facts["dkms_modules"]] == ["nvidia"]


def test_collect_packages_dkms_package_without_dkms_command(tmp_path: Path) -> None:
    facts = pk.collect_packages(dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_510_held.txt")))
    assert facts["status"] == "ok"
    assert facts["dkms_used"] is True
    assert facts["dkms_built_for_running_kernel"] is None
    assert "dkms command is missing" in facts["reason"]


def test_collect_packages_ubuntu_550_prebuilt_modules(tmp_path: Path) -> None:
    facts = pk.collect_packages(dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_550_server_prebuilt.txt"),
                                          dkms=""))
    PackageFacts.model_validate(facts)
    assert facts["status"] == "ok"
    # No nvidia-driver metapackage: the utils package states the driver.
    assert (facts["driver_branch"], facts["driver_version"]) == ("550", "550.127.08")
    roles = {p["name"]: p["role"] for p in facts["packages"]}
    assert roles["linux-modules-nvidia-550-server-6.8.0-51-generic"] == "kernel_modules"
    assert roles["nvidia-compute-utils-550-server"] == "utils"
    assert facts["dkms_used"] is False
    assert facts["dkms_built_for_running_kernel"] is None
    assert all(not p["held"] for p in facts["packages"])


def test_collect_packages_two_branches_are_kept(tmp_path: Path) -> None:
    facts = pk.collect_packages(dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_495_510_mixed.txt")))
    assert {p["branch"] for p in facts["packages"]} == {"495", "510"}
    assert (facts["driver_branch"], facts["driver_version"]) == ("510", "510.47.03")
    assert "libnvidia-compute-495" not in by_name(facts)  # rc: removed, config left


def test_collect_packages_no_nvidia_packages_is_absent(tmp_path: Path) -> None:
    facts = pk.collect_packages(dpkg_node(tmp_path, fixture("dpkg_query_debian12_hold.txt")))
    PackageFacts.model_validate(facts)
    assert facts["status"] == "absent"
    assert facts["reason"].startswith("no NVIDIA packages installed (dpkg)")
    assert facts["unattended_upgrades_installed"] is False


@pytest.mark.parametrize(("listing", "installed", "enabled"), [
    ("dpkg_query_debian12_unattended.txt", True, True),
    # The package was removed, its 20auto-upgrades stayed behind: nothing runs it.
    ("dpkg_query_debian12_removed_rc.txt", False, False),
])
def test_collect_packages_unattended_upgrades(tmp_path: Path, listing: str, installed: bool, enabled: bool) -> None:
    reader = dpkg_node(tmp_path, fixture(listing),
                       files={"/etc/apt/apt.conf.d/20auto-upgrades": fixture("apt_20auto_upgrades_debian12.txt")})
    facts = pk.collect_packages(reader)
    assert facts["unattended_upgrades_installed"] is installed
    assert facts["unattended_upgrades_enabled"] is enabled


def test_collect_packages_unattended_installed_but_off(tmp_path: Path) -> None:
    off = fixture("apt_20auto_upgrades_debian12.txt").replace('Unattended-Upgrade "1"', 'Unattended-Upgrade "0"')
    reader = dpkg_node(tmp_path, fixture("dpkg_query_debian12_unattended.txt"),
                       files={"/etc/apt/apt.conf.d/20auto-upgrades": off})
    facts = pk.collect_packages(reader)
    assert facts["unattended_upgrades_installed"] is True
    assert facts["unattended_upgrades_enabled"] is False


def test_collect_packages_rpm_versionlock(tmp_path: Path) -> None:
    reader = node(tmp_path, {"/proc/sys/kernel/osrelease": "5.14.0-611.41.1.el9_7.x86_64\n",
                             "/etc/dnf/plugins/versionlock.list": fixture("versionlock_dnf4.list")})
    fake_command(tmp_path / "bin", "rpm", [("-qa*", fixture("rpm_query_rhel9_595.txt"), "", 0)])
    fake_command(tmp_path / "bin", "systemctl",
                 [("show*", fixture("systemctl_show_fm_not_found.txt", "fabricmanager"), "", 0)])
    facts = pk.collect_packages(reader)
    PackageFacts.model_validate(facts)
    assert facts["status"] == "ok"
    assert facts["manager"] == "rpm"
    pkgs = by_name(facts)
    assert pkgs["nvidia-driver"]["held"] is True
    assert pkgs["nvidia-driver"]["branch"] == "595"  # from the version: the RHEL name has no branch
    assert pkgs["kmod-nvidia-open-dkms"] == {"name": "kmod-nvidia-open-dkms", "version": "595.71.05-1.el9",
                                             "held": True, "role": "dkms", "branch": "595", "flavour": "open",
                                             "arch": "noarch"}
    assert pkgs["nvidia-kmod-common"]["held"] is False
    assert (facts["driver_branch"], facts["driver_version"]) == ("595", "595.71.05")
    assert facts["unattended_upgrades_installed"] is False
    assert facts["unattended_upgrades_enabled"] is False
    assert facts["dkms_used"] is True


def test_collect_packages_rpm_without_systemd(tmp_path: Path) -> None:
    reader = node(tmp_path, {"/proc/sys/kernel/osrelease": "5.14.0\n"})
    fake_command(tmp_path / "bin", "rpm", [("-qa*", fixture("rpm_query_rhel9_595.txt"), "", 0)])
    fake_command(tmp_path / "bin", "systemctl",
                 [("show*", "", fixture("systemctl_show_no_systemd.stderr", "fabricmanager"), 1)])
    facts = pk.collect_packages(reader)
    assert facts["status"] == "ok"
    assert facts["unattended_upgrades_enabled"] is None
    assert "dnf-automatic.timer state unknown: systemd not running: System has not been booted" in facts["reason"]
    assert all(not p["held"] for p in facts["packages"])  # no versionlock list


def test_collect_packages_transitional_name_takes_the_version_branch(tmp_path: Path) -> None:
    # docs/facts.md section 4: on newer Ubuntu some -575 names are transitional packages that install 580.
    listing = "nvidia-driver-575\t580.95.05-0ubuntu1\tii \n"
    facts = pk.collect_packages(dpkg_node(tmp_path, listing))
    (entry,) = facts["packages"]
    assert entry["branch"] == "580"
    assert entry["name_branch"] == "575"
    assert facts["driver_branch"] == "580"


def test_collect_packages_no_manager_is_absent(tmp_path: Path) -> None:
    facts = pk.collect_packages(node(tmp_path, {"/proc/sys/kernel/osrelease": "6.8.0\n"}))
    PackageFacts.model_validate(facts)
    assert facts["status"] == "absent"
    assert facts["manager"] is None
    assert "neither dpkg-query nor rpm" in facts["reason"]


def test_collect_packages_query_failure_is_unknown(tmp_path: Path) -> None:
    reader = node(tmp_path)
    fake_command(tmp_path / "bin", "dpkg-query", [("*", "", "dpkg-query: error: parsing file '/var/lib/dpkg/status'"
                                                           " near line 5:\n", 2)])
    facts = pk.collect_packages(reader)
    PackageFacts.model_validate(facts)
    assert facts["status"] == "unknown"
    assert facts["reason"].startswith("dpkg-query -W")
    assert "exit 2: dpkg-query: error: parsing file" in facts["reason"]
    assert "running kernel unknown" not in facts["reason"]  # the listing failure is the reason


def test_collect_packages_truncated_listing_is_unknown(tmp_path: Path) -> None:
    facts = pk.collect_packages(dpkg_node(tmp_path, fixture("dpkg_query_ubuntu_510_held.txt")[:-40]))
    assert facts["status"] == "unknown"
    assert facts["reason"].startswith("dpkg-query output not understood: dpkg-query line 37 is not")
    assert facts["packages"] == []


def test_collect_packages_timeout_is_unknown(tmp_path: Path) -> None:
    reader = node(tmp_path, timeout=0.5)
    fake_command(tmp_path / "bin", "dpkg-query", [("*", fixture("dpkg_query_ubuntu_510_held.txt"), "", 0)], sleep=5)
    facts = pk.collect_packages(reader)
    assert facts["status"] == "unknown"
    assert "timed out" in facts["reason"]


def test_collect_packages_kernel_release_missing(tmp_path: Path) -> None:
    reader = node(tmp_path)
    fake_command(tmp_path / "bin", "dpkg-query", [("*", fixture("dpkg_query_ubuntu_510_held.txt"), "", 0)])
    fake_command(tmp_path / "bin", "dkms", [("status", fixture("dkms_status_old_format.txt"), "", 0)])
    facts = pk.collect_packages(reader)
    assert facts["running_kernel"] is None
    assert facts["dkms_built_for_running_kernel"] is None
    assert "running kernel unknown: /proc/sys/kernel/osrelease" in facts["reason"]
