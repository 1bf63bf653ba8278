"""roles/k3_preflight on the real testbed: each way a node is unfit stops it with a message that names
the host, what was found and what was expected; check mode changes nothing.

The happy path, idempotence and check mode after converge are molecule's (molecule/default, run by
test_molecule.py); this module breaks one thing per guest and runs the role once on all four.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import pytest

from k3fleet.audit.runner import ansible_env
from k3fleet.lab import testbed

pytestmark = pytest.mark.system

TARGET = "580.95.05"
PIN_FILE = "/etc/apt/preferences.d/k3fleet-nvidia"

# tb-node03: another preferences file outranks ours for Fabric Manager.
RIVAL_PIN = "Package: nvidia-fabricmanager-580\nPin: version 580.82.07-*\nPin-Priority: 1002\n"
# tb-node02: a package unpacked but never configured, as an interrupted dpkg run leaves it.
HALF_INSTALL = (
    "apt-get update -q && cd /tmp && DEBIAN_FRONTEND=noninteractive apt-get download -q nvidia-sim-hardware"
    " && dpkg --unpack /tmp/nvidia-sim-hardware_*.deb"
)

PLAY = """
- name: Preflight every guest, each with its own way of being unfit
  hosts: testbed
  gather_facts: false
  tasks:
    - name: Apply k3_preflight
      ansible.builtin.include_role:
        name: k3fleet.gpu.k3_preflight
      vars:
        k3_preflight_driver_version: "{{ cases[inventory_hostname].version | default(target) }}"
        k3_preflight_min_free_mb: "{{ cases[inventory_hostname].min_free_mb | default(2048) }}"
        k3_preflight_fabricmanager: "{{ cases[inventory_hostname].fabricmanager | default('auto') }}"
"""


@dataclass
class Run:
    rc: int
    status: str
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> {task, msg}
    changed: dict[str, list[str]] = field(default_factory=dict)  # host -> changed task names
    ok: dict[str, int] = field(default_factory=dict)


def run_role(state: testbed.TestbedState, workdir: Path, *, limit: str | None = None, check: bool = False,
             cases: dict[str, dict[str, Any]] | None = None) -> Run:
    project = workdir / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "preflight.yml").write_text(PLAY)
    cmdline = "--check" if check else None
    result = ansible_runner.run(
        private_data_dir=str(workdir),
        inventory=str(state.inventory),
        playbook="preflight.yml",
        extravars={"cases": cases or {}, "target": TARGET},
        limit=limit,
        cmdline=cmdline,
        envvars={**ansible_env(), "ANSIBLE_SSH_ARGS": "-o ControlMaster=no"},
        quiet=True,
    )
    run = Run(rc=result.rc, status=result.status)
    for event in result.events:
        data = event.get("event_data") or {}
        host = data.get("host")
        if event.get("event") == "runner_on_failed":
            run.failed[host] = {"task": data.get("task"), "msg": (data.get("res") or {}).get("msg", "")}
        elif event.get("event") == "runner_on_ok":
            run.ok[host] = run.ok.get(host, 0) + 1
            if (data.get("res") or {}).get("changed"):
                run.changed.setdefault(host, []).append(data.get("task"))
    return run


def pin_exists(state: testbed.TestbedState, host: str) -> bool:
    argv = testbed.ssh_argv(state, host, "test", "-e", PIN_FILE)
    return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def unfit(fresh_testbed: testbed.TestbedState, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    state = fresh_testbed
    testbed.ssh_run(state, "tb-node02", HALF_INSTALL, timeout=120)
    testbed.ssh_run(state, "tb-node03", f"printf '{RIVAL_PIN}' > /etc/apt/preferences.d/zz-rival")
    cases = {
        "tb-node01": {"version": "580.99.99"},
        # A bare guest has no NVSwitch the collectors can see: Fabric Manager is required by hand here.
        "tb-node03": {"fabricmanager": True},
        "tb-node04": {"min_free_mb": 10**9},
    }
    yield run_role(state, tmp_path_factory.mktemp("preflight"), cases=cases)


def test_every_guest_failed_and_the_play_says_so(unfit: Run) -> None:
    assert unfit.rc != 0 and unfit.status == "failed"
    assert sorted(unfit.failed) == ["tb-node01", "tb-node02", "tb-node03", "tb-node04"]
    for host, failure in unfit.failed.items():
        assert failure["msg"].startswith(f"{host}: "), failure
        assert "Fix: " in failure["msg"], failure


def test_target_version_missing_from_the_repositories(unfit: Run, fresh_testbed: testbed.TestbedState) -> None:
    failure = unfit.failed["tb-node01"]
    assert failure["task"] == "Check that the target driver and its matching Fabric Manager are available"
    msg = failure["msg"]
    assert "not available at 580.99.99" in msg
    # What the repository does offer is in the message: the operator sees the nearest versions.
    # No driver installed yet: auto picks the open flavour.
    assert "nvidia-driver-580-server-open 580.95.05-0ubuntu1" in msg
    assert not pin_exists(fresh_testbed, "tb-node01")


def test_half_installed_package_stops_the_node(unfit: Run, fresh_testbed: testbed.TestbedState) -> None:
    failure = unfit.failed["tb-node02"]
    assert failure["task"] == "Check that dpkg and apt are healthy"
    assert "nvidia-sim-hardware" in failure["msg"] and "not yet configured" in failure["msg"]
    assert "dpkg --configure -a" in failure["msg"]
    assert not pin_exists(fresh_testbed, "tb-node02")


def test_rival_pin_is_caught_after_staging(unfit: Run, fresh_testbed: testbed.TestbedState) -> None:
    failure = unfit.failed["tb-node03"]
    assert failure["task"] == "Check that apt's candidate is the pinned target version"
    # The rival wins for Fabric Manager: its candidate is the other point release.
    assert "580.82.07-1" in failure["msg"] and PIN_FILE in failure["msg"]
    assert pin_exists(fresh_testbed, "tb-node03")


def test_not_enough_space(unfit: Run, fresh_testbed: testbed.TestbedState) -> None:
    failure = unfit.failed["tb-node04"]
    assert failure["task"] == "Check that the driver packages fit"
    assert "MB free under /var, expected at least 1000000000 MB" in failure["msg"]
    assert not pin_exists(fresh_testbed, "tb-node04")


def test_check_mode_on_a_fit_node_changes_nothing(
    unfit: Run, fresh_testbed: testbed.TestbedState, tmp_path: Path
) -> None:
    # tb-node04 is fit once the space threshold is the default one.
    run = run_role(fresh_testbed, tmp_path / "check", limit="tb-node04", check=True)
    assert run.rc == 0 and not run.failed, run
    assert run.changed == {"tb-node04": ["Pin the target branch's driver and Fabric Manager packages to 580.95.05"]}
    assert not pin_exists(fresh_testbed, "tb-node04")

    real = run_role(fresh_testbed, tmp_path / "real", limit="tb-node04")
    assert real.rc == 0 and real.changed == run.changed, real
    text = testbed.ssh_run(fresh_testbed, "tb-node04", f"cat {PIN_FILE}")
    stanza = [line for line in text.splitlines() if not line.startswith("Explanation:")]
    assert stanza[1:] == [f"Pin: version {TARGET}-*", "Pin-Priority: 1001"]
