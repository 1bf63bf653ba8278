"""The real testbed itself: SSH and Ansible into booted guests, real reboots, Slurm, podman, teardown.

The last two tests tear the session's testbed down (normally, then after a SIGKILL of the
supervisor), check that nothing is left on the machine, and bring it up again for later tests.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import ansible_runner
import pytest
import yaml

from k3fleet.lab import testbed
from k3fleet.lab.common import proc

pytestmark = pytest.mark.system
HOSTS = 4  # what the session fixture brings up


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(0.3)


def machine_leftovers(workdir: Path) -> list[str]:
    """Independent of the harness's own bookkeeping: ask the machine what is still there."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith("k3tb-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(("k3tbh", "k3tbg")):
            found.append(f"link {name}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(workdir) + "/"):
            found.append(f"mount {point}")
    propagate = Path("/run/systemd/nspawn/propagate")
    if propagate.is_dir():
        found += [f"nspawn runtime {p}" for p in propagate.glob("tb-node*")]
    me = os.getpid()
    for pid in proc.all_pids():
        if pid == me or not proc.pid_alive(pid):
            continue
        argv = " ".join(proc.cmdline(pid))
        try:
            # A guest's processes have their root in its overlay, whatever their command line.
            root = os.readlink(f"/proc/{pid}/root")
        except OSError:
            root = "/"
        if str(workdir) in argv or "--machine=tb-node" in argv or root.startswith(str(workdir)):
            found.append(f"process {pid} {argv[:100]}")
    return found


# -- state and inventory -------------------------------------------------------------------------


def test_state_and_inventory_describe_every_guest(testbed_state: testbed.TestbedState) -> None:
    st = testbed.status(testbed_state.workdir)
    assert st.phase == "up"
    assert [h.name for h in st.hosts] == [f"tb-node{i:02d}" for i in range(1, HOSTS + 1)]
    for h in st.hosts:
        assert h.address == f"169.254.77.{4 * h.index + 2}"
        assert h.host_address == f"169.254.77.{4 * h.index + 1}"
        assert Path("/run/netns", h.netns).exists()
        assert h.running and h.guest_pid is not None and proc.pid_alive(h.guest_pid)
        assert h.has_pynvml is (h.index in (1, 3))
    inventory = yaml.safe_load(st.inventory.read_text())
    group = inventory["all"]["children"]["testbed"]
    assert sorted(group["hosts"]) == [h.name for h in st.hosts]
    assert group["vars"]["ansible_ssh_private_key_file"] == str(st.ssh_key)
    assert group["vars"]["k3fleet_procfs"] == "/run/nvidia-sim/proc"
    assert Path(group["vars"]["k3fleet_slurm_conf"]).is_file()
    assert group["hosts"]["tb-node02"]["k3fleet_slurm_node"] == "node02"
    assert group["hosts"]["tb-node03"]["k3fleet_has_pynvml"] is True
    podman_env = testbed.podman_env(st.workdir)
    assert group["vars"]["k3fleet_podman_env"] == {
        key: podman_env[key] for key in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")
    }


# -- guests over SSH -----------------------------------------------------------------------------


def test_ansible_reaches_every_guest_over_ssh(testbed_state: testbed.TestbedState, tmp_path: Path) -> None:
    result = ansible_runner.run(
        private_data_dir=str(tmp_path),
        inventory=str(testbed_state.inventory),
        host_pattern="testbed",
        module="ansible.builtin.command",
        module_args="cat /etc/hostname",
        quiet=True,
        envvars={"ANSIBLE_SSH_ARGS": "-o ControlMaster=no", "ANSIBLE_HOST_KEY_CHECKING": "False"},
    )
    assert result.rc == 0, f"ansible ad-hoc failed: status {result.status}"
    seen = {}
    for event in result.events:
        if event.get("event") == "runner_on_ok":
            data = event["event_data"]
            seen[data["host"]] = data["res"]["stdout"].strip()
    assert seen == {h.name: h.name for h in testbed_state.hosts}


def test_pynvml_only_in_odd_guests(testbed_state: testbed.TestbedState) -> None:
    for h in testbed_state.hosts:
        argv = testbed.ssh_argv(testbed_state, h.name, "python3", "-c", "'import pynvml'")
        rc = subprocess.run(argv, capture_output=True, text=True, timeout=60).returncode
        assert (rc == 0) is h.has_pynvml, f"{h.name}: import pynvml rc {rc}, has_pynvml {h.has_pynvml}"


def test_guest_apt_sees_only_the_standin_repository(testbed_state: testbed.TestbedState) -> None:
    out = testbed.ssh_run(testbed_state, "tb-node01", "apt-get update 2>&1; apt-cache policy", timeout=120)
    assert "file:/srv/k3fleet-repo ./ Packages" in out
    assert "http" not in out.split("Package files:")[-1]


def test_reboot_inside_a_guest_keeps_its_files(testbed_state: testbed.TestbedState) -> None:
    before = testbed.status(testbed_state.workdir).host("tb-node02")
    bystander = testbed.status(testbed_state.workdir).host("tb-node01")
    token = secrets.token_hex(8)
    testbed.ssh_run(testbed_state, "tb-node02", f"echo {token} > /root/k3tb-marker && sync")
    # The connection may drop while the guest goes down: its exit status says nothing.
    subprocess.run(testbed.ssh_argv(testbed_state, "tb-node02", "systemctl reboot"), capture_output=True, timeout=60)
    after = testbed.wait_host_ready(testbed_state.workdir, "tb-node02", min_boots=before.boots + 1)
    assert after.boots == before.boots + 1
    assert after.guest_pid != before.guest_pid
    assert testbed.ssh_run(testbed_state, "tb-node02", "cat /root/k3tb-marker").strip() == token
    # The other guests were not touched.
    assert testbed.status(testbed_state.workdir).host("tb-node01").boots == bystander.boots


REBOOT_PLAY = """
- name: Reboot one testbed guest the way the change night does
  hosts: tb-node03
  gather_facts: false
  tasks:
    - name: Leave a file in the guest's writable layer
      ansible.builtin.copy:
        dest: /root/k3tb-ansible-marker
        content: "{{ marker }}"
        mode: "0644"
    - name: Reboot and wait for the guest to come back
      ansible.builtin.reboot:
        reboot_timeout: 120
    - name: Read the file after the reboot
      ansible.builtin.slurp:
        src: /root/k3tb-ansible-marker
      register: after
    - name: The file survived the reboot
      ansible.builtin.assert:
        that: (after.content | b64decode) == marker
"""


def test_ansible_reboot_module_reboots_a_guest(testbed_state: testbed.TestbedState, tmp_path: Path) -> None:
    before = testbed.status(testbed_state.workdir).host("tb-node03")
    marker = secrets.token_hex(8)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "reboot.yml").write_text(REBOOT_PLAY)
    result = ansible_runner.run(
        private_data_dir=str(tmp_path),
        inventory=str(testbed_state.inventory),
        playbook="reboot.yml",
        extravars={"marker": marker},
        quiet=True,
        envvars={"ANSIBLE_SSH_ARGS": "-o ControlMaster=no", "ANSIBLE_HOST_KEY_CHECKING": "False"},
    )
    failed = [e["event_data"].get("res") for e in result.events if e.get("event") == "runner_on_failed"]
    assert result.rc == 0, f"reboot play failed: {result.status} {failed}"
    after = testbed.status(testbed_state.workdir).host("tb-node03")
    # A real reboot: nspawn exited 133 and the supervisor booted the guest again.
    assert after.boots == before.boots + 1
    assert after.guest_pid != before.guest_pid


