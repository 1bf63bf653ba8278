"""A night stopped by a signal in each stage, then continued, on the real testbed (docs/change-night.md
"Interrupted").

One guest (tb-node02), a canary-only night started as an operator starts it (its own process, its own
session). When the journal shows the host in the stage under test the controller gets SIGTERM (drain,
packages, verify, return) or SIGHUP (reboot: the operator's SSH session closing). Each time: the
controller exits 3, nothing it started is still running (ansible-playbook, its workers, their ssh
clients), the journal has one line marked as the interruption at the host's stage, and then
`upgrade --resume` (packages, verify, return) or `rollback` (drain, reboot) finishes: the host on R580
and back in service, or on exactly its R575 packages and holds and back in service.

The stages and what the test waits for: drain = `draining` in the journal while a Slurm job keeps the
drain waiting; packages = `upgrading` (apt under way); reboot = `rebooting` (the guest's sshd held
20 s at each boot while this test runs, so the stage outlasts the poll); verify = the first
`verifying`; return = the second `verifying` (the serving smoke done) and the return to service under
way: for that stage alone the night's Slurm client is a wrapper of the real `scontrol` that leaves a mark
and takes 30 s over `state=resume` (the return is otherwise over in a moment).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from nightkit import LAUNCHER, NEW, OLD, loaded, packages, put_on_575, smoke_launch, ssh, wait_for
from procwatch import Watcher

from k3fleet.change import RollbackOptions, UpgradeOptions, run_rollback, run_upgrade
from k3fleet.change.journal import read_journal, replay
from k3fleet.lab import testbed

pytestmark = pytest.mark.system

HOST = "tb-node02"
ACCEPT = ["rdma.*", "container.*"]


def slow_return(inventory: Path, directory: Path, mark: Path) -> Path:
    """The inventory with a Slurm client whose return to service (`state=resume`) leaves ``mark`` and
    takes 30 s, then runs the real scontrol."""
    bindir = directory / "slow-bin"
    bindir.mkdir()
    real = shutil.which("scontrol") or "/usr/bin/scontrol"
    (bindir / "scontrol").write_text(f'#!/bin/sh\ncase "$*" in *state=resume*) touch {mark}; sleep 30 ;; esac\n'
                                     f'exec {real} "$@"\n')
    (bindir / "scontrol").chmod(0o755)
    data = yaml.safe_load(inventory.read_text())
    data["all"]["children"]["testbed"]["vars"]["k3fleet_slurm_path"] = f"{bindir}:/usr/bin:/bin"
    path = directory / "slow-return.yml"
    path.write_text(yaml.safe_dump(data))
    return path


SLOW_BOOT = "/etc/systemd/system/ssh.service.d/k3fleet-test-slow-boot.conf"
SLOW_BOOT_S = 20


def slow_boot(tb: testbed.TestbedState, on: bool) -> None:
    """Hold the guest's sshd ``SLOW_BOOT_S`` seconds at each boot (or stop holding it): the reboot stage then
    lasts long enough for the signal to land in it. A guest reboots in a few seconds, and the stage
    seen in the journal could otherwise be over before the signal arrives (real GPU nodes take minutes)."""
    if on:
        ssh(tb, HOST, f"mkdir -p {os.path.dirname(SLOW_BOOT)} && printf '[Service]\\nExecStartPre=/bin/sleep "
                      f"{SLOW_BOOT_S}\\n' > {SLOW_BOOT} && systemctl daemon-reload")
    else:
        testbed.wait_host_ready(tb.workdir, HOST)
        ssh(tb, HOST, f"rm -f {SLOW_BOOT} && systemctl daemon-reload")


# stage under test -> (the journal's stages that say the host is in it, the signal, how the night ends)
STAGES = {
    "drain": (["snapshot", "draining"], signal.SIGTERM, "rollback"),
    "packages": (["snapshot", "draining", "drained", "upgrading"], signal.SIGTERM, "resume"),
    "reboot": (["snapshot", "draining", "drained", "upgrading", "rebooting"], signal.SIGHUP, "rollback"),
    "verify": (["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying"], signal.SIGTERM,
               "resume"),
    "return": (["snapshot", "draining", "drained", "upgrading", "rebooting", "verifying", "verifying"],
               signal.SIGTERM, "resume"),
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_night_stopped_in_a_stage_is_continued(testbed_state: testbed.TestbedState, inventory: Path,
                                                 tmp_path: Path, stage: str,
                                                 testbed_report: Callable[[str], None],
                                                 request: pytest.FixtureRequest) -> None:
    tb = testbed_state
    reached, sig, ending = STAGES[stage]
    put_on_575(tb, [HOST])
    if stage == "reboot":
        slow_boot(tb, True)
        request.addfinalizer(lambda: slow_boot(tb, False))
    before = packages(tb, HOST)
    node = tb.host(HOST).slurm_node
    runs = tmp_path / "runs"
    out = runs / "night"
    boots = testbed.status(tb.workdir).host(HOST).boots
    job = testbed.submit_job(tb, node, seconds=600, name="k3-int") if stage == "drain" else None
    started = time.monotonic()
    try:
        if job is not None:
            wait_for(lambda: testbed.job_state(tb, job) == "RUNNING", 60, "the job running", every=0.3)
        launcher = tmp_path / "k3fleet_cli.py"
        launcher.write_text(LAUNCHER)
        night_inventory, returning = inventory, tmp_path / "returning"
        if stage == "return":
            night_inventory = slow_return(inventory, tmp_path, returning)
        proc = subprocess.Popen(
            [sys.executable, str(launcher), "upgrade", "-i", str(night_inventory), "--change-id", f"CHG-INT-{stage}",
             "--operator", "erin", "--canary", HOST, "--limit", HOST, "--out", str(out), "--runs-dir", str(runs),
             "-q", "--launch-file", str(smoke_launch(tmp_path)), *[x for a in ACCEPT for x in ("--accept-finding", a)]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=dict(os.environ))
        watch = Watcher(proc.pid)
        watch.start()
        journal = out / "journal.jsonl"

        def there() -> bool:
            assert proc.poll() is None, f"the night ended ({proc.returncode}) before the {stage} stage"
            if not journal.exists():
                return False
            if stage == "return" and not returning.exists():
                return False
            return [e.stage for e in read_journal(journal).entries if e.host == HOST] == reached

        try:
            wait_for(there, 900, f"{HOST} in its {stage} stage", every=0.3)
        finally:
            os.kill(proc.pid, sig)
            _stdout, stderr = proc.communicate(timeout=120)
            watch.stop()
        stopped_after = time.monotonic() - started
        assert proc.returncode == 3, stderr[-3000:]
        assert "Traceback" not in stderr
        time.sleep(1)
        assert watch.left() == [], watch.left()
        assert watch.in_session() == []
        assert not list((runs / ".k3fleet" / "plays").glob("*/pid.json"))
        # The journal says where the host was, and nothing else changed in its history.
        back = read_journal(journal)
        marks = [e for e in back.entries if e.interrupted is not None]
        assert [(m.host, m.stage, m.interrupted["signal"]) for m in marks] == [(HOST, reached[-1], sig.name)]
        assert [e.stage for e in replay(back.entries)[HOST].entries] == reached
        run = json.loads((out / "run.json").read_text())
        assert run["status"] == "interrupted" and run["hosts"][HOST]["interrupted"]["stage"] == reached[-1]
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    finally:
        if job is not None and ending == "resume":
            subprocess.run(["scancel", str(job)], env=testbed.slurm_env(tb), check=False)

    continued = time.monotonic()
    if ending == "resume":
        res = run_upgrade(UpgradeOptions(inventory=inventory, change_id=f"CHG-INT-{stage}", operator="erin",
                                         resume=out, runs_dir=runs, accept_findings=ACCEPT,
                                         launch_file=smoke_launch(tmp_path)),
                          ["k3fleet", "upgrade", "--resume"])
        assert res.exit_code == 0, (res.message, res.hosts)
        assert res.hosts[HOST]["outcome"] == "upgraded"
        assert loaded(tb, HOST) == NEW
    else:
        if stage == "reboot":
            # A reboot already asked for happens whether or not anyone watches: the rollback starts once
            # the guest is back (the signal may also have come before the play asked for it).
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and testbed.status(tb.workdir).host(HOST).boots <= boots:
                time.sleep(1)
            if testbed.status(tb.workdir).host(HOST).boots > boots:
                testbed.wait_host_ready(tb.workdir, HOST, min_boots=boots + 1)
        rolled = run_rollback(RollbackOptions(inventory=inventory, run=out, runs_dir=runs), ["k3fleet", "rollback"])
        assert rolled.exit_code == 0, (rolled.message, rolled.hosts)
        assert rolled.hosts[HOST]["outcome"] == "rolled_back"
        assert packages(tb, HOST) == before
        assert loaded(tb, HOST) == OLD
        if job is not None:
            # The job the drain waited for was never cancelled.
            assert testbed.job_state(tb, job) == "RUNNING"
            subprocess.run(["scancel", str(job)], env=testbed.slurm_env(tb), check=False)
    assert not testbed.node_state(tb, node).drained, "the node was not given back"
    testbed_report(f"interrupt at {stage}: stopped after {stopped_after:.0f}s, {ending} in "
                   f"{time.monotonic() - continued:.0f}s")
