"""k3fleet_slurm (parsers, ownership rule) and the k3fleet_slurm_node module.

Three layers: pure functions on recorded real Slurm output (tests/fixtures/slurm/SOURCES.md);
the module against replaying stand-in commands (every branch, no root needed); and the module
against real slurmctld + slurmd daemons started here, as children of the test, when the machine
has Slurm and root (scripts/testbed-deps.sh installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from nodetree import ExitJson, FailJson, exe, fixtures

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_lease import (
    adopted_text,
    lease_holder,
    lease_owner,
    lease_text,
    previous_reason,
    valid_change_id,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_slurm import (
    drain_complete,
    parse_job_ids,
    plan_drain,
    plan_resume,
    split_stamp,
    status_from_scontrol,
    status_from_sinfo_json,
    strip_marker,
    validated_marker,
    with_marker,
)
from ansible_collections.k3fleet.gpu.plugins.modules import k3fleet_slurm_node

FIX, fixture = fixtures("slurm")
CHANGE = "CHG-1042"
OUR_REASON = "k3fleet:CHG-1042 alice: R580 driver change"
ADOPTED = OUR_REASON + " [was: disk replacement INC-7731]"


# -- pure functions on recorded output ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "node", "state", "drain", "reason", "user", "plan", "resume"),
    [
        ("scontrol_node01_allocated.txt", "node01", "mixed", False, None, None, "drain", "not_drained"),
        ("scontrol_node01_draining.txt", "node01", "draining", True, OUR_REASON, "root", "ours", "resume"),
        ("scontrol_node01_drained_ours.txt", "node01", "drained", True, OUR_REASON, "root", "ours", "resume"),
        ("scontrol_node02_drained_other.txt", "node02", "drained", True, "disk replacement INC-7731", "root",
         "adopt", "not_ours"),
        ("scontrol_node02_down.txt", "node02", "down", True, "hw failure INC-7740", "root", "adopt", "not_ours"),
        ("scontrol_node01_idle_after_resume.txt", "node01", "idle", False, None, None, "drain", "not_drained"),
        ("scontrol_two_nodes.txt", "node01", "drained", True, OUR_REASON, "root", "ours", "resume"),
        ("scontrol_two_nodes.txt", "node02", "drained", True, "disk replacement INC-7731", "root", "adopt",
         "not_ours"),
    ],
)
def test_scontrol_status(name: str, node: str, state: str, drain: bool, reason: str | None, user: str | None,
                         plan: str, resume: str) -> None:
    status = status_from_scontrol(fixture(name), node)
    assert (status["state"], status["drain"], status["reason"], status["reason_user"]) == (state, drain, reason, user)
    assert plan_drain(status, CHANGE) == plan
    assert plan_resume(status, CHANGE) == resume


@pytest.mark.parametrize(
    ("name", "node", "state", "flags", "reason", "user", "plan"),
    [
        ("sinfo_node01_draining.json", "node01", "draining", ["drain"], OUR_REASON, "root", "ours"),
        ("sinfo_node01_draining.json", "node02", "idle", [], None, None, "drain"),
        ("sinfo_drained_both.json", "node02", "drained", ["drain"], "disk replacement INC-7731", "root", "adopt"),
        ("sinfo_node02_down.json", "node02", "down", ["drain"], "hw failure INC-7740", "root", "adopt"),
        # Slurm 24.11: state is a list, reason_changed_at an object.
        ("sinfo_24.11_trinityx.json", "node001", "down", ["drain", "not_responding"],
         "TRIX-DRAINER: Multiple reasons for drained node, check AlertX for more information", "root", "adopt"),
        ("sinfo_24.11_trinityx.json", "node003", "idle", [], None, None, "drain"),
    ],
)
def test_sinfo_json_status(name: str, node: str, state: str, flags: list[str], reason: str | None,
                           user: str | None, plan: str) -> None:
    status = status_from_sinfo_json(fixture(name), node)
    assert (status["state"], status["flags"], status["reason"], status["reason_user"]) == (state, flags, reason, user)
    assert plan_drain(status, CHANGE) == plan
    assert (status["reason_time"] is None) == (reason is None)


def test_scontrol_and_sinfo_agree_on_the_same_moment() -> None:
    a = status_from_scontrol(fixture("scontrol_node01_draining.txt"), "node01")
    b = status_from_sinfo_json(fixture("sinfo_node01_draining.json"), "node01")
    assert {k: a[k] for k in ("state", "flags", "drain", "reason", "reason_user")} == {
        k: b[k] for k in ("state", "flags", "drain", "reason", "reason_user")}


@pytest.mark.parametrize(
    ("text", "node", "error"),
    [
        ("scontrol_node99.txt", "node99", "no NodeName=node99 record"),
        ("no_conf.txt", "node01", "no NodeName=node01 record"),
        ("scontrol_node01_allocated.txt", "node02", "no NodeName=node02 record"),
    ],
)
def test_scontrol_without_the_record_is_an_error(text: str, node: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        status_from_scontrol(fixture(text), node)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "printed no JSON"),
        (fixture("sinfo_drained_both.json")[:700], "printed no JSON"),  # truncated output
        ('{"meta": {}, "errors": []}', "no nodes list"),
        (fixture("sinfo_drained_both.json"), "node node07 not in sinfo --json output"),
    ],
)
def test_sinfo_json_garbage_is_an_error(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        status_from_sinfo_json(text, "node07")


@pytest.mark.parametrize(
    ("reason", "change", "owner"),
    [
        (OUR_REASON, CHANGE, "ours"),
        ("k3fleet:CHG-1042", CHANGE, "ours"),
        ("k3fleet:CHG-10420 bob: other night", CHANGE, "k3fleet"),  # a prefix of the id is not the id
        ("k3fleet:CHG-1041 bob: last week", CHANGE, "k3fleet"),
        ("disk replacement INC-7731", CHANGE, "other"),
        ("Not responding", CHANGE, "other"),
        ("  ", CHANGE, None),
        ("(null)", CHANGE, None),
        (None, CHANGE, None),
    ],
)
def test_reason_owner(reason: str | None, change: str, owner: str | None) -> None:
    assert lease_owner(reason, change) == owner


def test_lease_round_trip() -> None:
    reason = lease_text(CHANGE, "alice", "R580 driver change")
    assert reason == OUR_REASON
    assert lease_owner(reason, CHANGE) == "ours" and lease_holder(reason) == CHANGE
    assert lease_text(CHANGE) == "k3fleet:CHG-1042"
    assert lease_holder("k3fleet: manual note") is None and lease_owner("k3fleet: manual note", CHANGE) == "other"
    adopted = adopted_text(OUR_REASON, "disk replacement INC-7731")
    assert adopted == ADOPTED and lease_owner(adopted, CHANGE) == "ours"
    assert previous_reason(adopted + " ") == "disk replacement INC-7731" and previous_reason(OUR_REASON) is None
    assert split_stamp(OUR_REASON + " [root@2026-11-29T17:18:53]") == (OUR_REASON, "root", "2026-11-29T17:18:53")
    assert split_stamp("no stamp here") == ("no stamp here", None, None)


@pytest.mark.parametrize(("change", "ok"), [("CHG-1042", True), ("2026.11.29_a", True), ("", False),
                                            ("-x", False), ("a b", False), ("a=b", False), ("x" * 65, False)])
def test_valid_change_id(change: str, ok: bool) -> None:
    assert valid_change_id(change) is ok


def test_job_ids() -> None:
    assert parse_job_ids(fixture("squeue_node01_running.txt")) == ["1"]
    assert parse_job_ids("") == []
    with pytest.raises(ValueError, match="not a job id"):
        parse_job_ids("JOBID\n1\n")


@pytest.mark.parametrize(
    ("name", "node", "jobs", "complete"),
    [
        ("scontrol_node01_draining.txt", "node01", 1, False),
        ("scontrol_node01_drained_ours.txt", "node01", 0, True),
        # Slurm says drained but squeue still lists a job (completing): not done yet.
        ("scontrol_node01_drained_ours.txt", "node01", 1, False),
        ("scontrol_node02_down.txt", "node02", 0, True),
        ("scontrol_node01_allocated.txt", "node01", 1, False),
        ("scontrol_node01_idle_after_resume.txt", "node01", 0, False),
    ],
)
def test_drain_complete(name: str, node: str, jobs: int, complete: bool) -> None:
    status = status_from_scontrol(fixture(name), node)
    status["jobs_running"] = jobs
    assert drain_complete(status) is complete


def test_completing_job_keeps_the_drain_incomplete() -> None:
    # A cancelled job's processes may still hold the GPUs: IDLE+COMPLETING+DRAIN is not done.
    status = status_from_scontrol(fixture("scontrol_node01_drained_ours.txt").replace(
        "State=IDLE+DRAIN", "State=IDLE+COMPLETING+DRAIN"), "node01")
    status["jobs_running"] = 0
    assert status["state"] == "drained" and "completing" in status["flags"]
    assert drain_complete(status) is False


# -- the module against replaying stand-in commands -----------------------------------------


def run_module(args: dict[str, Any], *, check: bool = False, diff: bool = False) -> dict[str, Any]:
    full = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    with patch_module_args(full), pytest.raises(ExitJson) as exc:
        k3fleet_slurm_node.main()
    return exc.value.args[0]


def fail_module(args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    full = dict(args, _ansible_check_mode=check)
    with patch_module_args(full), pytest.raises(FailJson) as exc:
        k3fleet_slurm_node.main()
    return exc.value.args[0]


@dataclass
class FakeSlurm:
    """scontrol/squeue/scancel that replay recorded output and switch it the way Slurm does."""

    dir: Path

    def set(self, *, node: str, jobs: str = "", after_drain: str | None = None, after_resume: str | None = None,
            after_cancel: str | None = None) -> None:
        shutil.copy(FIX / node, self.dir / "node")
        (self.dir / "jobs").write_text(jobs)
        for key, name in (("after_drain", after_drain), ("after_resume", after_resume),
                          ("after_cancel", after_cancel)):
            if name:
                shutil.copy(FIX / name, self.dir / key)

    def calls(self) -> list[str]:
        path = self.dir / "calls"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched_exits: None) -> FakeSlurm:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scripts = {
        "scontrol": """echo "scontrol $*" >> "$FAKE_SLURM/calls"
