"""The testbed's state (saved as JSON in the work directory) and the layout of that directory.

The state file is written before anything is created and updated as pieces come up, so `down`
knows what to remove even when `up` died half-way or everything was killed with SIGKILL.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from k3fleet.lab.common import workdir as common
from k3fleet.lab.testbed.errors import TestbedError

# Global names: one testbed per machine, found again by these prefixes after a crash.
NETNS_PREFIX = "k3tb-"
VETH_HOST_PREFIX = "k3tbh"
HOSTNAME_FORMAT = "tb-node{index:02d}"
SLURM_NODE_FORMAT = "node{index:02d}"
# Link-local only (docs/architecture.md, testbed): 169.254.77.(4i+1)/30 on the machine, .(4i+2)/30 in the guest.
ADDRESS_PREFIX = "169.254.77."
MAX_HOSTS = 63
GUEST_PROCFS = "/run/nvidia-sim/proc"
GUEST_REPO_MOUNT = "/srv/k3fleet-repo"
# The machine's podman image store, mounted read-only into every guest as an additional image store;
# the guests' own store (containers, their layers) is a tmpfs at GUEST_CONTAINERS, new at every boot.
GUEST_IMAGE_STORE = "/var/lib/k3fleet-images"
GUEST_CONTAINERS = "/var/lib/containers"


def host_address(index: int) -> str:
    return f"{ADDRESS_PREFIX}{4 * index + 1}"


def guest_address(index: int) -> str:
    return f"{ADDRESS_PREFIX}{4 * index + 2}"


def known_hosts_of(ssh_key: Path) -> Path:
    """The known_hosts file the testbed writes for its guests, beside its client key."""
    return ssh_key.parent / "known_hosts"


class Layout(common.WorkdirLayout):
    """Every path under the work directory, in one place (the shared ones in WorkdirLayout);
    <checkout>/.testbed when running from a checkout, else ./.testbed (installed from a wheel)."""

    default_parts = (".testbed",)

    @property
    def cache(self) -> Path:
        return self.workdir / "cache"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def slurm_dir(self) -> Path:
        return self.workdir / "slurm"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def podman_dir(self) -> Path:
        # Image store lives in the cache: importing two 300 MB images costs seconds on every up.
        return self.cache / "podman"

    @property
    def repo_dir(self) -> Path:
        return self.workdir / "repo"


default_workdir = Layout.default_workdir
resolve_workdir = Layout.resolve


class OverlayDirs(BaseModel):
    lower: Path | None = Field(default=None, description="the shared read-only image; None until it is built")
    upper: Path
    work: Path
    merged: Path


class HostState(BaseModel):
    name: str
    index: int
    address: str = Field(description="guest side of the /30, what Ansible connects to")
    host_address: str = Field(description="machine side of the /30")
    netns: str
    veth_host: str
    slurm_node: str
    has_pynvml: bool
    overlay: OverlayDirs
    nspawn_pid: int | None = None
    guest_pid: int | None = Field(default=None, description="the guest's systemd (PID 1 inside)")
    boots: int = 0
    running: bool = False


class SlurmState(BaseModel):
    conf_dir: Path
    conf: Path
    munge_socket: Path
    ctld_port: int
    slurmd_port: int
    node_ports: dict[str, int]
    nodes: list[str]
    partition: str


class PodmanState(BaseModel):
    containers_conf: Path
    storage_conf: Path
    images: dict[str, dict[str, str]] = Field(description="image reference -> its ENV settings")


class TestbedState(common.SavedState):
    __test__ = False  # not a pytest test class

    phase: str = Field(description="planned | starting | up | failed")
    hosts: list[HostState]
    ssh_key: Path
    inventory: Path
    repo: Path | None = None
    image: Path | None = None
    slurm: SlurmState | None = None
    podman: PodmanState | None = None
    up_seconds: float | None = None

    @property
    def known_hosts(self) -> Path:
        return known_hosts_of(self.ssh_key)

    def host(self, name: str) -> HostState:
        for host in self.hosts:
            if name in (host.name, host.slurm_node, host.address):
                return host
        raise TestbedError(f"testbed: no host named {name!r} (have {', '.join(h.name for h in self.hosts)})")


save_state = common.save_state


def load_state(workdir: Path) -> TestbedState | None:
    return common.load_state(workdir, TestbedState, TestbedError, "testbed")
