"""The rollback kit against real apt, without root (docs/change-night.md "Rollback kit").

A private, real apt/dpkg state (APT_CONFIG, DPKG_ADMINDIR; k3fleet.lab.changelab) over the stand-in
driver repository, with R575 installed and held: the kit is fetched for real with `apt-get download`
from the repository, checked with `dpkg-deb`, recorded with sha256; then the repository is rebuilt
without R575 (a mirror that keeps only the newest releases) and apt's lists refreshed: apt-cache policy
no longer offers the versions, a new kit cannot be made (apt's own words), and a rollback would take the
kit made before, whose files still have their recorded sha256. Installing from the kit needs root and a
booted node: tests/system/test_rollback_kit_night.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_rollback_kit as kit
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from k3fleet.lab.standin import build_repo, install_pins
from k3fleet.paths import collections_path

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


ROLE_PLAY = """
- name: The rollback kit role's entry points
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Run one entry point
      ansible.builtin.include_role:
        name: k3fleet.gpu.k3_rollback_kit
        tasks_from: "{{ entry }}"
      vars:
        k3_rollback_kit_packages: "{{ packages }}"
        k3_rollback_kit_change_id: "{{ change_id | default('CHG-1') }}"
        k3_rollback_kit_timeout: 120
        k3_rollback_kit_node_root: "{{ node_root }}"
        k3_rollback_kit_record: "{{ record | default(none) }}"

    - name: Say what it set
      ansible.builtin.debug:
        msg: "K3KIT {{ (k3_rollback_kit_check if entry == 'check' else k3_rollback_kit_source) | to_json }}"
"""


def play(tmp_path: Path, entry: str, extra: dict[str, object]) -> tuple[int, dict[str, object] | None, str]:
    """ansible-playbook over the role's entry point on this machine (local connection), in the apt sandbox."""
    book = tmp_path / "play.yml"
    book.write_text(ROLE_PLAY)
    ev = tmp_path / f"ev-{entry}.json"
    ev.write_text(json.dumps({"entry": entry, "node_root": str(tmp_path / "node"), **extra}))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path()), ANSIBLE_STDOUT_CALLBACK="default",
               ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3")
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(book), "-e", f"@{ev}"], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    said = re.search(r'"msg": "K3KIT (.*)"\n', done.stdout)
    return done.returncode, (json.loads(json.loads(f'"{said.group(1)}"')) if said else None), done.stdout


def test_the_roles_check_and_source_entry_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apt_sandbox: Callable[[Path, Path], dict[str, str]]) -> None:
    repo = build_repo(tmp_path / "repo")
    for name, value in apt_sandbox(tmp_path / "apt", repo).items():
        monkeypatch.setenv(name, value)
    (tmp_path / "node").mkdir()
    packages = [{"name": p.split("=")[0], "version": p.split("=")[1], "branch": "575", "held": True}
                for p in install_pins(OLD)]
    # The pre-flight question, while the repository offers R575: the kit can be made; nothing is fetched.
    rc, check, out = play(tmp_path, "check", {"packages": packages})
    assert rc == 0 and check is not None, out
    assert check["can_make"] is True and check["problems"] == [] and check["repository"] is True
    assert not (tmp_path / "node" / "var").exists()
    # The kit made before the change (the module, as the night's stage runs it).
    reader = NodeReader(root=str(tmp_path / "node"), timeout=120)
    made = kit.make_kit(reader, KIT, kit.kit_packages(packages), change_id="CHG-1")
    record = {"path": KIT, "packages": made["packages"], "made": True}

    build_repo(repo, without=[OLD])
    # The check reads the lists as they are (read-only); the node's own apt-get update makes them current.
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=dict(os.environ))
    rc, check, out = play(tmp_path, "check", {"packages": packages})
    # The change whose kit is on the node already can still roll back: its files are there.
    assert rc == 0 and check is not None and check["can_make"] is True and check["repository"] is False, out
    # Another change could make no kit now.
    rc, check, out = play(tmp_path, "check", {"packages": packages, "change_id": "CHG-2"})
    assert rc != 0 and "the rollback kit cannot be made" in out and "Can't find a source to download" in out, out
    # The rollback's source: the kit, each file checked; the lists are refreshed by the role itself.
    rc, source, out = play(tmp_path, "source", {"packages": packages, "record": record})
    assert rc == 0 and source is not None, out
    assert source["source"] == "kit" and source["repository"] is False, source
    assert sorted(source["debs"]) == sorted(f"{KIT}/{e['file']}" for e in made["packages"])
    # No kit recorded: the host fails before anything changes, with the reason.
    rc, _, out = play(tmp_path, "source", {"packages": packages})
    assert rc != 0 and "nothing to roll back from, and nothing was changed yet" in out, out
    assert "no rollback kit was recorded for this change" in out, out