case "$1" in
  show) if grep -q "not found" "$FAKE_SLURM/node"; then cat "$FAKE_SLURM/node" >&2; exit 1; fi
        cat "$FAKE_SLURM/node";;
  update) node=""; reason=""; state=""
          for a in "$@"; do case "$a" in
            nodename=*) node="${a#nodename=}";;
            reason=*) reason="${a#reason=}";;
            state=*) state="${a#state=}";;
          esac; done
          case "$state" in
            # Slurm keeps one reason per node: a drain with a reason replaces it (as the daemons do).
            drain) if [ -f "$FAKE_SLURM/after_drain" ]; then cp "$FAKE_SLURM/after_drain" "$FAKE_SLURM/node"
                   else REASON="$reason" NODE="$node" python3 -c 'import os, re, sys
p = os.environ["FAKE_SLURM"] + "/node"
lines = open(p).read().splitlines()
out = [re.sub(r"Reason=.*$", "Reason=" + os.environ["REASON"] + " [root@2026-11-29T17:18:53]", line)
       if line.startswith("NodeName=" + os.environ["NODE"] + " ") else line for line in lines]
open(p, "w").write("\\n".join(out) + "\\n")'; fi;;
            resume) cp "$FAKE_SLURM/after_resume" "$FAKE_SLURM/node";;
          esac;;
