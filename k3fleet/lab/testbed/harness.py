"""Bring the real testbed up, report its status, and tear it down without leaving anything behind.

    up(n=4, workdir=<repo>/.testbed, repo=None) -> TestbedState
    status(workdir) -> TestbedState
    down(workdir) -> None

What `up` builds (docs/architecture.md has the testbed's recipes and this kind of machine's quirks): per host a network
namespace `k3tb-<i>` with a veth pair (169.254.77.(4i+1)/30 here, .(4i+2)/30 in the guest), an
overlay writable layer over the cached Debian image, and a booted systemd-nspawn guest
`tb-nodeNN` with sshd and podman (over this machine's image store, read-only); munged + slurmctld +
one slurmd per host on this machine; podman images.
Every long-running process is a child of one supervisor (see supervisor.py).

Teardown (`down`, `leftovers`) lives in teardown.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from k3fleet.lab.common import network, proc, processes
from k3fleet.lab.common.errors import LabError
from k3fleet.lab.common.workdir import locked
from k3fleet.lab.testbed import image as image_mod
from k3fleet.lab.testbed import podman, slurm
from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.state import (
    GUEST_CONTAINERS,
    GUEST_IMAGE_STORE,
    GUEST_PROCFS,
    GUEST_REPO_MOUNT,
    HOSTNAME_FORMAT,
    MAX_HOSTS,
    NETNS_PREFIX,
    SLURM_NODE_FORMAT,
    VETH_HOST_PREFIX,
    HostState,
    Layout,
    OverlayDirs,
    TestbedState,
    guest_address,
    host_address,
    load_state,
    resolve_workdir,
    save_state,
)
from k3fleet.lab.testbed.teardown import LABEL, SUPERVISOR_MODULE, down, supervisor_alive
from k3fleet.lab.testbed.tools import require_root, require_tools

BOOT_TIMEOUT = 120.0
SLURM_TIMEOUT = 60.0
LOG_TAIL = 5  # lines of a log quoted in an error


def ssh_options(state: TestbedState) -> tuple[str, ...]:
    """Host keys checked against the known_hosts the testbed wrote from its guests' own keys."""
    return ("-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={state.known_hosts}")


def _has_pynvml(index: int) -> bool:
    # Hosts 1 and 3 (odd) get pynvml, 2 and 4 (even) do not: both collector paths get exercised.
    return index % 2 == 1


# ---------------------------------------------------------------------------------------------
# repository and keys


def default_repo(workdir: Path | None = None) -> Path:
    """The stand-in driver repository when k3fleet.lab.standin is available, else an empty one.

    Built under the cache so its packages are compiled once; rebuilt in place when its inputs
    change (the guests bind-mount the directory, so they see a rebuild without a restart).
    """
    layout = Layout(resolve_workdir(workdir))
    if importlib.util.find_spec("k3fleet.lab.standin") is not None:
        from k3fleet.lab import standin  # lazy: a build can leave the stand-in packages out (find_spec)

        return Path(standin.build_repo(layout.cache / "standin-repo")).resolve()
    empty = layout.cache / "empty-repo"
    empty.mkdir(parents=True, exist_ok=True)
    # A flat repository with no packages: apt accepts an empty Packages file from a trusted source.
    (empty / "Packages").write_text("")
    return empty


def _pynvml_source(repo: Path) -> Path:
    bundled = repo / "pynvml" / "pynvml.py"
    if bundled.is_file():
        return bundled
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise TestbedError(f"testbed: no pynvml for the guests: {bundled} missing and nvidia-ml-py not installed")
    return Path(spec.origin)


def _ensure_ssh_key(layout: Layout) -> str:
    layout.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not layout.ssh_key.exists():
        proc.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k3fleet-testbed", "-f", str(layout.ssh_key)],
            what=f"testbed: generating {layout.ssh_key}",
        )
    return layout.ssh_key.with_suffix(".pub").read_text()


# ---------------------------------------------------------------------------------------------
# guests


def ssh_argv(state: TestbedState, host: str, *command: str, connect_timeout: int = 5) -> list[str]:
    """`ssh` command line that logs into a guest as root with the testbed's key."""
    h = state.host(host)
    return [
        "ssh",
        "-i",
        str(state.ssh_key),
        *ssh_options(state),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        f"root@{h.address}",
        *command,
    ]


def ssh_run(state: TestbedState, host: str, command: str, *, timeout: float = 60.0, check: bool = True) -> str:
    """Run a shell command in a guest over real SSH; return stdout."""
    result = proc.run(
        ssh_argv(state, host, command),
        what=f"testbed: ssh {host} {command!r}",
        timeout=timeout,
        check=check,
    )
    return result.stdout


