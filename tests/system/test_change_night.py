"""The change night and rollback on the real testbed: booted guests over SSH, real apt with the
stand-in driver packages, real reboots, real slurmctld/slurmd drains.

Four guests: tb-node01/02 carry the happy path (canary + one wave, a job on the canary) and the
"drained by someone else" case; tb-node03/04 the broken Fabric Manager (rollback, waves stop),
then the killed controller (resume, then rollback of the whole run). --check is compared
before/after. Every test first puts its guests on the R575 packages, held and loaded.

Timings (wall time per host, share spent in k3fleet itself) are printed, not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from k3fleet.change import RollbackOptions, UpgradeOptions, run_rollback, run_upgrade
from k3fleet.journal import read_journal, replay
from k3fleet.lab import testbed
from k3fleet.lab.standin import build_repo, install_pins
from k3fleet.runner import Observer

pytestmark = pytest.mark.system

OLD, NEW = "575.57.08", "580.95.05"
OLD_PINS = install_pins(OLD)
NEW_PINS = install_pins(NEW)
OLD_NAMES = [p.split("=")[0] for p in OLD_PINS]
NEW_NAMES = [p.split("=")[0] for p in NEW_PINS]
# What the role holds: the metapackages; their exact-version dependencies pin the kernel module package.
NEW_HELD = [n for n in NEW_NAMES if not n.startswith("nvidia-kernel-sim-")]
HAPPY = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "returned"]
# The guests have no InfiniBand and no container runtime inside: real findings for serving Kimi K3,
# accepted here (as an operator would, recorded in change.json) because they do not stop a driver change.
ACCEPT = ["rdma.*", "container.*"]
LAUNCHER = """
import sys
from k3fleet import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def report(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def ssh(state: testbed.TestbedState, host: str, command: str, timeout: float = 300) -> str:
    return testbed.ssh_run(state, host, command, timeout=timeout)


def loaded(state: testbed.TestbedState, host: str) -> str:
    first = ssh(state, host, "head -1 /run/nvidia-sim/proc/driver/nvidia/version 2>/dev/null || true")
    return next((t for t in first.split() if t.count(".") == 2 and t.split(".")[0].isdigit()), "none")


def packages(state: testbed.TestbedState, host: str) -> str:
    """Every installed package with version and selection: the before/after fingerprint."""
    return ssh(state, host, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' | sort")


def reboot(state: testbed.TestbedState, host: str) -> None:
    boots = testbed.status(state.workdir).host(host).boots
    subprocess.run(testbed.ssh_argv(state, host, "systemctl reboot"), capture_output=True, timeout=60, check=False)
    testbed.wait_host_ready(state.workdir, host, min_boots=boots + 1)


def put_on_575(state: testbed.TestbedState, hosts: list[str]) -> None:
    """R575 packages installed exactly and held, R575 loaded, Fabric Manager running, node idle in Slurm."""
    script = " && ".join([
        "export DEBIAN_FRONTEND=noninteractive",
        "(apt-mark showhold | xargs -r apt-mark unhold >/dev/null)",
        "dpkg --configure --pending >/dev/null",
        "apt-get update -q >/dev/null",
        "apt-get install -y -q --allow-downgrades -o APT::Install-Recommends=no "
        + " ".join(OLD_PINS) + " " + " ".join(f"{n}-" for n in NEW_NAMES) + " >/tmp/k3fleet-reset.log 2>&1",
        "apt-mark hold " + " ".join(OLD_NAMES) + " >/dev/null",
    ])
    for host in hosts:
        ssh(state, host, script)
        if loaded(state, host) != OLD:
            reboot(state, host)
        assert loaded(state, host) == OLD, f"{host}: R575 not loaded after reset"
        node = state.host(host).slurm_node
        status = testbed.node_state(state, node)
        if status.drained:
            testbed.update_node(state, node, "resume")


@pytest.fixture(scope="module")
def tb(testbed_state: testbed.TestbedState) -> testbed.TestbedState:
    return testbed_state


@pytest.fixture(scope="module")
def inventory(tb: testbed.TestbedState, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The testbed inventory; Slurm's daemons run on this machine, so its clients do too."""
    data = yaml.safe_load(tb.inventory.read_text())
    data["all"]["children"]["testbed"]["vars"]["k3fleet_slurm_client"] = "localhost"
    path = tmp_path_factory.mktemp("night") / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def journal_stages(run_dir: Path) -> dict[str, list[str]]:
    return {h: [e.stage for e in hist.entries] for h, hist in replay(read_journal(run_dir / "journal.jsonl").entries)
            .items()}


def sinfo(state: testbed.TestbedState) -> str:
    """Every node's state and reason: what --check must leave as it found it."""
    return subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T %E"], env=testbed.slurm_env(state), capture_output=True,
                          text=True, check=True).stdout


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:.0f}s"
        time.sleep(0.5)


# -- 1. happy path ------------------------------------------------------------------------------


class JobAtNightStart(Observer):
    """Starts a real Slurm job on a node when the change night's playbook starts, and waits until it runs."""

    def __init__(self, state: testbed.TestbedState, node: str, seconds: int) -> None:
        self.state, self.node, self.seconds = state, node, seconds
        self.job: int | None = None

    def play_started(self, playbook: str, hosts: int | None) -> None:
        if playbook == "change_night.yml" and self.job is None:
            job = testbed.submit_job(self.state, self.node, seconds=self.seconds, name="k3-happy")
            _wait(lambda: testbed.job_state(self.state, job) == "RUNNING", 30, f"job running on {self.node}")
            self.job = job


def test_happy_path_canary_then_wave_with_a_job_on_the_canary(tb: testbed.TestbedState, inventory: Path, runs: Path,
                                                             pytestconfig: pytest.Config) -> None:
    hosts = ["tb-node01", "tb-node02"]
    put_on_575(tb, hosts)
    started = time.monotonic()
    # The job starts when the night does (after the gating audit, however long that takes on a busy
    # machine), so the canary's drain always finds it running.
    jobs = JobAtNightStart(tb, "node01", seconds=20)
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-HAPPY", operator="alice",
                                        canary="tb-node01", waves=True, limit=",".join(hosts), drain_timeout=300,
                                        runs_dir=runs, forks=4, accept_findings=ACCEPT), ["k3fleet", "upgrade"],
                         observer=jobs)
    wall = time.monotonic() - started
    assert result.exit_code == 0, (result.message, result.hosts)
    job = jobs.job
    assert job is not None
    assert result.change["waves"] == [["tb-node02"]]
    assert journal_stages(result.run_dir.path) == {"tb-node01": HAPPY, "tb-node02": HAPPY}
    # The drain waited for the job, which ended by itself.
    assert testbed.job_state(tb, job) == "COMPLETED"
    drained = next(e for e in read_journal(result.run_dir.path / "journal.jsonl").entries
                   if e.host == "tb-node01" and e.stage == "drained")
    assert drained.detail["waited_s"] >= 5 and drained.detail["drained_by_us"] is True
    for host in hosts:
        assert loaded(tb, host) == NEW
        assert ssh(tb, host, "systemctl is-active nvidia-fabricmanager").strip() == "active"
        assert ssh(tb, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u").strip() == NEW
        held = ssh(tb, host, "apt-mark showhold").split()
        assert set(NEW_HELD) <= set(held) and not set(OLD_NAMES) & set(held), held
        status = testbed.node_state(tb, tb.host(host).slurm_node)
        assert not status.drained, f"{host} not returned to service: {status}"
    # NVML itself reports the new driver where pynvml is installed (tb-node01).
    nvml = ssh(tb, "tb-node01",
               "python3 -c 'import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlSystemGetDriverVersion())'")
    assert nvml.strip() == NEW
    for host in hosts:
        t = result.hosts[host]["timing"]
        report(pytestconfig, f"happy path {host}: wall {t['wall_s']}s, k3fleet itself {t['tool_s']}s "
                             f"({t['tool_share']:.0%}), external {t['external_s']}")
    report(pytestconfig, f"happy path, both hosts incl. the gating audit: {wall:.1f}s")
    run_json = json.loads((result.run_dir.path / "run.json").read_text())
    assert run_json["exit_code"] == 0 and set(run_json["hosts"]) == set(hosts)
    assert (result.run_dir.path / "snapshots" / "tb-node01.json").is_file()
    assert result.run_dir.verify_manifest() == []

    # A second night changes nothing: the audit plans no host ...
    before = {h: packages(tb, h) for h in hosts}
    again = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-HAPPY-2", operator="alice", waves=True,
                                       limit=",".join(hosts), runs_dir=runs, accept_findings=ACCEPT),
                        ["k3fleet", "upgrade"])
    assert again.exit_code == 0 and again.message.startswith("nothing to change"), again.message
    # ... and the playbook itself, forced onto the same hosts, reports no change on them.
    from k3fleet.runner import run_playbook

    rd = result.run_dir.path
    play = run_playbook("change_night.yml", inventory, runs / "again", extravars={
        "k3fleet_change_id": "CHG-HAPPY", "k3fleet_operator": "alice", "k3fleet_target_version": NEW,
        "k3fleet_run_id": "again", "k3fleet_journal": str(runs / "again" / "journal.jsonl"),
        "k3fleet_change_hosts": hosts, "k3fleet_serial": [1, 1], "k3fleet_audit": str(rd / "audit" / "verdict.json"),
        "k3fleet_audit_max_age": 86400, "k3fleet_accepted_blocked": hosts})
    assert play.status == "successful", play.stderr_tail
    changed = {h: [o.task for o in outs if o.result and o.result.get("changed")] for h, outs in play.hosts.items()}
    assert all(not tasks for tasks in changed.values()), changed
    assert {h: packages(tb, h) for h in hosts} == before