def test_guest_exec_enters_the_guest(testbed_state: testbed.TestbedState) -> None:
    st = testbed.status(testbed_state.workdir)
    assert testbed.guest_exec(st, "tb-node04", ["cat", "/etc/hostname"]).strip() == "tb-node04"
    assert testbed.guest_exec(st, "tb-node04", ["systemctl", "is-active", "ssh"]).strip() == "active"


# -- Slurm ----------------------------------------------------------------------------------------


def test_slurm_runs_a_job(testbed_state: testbed.TestbedState) -> None:
    job = testbed.submit_job(testbed_state, "node01", seconds=1)
    _wait(lambda: testbed.job_state(testbed_state, job) == "COMPLETED", 60, f"job {job} completed")
    nodes = {n["name"] for n in testbed.sinfo_json(testbed_state)["nodes"]}
    assert nodes == {f"node{i:02d}" for i in range(1, HOSTS + 1)}


def test_slurm_drain_with_running_job_then_resume(testbed_state: testbed.TestbedState) -> None:
    job = testbed.submit_job(testbed_state, "node03", seconds=6)
    _wait(lambda: testbed.job_state(testbed_state, job) == "RUNNING", 60, f"job {job} running")
    testbed.update_node(testbed_state, "node03", "drain", reason="k3fleet system test")
    draining = testbed.node_state(testbed_state, "node03")
    # Draining: still allocated to the job, flagged DRAIN, with our reason.
    assert draining.drained and draining.state in ("mixed", "allocated")
    assert draining.reason == "k3fleet system test"
    _wait(lambda: testbed.job_state(testbed_state, job) == "COMPLETED", 60, f"job {job} completed")
    _wait(lambda: testbed.node_state(testbed_state, "node03").state == "idle", 30, "node03 drained")
    assert testbed.node_state(testbed_state, "node03").drained
    testbed.update_node(testbed_state, "node03", "resume")

    def back() -> bool:
        st = testbed.node_state(testbed_state, "node03")
        return st.state == "idle" and not st.flags

    _wait(back, 30, "node03 idle again")