def guest_exec(state: TestbedState, host: str, argv: list[str], *, timeout: float = 30.0, check: bool = True) -> str:
    """Run a command inside a guest through `nsenter` into its systemd's namespaces (no SSH)."""
    h = state.host(host)
    if h.guest_pid is None or not proc.pid_alive(h.guest_pid):
        raise TestbedError(f"testbed: guest {h.name} is not running (guest pid {h.guest_pid})")
    result = proc.run(
        ["nsenter", "-t", str(h.guest_pid), "-a", *argv],
        what=f"testbed: in guest {h.name}: {' '.join(argv)}",
        timeout=timeout,
        check=check,
    )
    return result.stdout


def _guest_pid_of(nspawn_pid: int | None) -> int | None:
    if nspawn_pid is None or not proc.pid_alive(nspawn_pid):
        return None
    for child in proc.children(nspawn_pid):
        if proc.pid_alive(child):
            return child
    return None


def _system_state(guest_pid: int) -> str:
    result = proc.run(
        ["nsenter", "-t", str(guest_pid), "-a", "systemctl", "is-system-running"],
        what="testbed: systemctl is-system-running",
        timeout=15,
        check=False,
    )
    return result.stdout.strip() or result.stderr.strip()


def _ssh_ok(state: TestbedState, host: str) -> bool:
    argv = ssh_argv(state, host, "true", connect_timeout=2)
    result = proc.run(argv, what="testbed: ssh probe", timeout=15, check=False)
    return result.returncode == 0


def wait_host_ready(
    workdir: Path | None,
    host: str,
    *,
    min_boots: int = 1,
    timeout: float = BOOT_TIMEOUT,
) -> HostState:
    """Wait until a guest has booted at least `min_boots` times, systemd is up and sshd takes our key.

    After a reboot inside a guest, pass the boot count seen before it plus one.
    """
    deadline = time.monotonic() + timeout
    last = "no status yet"
    while True:
        state = status(workdir)
        h = state.host(host)
        if h.guest_pid is not None and h.boots >= min_boots:
            system = _system_state(h.guest_pid)
            if system in ("running", "degraded"):
                if _ssh_ok(state, h.name):
                    return h
                last = f"systemd {system}, sshd on {h.address} not accepting the key yet"
            else:
                last = f"systemd is {system or 'not answering'}"
        else:
            last = f"boots {h.boots} (want {min_boots}), guest pid {h.guest_pid}"
        if time.monotonic() >= deadline:
            raise TestbedError(f"testbed: guest {host} not ready after {timeout:.0f}s: {last}")
        time.sleep(0.25)


# ---------------------------------------------------------------------------------------------
# status


def _refresh(state: TestbedState) -> TestbedState:
    layout = Layout(state.workdir)
    live = processes.read_live(layout)
    services = live.get("services", {}) if isinstance(live.get("services"), dict) else {}
    supervisor_ok = supervisor_alive(state)
    for h in state.hosts:
        entry = services.get(f"guest-{h.name}", {})
        nspawn_pid = entry.get("pid") if supervisor_ok else None
        h.nspawn_pid = nspawn_pid if isinstance(nspawn_pid, int) and proc.pid_alive(nspawn_pid) else None
        h.guest_pid = _guest_pid_of(h.nspawn_pid)
        h.boots = int(entry.get("starts", 0) or 0)
        h.running = h.guest_pid is not None
    if state.phase == "up" and not supervisor_ok:
        state.phase = "broken"
        state.error = f"supervisor pid {state.supervisor_pid} is gone; run `down`"
    return state


def status(workdir: Path | None = None) -> TestbedState:
    """The saved state with live pids (guest pids change on every guest reboot)."""
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    state = load_state(wd)
    if state is None:
        return TestbedState(workdir=wd, phase="down", hosts=[], ssh_key=layout.ssh_key, inventory=layout.inventory)
    return _refresh(state)


# ---------------------------------------------------------------------------------------------
# up


def _plan(wd: Path, n: int) -> TestbedState:
    layout = Layout(wd)
    hosts = []
    for i in range(1, n + 1):
        name = HOSTNAME_FORMAT.format(index=i)
        hdir = layout.host_dir(name)
        hosts.append(
            HostState(
                name=name,
                index=i,
                address=guest_address(i),
                host_address=host_address(i),
                netns=f"{NETNS_PREFIX}{i}",
                veth_host=f"{VETH_HOST_PREFIX}{i}",
                slurm_node=SLURM_NODE_FORMAT.format(index=i),
                has_pynvml=_has_pynvml(i),
                overlay=OverlayDirs(
                    upper=hdir / "upper",
                    work=hdir / "work",
                    merged=hdir / "merged",
                ),
            )
        )
    return TestbedState(
        workdir=wd,
        phase="planned",
        hosts=hosts,
        ssh_key=layout.ssh_key,
        inventory=layout.inventory,
    )


