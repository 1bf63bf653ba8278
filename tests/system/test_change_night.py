"""The change night and rollback on the real testbed: booted guests over SSH, real apt with the
stand-in driver packages, real reboots, real slurmctld/slurmd drains.

Four guests, in an order that never needs a guest put back by an extra reboot:
1. tb-node03/04: broken Fabric Manager (canary rolled back, waves stop).
2. tb-node03/04: --check changes nothing.
3. tb-node03/04: controller killed with SIGKILL mid-wave: no play survives it; the journal torn
   mid-line, then resume (which appends after the torn line) and rollback of the whole run.
4. all four: a node drained by someone else is the canary (leased on top of that drain, its reason
   given back), then a wave where every host fails, bounded by --max-unavailable (from the
   journal and from Slurm sampled during the run).
5. tb-node03: two nights started at once (two processes, two runs directories) on the same canary:
   one changes it, the other reports the first one's lease; a third on the first one's runs
   directory is refused by its lock.
6. tb-node01/04: the happy path (canary + one wave, a job on the canary), then a second night and
   the playbook itself change nothing.
Every test first puts its guests on the R575 packages, held and loaded. Every night runs the serving
smoke (on by default; tests/system/test_change_smoke.py is about it): a host that finishes journals a
second `verifying` line, the smoke's.

Timings (wall time per host, share spent in k3fleet itself) are printed, not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nightkit import LAUNCHER, NEW, NEW_NAMES, OLD, OLD_NAMES, loaded, packages, put_on_575, smoke_launch, ssh, wait_for

from k3fleet.audit.runner import Observer
from k3fleet.change import RollbackOptions, UpgradeOptions, run_rollback, run_upgrade
from k3fleet.change.journal import read_journal, replay
from k3fleet.lab import testbed
from k3fleet.lab.standin import build_repo

pytestmark = pytest.mark.system

# What the role holds: the metapackages; their exact-version dependencies pin the kernel module package.
NEW_HELD = [n for n in NEW_NAMES if not n.startswith("nvidia-kernel-sim-")]
# The second "verifying" is the serving smoke's line: the stand-in image served one chat request in the guest.
HAPPY = ["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "verifying", "returned"]
# The guests have no InfiniBand, and podman without NVIDIA's container toolkit: real findings for serving
# Kimi K3, accepted here (as an operator would, recorded in change.json) because they do not stop a driver change.
ACCEPT = ["rdma.*", "container.*"]
def report(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.fixture(scope="module")
def tb(testbed_state: testbed.TestbedState) -> testbed.TestbedState:
    return testbed_state


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


def controller(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """`k3fleet ARGS` as its own process (as an operator starts it), in its own session."""
    launcher = tmp_path / "k3fleet_cli.py"
    if not launcher.exists():
        launcher.write_text(LAUNCHER)
    return subprocess.Popen([sys.executable, str(launcher), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ))


def session_members(sid: int) -> list[int]:
    """Processes whose session is ``sid`` (a play's workers and ssh clients are in its session)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # A zombie has ended; it only waits to be reaped (the tests are the subreaper of the testbed).
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry.name))
    return members


class SlurmSampler(threading.Thread):
    """Samples Slurm while a night runs: the most nodes drained under the change's lease at once."""

    def __init__(self, state: testbed.TestbedState, change_id: str) -> None:
        super().__init__(daemon=True)
        self.state, self.prefix = state, f"k3fleet:{change_id} "
        self.stop = threading.Event()
        self.samples = 0
        self.most: tuple[int, list[str]] = (0, [])

    def run(self) -> None:
        while not self.stop.is_set():
            done = subprocess.run(["sinfo", "-N", "-h", "-o", "%N|%T|%E"], env=testbed.slurm_env(self.state),
                                  capture_output=True, text=True, check=False)
            out = sorted({line.split("|")[0] for line in done.stdout.splitlines()
                          if line.count("|") >= 2 and line.split("|", 2)[2].startswith(self.prefix)})
            self.samples += 1
            if len(out) > self.most[0]:
                self.most = (len(out), out)
            self.stop.wait(0.3)