# -- podman ---------------------------------------------------------------------------------------


def test_podman_images_carry_their_cuda_version(testbed_state: testbed.TestbedState) -> None:
    env = testbed.podman_env(testbed_state.workdir)
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Config.Env}}", "vllm/vllm-openai:kimi-k3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    assert '"CUDA_VERSION=13.0.2"' in out
    k3 = testbed.image_env(testbed.inspect_image(testbed_state.workdir, "vllm/vllm-openai:kimi-k3"))
    assert k3["NVIDIA_REQUIRE_CUDA"].startswith("cuda>=13.0 ")
    assert k3["VLLM_VERSION"] == "0.27.1"
    selfbuilt = testbed.inspect_image(testbed_state.workdir, "vllm/vllm-openai:k3-cu129-selfbuilt")
    assert testbed.image_env(selfbuilt)["CUDA_VERSION"] == "12.9.1"


# -- teardown ---------------------------------------------------------------------------------------
# These two tear the session's testbed down and bring it back, so tests collected after them
# still find it up.


def _adopt(session_state: testbed.TestbedState, fresh: testbed.TestbedState) -> None:
    """Point the session fixture's object at the new testbed (pids and ports may differ)."""
    for name in type(fresh).model_fields:
        setattr(session_state, name, getattr(fresh, name))


def test_down_leaves_nothing_and_cached_up_is_fast(
    testbed_state: testbed.TestbedState, testbed_report: Callable[[str], None]
) -> None:
    workdir = testbed_state.workdir
    testbed.down(workdir)
    assert machine_leftovers(workdir) == []
    assert testbed.leftovers(workdir).empty
    assert testbed.status(workdir).phase == "down"
    testbed.down(workdir)  # idempotent

    started = time.monotonic()
    st = testbed.up(n=HOSTS, workdir=workdir)
    seconds = time.monotonic() - started
    testbed_report(f"testbed up with cached image: {HOSTS} hosts in {seconds:.1f}s (target < 60 s)")
    assert st.phase == "up" and all(h.running for h in st.hosts)
    _adopt(testbed_state, st)


def test_down_after_sigkill_of_the_supervisor(testbed_state: testbed.TestbedState) -> None:
    workdir = testbed_state.workdir
    st = testbed.status(workdir)
    assert st.phase == "up" and st.supervisor_pid is not None
    # A job in flight too: its slurmstepd daemonizes away from slurmd.
    job = testbed.submit_job(st, "node01", seconds=300)
    _wait(lambda: testbed.job_state(st, job) == "RUNNING", 60, f"job {job} running")
    # SIGKILL the supervisor, and with it one guest's nspawn (no clean halt for that guest).
    victims = [st.supervisor_pid, st.host("tb-node01").nspawn_pid]
    for pid in victims:
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: not any(proc.pid_alive(p) for p in victims if p is not None), 10, "killed pids gone")
    assert testbed.status(workdir).phase == "broken"
    assert machine_leftovers(workdir), "killing only the supervisor should leave guests running"

    testbed.down(workdir)
    proc.reap_zombie_children()
    assert machine_leftovers(workdir) == []
    assert testbed.leftovers(workdir).empty

    _adopt(testbed_state, testbed.up(n=HOSTS, workdir=workdir))