esac""",
        "squeue": 'cat "$FAKE_SLURM/jobs"',
        "scancel": """echo "scancel $*" >> "$FAKE_SLURM/calls"
: > "$FAKE_SLURM/jobs"; cp "$FAKE_SLURM/after_cancel" "$FAKE_SLURM/node" """,
    }
    for name, body in scripts.items():
        exe(bindir / name, body)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FAKE_SLURM", str(state))
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return FakeSlurm(state)


ARGS = {"node": "node01", "change_id": CHANGE, "reason": OUR_REASON, "poll_interval": 0.05, "settle": 0}


def test_drain_idle_node(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_idle_after_resume.txt", after_drain="scontrol_node01_drained_ours.txt")
    res = run_module(ARGS, diff=True)
    k = res[RESULT_KEY]
    assert res["changed"] is True
    assert (k["decision"], k["drained_by_us"], k["owner"]) == ("drain", True, "ours")
    assert k["after"]["state"] == "drained"
    assert f"scontrol update nodename=node01 state=drain reason={OUR_REASON}" in fake.calls()
    assert "reason: " + OUR_REASON in res["diff"]["after"]
    assert "state: IDLE+NOT_RESPONDING" in res["diff"]["before"]


def test_drain_check_mode_changes_nothing(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt", jobs="1\n", after_drain="scontrol_node01_draining.txt")
    res = run_module(ARGS, check=True, diff=True)
    k = res[RESULT_KEY]
    assert res["changed"] is True
    assert not any(c.startswith("scontrol update") for c in fake.calls())
    assert k["after"]["state"] == "draining" and k["after"]["reason"] == OUR_REASON
    assert res["actions"][0] == f"scontrol update nodename=node01 state=drain reason='{OUR_REASON}'"
    assert res["actions"][1] == "would wait up to 3600s for 1 running job(s): 1"


def test_drain_is_idempotent(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_drained_ours.txt")
    res = run_module(ARGS)
    assert res["changed"] is False
    assert (res[RESULT_KEY]["decision"], res[RESULT_KEY]["drained_by_us"]) == ("ours", True)
    assert not any(c.startswith("scontrol update") for c in fake.calls())


def test_node_drained_by_someone_else_is_leased_on_top_and_given_back(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_two_nodes.txt")
    res = run_module(dict(ARGS, node="node02"))
    k = res[RESULT_KEY]
    assert res["changed"] is True
    assert (k["decision"], k["drained_by_us"], k["leased"], k["owner"]) == ("adopt", False, True, "ours")
    assert k["after"]["reason"] == ADOPTED
    assert res["actions"][0] == f"scontrol update nodename=node02 state=drain reason='{ADOPTED}'"
    # The lease comes off again and the operator's own reason is back; the node is never resumed.
    res = run_module(dict(ARGS, node="node02", state="resumed"))
    assert res["changed"] is True and res[RESULT_KEY]["decision"] == "restore"
    assert res[RESULT_KEY]["after"]["reason"] == "disk replacement INC-7731"
    assert res[RESULT_KEY]["after"]["drain"] is True
    assert not any("state=resume" in c for c in fake.calls())


def test_node_held_by_another_change_is_never_touched(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_two_nodes.txt")
    theirs = dict(ARGS, node="node01", change_id="CHG-2000", reason="k3fleet:CHG-2000 bob: NVIDIA driver change")
    for args in (theirs, dict(theirs, state="resumed"), dict(theirs, state="query")):
        res = run_module(args)
        k = res[RESULT_KEY]
        assert res["changed"] is False and k["holder"] == "CHG-1042", k
        assert k["decision"] in ("held", "not_ours", "query") and k["drained_by_us"] is False
    assert not any(c.startswith("scontrol update") for c in fake.calls())


def test_a_change_that_loses_the_race_for_a_node_reports_it_held(fake: FakeSlurm) -> None:
    # Both read the node idle; the other change's drain lands last, so its reason is what Slurm keeps.
    fake.set(node="scontrol_node01_idle_after_resume.txt", after_drain="scontrol_node01_drained_ours.txt")
    res = run_module(dict(ARGS, change_id="CHG-2000", reason="k3fleet:CHG-2000 bob: NVIDIA driver change"))
    k = res[RESULT_KEY]
    assert (k["decision"], k["holder"], k["drained_by_us"], k["leased"]) == ("held", "CHG-1042", False, False)
    assert res["changed"] is True  # it did write its reason, which the other change's then replaced
    assert res["actions"][-1].startswith("left as it is: another change took the node at the same moment")


def test_drain_timeout_keeps_drain_and_jobs(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt", jobs="1\n", after_drain="scontrol_node01_draining.txt")
    res = fail_module(dict(ARGS, wait_timeout=0))
    assert res["msg"].startswith("node node01 still runs 1 job(s) (1, state draining) after 0s; the drain stays")
    assert res[RESULT_KEY]["drained_by_us"] is True
    assert not any(c.startswith("scancel") for c in fake.calls())


def test_force_cancels_after_timeout(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt", jobs="1\n", after_drain="scontrol_node01_draining.txt",
             after_cancel="scontrol_node01_drained_ours.txt")
    res = run_module(dict(ARGS, wait_timeout=0, force=True))
    assert res[RESULT_KEY]["jobs_cancelled"] == ["1"]
    assert "scancel 1" in fake.calls()
    assert res[RESULT_KEY]["after"]["state"] == "drained"


def test_resumed_by_someone_else_while_waiting(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt", jobs="1\n",
             after_drain="scontrol_node01_idle_after_resume.txt")
    res = fail_module(dict(ARGS, wait_timeout=5))
    assert "was returned to service (state idle) while k3fleet waited" in res["msg"]


def test_resume_ours(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_drained_ours.txt", after_resume="scontrol_node01_idle_after_resume.txt")
    res = run_module(dict(ARGS, state="resumed"), diff=True)
    assert res["changed"] is True
    assert res[RESULT_KEY]["decision"] == "resume" and res[RESULT_KEY]["after"]["drain"] is False
    assert "scontrol update nodename=node01 state=resume" in fake.calls()


def test_resume_check_mode(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_drained_ours.txt", after_resume="scontrol_node01_idle_after_resume.txt")
    res = run_module(dict(ARGS, state="resumed"), check=True)
    assert res["changed"] is True
    assert not any(c.startswith("scontrol update") for c in fake.calls())


def test_resume_not_drained(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt")
    res = run_module(dict(ARGS, state="resumed"))
    assert res["changed"] is False and res[RESULT_KEY]["decision"] == "not_drained"


def test_query_reports_owner(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_draining.txt", jobs="1\n")
    res = run_module({"node": "node01", "state": "query", "change_id": CHANGE})
    k = res[RESULT_KEY]
    assert res["changed"] is False
    assert (k["owner"], k["drained_by_us"], k["before"]["jobs_running"]) == ("ours", True, 1)
    assert fake.calls() == ["scontrol show node node01 --oneliner"]


def test_unknown_node_fails_clearly(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node99.txt")
    res = fail_module(dict(ARGS, node="node99"))
    assert res["msg"] == "Slurm has no node named node99 (scontrol: Node node99 not found)"


def test_garbage_from_squeue_fails_clearly(fake: FakeSlurm) -> None:
    fake.set(node="scontrol_node01_allocated.txt", jobs="JOBID\n1\n")
    res = fail_module(ARGS)
    assert res["msg"] == "listing running jobs of node node01: squeue line is not a job id: 'JOBID'"


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ({"node": "node01", "state": "drained"}, "state is drained but all of the following are missing: change_id"),
        (dict(ARGS, change_id="bad id"), "change id 'bad id' is not valid"),
        (dict(ARGS, reason="k3fleet:CHG-1 alice: x"), "lease 'k3fleet:CHG-1 alice: x' does not start with "
                                                      "k3fleet:CHG-1042"),
        ({"node": "node01", "change_id": CHANGE}, "state is drained but all of the following are missing: reason"),
        (dict(ARGS, settle=-1), "settle must be 0 or more"),
        (dict(ARGS, node="node[01-02]"), "node must be one Slurm NodeName"),
        (dict(ARGS, poll_interval=0), "poll_interval must be positive"),
    ],
)
def test_bad_arguments(fake: FakeSlurm, args: dict[str, Any], msg: str) -> None:
    assert msg in fail_module(args)["msg"]


def test_missing_scontrol(patched_exits: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    res = fail_module(ARGS)
    assert res["msg"] == "reading node node01 failed: scontrol: command not found"


# -- the module against real Slurm daemons -----------------------------------------------------

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch", "scancel", "sinfo")


def _slurm_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "real Slurm daemons need root"
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [t for t in SLURM_TOOLS if shutil.which(t, path=search) is None]
    if missing:
        return f"Slurm not installed (missing {', '.join(missing)}; scripts/testbed-deps.sh)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no munge user (install munge)"
    return None


@dataclass
class Cluster:
    conf: Path
    env: dict[str, str]

    def sh(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def node(self, name: str) -> dict[str, Any]:
        return status_from_scontrol(self.sh("scontrol", "show", "node", name, "--oneliner"), name)

    def job_state(self, job: str) -> str:
        out = self.sh("scontrol", "-o", "show", "job", job)
        return out.split("JobState=", 1)[1].split()[0]

    def wait_for(self, what: str, predicate: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = _slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    from k3fleet.lab.testbed.slurm import plan_slurm, service_specs, write_slurm_files

    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    tools = {t: str(shutil.which(t, path=search)) for t in SLURM_TOOLS}
    # Not under pytest's tmp tree: that is private to root, and munged runs as the munge user.
    conf_dir = Path(tempfile.mkdtemp(prefix="k3fleet-slurm-"))
    conf_dir.chmod(0o755)
    slurm = plan_slurm(conf_dir, ["node01", "node02"])
    write_slurm_files(slurm)
    env = dict(os.environ, SLURM_CONF=str(slurm.conf), LC_ALL="C")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for spec in service_specs(slurm, tools):
            log = open(conf_dir / f"{spec['name']}.out", "wb")  # noqa: SIM115 - closed with the process
            # Foreground daemons as our children: this machine's PID 1 does not reap orphans.
            procs.append(subprocess.Popen(spec["argv"], env={**os.environ, **spec["env"]}, stdout=log,
                                          stderr=subprocess.STDOUT, user=spec.get("user"),
                                          start_new_session=True))
            if spec.get("ready_path"):
                deadline = time.monotonic() + 20
                while not Path(spec["ready_path"]).exists():
                    assert time.monotonic() < deadline, f"{spec['name']} did not start: see {log.name}"
                    assert procs[-1].poll() is None, f"{spec['name']} exited: see {log.name}"
                    time.sleep(0.2)
        c = Cluster(slurm.conf, env)
        c.wait_for("both nodes idle", lambda: all(
            c.node(n)["state"] == "idle" for n in ("node01", "node02")), timeout=60)
        yield c
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(conf_dir, ignore_errors=True)


@pytest.fixture
def real(cluster: Cluster, patched_exits: None) -> Iterator[Cluster]:
    yield cluster
    # Leave both nodes idle and empty for the next test, whatever this one did.
    cluster.sh("scancel", "--nodelist=node01,node02", check=False)
    for n in ("node01", "node02"):
        if cluster.node(n)["drain"]:
            cluster.sh("scontrol", "update", f"nodename={n}", "state=resume")
    cluster.wait_for("nodes idle again", lambda: all(
        cluster.node(n)["state"] == "idle" for n in ("node01", "node02")))


def real_args(c: Cluster, **kw: Any) -> dict[str, Any]:
    return dict(ARGS, slurm_conf=str(c.conf), poll_interval=0.5, **kw)


def submit(c: Cluster, node: str, seconds: int) -> str:
    job = c.sh("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", f"sleep {seconds}").strip()
    c.wait_for(f"job {job} running", lambda: c.job_state(job) == "RUNNING")
    return job


@pytest.mark.integration
def test_real_drain_waits_for_the_running_job_then_resume(real: Cluster) -> None:
    job = submit(real, "node01", 6)
    res = run_module(real_args(real, wait_timeout=60))
    k = res[RESULT_KEY]
    assert res["changed"] is True and k["decision"] == "drain"
    assert k["before"]["jobs_running"] == 1 and k["before"]["state"] in ("mixed", "allocated")
    assert k["waited_s"] >= 2, "the drain returned before the job ended"
    assert real.job_state(job) == "COMPLETED", "the job must end on its own, never cancelled"
    node = real.node("node01")
    assert (node["state"], node["reason"]) == ("drained", OUR_REASON)
    again = run_module(real_args(real))
    assert again["changed"] is False and again[RESULT_KEY]["decision"] == "ours"
    res = run_module(real_args(real, state="resumed"))
    assert res["changed"] is True
    assert real.node("node01")["drain"] is False
    assert run_module(real_args(real, state="resumed"))["changed"] is False


@pytest.mark.integration
def test_real_node_drained_by_someone_else_is_leased_then_given_back(real: Cluster) -> None:
    real.sh("scontrol", "update", "nodename=node02", "state=drain", "reason=disk replacement INC-7731")
    res = run_module(real_args(real, node="node02"))
    assert res[RESULT_KEY]["decision"] == "adopt" and res[RESULT_KEY]["drained_by_us"] is False
    assert real.node("node02")["reason"] == ADOPTED
    res = run_module(real_args(real, node="node02", state="resumed"))
    assert res["changed"] is True and res[RESULT_KEY]["decision"] == "restore"
    node = real.node("node02")
    assert (node["state"], node["reason"]) == ("drained", "disk replacement INC-7731")
    again = run_module(real_args(real, node="node02", state="resumed"))
    assert again["changed"] is False and again[RESULT_KEY]["decision"] == "not_ours"


@pytest.mark.integration
def test_real_two_changes_racing_for_one_node_one_wins(real: Cluster) -> None:
    """Two controllers drain the same idle node at once (two processes): exactly one keeps it."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(real_args(real, change_id=cid, reason=f"k3fleet:{cid} x: NVIDIA driver "
                                                       "change", settle=2), results)) for cid in ("CHG-A", "CHG-B")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    got = sorted((results.get(timeout=5) for _ in procs), key=lambda r: r["decision"])
    decisions = [r["decision"] for r in got]
    assert decisions in (["drain", "held"], ["held", "drain"]), got
    winner = next(r for r in got if r["decision"] == "drain")
    loser = next(r for r in got if r["decision"] == "held")
    assert loser["holder"] == winner["change_id"] and loser["drained_by_us"] is False
    assert real.node("node01")["reason"] == f"k3fleet:{winner['change_id']} x: NVIDIA driver change"