def most_out_from_journal(run_dir: Path) -> tuple[int, list[str]]:
    """The most hosts out of service at once by the journal, in the order its lines were appended
    (under its lock): from a host's slot (snapshot line) to its return, or to a rollback that gave
    it back."""
    out: set[str] = set()
    most: tuple[int, list[str]] = (0, [])
    for e in read_journal(run_dir / "journal.jsonl").entries:
        if e.stage == "snapshot":
            out.add(e.host)
        elif e.stage == "returned" or (e.stage == "rolled_back" and not (e.detail or {}).get("left_drained")):
            out.discard(e.host)
        if len(out) > most[0]:
            most = (len(out), sorted(out))
    return most


# -- 1. failure after the reboot: broken Fabric Manager ---------------------------------------------


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
                                        forks=4, accept_findings=ACCEPT, launch_file=smoke_launch(runs.parent)),
                         ["k3fleet", "upgrade"])
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
    # Left drained, under the change's lease, for someone to look at.
    status = testbed.node_state(tb, "node03")
    assert status.drained and status.reason.startswith("k3fleet:CHG-BROKEN "), status
    run_json = json.loads((result.run_dir.path / "run.json").read_text())
    assert "tb-node03" in run_json["message"] and "Fabric Manager" in (run_json["hosts"]["tb-node03"]["failure"] or "")
    testbed.update_node(tb, "node03", "resume")


# -- 2. --check changes nothing ---------------------------------------------------------------


def test_check_changes_nothing(tb: testbed.TestbedState, inventory: Path, runs: Path) -> None:
    hosts = ["tb-node03", "tb-node04"]
    put_on_575(tb, hosts)
    job = testbed.submit_job(tb, "node03", seconds=180, name="k3-check")
    try:
        wait_for(lambda: testbed.job_state(tb, job) == "RUNNING", 30, "job running on node03")
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


# -- 3. the controller killed mid-wave, the journal torn: resume, then roll the whole run back -------


def tear_last_line(journal: Path, keep: int) -> int:
    """Cut the journal's last line after ``keep`` bytes, as power lost mid-write leaves it."""
    raw = journal.read_bytes()
    start = raw.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(raw[:start + keep])
    return start


def test_killed_controller_leaves_no_play_then_torn_journal_resume_and_rollback(
        tb: testbed.TestbedState, inventory: Path, runs: Path, tmp_path: Path) -> None:
    hosts = ["tb-node03", "tb-node04"]
    put_on_575(tb, hosts)
    before = {h: packages(tb, h) for h in hosts}
    out_dir = runs / "night"
    proc = controller(tmp_path, "upgrade", "-i", str(inventory), "--change-id", "CHG-KILL", "--operator", "erin",
                      "--canary", "tb-node03", "--waves", "--limit", ",".join(hosts), "--out", str(out_dir),
                      "--runs-dir", str(runs), "-q", "--launch-file", str(smoke_launch(tmp_path)),
                      *[x for a in ACCEPT for x in ("--accept-finding", a)])
    journal = out_dir / "journal.jsonl"

    def wave_host_upgrading() -> bool:
        # A controller that ended on its own (refused the night, failed) fails the test at once.
        assert proc.poll() is None, f"the controller exited with {proc.returncode} before the kill"
        return journal.exists() and any(e.host == "tb-node04" and e.stage == "upgrading"
                                        for e in read_journal(journal).entries)

    plays: list[dict[str, Any]] = []
    try:
        wait_for(wave_host_upgrading, 600, "the wave host reaching the package change")
        plays = [json.loads(p.read_text()) for p in (runs / ".k3fleet" / "plays").glob("*/pid.json")]
    finally:
        # The controller alone, as `kill -9 PID` does: not its process group, not the play's session.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert len(plays) == 1, plays
    play = plays[0]["pid"]
    wait_for(lambda: not session_members(play), 30, f"the play (pid {play}) and its workers ending with the controller")
    stages = journal_stages(out_dir)
    assert stages["tb-node03"] == HAPPY and stages["tb-node04"][-1] in ("upgrading", "rebooting")

    # Power lost mid-write: the last line is torn; the resume's first append must not merge with it.
    offset = tear_last_line(journal, 110)
    resumed = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-KILL", operator="erin",
                                         resume=out_dir, runs_dir=runs, accept_findings=ACCEPT),
                          ["k3fleet", "upgrade", "--resume"])
    assert resumed.exit_code == 0, (resumed.message, resumed.hosts)
    assert any(f"byte {offset}" in p for p in resumed.problems), resumed.problems
    back = read_journal(journal)
    torn = [u for u in back.unreadable if u.offset == offset]
    assert len(torn) == 1 and torn[0].host == "tb-node04", back.unreadable
    stages = journal_stages(out_dir)
    assert stages["tb-node03"] == HAPPY, "the canary was touched again"
    assert stages["tb-node04"].count("snapshot") == 1 and stages["tb-node04"][-1] == "returned"
    assert "draining" in stages["tb-node04"][stages["tb-node04"].index("drained") + 1:], \
        "the resumed host is drained (confirmed) once more"
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