# -- 2. failure after the reboot: broken Fabric Manager ---------------------------------------------


@pytest.fixture
def broken_fm(tb: testbed.TestbedState) -> Iterator[None]:
    assert tb.repo is not None
    build_repo(tb.repo, broken_fm=NEW)
    try:
        yield
    finally:
        build_repo(tb.repo)


def test_broken_fabricmanager_rolls_the_canary_back_and_stops_the_waves(
        tb: testbed.TestbedState, inventory: Path, runs: Path, broken_fm: None) -> None:
    hosts = ["tb-node03", "tb-node04"]
    put_on_575(tb, hosts)
    before = packages(tb, "tb-node03")
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-BROKEN", operator="bob",
                                        canary="tb-node03", waves=True, limit=",".join(hosts), runs_dir=runs,
                                        forks=4, accept_findings=ACCEPT), ["k3fleet", "upgrade"])
    assert result.exit_code == 1, (result.message, result.hosts)
    stages = journal_stages(result.run_dir.path)
    assert stages["tb-node03"] == ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying",
                                   "failed", "rolled_back"]
    assert "tb-node04" not in stages, "the wave started after a failed canary"
    assert result.hosts["tb-node04"]["outcome"] == "not_started"
    failed = next(e for e in read_journal(result.run_dir.path / "journal.jsonl").entries if e.stage == "failed")
    assert failed.detail["at"] == "verifying" and "Fabric Manager" in failed.detail["msg"]
    # Exactly the previous versions and holds, the previous driver loaded, Fabric Manager back.
    assert packages(tb, "tb-node03") == before
    assert loaded(tb, "tb-node03") == OLD
    assert ssh(tb, "tb-node03", "systemctl is-active nvidia-fabricmanager").strip() == "active"
    # Left drained, with our reason, for someone to look at.
    status = testbed.node_state(tb, "node03")
    assert status.drained and status.reason.startswith("k3fleet:CHG-BROKEN "), status
    run_json = json.loads((result.run_dir.path / "run.json").read_text())
    assert "tb-node03" in run_json["message"] and "Fabric Manager" in (run_json["hosts"]["tb-node03"]["failure"] or "")
    testbed.update_node(tb, "node03", "resume")


