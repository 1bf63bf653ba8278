"""The runs directory's lock and the play guard (k3fleet.change.lock), and reading a run back
(k3fleet.change.record): real flock, real processes, real files; no Ansible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3fleet.change.lock import NightLock, PlayGuard, live_plays
from k3fleet.change.record import load_change, verified
from k3fleet.errors import IncompleteError, UsageError
from k3fleet.evidence import RunDir


def test_a_second_night_on_the_same_runs_directory_is_refused_with_its_holder(tmp_path: Path) -> None:
    with NightLock(tmp_path, kind="change night", change_id="CHG-A", operator="alice") as lock:
        lock.set_run(tmp_path / "run-a")
        with pytest.raises(UsageError) as exc, NightLock(tmp_path, kind="rollback", change_id=None,
                                                         operator="bob"):
            pass
        msg = str(exc.value)
        assert "change night CHG-A of alice on" in msg and f"pid {os.getpid()}" in msg and "run-a" in msg
        assert "\n" not in msg
    # Released: the next one gets it, and the record is its own.
    with NightLock(tmp_path, kind="rollback", change_id=None, operator="bob"):
        record = json.loads((tmp_path / ".k3fleet" / "night.lock").read_text())
        assert (record["kind"], record["operator"], record["pid"]) == ("rollback", "bob", os.getpid())


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from k3fleet.change.lock import NightLock\n"
            "with NightLock(Path(sys.argv[1]), kind='change night', change_id='CHG-K', operator='k'):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=f"CHG-K of k on .* \\(pid {holder.pid}, since"):
            NightLock(tmp_path, kind="x", change_id=None, operator=None).__enter__()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    with NightLock(tmp_path, kind="change night", change_id="CHG-N", operator="n"):
        pass


def _fake_play(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process whose command line is a python running a file named ansible-playbook, like the real one."""
    script = tmp_path / "bin" / "ansible-playbook"
    script.parent.mkdir()
    script.write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    # Popen returns once the child's exec has begun; the kernel fills /proc/<pid>/cmdline a moment
    # later (a window a loaded machine widens). Wait for the state the test is about, not a time.
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(10000):
        if b"ansible-playbook" in cmdline.read_bytes():
            break
        time.sleep(0.001)
    return proc