# -- 4. a canary someone else drained, then a wave where every host fails, bounded ----------------------


def test_foreign_drain_canary_then_a_failing_wave_never_exceeds_max_unavailable(
        tb: testbed.TestbedState, inventory: Path, runs: Path) -> None:
    wave = ["tb-node01", "tb-node03", "tb-node04"]
    put_on_575(tb, ["tb-node02", *wave])
    testbed.update_node(tb, "node02", "drain", reason="disk replacement INC-7731")
    # Jobs that outlast the drain timeout: every wave host fails at its drain (nothing else changes).
    jobs = [testbed.submit_job(tb, tb.host(h).slurm_node, seconds=900, name="k3-busy") for h in wave]
    sampler = SlurmSampler(tb, "CHG-BLAST")
    try:
        wait_for(lambda: all(testbed.job_state(tb, j) == "RUNNING" for j in jobs), 60, "the wave's jobs running")
        sampler.start()
        result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-BLAST", operator="carol",
                                            canary="tb-node02", waves=True, limit=",".join(["tb-node02", *wave]),
                                            runs_dir=runs, forks=4, drain_timeout=5, failure_budget=3,
                                            max_unavailable="2", accept_findings=ACCEPT,
                                            launch_file=smoke_launch(runs.parent)), ["k3fleet", "upgrade"])
        sampler.stop.set()
        sampler.join(10)
        assert result.exit_code == 1, (result.message, result.hosts)
        assert result.change["waves"] == [wave]
        entries = read_journal(result.run_dir.path / "journal.jsonl").entries

        # The canary: the drain was someone else's, so it was leased on top and their reason given back.
        drained = next(e for e in entries if e.host == "tb-node02" and e.stage == "drained")
        assert (drained.detail["decision"], drained.detail["drained_by_us"]) == ("adopt", False)
        returned = [e for e in entries if e.host == "tb-node02" and e.stage == "returned"][-1]
        assert returned.detail["returned_to_service"] is False and returned.detail["decision"] == "restore"
        assert loaded(tb, "tb-node02") == NEW
        status = testbed.node_state(tb, "node02")
        assert status.drained and status.reason == "disk replacement INC-7731", status

        # Every wave host failed at its drain, had its drain undone, and kept its job and packages.
        for h in wave:
            assert result.hosts[h]["outcome"] == "rolled_back", result.hosts[h]
            failed = next(e for e in entries if e.host == h and e.stage == "failed")
            assert failed.detail["at"] == "draining" and "still runs 1 job(s)" in failed.detail["msg"]
            assert loaded(tb, h) == OLD and not testbed.node_state(tb, tb.host(h).slurm_node).drained
        assert all(testbed.job_state(tb, j) == "RUNNING" for j in jobs), "a job was cancelled"

        # Never more than two out at once: the slots the journal granted, its timeline, and Slurm itself.
        slots = [e.detail["slot"]["out"] for e in entries if e.stage == "snapshot"]
        assert max(len(s) for s in slots) == 2 and all(len(s) <= 2 for s in slots), slots
        most, when = most_out_from_journal(result.run_dir.path)
        assert most == 2, when
        assert sampler.samples > 10 and 1 <= sampler.most[0] <= 2, sampler.most
    finally:
        sampler.stop.set()
        subprocess.run(["scancel", *map(str, jobs)], env=testbed.slurm_env(tb), check=False)
        testbed.update_node(tb, "node02", "resume")


