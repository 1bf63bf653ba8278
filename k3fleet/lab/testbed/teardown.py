"""Teardown of the real testbed, and the scan for what a testbed left on the machine.

`down` works from the state file and, when that is gone or stale, from name prefixes, the
environment mark every supervised process carries, TCP connections to guest addresses and the
mount table, so it also cleans up after a SIGKILL of everything. Its order matters: supervisor
(clean guest halt), leftover processes, processes inside the namespaces, `ip netns del`, nspawn's
runtime files, then the overlay mounts and the veths.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from k3fleet.lab.common import network, proc, processes, teardown
from k3fleet.lab.testbed.errors import TestbedError
from k3fleet.lab.testbed.state import (
    ADDRESS_PREFIX,
    HOSTNAME_FORMAT,
    NETNS_PREFIX,
    VETH_HOST_PREFIX,
    Layout,
    TestbedState,
    load_state,
    resolve_workdir,
)
from k3fleet.lab.testbed.supervisor import MARK_ENV
from k3fleet.lab.testbed.supervisor import MODULE as SUPERVISOR_MODULE
from k3fleet.lab.testbed.tools import require_root

SUPERVISOR_STOP_GRACE = 60.0


def supervisor_alive(state: TestbedState) -> bool:
    return processes.supervisor_alive(state)


LABEL = "testbed"


@dataclass
class Leftovers(teardown.Leftovers):
    """What of a testbed is still on the machine; empty after a successful `down`."""

    mounts: list[str] = field(default_factory=list)
    runtime: list[str] = field(default_factory=list)

    def kinds(self) -> list[tuple[str, list[str]]]:
        return [*super().kinds(), ("mounts", self.mounts), ("nspawn runtime dirs", self.runtime)]


def list_netns() -> list[str]:
    return network.list_netns(NETNS_PREFIX)


def list_links() -> list[str]:
    return network.list_links(VETH_HOST_PREFIX, LABEL)


def _root_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return "/"


def _marked_processes(wd: Path) -> dict[int, str]:
    """Live processes that belong to the testbed in `wd`, and all their descendants."""
    marker = str(wd)
    conf = str(Layout(wd).slurm_dir / "slurm.conf")

    def ours(pid: int, argv: list[str]) -> bool:
        env = processes.environ(pid)
        return (
            env.get(MARK_ENV) == marker
            or env.get("SLURM_CONF") == conf
            or any(marker + os.sep in arg or arg == marker for arg in argv)
            # A guest's processes live in its overlay, even once their nspawn and netns are gone.
            or _root_of(pid).startswith(marker + os.sep)
        )

    # Ansible's ControlPersist masters to guest addresses outlive the play: ours too.
    return processes.marked_processes(ours, seed=processes.tcp_clients(lambda a: a.startswith(ADDRESS_PREFIX)))


def _mounts_under(wd: Path) -> list[str]:
    prefix = str(wd) + os.sep
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            # mountinfo escapes spaces as \040
            point = fields[4].replace("\\040", " ")
            if point.startswith(prefix):
                mounts.append(point)
    # Deepest first so nested mounts come off before their parents.
    return sorted(set(mounts), key=lambda p: p.count(os.sep), reverse=True)


def leftovers(workdir: Path | None = None) -> Leftovers:
    """Processes, namespaces, links and mounts of the testbed still present on the machine."""
    wd = resolve_workdir(workdir)
    found = Leftovers()
    found.netns = list_netns()
    found.processes = {**_marked_processes(wd), **network.processes_inside(found.netns)}
    found.links = list_links()
    found.mounts = _mounts_under(wd)
    found.runtime = [str(NSPAWN_RUNTIME / "propagate" / name) for name in _nspawn_propagate_dirs()]
    return found


def _stop_supervisor(state: TestbedState | None, wd: Path) -> None:
    # SIGTERM: it halts the guests cleanly and stops Slurm; give it the time a halt takes.
    processes.stop(processes.supervisor_pids(SUPERVISOR_MODULE, Layout(wd), state), SUPERVISOR_STOP_GRACE)


def _kill_leftover_processes(wd: Path) -> None:
    # nspawn first with SIGTERM: a guest whose supervisor died still gets a clean halt.
    marked = _marked_processes(wd)
    nspawns = [pid for pid, cmd in marked.items() if "systemd-nspawn" in cmd]
    if nspawns:
        proc.signal_pids(nspawns, signal.SIGTERM)
        proc.wait_gone(nspawns, 20.0)
    processes.kill_until_gone(functools.partial(_marked_processes, wd))


NSPAWN_RUNTIME = Path("/run/systemd/nspawn")


def _nspawn_propagate_dirs() -> list[str]:
    """Machine names of our guests with a propagation directory in /run (by name pattern)."""
    prefix = HOSTNAME_FORMAT.split("{", 1)[0]
    base = NSPAWN_RUNTIME / "propagate"
    return sorted(p.name for p in base.glob(f"{prefix}*")) if base.is_dir() else []


def _clear_nspawn_runtime(points: list[str], names: list[str]) -> None:
    """Remove what a killed systemd-nspawn leaves in /run: its propagation directory, named after
    the machine, and its image lock, named after the device and inode of the guest's root (so
    this must run while the overlays are still mounted). A clean halt removes both itself."""
    locks = set()
    for point in points:
        try:
            st = os.stat(point)
        except OSError:
            continue
        locks.add(f"inode-{st.st_dev}:{st.st_ino}")
    for lock in locks:
        path = NSPAWN_RUNTIME / "locks" / lock
        if path.is_file() or path.is_symlink():
            path.unlink()
    for name in names:
        path = NSPAWN_RUNTIME / "propagate" / name
        if path.is_dir() and not os.path.ismount(path):
            shutil.rmtree(path)


def _unmount(points: list[str]) -> None:
    for point in points:
        result = proc.run(["umount", point], what=f"testbed teardown: unmounting {point}", check=False)
        if result.returncode != 0 and point in _mounts_under(Path(point).parent.parent):
            # Still busy (a shell sitting in it): detach now, the kernel frees it when released.
            proc.run(["umount", "-l", point], what=f"testbed teardown: lazy unmount of {point}")


def down(workdir: Path | None = None) -> None:
    """Stop and remove everything the testbed made; safe to call repeatedly and after a crash.

    Keeps `workdir/cache` (image tarball, podman store, stand-in repository) and
    `workdir/last-failure`. Raises TestbedError naming what could not be removed.
    """
    require_root()
    wd = resolve_workdir(workdir)
    layout = Layout(wd)
    try:
        state = load_state(wd)
    except TestbedError:
        state = None  # unreadable state: the prefix scan below still finds everything

    _stop_supervisor(state, wd)
    _kill_leftover_processes(wd)

    names = set(list_netns())
    if state is not None:
        names |= {h.netns for h in state.hosts if (network.NETNS_RUN_DIR / h.netns).exists()}
    network.clear_netns(names, LABEL)

    mounts = _mounts_under(wd)
    _clear_nspawn_runtime(mounts, _nspawn_propagate_dirs())
    _unmount(mounts)
    network.delete_links(list_links(), LABEL)

    for path in (layout.hosts_dir, layout.slurm_dir, layout.run_dir, layout.ssh_dir):
        if path.exists():
            shutil.rmtree(path)
    for path in (layout.inventory, layout.state_file):
        if path.exists():
            path.unlink()

    left = leftovers(wd)
    if not left.empty:
        raise TestbedError(f"testbed teardown of {wd} incomplete: {left.describe()}")