def test_an_orphaned_play_blocks_the_next_night_naming_its_pid(tmp_path: Path) -> None:
    play = _fake_play(tmp_path)
    try:
        rec = tmp_path / "runs" / ".k3fleet" / "plays" / "night-ansible" / "pid.json"
        rec.parent.mkdir(parents=True)
        start = Path(f"/proc/{play.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        rec.write_text(json.dumps({"pid": play.pid, "start": start, "run": "night"}))
        assert [p["pid"] for p in live_plays(tmp_path / "runs")] == [play.pid]
        with pytest.raises(UsageError, match=f"an ansible-playbook of run night still runs as pid {play.pid}"):
            NightLock(tmp_path / "runs", kind="resumed change night", change_id="CHG-1", operator="a").__enter__()
    finally:
        play.kill()
        play.wait(10)
    # Gone (or a reused pid with another start time): the stale record is cleared, the lock is free.
    assert live_plays(tmp_path / "runs") == []
    assert not rec.parent.exists()
    with NightLock(tmp_path / "runs", kind="resumed change night", change_id="CHG-1", operator="a"):
        pass


def test_a_play_record_that_is_not_a_file_is_skipped_not_waited_on(tmp_path: Path) -> None:
    """A FIFO where a play's pid.json belongs would block a plain read forever: it is passed over."""
    rec = tmp_path / "runs" / ".k3fleet" / "plays" / "night-ansible" / "pid.json"
    rec.parent.mkdir(parents=True)
    os.mkfifo(rec)
    assert live_plays(tmp_path / "runs") == []
    with NightLock(tmp_path / "runs", kind="change night", change_id="CHG-1", operator="a"):
        pass


def test_the_play_guard_launcher_dies_with_its_parent(tmp_path: Path) -> None:
    """The launcher, started by a process that is then SIGKILLed, takes the program it runs with it."""
    real = tmp_path / "real" / "ansible-playbook"
    real.parent.mkdir()
    real.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    real.chmod(0o755)
    runs = tmp_path / "runs"
    parent_code = ("import os, subprocess, sys, time\nfrom pathlib import Path\n"
                   "from k3fleet.change.lock import PlayGuard\n"
                   "with PlayGuard(Path(sys.argv[1]), 'night-ansible', sys.argv[2]) as d:\n"
                   "    subprocess.Popen(['ansible-playbook', '--version'])\n"
                   "    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code, str(runs), str(real)])
    pidfile = runs / ".k3fleet" / "plays" / "night-ansible" / "pid.json"
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists():
            assert time.monotonic() < deadline, "the launcher recorded no pid"
            time.sleep(0.1)
        time.sleep(0.2)
        child = json.loads(pidfile.read_text())["pid"]
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert str(real).encode() in cmd and b"--version" in cmd
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, f"pid {child} outlived its controller"
        time.sleep(0.1)


def test_the_play_guard_restores_path(tmp_path: Path) -> None:
    before = os.environ.get("PATH")
    with PlayGuard(tmp_path, "r1", sys.executable) as d:
        assert os.environ["PATH"].split(os.pathsep)[0] == str(d)
        assert (d / "ansible-playbook").stat().st_mode & 0o100
    assert os.environ.get("PATH") == before and not d.exists()


# -- reading a change run back ---------------------------------------------------------------------


def _run(tmp_path: Path, change: object) -> RunDir:
    rd = RunDir.create(tmp_path, "change", ["k3fleet", "upgrade"], out=tmp_path / "run")
    rd.write_json("change.json", change)
    rd.write_manifest()
    return rd


@pytest.mark.parametrize(("change", "message"), [
    ({}, "is not a change record (change_id: Field required (+3 more))"),
    ([], "holds a JSON list, not a change record"),
    ({"change_id": "C", "operator": "o", "target_version": "580.95.05", "target_branch": "R580"},
     "(target_branch: Input should be a valid integer"),
])
def test_a_broken_change_record_is_one_line_exit_3(tmp_path: Path, change: object, message: str) -> None:
    rd = _run(tmp_path, change)
    with pytest.raises(IncompleteError) as exc:
        load_change(verified(rd.path))
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.exit_code == 3


def test_a_tampered_run_is_refused_but_a_grown_journal_is_not(tmp_path: Path) -> None:
    good = {"change_id": "C", "operator": "o", "target_version": "580.95.05", "target_branch": 580}
    rd = _run(tmp_path, good)
    (rd.path / "journal.jsonl").write_text('{"ts": "t1"}\n')
    rd.write_manifest()
    # What a night writes after its manifest: the journal grows, the play's output appears.
    with (rd.path / "journal.jsonl").open("a") as fh:
        fh.write('{"ts": "t2"}\n')
    (rd.path / "events-resume-1.jsonl").write_text("{}\n")
    assert load_change(verified(rd.path)).change_id == "C"
    # A journal rewritten (not grown), a changed record, a stray file: refused, exit 3.
    (rd.path / "journal.jsonl").write_text('{"ts": "X1"}\n{"ts": "t2"}\n')
    with pytest.raises(IncompleteError, match=r"journal\.jsonl: changed"):
        verified(rd.path)
    rd.write_manifest()
    (rd.path / "change.json").write_text(json.dumps(dict(good, operator="mallory")))
    (rd.path / "notes.txt").write_text("x")
    with pytest.raises(IncompleteError, match=r"change.json: changed; notes.txt: not in the manifest"):
        verified(rd.path)


def test_a_run_without_a_manifest_never_reached_its_play(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "change", ["k3fleet"], out=tmp_path / "run")
    with pytest.raises(IncompleteError, match=r"no manifest\.json: it stopped before its play started"):
        verified(rd.path)
    with pytest.raises(UsageError, match="is not a directory"):
        verified(tmp_path / "nope")


# -- the command line on a run that cannot be trusted ----------------------------------------------------

GOOD = {"change_id": "CHG-1", "operator": "o", "target_version": "580.95.05", "target_branch": 580,
        "canary": "gpu-a01", "hosts": {"gpu-a01": {"target_version": "580.95.05", "target_branch": 580,
                                                   "packages": [{"name": "nvidia-driver-575-server",
                                                                 "to_name": "nvidia-driver-580-server",
                                                                 "to_version": "580.95.05"}]}}}


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from k3fleet.cli.base import main

    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize(("change", "code", "message"), [
    ({}, 3, "is not a change record"),
    ([], 3, "holds a JSON list, not a change record"),
    (dict(GOOD, failure_budget="lots"), 3, "(failure_budget: Input should be a valid integer"),
    (GOOD, 2, "has simulated lab hosts, which cannot be changed"),
])
def test_resume_and_rollback_of_a_bad_run_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       change: object, code: int, message: str) -> None:
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    lab = generate_fleet(load_fleet(None), tmp_path / "lab")
    rd = _run(tmp_path, change)
    rc, err = _cli(["upgrade", "-i", str(lab), "--change-id", "CHG-1", "--operator", "o",
                    "--resume", str(rd.path), "--runs-dir", str(tmp_path / "runs")], capsys)
    assert (rc, len(err.strip().splitlines())) == (code, 1), err
    assert message in err and "Traceback" not in err


def test_rollback_of_a_tampered_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rd = _run(tmp_path, GOOD)
    (rd.path / "journal.jsonl").write_text(json.dumps({"ts": "t", "run": "r", "change_id": "CHG-1",
                                                       "host": "gpu-a01", "stage": "snapshot", "detail": {},
                                                       "snapshot": {"packages": []}}) + "\n")
    rd.write_manifest()
    (rd.path / "change.json").write_text("{}")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu-a01: {ansible_host: 192.0.2.10}\n")
    rc, err = _cli(["rollback", "-i", str(inventory), "--run", str(rd.path), "--runs-dir",
                    str(tmp_path / "runs")], capsys)
    assert rc == 3 and "change.json: changed" in err and len(err.strip().splitlines()) == 1, err


def test_rollback_of_a_host_takes_its_latest_change_not_a_rollback_copy(tmp_path: Path) -> None:
    from k3fleet.change import RollbackOptions, rollback_sources

    runs = tmp_path / "runs"
    line = {"ts": "2026-11-29T21:00:00Z", "run": "night", "change_id": "CHG-1", "host": "gpu-a01", "detail": {}}
    night = RunDir.create(runs, "change", ["k3fleet", "upgrade"])
    for stage in ("snapshot", "draining", "drained", "upgrading", "returned"):
        night.append_jsonl("journal.jsonl", dict(line, stage=stage, **({"snapshot": {"packages": []}}
                                                                         if stage == "snapshot" else {})))
    night.write_manifest()
    # The rollback run keeps a copy of its own lines (no snapshot), later than the night's.
    back = RunDir.create(runs, "rollback", ["k3fleet", "rollback"])
    for stage in ("draining", "rolled_back", "returned"):
        back.append_jsonl("journal.jsonl", dict(line, ts="2026-11-29T22:00:00Z", run=back.path.name, stage=stage))
    back.write_manifest()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu-a01: {ansible_host: 192.0.2.10}\n")
    sources, skipped, refused = rollback_sources(RollbackOptions(inventory=inventory, limit="gpu-a01", runs_dir=runs))
    assert [(s.journal.path, s.hosts) for s in sources] == [(night.path / "journal.jsonl", ["gpu-a01"])]
    assert (skipped, refused) == ({}, {})


def test_the_lease_is_built_once_and_handed_in() -> None:
    import datetime as dt

    from k3fleet.change.lease import DRAIN_TEXT, Lease, lease_holder

    lease = Lease.build("CHG-7", "alice", DRAIN_TEXT, ttl_s=3600,
                        now=dt.datetime(2026, 11, 29, 21, 0, tzinfo=dt.UTC))
    assert lease.extravar() == {"change_id": "CHG-7", "operator": "alice", "id": "k3fleet:CHG-7",
                                "text": "k3fleet:CHG-7 alice: NVIDIA driver change", "prefix": "k3fleet:",
                                "expires": "2026-11-29T22:00:00Z"}
    assert lease_holder(lease.text) == "CHG-7"
    with pytest.raises(UsageError, match="--change-id 'CHG 7' is not valid"):
        Lease.build("CHG 7", "alice", DRAIN_TEXT, ttl_s=1)


def test_rollback_of_a_run_on_simulated_lab_hosts_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    lab = generate_fleet(load_fleet(None), tmp_path / "lab")
    rd = _run(tmp_path, GOOD)
    line = {"ts": "t", "run": "r", "change_id": "CHG-1", "host": "gpu-a01", "detail": {}}
    for stage in ("snapshot", "draining", "drained", "upgrading"):
        rd.append_jsonl("journal.jsonl", dict(line, stage=stage, **({"snapshot": {"packages": []}}
                                                                      if stage == "snapshot" else {})))
    rd.write_manifest()
    rc, err = _cli(["rollback", "-i", str(lab), "--run", str(rd.path), "--runs-dir", str(tmp_path / "runs")], capsys)
    assert rc == 2 and "simulated lab hosts, which cannot be changed" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("*-rollback-*"))
