"""The rollback kit on the real testbed (docs/change-night.md "Rollback kit"): booted guests over SSH, real
apt and dpkg with the stand-in driver packages, a real reboot, real Slurm drains.

1. The repository no longer offers the R575 packages tb-node02 runs (the stand-in repository rebuilt
   without them, as a mirror that keeps only the newest releases): the kit cannot be made, so the night
   does not touch the node: not drained, packages and holds byte-exact, the reason journaled.
2. A night upgrades tb-node02 to R580 with its kit staged first (each file's sha256 in the journal and on
   the node); then the R575 packages are removed from the repository; then `k3fleet rollback --run`
   installs them from the kit and says so: `dpkg -l` and `apt-mark showhold` are byte-exact as before the
   night, and R575 is loaded again.

The nights run without the serving smoke (--no-smoke; tests/system/test_change_smoke.py is about it).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nightkit import OLD, OLD_PINS, loaded, put_on_575, ssh

from k3fleet.change import RollbackOptions, UpgradeOptions, run_rollback, run_upgrade
from k3fleet.change.journal import read_journal, replay
from k3fleet.lab import testbed
from k3fleet.lab.standin import build_repo

pytestmark = pytest.mark.system

HOST, NODE = "tb-node02", "node02"
# The guests have no InfiniBand, and podman without NVIDIA's container toolkit: accepted, as in the
# change-night tests, because they do not stop a driver change.
ACCEPT = ["rdma.*", "container.*"]
KIT_ROOT = "/var/lib/k3fleet/rollback-kit"


@pytest.fixture(scope="module")
def tb(testbed_state: testbed.TestbedState) -> testbed.TestbedState:
    return testbed_state


@pytest.fixture
def without_575(tb: testbed.TestbedState) -> Iterator[None]:
    """The stand-in repository without the R575 packages for the test's duration; whole again after."""
    assert tb.repo is not None
    build_repo(tb.repo, without=[OLD])
    try:
        yield
    finally:
        build_repo(tb.repo)
        ssh(tb, HOST, "apt-get update -q >/dev/null")


def listing(tb: testbed.TestbedState) -> tuple[str, str]:
    """What the node runs, as an operator compares it: `dpkg -l` and `apt-mark showhold`, byte for byte."""
    return (ssh(tb, HOST, "COLUMNS=200 dpkg -l"), ssh(tb, HOST, "apt-mark showhold"))


def offered_575(tb: testbed.TestbedState) -> bool:
    policy = ssh(tb, HOST, "apt-get update -q >/dev/null && LC_ALL=C apt-cache policy nvidia-driver-575-server")
    return "k3fleet-repo" in policy


def night(inventory: Path, runs: Path, change_id: str) -> object:
    return run_upgrade(UpgradeOptions(inventory=inventory, change_id=change_id, operator="kim", canary=HOST,
                                      limit=HOST, runs_dir=runs, forks=2, accept_findings=ACCEPT, smoke=False),
                       ["k3fleet", "upgrade", "--no-smoke"])


def test_a_host_whose_kit_cannot_be_made_is_not_changed(tb: testbed.TestbedState, inventory: Path,
                                                         tmp_path: Path, request: pytest.FixtureRequest) -> None:
    put_on_575(tb, [HOST])
    ssh(tb, HOST, f"rm -rf {KIT_ROOT}")
    before = listing(tb)
    request.getfixturevalue("without_575")
    assert not offered_575(tb), "the repository still offers R575"
    started = time.monotonic()
    result = night(inventory, tmp_path / "runs", "CHG-NOKIT")
    assert result.exit_code == 1, (result.message, result.hosts)
    entries = read_journal(result.run_dir.path / "journal.jsonl").entries
    assert [e.stage for e in entries] == ["failed"], [e.stage for e in entries]
    msg = entries[0].detail["msg"]
    assert "cannot be made" in msg and "nvidia-driver-575-server:amd64=575.57.08-0ubuntu1" in msg, msg
    assert "E: Can't find a source to download version '575.57.08-0ubuntu1'" in msg, msg
    # Not drained, not changed.
    assert not testbed.node_state(tb, NODE).drained
    assert listing(tb) == before
    assert loaded(tb, HOST) == OLD
    assert ssh(tb, HOST, f"ls {KIT_ROOT}/CHG-NOKIT 2>/dev/null | grep -c . || true").strip() == "0"
    print(f"blocked night: {time.monotonic() - started:.1f}s")


def test_rollback_from_the_kit_when_the_repository_dropped_the_old_versions(
        tb: testbed.TestbedState, inventory: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    put_on_575(tb, [HOST])
    ssh(tb, HOST, f"rm -rf {KIT_ROOT}")
    before = listing(tb)
    assert "nvidia-driver-575-server" in before[1]
    runs = tmp_path / "runs"
    started = time.monotonic()
    result = night(inventory, runs, "CHG-KIT")
    night_s = time.monotonic() - started
    assert result.exit_code == 0, (result.message, result.hosts)
    run_dir = result.run_dir.path
    history = replay(read_journal(run_dir / "journal.jsonl").entries)[HOST]
    assert history.stage == "returned"
    kit = history.snapshot["rollback_kit"] if history.snapshot else None
    assert kit is not None and kit["made"] is True and kit["path"] == f"{KIT_ROOT}/CHG-KIT"
    assert sorted(f"{p['name']}={p['version']}" for p in kit["packages"]) == sorted(OLD_PINS)
    assert all(p["held"] for p in kit["packages"])
    # The files on the node are the journal's, byte for byte.
    on_node = dict(line.split()[::-1] for line in ssh(tb, HOST, f"cd {kit['path']} && sha256sum *.deb").splitlines())
    assert on_node == {p["file"]: p["sha256"] for p in kit["packages"]}
    kit_json = json.loads(ssh(tb, HOST, f"cat {kit['path']}/kit.json"))
    assert kit_json["packages"] == kit["packages"] and kit_json["change_id"] == "CHG-KIT"
    assert loaded(tb, HOST) != OLD

    request.getfixturevalue("without_575")
    assert not offered_575(tb), "the repository still offers R575"
    started = time.monotonic()
    back = run_rollback(RollbackOptions(inventory=inventory, run=run_dir, runs_dir=runs, operator="kim"),
                        ["k3fleet", "rollback", "--run", str(run_dir)])
    rollback_s = time.monotonic() - started
    assert back.exit_code == 0, (back.message, back.hosts)
    host = back.hosts[HOST]
    assert host["outcome"] == "rolled_back" and host["source"] == "kit", host
    assert "does not offer" in host["source_why"] and "recorded sha256" in host["source_why"], host
    line = next(e for e in reversed(read_journal(run_dir / "journal.jsonl").entries) if e.stage == "rolled_back")
    assert line.detail["source"] == "kit" and line.detail["packages_restored"] is True
    # Exactly the packages and holds the node ran before the night, and its driver loaded again.
    after = listing(tb)
    assert after[1] == before[1], (before[1], after[1])
    assert after[0] == before[0]
    assert loaded(tb, HOST) == OLD
    sha = hashlib.sha256(after[0].encode()).hexdigest()[:12]
    print(f"night {night_s:.1f}s, rollback from the kit {rollback_s:.1f}s, dpkg -l sha256 {sha} before and after")
    # The rollback drained the node itself, so it gave it back.
    assert host["returned_to_service"] is True and not testbed.node_state(tb, NODE).drained
