"""The lab fleet over real SSH: one network namespace and one sshd per simulated host (root).

Public API:

    up(n, workdir=None, fleet=None, target=None, progress=...) -> SshFleetState
    status(workdir=None) -> SshFleetStatus
    down(workdir=None) -> None                  idempotent, also after an interrupted or killed run
    leftovers(workdir=None) -> Leftovers        what is still on the machine
    node_cpu_seconds(workdir=None) -> float     CPU of the node side (sshd and its sessions)
    close_ssh_clients() -> int                  end the controller's ControlPersist masters

`workdir` defaults to <checkout>/.lab/ssh-fleet. See docs/scale.md.
"""

from __future__ import annotations

from k3fleet.lab.sshfleet.errors import SshFleetError, SshFleetUsageError
from k3fleet.lab.sshfleet.harness import (
    Leftovers,
    SshFleetStatus,
    close_ssh_clients,
    down,
    leftovers,
    node_cpu_seconds,
    other_fleets,
    ssh_argv,
    ssh_clients,
    sshd_pids,
    status,
    up,
)
from k3fleet.lab.sshfleet.state import SshFleetState, SshHost, default_workdir, load_state

__all__ = [
    "Leftovers",
    "SshFleetError",
    "SshFleetState",
    "SshFleetStatus",
    "SshFleetUsageError",
    "SshHost",
    "close_ssh_clients",
    "default_workdir",
    "down",
    "leftovers",
    "load_state",
    "node_cpu_seconds",
    "other_fleets",
    "ssh_argv",
    "ssh_clients",
    "sshd_pids",
    "status",
    "up",
]
