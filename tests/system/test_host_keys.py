"""Host keys on the real testbed: checked by default, a changed or unknown key refuses that guest
only (one line naming it and the fix), the rest of the fleet is audited; turning checking off is
an explicit choice that command.json records (docs/safety.md "Host keys").

The testbed writes a known_hosts from each guest's own host keys when it comes up. Here one guest
gets new host keys (a reinstalled node, or someone in the middle) and another is checked against
an empty known_hosts (a node never seen). Each audit uses its own ssh control directory, so no
master connection opened before the change can carry the audit past the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3fleet.lab import testbed

pytestmark = pytest.mark.system

BACKUP = "/root/.k3fleet-test-hostkeys"


def _audit(inventory: Path, out: Path, control: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control), "COLUMNS": "400"}
    done = subprocess.run([str(Path(sys.executable).with_name("k3fleet")), "audit", "-i", str(inventory), "--json",
                           "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.stdout.strip(), f"no verdict (rc {done.returncode}): {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.fixture
def rekeyed(testbed_state: testbed.TestbedState) -> Iterator[tuple[testbed.TestbedState, str]]:
    """tb-node02 with fresh host keys; its old keys are put back afterwards."""
    state = testbed.status(testbed_state.workdir)
    host = state.hosts[1].name
    testbed.guest_exec(state, host, ["sh", "-c", f"rm -rf {BACKUP} && mkdir -p {BACKUP} && "
                                                 f"cp -a /etc/ssh/ssh_host_* {BACKUP}/ && rm -f /etc/ssh/ssh_host_* && "
                                                 "ssh-keygen -A && systemctl restart ssh"])
    try:
        yield state, host
    finally:
        testbed.guest_exec(state, host, ["sh", "-c", f"rm -f /etc/ssh/ssh_host_* && cp -a {BACKUP}/. /etc/ssh/ && "
                                                     f"rm -rf {BACKUP} && systemctl restart ssh"])
        testbed.ssh_run(state, host, "true")  # the known key is accepted again


def test_changed_and_unknown_keys_refuse_those_guests_only(
        rekeyed: tuple[testbed.TestbedState, str], tmp_path: Path) -> None:
    state, changed = rekeyed
    unknown = state.hosts[2].name
    inv = yaml.safe_load(state.inventory.read_text())
    # A guest checked against an empty known_hosts: never seen before.
    (tmp_path / "empty_known_hosts").write_text("")
    inv["all"]["children"]["testbed"]["hosts"][unknown]["ansible_ssh_common_args"] = (
        f"-o UserKnownHostsFile={tmp_path / 'empty_known_hosts'}")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(inv))

    rc, verdict, _stderr = _audit(inventory, tmp_path / "checked", tmp_path / "cp1")
    hosts = verdict["hosts"]
    assert hosts[changed]["status"] == "unreachable"
    reason = hosts[changed]["reason"]
    address = state.host(changed).address
    assert reason.startswith(f"{changed}: host key verification failed: the SSH host key of {address} has CHANGED")
    assert f"ssh-keygen -f {state.known_hosts} -R {address}" in reason
    assert hosts[unknown]["status"] == "unreachable"
    assert hosts[unknown]["reason"].startswith(f"{unknown}: host key verification failed")
    assert "is not in known_hosts" in hosts[unknown]["reason"] and "ssh-keyscan" in hosts[unknown]["reason"]
    # The same line in the report a reviewer reads.
    assert f"\n- {reason}\n" in (tmp_path / "checked" / "report.md").read_text()
    others = [h.name for h in state.hosts if h.name not in (changed, unknown)]
    for host in others:
        assert hosts[host]["status"] != "unreachable", hosts[host]
        assert (tmp_path / "checked" / "facts" / f"{host}.json").is_file()
    assert not (tmp_path / "checked" / "facts" / f"{changed}.json").exists()
    # Unreachable hosts are exit 3 unless a check failed (1).
    assert rc == (1 if verdict["checks_failed"] else 3)
    command = json.loads((tmp_path / "checked" / "command.json").read_text())
    assert command["host_key_checking"]["ansible"] == {"default": "checked", "unchecked_hosts": {}}

    # Opting out for one host in the inventory: that host connects, and the choice is recorded.
    inv["all"]["children"]["testbed"]["hosts"][changed]["k3fleet_host_key_checking"] = False
    inventory.write_text(yaml.safe_dump(inv))
    _rc, verdict, _ = _audit(inventory, tmp_path / "one-opt-out", tmp_path / "cp2")
    assert verdict["hosts"][changed]["status"] != "unreachable", verdict["hosts"][changed]
    assert verdict["hosts"][unknown]["status"] == "unreachable"
    command = json.loads((tmp_path / "one-opt-out" / "command.json").read_text())
    assert command["host_key_checking"]["ansible"]["unchecked_hosts"] == {
        changed: "k3fleet_host_key_checking: false"}

    # Opting out for the run: every guest connects, recorded with the option on the command line.
    _rc, verdict, _ = _audit(state.inventory, tmp_path / "unchecked", tmp_path / "cp3", "--no-host-key-checking")
    assert all(h["status"] != "unreachable" for h in verdict["hosts"].values()), verdict["hosts"]
    command = json.loads((tmp_path / "unchecked" / "command.json").read_text())
    assert command["host_key_checking"]["ansible"]["default"].startswith("unchecked")
    assert "--no-host-key-checking" in command["argv"]
