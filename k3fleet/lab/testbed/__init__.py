"""The real testbed: booted systemd-nspawn guests reached over SSH, real Slurm, podman images.

Public API (root required):

    up(n=4, workdir=None, repo=None) -> TestbedState     bring it up (tears down leftovers first)
    status(workdir=None) -> TestbedState                  saved state + live pids
    down(workdir=None) -> None                            idempotent, also after kill -9
    leftovers(workdir=None) -> Leftovers                  what is still on the machine

Helpers for tests and tools: ssh_argv/ssh_run/guest_exec/wait_host_ready (guests),
submit_job/job_state/node_state/sinfo_json/update_node/slurm_env (Slurm), podman_env and
inspect_image (podman). `workdir` defaults to <checkout>/.testbed.
"""

from __future__ import annotations

from k3fleet.lab.testbed.errors import MissingToolError, NotRootError, TestbedError
from k3fleet.lab.testbed.harness import (
    default_repo,
    guest_exec,
    ssh_argv,
    ssh_run,
    status,
    up,
    wait_host_ready,
)
from k3fleet.lab.testbed.podman import image_env, inspect_image, podman_env
from k3fleet.lab.testbed.slurm import (
    NodeStatus,
    job_state,
    node_state,
    sinfo_json,
    slurm_env,
    submit_job,
    update_node,
)
from k3fleet.lab.testbed.state import HostState, PodmanState, SlurmState, TestbedState, default_workdir
from k3fleet.lab.testbed.teardown import Leftovers, down, leftovers

__all__ = [
    "HostState",
    "Leftovers",
    "MissingToolError",
    "NodeStatus",
    "NotRootError",
    "PodmanState",
    "SlurmState",
    "TestbedError",
    "TestbedState",
    "default_repo",
    "default_workdir",
    "down",
    "guest_exec",
    "image_env",
    "inspect_image",
    "job_state",
    "leftovers",
    "node_state",
    "podman_env",
    "sinfo_json",
    "slurm_env",
    "ssh_argv",
    "ssh_run",
    "status",
    "submit_job",
    "up",
    "update_node",
    "wait_host_ready",
]