# -- 3. a node drained beforehand by someone else --------------------------------------------------


def test_node_drained_by_someone_else_stays_drained(tb: testbed.TestbedState, inventory: Path, runs: Path) -> None:
    put_on_575(tb, ["tb-node02"])
    testbed.update_node(tb, "node02", "drain", reason="disk replacement INC-7731")
    try:
        result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-OTHER", operator="carol",
                                            canary="tb-node02", limit="tb-node02", runs_dir=runs,
                                            accept_findings=ACCEPT),
                             ["k3fleet", "upgrade"])
        assert result.exit_code == 0, (result.message, result.hosts)
        entries = read_journal(result.run_dir.path / "journal.jsonl").entries
        drained = next(e for e in entries if e.stage == "drained")
        assert (drained.detail["decision"], drained.detail["drained_by_us"]) == ("other", False)
        returned = [e for e in entries if e.stage == "returned"][-1]
        assert returned.detail["returned_to_service"] is False and returned.detail["decision"] == "not_ours"
        assert loaded(tb, "tb-node02") == NEW
        status = testbed.node_state(tb, "node02")
        assert status.drained and status.reason == "disk replacement INC-7731", status
    finally:
        testbed.update_node(tb, "node02", "resume")


# -- 4. --check changes nothing ---------------------------------------------------------------