def _race(args: dict[str, Any], out: Any) -> None:
    from nodetree import patch_exits

    mp = pytest.MonkeyPatch()
    patch_exits(mp)
    try:
        res = run_module(args)[RESULT_KEY]
        out.put({"change_id": args["change_id"], "decision": res["decision"], "holder": res["holder"],
                 "drained_by_us": res["drained_by_us"]})
    finally:
        mp.undo()


@pytest.mark.integration
def test_real_check_mode_changes_nothing(real: Cluster) -> None:
    before = real.sh("sinfo", "-N", "-h", "-o", "%N %T %E").replace("*", "")
    res = run_module(real_args(real), check=True, diff=True)
    assert res["changed"] is True and res[RESULT_KEY]["after"]["reason"] == OUR_REASON
    # A "*" (not responding for a ping) comes and goes on its own under load: not a change.
    assert real.sh("sinfo", "-N", "-h", "-o", "%N %T %E").replace("*", "") == before


@pytest.mark.integration
def test_real_timeout_keeps_job_and_drain_then_force(real: Cluster) -> None:
    job = submit(real, "node01", 120)
    res = fail_module(real_args(real, wait_timeout=1))
    assert f"still runs 1 job(s) ({job}, state draining)" in res["msg"]
    assert real.job_state(job) == "RUNNING"
    assert real.node("node01")["reason"] == OUR_REASON
    res = run_module(real_args(real, wait_timeout=0, force=True, cancel_grace=30))
    assert res[RESULT_KEY]["jobs_cancelled"] == [job]
    assert real.job_state(job) == "CANCELLED"
    assert real.node("node01")["state"] == "drained"