# -- 5. two nights at once on the same node -----------------------------------------------------------


def test_two_nights_at_once_change_a_node_once_and_report_the_lease(
        tb: testbed.TestbedState, inventory: Path, tmp_path: Path) -> None:
    put_on_575(tb, ["tb-node03", "tb-node04"])
    common = ["-i", str(inventory), "--canary", "tb-node03", "--limit", "tb-node03,tb-node04", "--json", "-q",
              "--launch-file", str(smoke_launch(tmp_path)),
              *[x for a in ACCEPT for x in ("--accept-finding", a)]]
    runs_a, runs_b = tmp_path / "runs-a", tmp_path / "runs-b"
    a = controller(tmp_path, "upgrade", "--change-id", "CHG-A", "--operator", "alice", "--runs-dir", str(runs_a),
                   *common)
    b = controller(tmp_path, "upgrade", "--change-id", "CHG-B", "--operator", "bob", "--runs-dir", str(runs_b),
                   *common)
    try:
        # A third night on A's runs directory is refused by its lock, naming who holds it.
        lock = runs_a / ".k3fleet" / "night.lock"
        wait_for(lambda: lock.exists() and b"CHG-A" in lock.read_bytes(), 60, "night A holding its lock")
        c = controller(tmp_path, "upgrade", "--change-id", "CHG-C", "--operator", "carol", "--runs-dir",
                       str(runs_a), *common)
        _, c_err = c.communicate(timeout=120)
        assert c.returncode == 2, c_err
        assert "CHG-A" in c_err and "alice" in c_err and f"pid {a.pid}" in c_err
        assert len(c_err.strip().splitlines()) == 1, c_err
        outs = {name: p.communicate(timeout=900) for name, p in (("CHG-A", a), ("CHG-B", b))}
    finally:
        for p in (a, b):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
    codes = {"CHG-A": a.returncode, "CHG-B": b.returncode}
    winner = next((c for c, rc in codes.items() if rc == 0), None)
    assert winner is not None and sorted(codes.values())[0] == 0, (codes, outs)
    loser = "CHG-B" if winner == "CHG-A" else "CHG-A"
    won = json.loads(outs[winner][0])
    assert won["hosts"]["tb-node03"]["outcome"] == "upgraded", won["hosts"]
    # The other one reports the winner's lease: refused at its gate (its audit already saw the lease,
    # exit 2) or the node found held at its drain (exit 3). It never drained or changed the node.
    if codes[loser] == 2:
        assert f"held by change {winner}" in outs[loser][1], outs[loser]
    else:
        assert codes[loser] == 3, (codes, outs[loser])
        lost = json.loads(outs[loser][0])
        assert lost["hosts"]["tb-node03"]["outcome"] == "held", lost["hosts"]
        assert winner in lost["hosts"]["tb-node03"]["failure"]
        stages = journal_stages(Path(lost["run_dir"])).get("tb-node03", [])
        assert not {"drained", "upgrading"} & set(stages), stages
    assert journal_stages(Path(won["run_dir"]))["tb-node03"] == HAPPY
    assert loaded(tb, "tb-node03") == NEW
    assert not testbed.node_state(tb, "node03").drained


# -- 6. happy path ------------------------------------------------------------------------------