def _mount_overlay(h: HostState) -> None:
    if h.overlay.lower is None:
        raise TestbedError(f"testbed: overlay for {h.name} has no image to sit on")
    for d in (h.overlay.upper, h.overlay.work, h.overlay.merged):
        d.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={h.overlay.lower},upperdir={h.overlay.upper},workdir={h.overlay.work}"
    proc.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(h.overlay.merged)],
        what=f"testbed: overlay for {h.name}",
    )


def _guest_spec(h: HostState, repo: Path, tools: dict[str, str], image_store: Path) -> dict[str, Any]:
    return {
        "name": f"guest-{h.name}",
        "kind": "guest",
        "argv": [
            tools["systemd-nspawn"],
            "-b",
            "--register=no",
            "--keep-unit",
            "--console=pipe",
            "--link-journal=no",
            f"--machine={h.name}",
            f"--network-namespace-path=/run/netns/{h.netns}",
            "-D",
            str(h.overlay.merged),
            f"--bind-ro={repo}:{GUEST_REPO_MOUNT}",
            # podman in the guest (image.py has its settings): the machine's images read-only, the
            # guest's containers in memory, and the right to set up a container's own network.
            f"--bind-ro={image_store}:{GUEST_IMAGE_STORE}",
            f"--tmpfs={GUEST_CONTAINERS}:mode=0700",
            "--capability=CAP_NET_ADMIN",
        ],
        "env": {},
        "ready_path": None,
    }


def _inventory(state: TestbedState) -> dict[str, Any]:
    assert state.slurm is not None
    podman_vars = {}
    if state.podman is not None:
        podman_vars = {
            "CONTAINERS_CONF": str(state.podman.containers_conf),
            "CONTAINERS_STORAGE_CONF": str(state.podman.storage_conf),
        }
    hosts: dict[str, Any] = {}
    for h in state.hosts:
        hosts[h.name] = {
            "ansible_host": h.address,
            "k3fleet_slurm_node": h.slurm_node,
            "k3fleet_has_pynvml": h.has_pynvml,
        }
    return {
        "all": {
            "children": {
                "testbed": {
                    "hosts": hosts,
                    "vars": {
                        "ansible_user": "root",
                        "ansible_ssh_private_key_file": str(state.ssh_key),
                        # Checked (k3fleet's default): against the guests' keys, written at `up`.
                        "ansible_ssh_common_args": f"-o UserKnownHostsFile={state.known_hosts}",
                        "ansible_python_interpreter": "/usr/bin/python3",
                        "k3fleet_procfs": GUEST_PROCFS,
                        "k3fleet_slurm_conf": str(state.slurm.conf),
                        # Slurm's daemons run on this machine, so the drain's Slurm client does too.
                        "k3fleet_slurm_client": "localhost",
                        # The images' store on this machine (the guests' podman reads it read-only):
                        # a play that checks the images on localhost passes this as its `environment`.
                        "k3fleet_podman_env": podman_vars,
                    },
                }
            }
        }
    }


def _start_supervisor(layout: Layout, spec: dict[str, Any]) -> tuple[int, int | None]:
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    return processes.spawn_supervisor(SUPERVISOR_MODULE, layout, json.dumps(spec, indent=2), {"LC_ALL": "C"})


def _wait_slurm(state: TestbedState) -> None:
    layout = Layout(state.workdir)
    assert state.slurm is not None

    def nodes_idle() -> bool:
        if not supervisor_alive(state) or not slurm.ping(state):
            return False
        data = slurm.sinfo_json(state)
        for node in state.slurm.nodes:  # type: ignore[union-attr]
            st = slurm.node_status_from_sinfo(data, node)
            if st.state != "idle" or st.flags:
                return False
        return True

    proc.wait_for(
        nodes_idle,
        timeout=SLURM_TIMEOUT,
        what=f"testbed slurm: nodes {', '.join(state.slurm.nodes)} idle",
        interval=0.5,
        detail=lambda: (processes.log_tail(layout.logs_dir / "slurmctld.log", LOG_TAIL)
                        or processes.log_tail(layout.logs_dir / "munged.log", LOG_TAIL)),
    )