@pytest.mark.integration
def test_real_sinfo_json_query(real: Cluster) -> None:
    real.sh("scontrol", "update", "nodename=node02", "state=drain", "reason=disk replacement INC-7731")
    res = run_module(real_args(real, node="node02", state="query", query="sinfo_json"))
    k = res[RESULT_KEY]
    assert (k["before"]["state"], k["before"]["reason"], k["owner"]) == ("drained", "disk replacement INC-7731",
                                                                        "other")
    theirs = run_module(real_args(real, node="node02", state="query", change_id="CHG-OTHER", reason=None))
    assert theirs[RESULT_KEY]["holder"] is None
    assert json.dumps(k)  # the result is plain JSON


def test_documentation_matches_the_argument_spec() -> None:
    import yaml

    doc = yaml.safe_load(k3fleet_slurm_node.DOCUMENTATION)
    spec = k3fleet_slurm_node.ARGUMENT_SPEC
    assert set(doc["options"]) == set(spec)
    for name, opt in doc["options"].items():
        assert opt["type"] == spec[name]["type"], name
        assert opt.get("default") == spec[name].get("default"), name
        assert opt.get("choices") == spec[name].get("choices"), name
    yaml.safe_load(k3fleet_slurm_node.RETURN)
    yaml.safe_load(k3fleet_slurm_node.EXAMPLES)


