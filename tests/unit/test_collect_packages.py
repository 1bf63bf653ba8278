"""Package collector: dpkg/rpm listings, holds, branches, unattended upgrades and DKMS on recorded output.

Fixture sources: tests/fixtures/packages/SOURCES.md (and fabricmanager/SOURCES.md for systemctl).
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


# -- names (docs/facts.md sections 3-4) ---------------------------------------------------


@pytest.mark.parametrize(("name", "role", "branch", "flavour"), [
    ("nvidia-driver-580-server", "driver", "580", "proprietary"),
    ("nvidia-driver-580-server-open", "driver", "580", "open"),
    ("nvidia-driver-575", "driver", "575", "proprietary"),
    ("nvidia-headless-no-dkms-580-server-open", "driver", "580", "open"),
    ("nvidia-open-580", "driver", "580", "open"),
    ("nvidia-open", "driver", None, "open"),
    ("cuda-drivers-580", "driver", "580", None),
    ("cuda-drivers", "driver", None, None),
    ("nvidia-driver", "driver", None, None),
    ("nvidia-driver-pinning-580", "other", "580", None),
    ("nvidia-utils-580-server", "utils", "580", None),
    ("nvidia-compute-utils-550-server", "utils", "550", None),
    ("nvidia-driver-cuda", "utils", None, None),
    ("libnvidia-compute-580", "compute", "580", None),
    ("libnvidia-compute-510:amd64", "compute", "510", None),
    ("nvidia-driver-NVML", "compute", None, None),
    ("nvidia-dkms-580-open", "dkms", "580", "open"),
    ("nvidia-dkms-510", "dkms", "510", "proprietary"),
    ("kmod-nvidia-open-dkms", "dkms", None, "open"),
    ("kmod-nvidia-latest-dkms", "dkms", None, "proprietary"),
    ("linux-modules-nvidia-580-server-open-6.8.0-45-generic", "kernel_modules", "580", "open"),
    ("linux-modules-nvidia-550-server-6.8.0-51-generic", "kernel_modules", "550", "proprietary"),
    ("linux-signatures-nvidia-6.8.0-51-generic", "kernel_modules", None, None),
    ("kmod-nvidia-535.54.03-5.14.0-284.18.1", "kernel_modules", "535", None),
    ("nvidia-fabricmanager-580", "fabricmanager", "580", None),
    ("cuda-drivers-fabricmanager-580", "fabricmanager", "580", None),
    ("nvidia-fabricmanager", "fabricmanager", None, None),
    ("nvidia-fabric-manager", "fabricmanager", None, None),
    ("nvidia-container-toolkit", "toolkit", None, None),
    ("libnvidia-container1", "toolkit", None, None),
    ("libnvidia-cfg1-510", "other", "510", None),
    ("nvidia-fabricmanager-dev-580", "other", "580", None),
    ("nvidia-kernel-source-510-open", "other", "510", "open"),
])
def test_classify_package(name: str, role: str, branch: str | None, flavour: str | None) -> None:
    got = pk.classify_package(name)
    assert got is not None
    assert (got["role"], got["branch"], got["flavour"]) == (role, branch, flavour)


@pytest.mark.parametrize("name", ["dbus", "cuda-toolkit-config-common", "screen-resolution-extra", "dkms",
                                  "unattended-upgrades"])
def test_classify_package_ignores_non_nvidia(name: str) -> None:
    assert pk.classify_package(name) is None


@pytest.mark.parametrize(("version", "upstream"), [
    ("580.95.05-0ubuntu1", "580.95.05"),
    ("580.95.05-1", "580.95.05"),
    ("580.95.05-1.el9", "580.95.05"),
    ("3:580.95.05-1.el9", "580.95.05"),
    ("550.127.08-0ubuntu0.24.04.1", "550.127.08"),
    ("570.148.08-0lambda0.22.04.1", "570.148.08"),
    ("580.95.05", "580.95.05"),
    ("", None),
    (None, None),
])
def test_upstream_version(version: str | None, upstream: str | None) -> None:
    assert pk.upstream_version(version) == upstream


# -- dpkg-query / rpm / versionlock / dkms / apt ----------------------------------------


@pytest.mark.parametrize(("name", "rows", "installed", "held"), [
    ("dpkg_query_debian12_hold.txt", 108, 108, {"dbus"}),
    ("dpkg_query_debian12_removed_rc.txt", 139, 138, {"dbus"}),
    ("dpkg_query_debian12_unattended.txt", 139, 139, {"dbus"}),
    ("dpkg_query_ubuntu_510_held.txt", 37, 33, None),
    ("dpkg_query_ubuntu_550_server_prebuilt.txt", 7, 7, set()),
    ("dpkg_query_ubuntu_495_510_mixed.txt", 8, 4, set()),
])
def test_parse_dpkg_query(name: str, rows: int, installed: int, held: set[str] | None) -> None:
    parsed = pk.parse_dpkg_query(fixture(name))
    assert len(parsed) == rows
    assert sum(r["installed"] for r in parsed) == installed
    if held is not None:
        assert {r["name"] for r in parsed if r["held"]} == held


def test_parse_dpkg_query_row_shapes() -> None:
    rows = {(r["name"], r["arch"]): r for r in pk.parse_dpkg_query(fixture("dpkg_query_ubuntu_510_held.txt"))}
    assert rows[("libnvidia-compute-510", "amd64")]["held"] is True
    assert rows[("libnvidia-compute-510", "i386")]["held"] is False
    assert rows[("libnvidia-compute-515", "amd64")] == {
        "name": "libnvidia-compute-515", "arch": "amd64", "version": "515.86.01-0ubuntu1", "status": "rc",
        "installed": False, "held": False}
    removed = {r["name"]: r for r in pk.parse_dpkg_query(fixture("dpkg_query_debian12_removed_rc.txt"))}
    assert removed["unattended-upgrades"]["status"] == "rc"
    assert removed["unattended-upgrades"]["installed"] is False


@pytest.mark.parametrize(("text", "message"), [
    (fixture("dpkg_query_debian12_hold.txt")[:-30], "line 108 is not"),
    (fixture("rpm_query_rhel9_595.txt"), "line 1 is not"),
    (fixture("nvidia_smi_no_driver.txt", "driver"), "line 1 is not"),
])
def test_parse_dpkg_query_rejects_truncated_or_foreign(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pk.parse_dpkg_query(text)


def test_parse_rpm() -> None:
    assert pk.parse_rpm(fixture("rpm_query_rhel9_595.txt")) == [
        {"name": "nvidia-driver", "version": "595.71.05-1.el9", "arch": "x86_64"},
        {"name": "kmod-nvidia-open-dkms", "version": "595.71.05-1.el9", "arch": "noarch"},
        {"name": "nvidia-kmod-common", "version": "595.71.05-1.el9", "arch": "noarch"},
    ]


@pytest.mark.parametrize("text", [fixture("rpm_query_rhel9_595.txt")[:40], fixture("dpkg_query_ubuntu_510_held.txt")])
def test_parse_rpm_rejects_truncated_or_foreign(text: str) -> None:
    with pytest.raises(ValueError, match="is not 'name<TAB>version-release<TAB>arch'"):
        pk.parse_rpm(text)


@pytest.mark.parametrize(("name", "locked", "excluded"), [
    ("versionlock_dnf4.list", {"nvidia-driver", "kmod-nvidia-open-dkms"}, set()),
    ("versionlock_yum_epoch_first.list", {"nvidia-driver"}, {"nvidia-kmod-common"}),
])
def test_parse_versionlock(name: str, locked: set[str], excluded: set[str]) -> None:
    assert pk.parse_versionlock(fixture(name)) == {"locked": locked, "excluded": excluded}


@pytest.mark.parametrize(("name", "expected"), [
    ("dkms_status_new_format.txt", [
        {"name": "nvidia", "version": "535.86.05", "kernel": "6.5.0-060500rc5-generic", "arch": "x86_64",
         "status": "installed"},
        {"name": "rtl8852bu", "version": "1.19.3", "kernel": "6.5.0-060500rc5-generic", "arch": "x86_64",
         "status": "installed"}]),
    ("dkms_status_old_format.txt", [
        {"name": "nvidia", "version": "460.91.03", "kernel": "5.11.0-36-generic", "arch": "x86_64",
         "status": "installed"}]),
    ("dkms_status_original_module.txt", [
        {"name": "amdgpu", "version": "1.9-211.el7", "kernel": "3.10.0-862.11.6.el7.x86_64", "arch": "x86_64",
         "status": "installed", "detail": "(original_module exists)"}]),
])
def test_parse_dkms_status_both_formats(name: str, expected: list[dict[str, str]]) -> None:
    assert pk.parse_dkms_status(fixture(name)) == expected


def test_parse_dkms_status_rejects_foreign_text() -> None:
    with pytest.raises(ValueError, match="no module line"):
        pk.parse_dkms_status(fixture("nvidia_smi_mismatch.txt", "driver"))
    assert pk.parse_dkms_status("") == []


def test_parse_apt_periodic() -> None:
    text = fixture("apt_20auto_upgrades_debian12.txt")
    assert pk.parse_apt_periodic(text) == "1"
    assert pk.parse_apt_periodic(text, "APT::Periodic::Update-Package-Lists") == "1"
    assert pk.parse_apt_periodic(text, "APT::Periodic::AutocleanInterval") is None
    assert pk.parse_apt_periodic(text.replace('Unattended-Upgrade "1"', 'Unattended-Upgrade "0"')) == "0"


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
