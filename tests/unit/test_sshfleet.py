"""SSH lab fleet parts that need no root: addresses, keys, sshd configuration, inventory, supervisor."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from k3fleet.audit.inventory import inventory_hosts
from k3fleet.contracts import EXIT_USAGE
from k3fleet.lab.common import proc
from k3fleet.lab.fleet import MARKER, generate_fleet, load_fleet
from k3fleet.lab.sshfleet import SshFleetUsageError, harness, state


def test_addresses_are_link_local_disjoint_and_apart_from_the_testbed() -> None:
    pairs = [state.addresses(i) for i in range(state.MAX_HOSTS)]
    flat = [a for pair in pairs for a in pair]
    assert len(set(flat)) == len(flat)
    for outside, inside in pairs:
        o, i = outside.split("."), inside.split(".")
        assert o[:3] == i[:3] and int(o[3]) % 4 == 1 and int(i[3]) == int(o[3]) + 1
        assert outside.startswith("169.254.") and state.is_fleet_address(inside)
        assert not outside.startswith("169.254.77.")
    assert not state.is_fleet_address("169.254.77.2")  # the real testbed's guests
    assert not state.is_fleet_address("10.0.0.1")
    with pytest.raises(state.SshFleetError):
        state.addresses(state.MAX_HOSTS)


def test_names_fit_linux_interface_names() -> None:
    assert len(f"{state.VETH_PREFIX}{state.MAX_HOSTS - 1}") <= 15
    assert not state.NETNS_PREFIX.startswith("k3tb")


@pytest.fixture
def planned(tmp_path: Path) -> tuple[state.SshFleetState, Path]:
    wd = tmp_path / "wd"
    layout = state.Layout(wd)
    inventory = generate_fleet(load_fleet(None), layout.fleet_dir, count=12)
    hosts = json.loads((layout.fleet_dir / MARKER).read_text())["hosts"]
    st = harness._plan(wd, hosts, "vllm/vllm-openai:kimi-k3")
    return st, inventory


def test_inventory_is_the_lab_over_ssh_with_host_keys_checked(planned: tuple[state.SshFleetState, Path]) -> None:
    st, lab_inventory = planned
    st.inventory.parent.mkdir(parents=True, exist_ok=True)
    harness._write_inventory(st, lab_inventory)
    data = yaml.safe_load(st.inventory.read_text())
    group = data["all"]["children"]["lab"]
    gv = group["vars"]
    assert gv["ansible_connection"] == "ssh" and gv["ansible_user"] == "root"
    assert gv["ansible_ssh_host_key_checking"] is True
    assert f"UserKnownHostsFile={st.known_hosts}" in gv["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in gv["ansible_ssh_common_args"]
    lab = yaml.safe_load(lab_inventory.read_text())["all"]["children"]["lab"]["hosts"]
    for h in st.hosts:
        hv = group["hosts"][h.name]
        assert hv["ansible_host"] == h.address
        assert hv["k3fleet_root"] == lab[h.name]["k3fleet_root"]
        assert "ansible_connection" not in hv and "ansible_port" not in hv
    # The unreachable profile has a namespace address but no sshd: a refused connection.
    assert [h.sshd for h in st.hosts].count(False) == [v.get("ansible_port") == 1 for v in lab.values()].count(True)
    assert inventory_hosts(st.inventory, None) == [h.name for h in st.hosts]


def test_state_survives_a_round_trip(planned: tuple[state.SshFleetState, Path]) -> None:
    st, _ = planned
    state.save_state(st)
    assert state.load_state(st.workdir) == st
    state.Layout(st.workdir).state_file.write_text("{broken")
    with pytest.raises(state.SshFleetError, match="unreadable"):
        state.load_state(st.workdir)


def test_keys_are_openssh_ed25519(tmp_path: Path) -> None:
    private, public = harness._keypair()
    key = tmp_path / "k"
    harness._write_private(key, private)
    assert key.stat().st_mode & 0o777 == 0o600
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen not installed: the key's round trip through OpenSSH is not checked")
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == public.split()[:2]


def test_sshd_accepts_the_generated_configuration(planned: tuple[state.SshFleetState, Path]) -> None:
    sshd = shutil.which("sshd", path=proc.SEARCH_PATH)
    if sshd is None or os.geteuid() != 0:
        pytest.skip("sshd -t needs openssh-server and root (it reads the host key as root)")
    st, _ = planned
    layout = state.Layout(st.workdir)
    layout.ssh_dir.mkdir(parents=True)
    layout.authorized_keys.write_text(harness._keypair()[1] + "\n")
    known: list[str] = []
    files = harness._write_host_files(layout, st.hosts[0], known)
    # sshd -t wants its privilege separation directory, as `up` makes it when missing. It stays: a
    # fleet brought up meanwhile by another test may be using it.
    harness.PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    check = subprocess.run([sshd, "-t", "-f", files["conf"]], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    assert known[0].startswith(f"{st.hosts[0].address} ssh-ed25519 ")


def test_up_refuses_without_root_and_bad_sizes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SshFleetUsageError, match="root required") as info:
        harness.up(3, tmp_path)
    assert info.value.exit_code == EXIT_USAGE
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(SshFleetUsageError, match="outside 1"):
        harness.up(harness.MAX_FLEET + 1, tmp_path)


def _wait(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_supervisor_runs_daemons_in_the_foreground_and_stops_everything(tmp_path: Path) -> None:
    """Real processes under the real supervisor: stand-in daemons that write a pid file like sshd -D,
    one of which leaves an orphan behind (an ssh session whose listener is gone)."""
    daemons = []
    for i in range(3):
        pid_file = tmp_path / f"d{i}.pid"
        script = f"echo $$ > {pid_file}; exec sleep 600"
        if i == 0:
            script = f"(sleep 601 &); {script}"
        daemons.append({"name": f"h{i}", "pid_file": str(pid_file), "argv": ["sh", "-c", script]})
    spec = {"mark_env": "K3FLEET_TEST_MARK", "workdir": str(tmp_path), "live_file": str(tmp_path / "live.json"),
            "log_file": str(tmp_path / "log"), "daemons": daemons}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    sup = subprocess.Popen([sys.executable, "-m", "k3fleet.lab.sshfleet.supervisor", str(tmp_path / "spec.json")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        live_file = tmp_path / "live.json"
        _wait(lambda: live_file.exists() and json.loads(live_file.read_text()).get("phase") == "running")
        live = json.loads(live_file.read_text())
        pids = [info["pid"] for info in live["sshd"].values()]
        assert len(pids) == 3 and all(info["running"] for info in live["sshd"].values())
        assert all(proc.read_stat(p) and proc.read_stat(p)[1] == sup.pid for p in pids)  # type: ignore[index]
        orphans = [p for p in proc.children(sup.pid) if p not in pids]
        assert orphans, "the orphaned sleep was not adopted by the supervisor (child subreaper)"
        # One daemon dies: the live view says so, the others keep running.
        os.kill(pids[1], signal.SIGKILL)
        _wait(lambda: json.loads(live_file.read_text())["sshd"]["h1"]["running"] is False)
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 0
        assert json.loads(live_file.read_text())["phase"] == "stopped"
        assert not [p for p in pids + orphans if proc.pid_alive(p)]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_other_fleets_are_named_by_their_work_directories(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`down` of one work directory names the fleets still up elsewhere (`up` refuses while one is)."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    argv = {
        11: [sys.executable, "-c", "entry", harness.SUPERVISOR_MODULE, str(theirs / "run" / "supervisor-spec.json")],
        12: [sys.executable, "-c", "entry", harness.SUPERVISOR_MODULE, str(mine / "run" / "supervisor-spec.json")],
    }
    monkeypatch.setattr(proc, "find_pids", lambda match: [pid for pid, a in argv.items() if match(a)])
    monkeypatch.setattr(proc, "cmdline", lambda pid: argv.get(pid))
    assert harness.other_fleets(mine) == [theirs]
    assert harness.other_fleets(theirs) == [mine]
    del argv[11]
    assert harness.other_fleets(mine) == []