class JobAtNightStart(Observer):
    """Starts a real Slurm job on a node when the change night's playbook starts, and waits until it runs."""

    def __init__(self, state: testbed.TestbedState, node: str, seconds: int) -> None:
        self.state, self.node, self.seconds = state, node, seconds
        self.job: int | None = None

    def play_started(self, playbook: str, hosts: int | None) -> None:
        if playbook == "change_night.yml" and self.job is None:
            job = testbed.submit_job(self.state, self.node, seconds=self.seconds, name="k3-happy")
            wait_for(lambda: testbed.job_state(self.state, job) == "RUNNING", 30, f"job running on {self.node}")
            self.job = job


def test_happy_path_canary_then_wave_with_a_job_on_the_canary(tb: testbed.TestbedState, inventory: Path, runs: Path,
                                                             pytestconfig: pytest.Config) -> None:
    hosts = ["tb-node01", "tb-node04"]
    put_on_575(tb, hosts)
    started = time.monotonic()
    # The job starts when the night does (after the gating audit, however long that takes on a busy
    # machine), so the canary's drain always finds it running.
    jobs = JobAtNightStart(tb, "node01", seconds=20)
    result = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-HAPPY", operator="alice",
                                        canary="tb-node01", waves=True, limit=",".join(hosts), drain_timeout=300,
                                        runs_dir=runs, forks=4, accept_findings=ACCEPT,
                                        launch_file=smoke_launch(runs.parent)), ["k3fleet", "upgrade"],
                         observer=jobs)
    wall = time.monotonic() - started
    assert result.exit_code == 0, (result.message, result.hosts)
    job = jobs.job
    assert job is not None
    assert result.change["waves"] == [["tb-node04"]]
    assert journal_stages(result.run_dir.path) == {"tb-node01": HAPPY, "tb-node04": HAPPY}
    # The drain waited for the job, which ended by itself.
    assert testbed.job_state(tb, job) == "COMPLETED"
    drained = next(e for e in read_journal(result.run_dir.path / "journal.jsonl").entries
                   if e.host == "tb-node01" and e.stage == "drained")
    assert drained.detail["waited_s"] >= 5 and drained.detail["drained_by_us"] is True
    entries = read_journal(result.run_dir.path / "journal.jsonl").entries
    for host in hosts:
        smoke = [e.detail["smoke"] for e in entries if e.host == host and e.stage == "verifying"
                 and isinstance(e.detail, dict) and "smoke" in e.detail]
        assert len(smoke) == 1 and smoke[0]["ok"] is True and smoke[0]["removed"] is True, smoke
        assert ssh(tb, host, "podman ps --all --format '{{.Names}}'").split() == []
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
    assert result.run_dir.verify() == []

    # A second night changes nothing: the audit plans no host ...
    before = {h: packages(tb, h) for h in hosts}
    again = run_upgrade(UpgradeOptions(inventory=inventory, change_id="CHG-HAPPY-2", operator="alice", waves=True,
                                       limit=",".join(hosts), runs_dir=runs, accept_findings=ACCEPT),
                        ["k3fleet", "upgrade"])
    assert again.exit_code == 0 and again.message.startswith("nothing to change"), again.message
    # ... and the playbook itself, forced onto the same hosts with the night's own values, changes nothing.
    from k3fleet.audit.runner import run_playbook
    from k3fleet.change.night import extravars
    from k3fleet.change.record import load_change, verified

    rd = verified(result.run_dir.path)
    record = load_change(rd)
    ev = extravars(record, rd, hosts, [1, 1], audit_dir=rd.path / "audit")
    ev.update(k3fleet_run_id="again", k3fleet_journal=str(runs / "again" / "journal.jsonl"), k3fleet_resume=True)
    play = run_playbook("change_night.yml", inventory, runs / "again", extravars=ev)
    assert play.status == "successful", play.stderr_tail
    changed = {h: [o.task for o in outs if o.result and o.result.get("changed")] for h, outs in play.hosts.items()}
    assert all(not tasks for tasks in changed.values()), changed
    assert {h: packages(tb, h) for h in hosts} == before
