"""The SSH lab fleet (root): 50 lab hosts behind real sshd, one network namespace each.

The audit over SSH must reach the same verdict as the local-connection lab on the same
generated fleet; host keys are checked; `down` leaves nothing, also after the supervisor and
an `up` were killed with SIGKILL. Start-up time and memory are reported, never asserted.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3fleet.lab import sshfleet
from k3fleet.lab.common import proc
from k3fleet.lab.sshfleet import harness

pytestmark = pytest.mark.system

HOSTS = 50
PR_SET_CHILD_SUBREAPER = 36
BIN = Path(sys.executable).parent


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return f"SSH lab fleet needs root (euid {os.geteuid()})"
    for tool in ("ip", "nsenter", "sshd", "ssh"):
        if shutil.which(tool, path=proc.SEARCH_PATH) is None:
            return f"SSH lab fleet needs `{tool}` (scripts/sshfleet-deps.sh installs it)"
    return None


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}


def k3fleet(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "k3fleet"), *args], capture_output=True, text=True, env=_env(),
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # Children of a supervisor this test kills come here instead of to PID 1, which never reaps.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    wd = tmp_path_factory.mktemp("sshfleet")
    try:
        yield wd
    finally:
        sshfleet.down(wd)
        proc.reap_zombie_children()


@pytest.fixture(scope="module")
def fleet(workdir: Path, testbed_report: Callable[[str], None]) -> sshfleet.SshFleetState:
    before = _mem_available()
    up = k3fleet("lab", "ssh-fleet", "up", "-n", str(HOSTS), "--workdir", str(workdir), "--json")
    assert up.returncode == 0, up.stderr
    state = sshfleet.SshFleetState.model_validate(json.loads(up.stdout))
    st = sshfleet.status(workdir)
    # MemAvailable moves with everything else on the machine; the sshd resident size is theirs alone.
    testbed_report(f"ssh fleet: {HOSTS} hosts up in {state.up_seconds:.1f}s, {st.sshd_running} sshd, "
                   f"{st.sshd_rss_mib:.0f} MiB resident (shared pages counted per process), "
                   f"MemAvailable {before - _mem_available():+.0f} MiB")
    return state


def _mem_available() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _host_view(verdict: dict[str, Any]) -> dict[str, Any]:
    """Per host: status and findings; the reason of an unreachable host is transport text."""
    out = {}
    for host, v in verdict["hosts"].items():
        out[host] = {"status": v["status"], "findings": [(f["check_id"], f["severity"], f["kind"], f["message"])
                                                         for f in v["findings"]]}
    return out


def test_fleet_is_up_with_one_sshd_per_reachable_host(fleet: sshfleet.SshFleetState, workdir: Path) -> None:
    st = sshfleet.status(workdir)
    assert st.phase == "up" and st.supervisor_alive
    assert st.sshd_running == st.sshd_expected == sum(1 for h in fleet.hosts if h.sshd)
    assert len(harness.list_netns()) == HOSTS
    assert len({h.address for h in fleet.hosts}) == HOSTS
    known = fleet.known_hosts.read_text().splitlines()
    assert len(known) == HOSTS and all(line.split()[1] == "ssh-ed25519" for line in known)
    # A second `up` on a live fleet is refused with one line, exit 2.
    again = k3fleet("lab", "ssh-fleet", "up", "-n", "2", "--workdir", str(workdir))
    assert again.returncode == 2 and "already up" in again.stderr


def test_audit_over_ssh_matches_the_local_lab(fleet: sshfleet.SshFleetState, workdir: Path, tmp_path: Path) -> None:
    node_before = sshfleet.node_cpu_seconds(workdir)
    ssh = k3fleet("audit", "-i", str(fleet.inventory), "--json", "--out", str(tmp_path / "ssh"), "-q")
    sshfleet.close_ssh_clients()  # sessions end; their CPU reaches the sshd listeners
    local = k3fleet("audit", "--lab", "--lab-count", str(HOSTS), "--json", "--out", str(tmp_path / "local"), "-q")
    assert ssh.stdout and local.stdout, ssh.stderr[-2000:] + local.stderr[-2000:]
    assert ssh.returncode == local.returncode
    a, b = json.loads(ssh.stdout), json.loads(local.stdout)
    assert a["outcome"] == b["outcome"] and a["reasons"] == b["reasons"]
    assert a["summary"] == b["summary"]
    assert a["plan"] == b["plan"]
    assert _host_view(a) == _host_view(b)
    run = json.loads((tmp_path / "ssh" / "run.json").read_text())
    unreachable = [h.name for h in fleet.hosts if not h.sshd]
    assert sorted(run["unreachable"]) == sorted(unreachable)
    assert all("Connection refused" in why for why in run["unreachable"].values()), run["unreachable"]
    # Real SSH: the modules ran in sshd sessions inside the hosts' namespaces, on the sshd side's CPU.
    deadline = time.monotonic() + 20
    while sshfleet.node_cpu_seconds(workdir) <= node_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sshfleet.node_cpu_seconds(workdir) > node_before


def test_host_keys_are_checked(fleet: sshfleet.SshFleetState, tmp_path: Path) -> None:
    served = [h for h in fleet.hosts if h.sshd][:2]
    original = fleet.known_hosts.read_text()
    lines = original.splitlines()
    keys = {line.split()[0]: " ".join(line.split()[1:]) for line in lines}
    a, b = served[0].address, served[1].address
    keys[a], keys[b] = keys[b], keys[a]
    sshfleet.close_ssh_clients()  # a live master would skip the handshake
    fleet.known_hosts.write_text("".join(f"{addr} {key}\n" for addr, key in keys.items()))
    try:
        proc_ = k3fleet("audit", "-i", str(fleet.inventory), "--limit", f"{served[0].name},{served[1].name}",
                        "--out", str(tmp_path / "swapped"), "-q")
    finally:
        fleet.known_hosts.write_text(original)
    assert proc_.returncode == 3, proc_.stderr
    run = json.loads((tmp_path / "swapped" / "run.json").read_text())
    assert sorted(run["unreachable"]) == sorted([served[0].name, served[1].name])
    assert all(re.search(r"IDENTIFICATION HAS CHANGED|Host key verification failed|host key", why, re.IGNORECASE)
               for why in run["unreachable"].values()), run["unreachable"]


def test_down_after_sigkill_leaves_nothing(fleet: sshfleet.SshFleetState, workdir: Path, tmp_path: Path) -> None:
    assert fleet.supervisor_pid is not None
    # Leave an ssh ControlPersist master and its sshd session behind, then kill the supervisor hard.
    h = next(h for h in fleet.hosts if h.sshd)
    # A unix socket path has at most 107 bytes: pytest's tmp_path is too deep for one.
    sockets = Path(tempfile.mkdtemp(prefix="k3sf-cm-", dir="/tmp"))
    argv = ["ssh", "-i", str(fleet.client_key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-o", f"ControlPath={sockets}/%C",
            f"root@{h.address}", "true"]
    # No pipes: the master that stays behind would hold them open.
    with open(tmp_path / "ssh.err", "wb") as err:
        master = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err, timeout=60, check=False)
    assert master.returncode == 0, (tmp_path / "ssh.err").read_text()
    assert sshfleet.ssh_clients(), "the ControlPersist master did not stay"
    os.kill(fleet.supervisor_pid, signal.SIGKILL)
    proc.wait_gone([fleet.supervisor_pid], 5.0)
    down = k3fleet("lab", "ssh-fleet", "down", "--workdir", str(workdir))
    assert down.returncode == 0, down.stderr
    left = sshfleet.leftovers(workdir)
    assert left.empty, left.describe()
    assert not harness.list_netns() and not harness.list_links() and not sshfleet.ssh_clients()
    assert not list(sockets.iterdir()), "the killed master's control socket was left behind"
    sockets.rmdir()
    status = k3fleet("lab", "ssh-fleet", "status", "--workdir", str(workdir))
    assert status.returncode == 2 and "nothing is up" in status.stderr


def test_down_after_an_interrupted_up(workdir: Path) -> None:
    """`up` killed half-way (SIGKILL, no cleanup of its own): the state file lets `down` finish the job."""
    starter = subprocess.Popen([str(BIN / "k3fleet"), "lab", "ssh-fleet", "up", "-n", "200", "--workdir", str(workdir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(harness.list_netns()) < 20:
        time.sleep(0.05)
    starter.kill()
    starter.wait()
    assert harness.list_netns(), "up was killed before it made any namespace"
    down = k3fleet("lab", "ssh-fleet", "down", "--workdir", str(workdir))
    assert down.returncode == 0, down.stderr
    left = sshfleet.leftovers(workdir)
    assert left.empty, left.describe()
