"""The rollback kit's logic (module_utils/k3fleet_rollback_kit.py, docs/change-night.md "Rollback kit"):
which packages a kit keeps, where each one comes from, its sha256 record, and where a rollback installs
from. apt's answers are recorded real output (the collection's tests/unit/fixtures/rollback_kit/SOURCES.md)
replayed on the reader's PATH; the .deb files are real packages built here with dpkg-deb, which checks them too.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_rollback_kit as kit
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import _package_entry, parse_dpkg_query
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import (
    ExitJson,
    FailJson,
    fake_command,
    module_args,
    node,
    patch_exits,
)
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import (
    fixture as read_fixture,
)

DPKG_DEB = shutil.which("dpkg-deb")
needs_dpkg_deb = pytest.mark.skipif(DPKG_DEB is None, reason="dpkg-deb builds and reads the test packages")


def fixture(name: str, area: str = "rollback_kit") -> str:
    return read_fixture(area, name)


def build_deb(out_dir: Path, name: str, version: str, arch: str = "amd64", payload: str = "x") -> Path:
    """A real (tiny) Debian package, as dpkg-deb builds it."""
    root = out_dir / f".build-{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: k3fleet tests <t@k3fleet.invalid>\n"
        f"Description: rollback kit test package\n", encoding="utf-8")
    (root / "usr" / "share" / name).mkdir(parents=True)
    (root / "usr" / "share" / name / "payload").write_text(payload, encoding="utf-8")
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / kit.deb_file_name(name, version, arch)
    subprocess.run([str(DPKG_DEB), "--root-owner-group", "-b", str(root), str(deb)], check=True,
                   capture_output=True)
    shutil.rmtree(root)
    return deb


def kit_node(tmp_path: Path, policy: str = "", download: list[tuple[str, str, str, int]] | None = None) -> NodeReader:
    """A node whose PATH has the real dpkg-deb and replayed apt-cache / apt-get / dpkg-query."""
    reader = node(tmp_path)
    bin_dir = tmp_path / "bin"
    (bin_dir / "dpkg-deb").symlink_to(DPKG_DEB or "/usr/bin/dpkg-deb")
    # dpkg-deb reads a package's control through tar.
    (bin_dir / "tar").symlink_to(shutil.which("tar") or "/bin/tar")
    fake_command(bin_dir, "apt-cache", [("policy*", policy, "", 0)])
    fake_command(bin_dir, "apt-get", download or [("*", "", "E: Unable to locate package\n", 100)])
    fake_command(bin_dir, "dpkg-query", [("*", "", "dpkg-query: no packages found matching\n", 1)])
    return reader


# -- apt-cache policy ---------------------------------------------------------------------------------


def test_policy_tells_a_version_only_dpkg_knows_from_one_a_repository_offers() -> None:
    policy = kit.parse_policy(fixture("apt_cache_policy_bookworm.txt"))
    assert set(policy) == {"bash", "python3"}, "a name apt does not know prints nothing"
    bash = policy["bash"]
    assert (bash["installed"], bash["candidate"]) == ("5.2.15-2+b8", "5.2.15-2+b13")
    assert bash["versions"] == {"5.2.15-2+b13": ["http://mirror.example/debian bookworm/main amd64 Packages"],
                                "5.2.15-2+b8": ["/var/lib/dpkg/status"]}
    # Installed, but only dpkg's status file lists it: what a rollback meets when the mirror dropped it.
    assert kit.offered(policy, "bash", "5.2.15-2+b8") is False
    assert kit.offered(policy, "bash", "5.2.15-2+b13") is True
    # Installed and offered: the repository line and the status line under one version.
    assert kit.offered(policy, "python3", "3.11.2-1+b1") is True
    assert kit.offered(policy, "nosuchpkg-xyz", "1.0") is False


def test_policy_refuses_a_table_without_its_package() -> None:
    with pytest.raises(ValueError, match="outside a package"):
        kit.parse_policy("  Installed: 1.0\n")


# -- what a kit keeps -----------------------------------------------------------------------------


def test_a_kit_keeps_every_driver_branch_package_with_its_hold() -> None:
    # A real Ubuntu node with driver 510 held (tests/fixtures/packages/SOURCES.md), as the collector lists it.
    rows = [r for r in parse_dpkg_query(fixture("dpkg_query_ubuntu_510_held.txt", "packages")) if r["installed"]]
    packages = [e for r in rows if (e := _package_entry(r["name"], r["version"], r["held"], r["arch"]))]
    kept = kit.kit_packages(packages)
    names = [p["name"] for p in kept]
    assert names == sorted(names)
    branch = [p for p in packages if p["branch"]]
    assert len(kept) == len(branch) > 0

    def triples(ps: list[dict[str, Any]]) -> set[tuple[str, str, bool]]:
        return {(p["name"], p["version"], p["held"]) for p in ps}

    assert triples(kept) == triples(branch)
    assert any(p["held"] for p in kept) and not all(p["held"] for p in kept)
    assert all(p["name"] != "nvidia-container-toolkit" for p in kept), "the toolkit follows no driver branch"


def test_a_package_without_a_version_is_refused() -> None:
    with pytest.raises(ValueError, match="without a name or version"):
        kit.kit_packages([{"name": "nvidia-driver-575-server", "branch": "575", "version": ""}])


@pytest.mark.parametrize(("name", "version", "arch", "file"), [
    ("nvidia-driver-575-server", "575.57.08-0ubuntu1", "amd64",
     "nvidia-driver-575-server_575.57.08-0ubuntu1_amd64.deb"),
    ("nvidia-driver", "3:580.95.05-1", "amd64", "nvidia-driver_3%3a580.95.05-1_amd64.deb"),
    ("bash", "5.2.15-2+b13", "amd64", "bash_5.2.15-2+b13_amd64.deb"),  # apt-get download's own name for it
    ("nvidia-kernel-common-580", "580.95.05-0ubuntu1", None, "nvidia-kernel-common-580_580.95.05-0ubuntu1_all.deb"),
])
def test_file_names_are_apts(name: str, version: str, arch: str | None, file: str) -> None:
    assert kit.deb_file_name(name, version, arch) == file


def test_print_uris_names_the_file_apt_would_write() -> None:
    # The file name apt-get download prints for the package is the one the kit expects to find.
    printed = fixture("apt_get_download_print_uris.txt").split()[1]
    assert printed == kit.deb_file_name("bash", "5.2.15-2+b13", "amd64")


@pytest.mark.parametrize("change_id", ["", "../etc", "a/b", ".hidden"])
def test_a_kit_directory_is_one_change_id_deep(change_id: str) -> None:
    with pytest.raises(ValueError, match="cannot name a kit directory"):
        kit.kit_dir(kit.KIT_ROOT, change_id)


# -- making a kit -----------------------------------------------------------------------------------


PKGS = [{"name": "nvidia-driver-575-server", "version": "575.57.08-0ubuntu1", "arch": "amd64", "held": True},
        {"name": "nvidia-fabricmanager-575", "version": "575.57.08-1", "arch": "amd64", "held": True}]
KIT = "/var/lib/k3fleet/rollback-kit/CHG-1"


def cache_debs(tmp_path: Path) -> None:
    for p in PKGS:
        build_deb(tmp_path / "root" / "var/cache/apt/archives", p["name"], p["version"], p["arch"])


@needs_dpkg_deb
def test_a_kit_from_apts_cache_records_each_sha256_and_is_idempotent(tmp_path: Path) -> None:
    cache_debs(tmp_path)
    reader = kit_node(tmp_path)
    made = kit.make_kit(reader, KIT, PKGS, change_id="CHG-1", made_at="2026-12-05T08:00:00Z")
    assert made["problems"] == [] and made["changed"] is True
    where = tmp_path / "root" / KIT.lstrip("/")
    manifest = json.loads((where / kit.MANIFEST).read_text())
    assert manifest["change_id"] == "CHG-1" and manifest["packages"] == made["packages"]
    for entry in made["packages"]:
        assert entry["source"] == "apt-cache"
        assert entry["sha256"] == kit.sha256_file(str(where / entry["file"]))
        assert entry["size"] == (where / entry["file"]).stat().st_size
    assert [e["held"] for e in made["packages"]] == [True, True]
    assert not list(where.glob(".fetch-*")) and not list(where.glob("*.part"))
    again = kit.make_kit(reader, KIT, PKGS, change_id="CHG-1", made_at="2026-12-05T09:00:00Z")
    assert again["changed"] is False and again["fetched"] == []
    assert json.loads((where / kit.MANIFEST).read_text())["made_at"] == "2026-12-05T08:00:00Z"


@needs_dpkg_deb
def test_a_changed_kit_file_is_fetched_again(tmp_path: Path) -> None:
    cache_debs(tmp_path)
    reader = kit_node(tmp_path)
    kit.make_kit(reader, KIT, PKGS, change_id="CHG-1")
    where = tmp_path / "root" / KIT.lstrip("/")
    first = where / PKGS[0]["name"]
    victim = next(where.glob(f"{first.name}_*.deb"))
    victim.write_bytes(b"not a package")
    again = kit.make_kit(reader, KIT, PKGS, change_id="CHG-1")
    assert again["changed"] is True and len(again["fetched"]) == 1
    assert kit.verify_entries(str(where), again["packages"])[1] == []


@needs_dpkg_deb
def test_a_cached_file_of_another_version_is_not_taken(tmp_path: Path) -> None:
    # The cache holds a file under the right name whose control says another version: never counted.
    deb = build_deb(tmp_path / "other", PKGS[0]["name"], "575.51.03-0ubuntu1", "amd64")
    cache = tmp_path / "root" / "var/cache/apt/archives"
    cache.mkdir(parents=True)
    shutil.copyfile(deb, cache / kit.deb_file_name(PKGS[0]["name"], PKGS[0]["version"], "amd64"))
    gone = fixture("apt_get_download_gone.txt")
    reader = kit_node(tmp_path, download=[("*", "", gone, 100)])
    made = kit.make_kit(reader, KIT, PKGS[:1], change_id="CHG-1")
    assert made["packages"] == []
    assert made["problems"] == [f"nvidia-driver-575-server:amd64=575.57.08-0ubuntu1: {gone.strip()}"]
    assert not (tmp_path / "root" / KIT.lstrip("/")).exists(), "a kit that kept nothing left its directory"


@needs_dpkg_deb
def test_check_mode_asks_the_repository_and_writes_nothing(tmp_path: Path) -> None:
    pkgs = [{"name": "bash", "version": "5.2.15-2+b13", "arch": "amd64", "held": False},
            {"name": "bash-old", "version": "5.2.15-2+b8", "arch": "amd64", "held": True}]
    reader = kit_node(tmp_path, download=[
        ("*--print-uris*bash:amd64=5.2.15-2+b13", fixture("apt_get_download_print_uris.txt"), "", 0),
        ("*--print-uris*bash-old:*", "", fixture("apt_get_download_gone.txt"), 100)])
    made = kit.make_kit(reader, KIT, pkgs, check_mode=True)
    assert made["fetched"] == ["bash:amd64=5.2.15-2+b13 from a repository"]
    assert made["problems"] == ["bash-old:amd64=5.2.15-2+b8: E: Can't find a source to download version "
                                "'5.2.15-2+b8' of 'bash:amd64'"]
    assert not (tmp_path / "root" / "var").exists(), "check mode wrote something"


# -- where a rollback installs from -----------------------------------------------------------------


BASH = [{"name": "bash", "version": "5.2.15-2+b8", "arch": "amd64", "held": False}]


@needs_dpkg_deb
def test_a_rollback_takes_the_kit_when_the_repository_dropped_the_version(tmp_path: Path) -> None:
    reader = kit_node(tmp_path, policy=fixture("apt_cache_policy_bookworm.txt"))
    where = tmp_path / "root" / KIT.lstrip("/")
    deb = build_deb(where, "bash", "5.2.15-2+b8", "amd64")
    record = {"path": KIT, "packages": [dict(BASH[0], file=deb.name, sha256=kit.sha256_file(str(deb)))]}
    got = kit.inspect(reader, BASH, kit=record)
    assert got["repository"] is False and got["source"] == "kit"
    assert got["kit"]["verified"] is True and got["kit"]["files"] == {deb.name: "ok"}
    assert "does not offer bash:amd64=5.2.15-2+b8" in got["why"]
    # A file changed on the node since the journal recorded it is never installed.
    deb.write_bytes(deb.read_bytes() + b"\0")
    bad = kit.inspect(reader, BASH, kit=record)
    assert bad["source"] is None and bad["kit"]["files"] == {deb.name: "changed"}
    assert "the kit fails its check" in bad["why"] and "the kit recorded" in bad["why"]
    deb.unlink()
    assert kit.inspect(reader, BASH, kit=record)["kit"]["files"] == {deb.name: "missing"}


def test_a_rollback_takes_the_repository_when_it_offers_every_version(tmp_path: Path) -> None:
    reader = kit_node(tmp_path, policy=fixture("apt_cache_policy_bookworm.txt"))
    pkgs = [{"name": "bash", "version": "5.2.15-2+b13", "arch": None, "held": True},
            {"name": "python3", "version": "3.11.2-1+b1", "arch": None, "held": False}]
    got = kit.inspect(reader, pkgs, kit=None)
    assert (got["repository"], got["source"]) == (True, "repository")


def test_no_source_names_the_versions_and_the_missing_kit(tmp_path: Path) -> None:
    reader = kit_node(tmp_path, policy=fixture("apt_cache_policy_bookworm.txt"))
    got = kit.inspect(reader, BASH, kit=None)
    assert got["source"] is None
    assert got["why"] == ("the repository does not offer bash:amd64=5.2.15-2+b8; no rollback kit was recorded "
                          "for this change")
    partial = kit.inspect(reader, BASH, kit={"path": KIT, "packages": []})
    assert partial["source"] is None and partial["kit"]["problems"] == ["bash:amd64=5.2.15-2+b8: not in the kit"]


def test_no_package_to_look_for_is_no_source_not_an_empty_kit(tmp_path: Path) -> None:
    reader = kit_node(tmp_path, policy=fixture("apt_cache_policy_bookworm.txt"))
    got = kit.inspect(reader, [], kit={"path": KIT, "packages": []})
    assert got["source"] is None and got["repository"] is False
    assert got["why"] == "no driver-branch package given (a snapshot's packages carry their branch)"


# -- the modules ------------------------------------------------------------------------------------


def run_module(monkeypatch: pytest.MonkeyPatch, name: str, args: dict[str, Any], check: bool = False
               ) -> tuple[str, dict[str, Any]]:
    patch_exits(monkeypatch)
    module = importlib.import_module(f"ansible_collections.k3fleet.gpu.plugins.modules.{name}")
    with module_args(dict(args, _ansible_check_mode=check)):
        try:
            module.main()
        except ExitJson as done:
            return "exit", done.args[0]
        except FailJson as failed:
            return "fail", failed.args[0]
    raise AssertionError("the module neither exited nor failed")


@needs_dpkg_deb
def test_the_module_makes_a_kit_then_reports_no_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache_debs(tmp_path)
    reader = kit_node(tmp_path)
    args = {"directory": KIT, "change_id": "CHG-1", "root": reader.root, "path": reader.path,
            "packages": [dict(p, branch="575", role="driver") for p in PKGS] + [
                {"name": "nvidia-container-toolkit", "version": "1.17.8-1", "branch": None, "held": False}]}
    how, res = run_module(monkeypatch, "k3fleet_rollback_kit", args)
    assert how == "exit" and res["changed"] is True and res["k3fleet"]["complete"] is True
    assert [p["name"] for p in res["k3fleet"]["packages"]] == [p["name"] for p in PKGS]
    how, res = run_module(monkeypatch, "k3fleet_rollback_kit", args)
    assert how == "exit" and res["changed"] is False


def test_the_module_fails_with_apts_words_and_the_info_says_it_cannot_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = kit_node(tmp_path, policy=fixture("apt_cache_policy_bookworm.txt"),
                      download=[("*", "", fixture("apt_get_download_gone.txt"), 100)])
    args = {"root": reader.root, "path": reader.path, "packages": [dict(BASH[0], branch="575")]}
    how, res = run_module(monkeypatch, "k3fleet_rollback_kit", dict(args, directory=KIT, change_id="CHG-1"))
    assert how == "fail"
    assert res["msg"] == (f"rollback kit {KIT} cannot be made: bash:amd64=5.2.15-2+b8: E: Can't find a source to "
                          "download version '5.2.15-2+b8' of 'bash:amd64'")
    how, info = run_module(monkeypatch, "k3fleet_rollback_kit_info", dict(args, directory=KIT), check=True)
    assert how == "exit" and info["changed"] is False
    assert info["k3fleet"]["can_make"] is False and info["k3fleet"]["source"] is None
    assert info["k3fleet"]["problems"] == [res["msg"].split("cannot be made: ", 1)[1]]


def test_the_module_refuses_a_node_without_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = node(tmp_path)
    how, res = run_module(monkeypatch, "k3fleet_rollback_kit",
                          {"root": reader.root, "path": reader.path, "directory": KIT,
                           "packages": [dict(PKGS[0], branch="575")]})
    assert how == "fail" and "apt-get is not on the node's PATH" in res["msg"]
