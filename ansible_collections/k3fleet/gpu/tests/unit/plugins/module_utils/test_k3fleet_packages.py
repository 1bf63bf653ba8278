"""The package collector's parsers: NVIDIA package names (role, branch, flavour), dpkg-query, rpm, versionlock
lists, dkms status and APT's periodic settings, on recorded output.

Fixture sources: tests/unit/fixtures/packages/SOURCES.md. The collector as a whole, against the controller's
model, and the parsers fed other tools' output are tested in the repository (tests/unit/test_collect_packages.py).
"""

from __future__ import annotations

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_packages as pk
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import fixture as _fixture


def fixture(name: str) -> str:
    return _fixture("packages", name)


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


def test_parse_apt_periodic() -> None:
    text = fixture("apt_20auto_upgrades_debian12.txt")
    assert pk.parse_apt_periodic(text) == "1"
    assert pk.parse_apt_periodic(text, "APT::Periodic::Update-Package-Lists") == "1"
    assert pk.parse_apt_periodic(text, "APT::Periodic::AutocleanInterval") is None
    assert pk.parse_apt_periodic(text.replace('Unattended-Upgrade "1"', 'Unattended-Upgrade "0"')) == "0"
