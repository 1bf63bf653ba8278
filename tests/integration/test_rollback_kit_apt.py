"""The rollback kit against real apt, without root (docs/change-night.md "Rollback kit").

A private, real apt/dpkg state (APT_CONFIG, DPKG_ADMINDIR; k3fleet.lab.changelab) over the stand-in
driver repository, with R575 installed and held: the kit is fetched for real with `apt-get download`
from the repository, checked with `dpkg-deb`, recorded with sha256; then the repository is rebuilt
without R575 (a mirror that keeps only the newest releases) and apt's lists refreshed: apt-cache policy
no longer offers the versions, a new kit cannot be made (apt's own words), and a rollback would take the
kit made before, whose files still have their recorded sha256. Installing from the kit needs root and a
booted node: tests/system/test_rollback_kit.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_rollback_kit as kit
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.lab.standin import build_repo, install_pins

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("change_tools")]

OLD = "575.57.08"
KIT = "/var/lib/k3fleet/rollback-kit/CHG-1"


def test_a_kit_fetched_from_a_repository_outlives_the_repositorys_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apt_sandbox: Callable[[Path, Path], dict[str, str]]) -> None:
    repo = build_repo(tmp_path / "repo")
    for name, value in apt_sandbox(tmp_path / "apt", repo).items():
        monkeypatch.setenv(name, value)
    # The node's packages as the collector lists them (installed, held, of driver branch 575).
    wanted = kit.kit_packages([{"name": p.split("=")[0], "version": p.split("=")[1], "branch": "575", "held": True}
                               for p in install_pins(OLD)])
    reader = NodeReader(root=str(tmp_path / "node"), timeout=120)
    (tmp_path / "node").mkdir()

    assert kit.make_kit(reader, KIT, wanted, check_mode=True)["problems"] == []
    made = kit.make_kit(reader, KIT, wanted, change_id="CHG-1", made_at="2026-12-05T08:00:00Z")
    assert made["problems"] == [] and len(made["packages"]) == len(install_pins(OLD)) == 6
    assert {e["source"] for e in made["packages"]} == {"repository"}
    where = tmp_path / "node" / KIT.lstrip("/")
    for e in made["packages"]:
        # The file apt fetched is the repository's own, byte for byte.
        assert e["sha256"] == kit.sha256_file(str(repo / e["file"]))
    assert json.loads((where / kit.MANIFEST).read_text())["packages"] == made["packages"]
    assert kit.make_kit(reader, KIT, wanted, change_id="CHG-1")["changed"] is False
    record = {"path": KIT, "packages": made["packages"]}
    assert kit.inspect(reader, wanted, kit=record)["source"] == "repository"

    # The mirror keeps only the newest releases now.
    build_repo(repo, without=[OLD])
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=dict(os.environ))
    got = kit.inspect(reader, wanted, kit=record)
    assert got["repository"] is False and not any(p["repository"] for p in got["packages"])
    assert got["source"] == "kit" and got["kit"]["verified"] is True
    again = kit.make_kit(reader, "/var/lib/k3fleet/rollback-kit/CHG-2", wanted, check_mode=True)
    assert len(again["problems"]) == 6
    assert again["problems"][0] == (f"cuda-drivers-fabricmanager-575:amd64={OLD}-1: E: Can't find a source to "
                                    f"download version '{OLD}-1' of 'cuda-drivers-fabricmanager-575:amd64'")