def up(n: int = 4, workdir: Path | None = None, repo: Path | None = None) -> TestbedState:
    """Bring up `n` booted guests reachable over SSH, Slurm with one node per guest, and podman images.

    Any previous testbed in `workdir` (or left behind by a crash) is torn down first. On failure
    everything is torn down again, the logs are kept in `workdir/last-failure`, and the error
    says which step failed.
    """
    require_root()
    if not 1 <= n <= MAX_HOSTS:
        raise TestbedError(f"testbed: {n} hosts requested; between 1 and {MAX_HOSTS} fit the 169.254.77.0/24 plan")
    tools = require_tools()
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    started = time.monotonic()
    with locked(layout, TestbedError(f"testbed: another `up` is running on {layout.workdir}")):
        down(wd)
        state = _plan(wd, n)
        save_state(state)
        try:
            _bring_up(state, layout, tools, repo)
        except BaseException as exc:
            state.phase = "failed"
            state.error = str(exc)
            save_state(state)
            _keep_failure_logs(layout)
            try:
                down(wd)
            except LabError as cleanup_exc:
                raise TestbedError(f"{exc}; and teardown after it failed: {cleanup_exc}") from exc
            raise
        state.up_seconds = round(time.monotonic() - started, 2)
        state.phase = "up"
        save_state(state)
    return _refresh(state)


def _keep_failure_logs(layout: Layout) -> None:
    target = layout.workdir / "last-failure"
    shutil.rmtree(target, ignore_errors=True)
    if layout.run_dir.exists():
        shutil.copytree(layout.run_dir, target, ignore_dangling_symlinks=True, dirs_exist_ok=True)
    slurm_logs = layout.slurm_dir / "log"
    if slurm_logs.exists():
        shutil.copytree(slurm_logs, target / "slurm-log", dirs_exist_ok=True)


def _bring_up(state: TestbedState, layout: Layout, tools: dict[str, str], repo: Path | None) -> None:
    # munged needs every directory above its socket to be traversable by its user.
    os.chmod(layout.workdir, 0o755)
    public_key = _ensure_ssh_key(layout)
    tarball, rootfs = image_mod.ensure_image(layout.cache, log=layout.run_dir / "debootstrap.log")
    image_mod.prepare_image(rootfs, public_key=public_key)
    state.image = rootfs
    repo_dir = (repo if repo is not None else default_repo(layout.workdir)).resolve()
    if not repo_dir.is_dir():
        raise TestbedError(f"testbed: apt repository {repo_dir} is not a directory")
    state.repo = repo_dir
    pynvml_source = _pynvml_source(repo_dir)

    state.podman = podman.ensure_images(layout.workdir, tarball, image_mod.cache_key())
    save_state(state)

    state.phase = "starting"
    known_hosts = []
    for h in state.hosts:
        h.overlay.lower = rootfs
        save_state(state)  # before creating: down must know about it even if the next line dies
        network.create([network.HostLink(h.name, h.netns, h.veth_host, h.host_address, h.address)], LABEL)
        _mount_overlay(h)
        image_mod.prepare_guest(
            h.overlay.merged,
            hostname=h.name,
            address=h.address,
            machine_id=secrets.token_hex(16),
            pynvml_source=pynvml_source if h.has_pynvml else None,
        )
        known_hosts += [f"{h.address} {key}" for key in image_mod.guest_host_keys(h.overlay.merged)]
    # The guests' own keys, read from their disks before they boot: every connection checks them.
    state.known_hosts.write_text("\n".join(known_hosts) + "\n")

    slurm_state = slurm.plan_slurm(layout.slurm_dir, [h.slurm_node for h in state.hosts])
    state.slurm = slurm_state
    os.makedirs(slurm_state.conf_dir, exist_ok=True)
    os.chmod(slurm_state.conf_dir, 0o755)
    slurm.write_slurm_files(slurm_state)
    save_state(state)

    services = slurm.service_specs(slurm_state, tools)
    # Guests after munged/slurmctld are ready (a few hundred ms) and before the slurmds.
    image_store = layout.podman_dir / "storage"
    services[2:2] = [_guest_spec(h, repo_dir, tools, image_store) for h in state.hosts]
    spec = {
        "workdir": str(layout.workdir),
        "live_file": str(layout.supervisor_live),
        "log_dir": str(layout.logs_dir),
        "services": services,
    }
    state.supervisor_pid, state.supervisor_start_time = _start_supervisor(layout, spec)
    save_state(state)

    deadline = time.monotonic() + BOOT_TIMEOUT
    for h in state.hosts:
        remaining = max(5.0, deadline - time.monotonic())
        if not supervisor_alive(state):
            raise TestbedError(f"testbed: supervisor exited: {processes.log_tail(layout.supervisor_log, LOG_TAIL)}")
        wait_host_ready(layout.workdir, h.name, timeout=remaining)
    _wait_slurm(state)

    layout.inventory.write_text(
        "# k3fleet real testbed: written by `k3fleet lab testbed up`, removed by `down`.\n"
        + yaml.safe_dump(_inventory(state), sort_keys=False)
    )