def test_check_changes_nothing(tb: testbed.TestbedState, inventory: Path, runs: Path) -> None:
    hosts = ["tb-node03", "tb-node04"]
    put_on_575(tb, hosts)
    job = testbed.submit_job(tb, "node03", seconds=180, name="k3-check")
    try:
        _wait(lambda: testbed.job_state(tb, job) == "RUNNING", 30, "job running on node03")
        before = ({h: packages(tb, h) for h in hosts}, sinfo(tb))
        result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-CHECK", operator="dave",
                                            canary="tb-node03", waves=True, check=True, limit=",".join(hosts),
                                            runs_dir=runs, accept_findings=ACCEPT), ["k3fleet", "upgrade", "--check"])
        assert result.exit_code == 0, (result.message, result.check)
        rep = result.check["tb-node03"]
        assert rep["drain"]["actions"][0].startswith("scontrol update nodename=node03 state=drain")
        assert rep["drain"]["actions"][1].startswith("would wait up to 3600s for 1 running job(s)")
        assert any(x.startswith("Inst nvidia-driver-580-server (580.95.05") for x in rep["transaction"])
        assert any(x.startswith("Remv nvidia-driver-575-server") for x in rep["transaction"])
        assert set(result.check) == set(hosts)
        after = ({h: packages(tb, h) for h in hosts}, sinfo(tb))
        assert after == before
        assert testbed.job_state(tb, job) == "RUNNING"
        assert not (result.run_dir.path / "journal.jsonl").exists()
    finally:
        subprocess.run(["scancel", str(job)], env=testbed.slurm_env(tb), check=False)


# -- 5. the controller killed mid-wave: resume, then roll the whole run back -------------------------


def test_killed_controller_then_resume_then_rollback_of_the_run(tb: testbed.TestbedState, inventory: Path,
                                                                runs: Path, tmp_path: Path) -> None:
    hosts = ["tb-node03", "tb-node04"]
    put_on_575(tb, hosts)
    before = {h: packages(tb, h) for h in hosts}
    launcher = tmp_path / "k3fleet_cli.py"
    launcher.write_text(LAUNCHER)
    out_dir = runs / "night"
    argv = [sys.executable, str(launcher), "upgrade", "-i", str(inventory), "--change-id", "CHG-KILL", "--operator",
            "erin", "--canary", "tb-node03", "--waves", "--limit", ",".join(hosts), "--out", str(out_dir), "-q",
            *[x for a in ACCEPT for x in ("--accept-finding", a)]]
    controller = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                  env=dict(os.environ))
    journal = out_dir / "journal.jsonl"

    def wave_host_upgrading() -> bool:
        # A controller that ended on its own (refused the night, failed) fails the test at once.
        assert controller.poll() is None, f"the controller exited with {controller.returncode} before the kill"
        return journal.exists() and any(e.host == "tb-node04" and e.stage == "upgrading"
                                        for e in read_journal(journal).entries)

    try:
        _wait(wave_host_upgrading, 600, "the wave host reaching the package change")
    finally:
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait(30)
    stages = journal_stages(out_dir)
    assert stages["tb-node03"] == HAPPY and stages["tb-node04"][-1] in ("upgrading", "rebooting")

    resumed = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-KILL", operator="erin",
                                         resume=out_dir, runs_dir=runs, accept_findings=ACCEPT),
                          ["k3fleet", "upgrade", "--resume"])
    assert resumed.exit_code == 0, (resumed.message, resumed.hosts)
    stages = journal_stages(out_dir)
    assert stages["tb-node03"] == HAPPY, "the canary was touched again"
    assert stages["tb-node04"].count("snapshot") == 1 and stages["tb-node04"][-1] == "returned"
    assert stages["tb-node04"].count("draining") == 2, "the resumed host is drained (confirmed) once more, not more"
    for h in hosts:
        assert loaded(tb, h) == NEW

    rolled = run_rollback(RollbackOptions(inventory=inventory, run=out_dir, runs_dir=runs), ["k3fleet", "rollback"])
    assert rolled.exit_code == 0, (rolled.message, rolled.hosts)
    for h in hosts:
        assert rolled.hosts[h]["outcome"] == "rolled_back"
        assert packages(tb, h) == before[h]
        assert loaded(tb, h) == OLD
        assert not testbed.node_state(tb, tb.host(h).slurm_node).drained
    again = run_rollback(RollbackOptions(inventory=inventory, limit="tb-node04", runs_dir=runs),
                         ["k3fleet", "rollback"])
    assert again.exit_code == 0 and again.hosts["tb-node04"]["stages"][-2:] == ["rolled_back", "returned"]
    assert packages(tb, "tb-node04") == before["tb-node04"]