# -- the validated marker (docs/change-night.md "Validated for the scheduler") -------------------------


def test_the_marker_goes_first_and_keeps_anyone_elses_comment() -> None:
    marker = validated_marker("580.95.05", CHANGE)
    assert marker == f"k3fleet.io/validated=580.95.05 ({CHANGE})"
    assert with_marker(None, marker) == marker
    assert with_marker("rack 7: cable checked", marker) == f"{marker} | rack 7: cable checked"
    # A second night replaces its own marker, never stacks one on another.
    again = with_marker(with_marker("rack 7: cable checked", marker), validated_marker("580.105.08", "CHG-2"))
    assert again == "k3fleet.io/validated=580.105.08 (CHG-2) | rack 7: cable checked"
    assert strip_marker(again) == "rack 7: cable checked"
    assert strip_marker(marker) == ""


@pytest.mark.integration
def test_real_validated_marker_is_set_read_back_and_removed(real: Cluster, tmp_path: Path) -> None:
    real.sh("scontrol", "update", "nodename=node01", "comment=rack 7: cable checked")
    try:
        res = run_module(real_args(real, state="validated", driver="580.95.05"))
        k = res[RESULT_KEY]
        marker = f"k3fleet.io/validated=580.95.05 ({CHANGE})"
        assert res["changed"] is True and k["decision"] == "validated" and k["marker"] == marker
        raw = real.sh("scontrol", "show", "node", "node01", "--oneliner")
        (tmp_path / "scontrol_node01_validated.txt").write_text(raw)
        assert real.node("node01")["comment"] == f"{marker} | rack 7: cable checked", raw
        # Idempotent, and check mode changes nothing.
        assert run_module(real_args(real, state="validated", driver="580.95.05"))["changed"] is False
        checked = run_module(real_args(real, state="unvalidated"), check=True)
        assert checked["changed"] is True and real.node("node01")["comment"].startswith(marker)
        res = run_module(real_args(real, state="unvalidated"))
        assert res["changed"] is True
        assert real.node("node01")["comment"] == "rack 7: cable checked"
        assert run_module(real_args(real, state="unvalidated"))["changed"] is False
    finally:
        real.sh("scontrol", "update", "nodename=node01", "comment=", check=False)
