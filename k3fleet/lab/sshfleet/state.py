"""The SSH lab fleet's names, addresses, directory layout and saved state.

Names and addresses are disjoint from the real testbed's (``k3tb-`` namespaces on
169.254.77.0/24): both can be on the machine at once and neither teardown touches the other.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

import k3fleet
from k3fleet.lab.sshfleet.errors import SshFleetError

STATE_VERSION = 1

NETNS_PREFIX = "k3sf-"
VETH_PREFIX = "k3sfh"
# Every process the supervisor starts carries this mark, so `down` finds them after a SIGKILL.
MARK_ENV = "K3FLEET_SSHFLEET_WORKDIR"
# Link-local only (docs/scale.md): one /30 per host, 64 per /24, third octet from 100 up.
FIRST_OCTET = 100
HOSTS_PER_OCTET = 64
MAX_HOSTS = 64 * 100  # 169.254.100.0 - 169.254.199.255


def addresses(index: int) -> tuple[str, str]:
    """(machine side, namespace side) of host ``index``'s /30."""
    if not 0 <= index < MAX_HOSTS:
        raise SshFleetError(f"ssh fleet: host index {index} outside 0..{MAX_HOSTS - 1}")
    third = FIRST_OCTET + index // HOSTS_PER_OCTET
    base = 4 * (index % HOSTS_PER_OCTET)
    return f"169.254.{third}.{base + 1}", f"169.254.{third}.{base + 2}"


def is_fleet_address(address: str) -> bool:
    parts = address.split(".")
    if len(parts) != 4 or parts[:2] != ["169", "254"] or not parts[2].isdigit():
        return False
    return FIRST_OCTET <= int(parts[2]) < FIRST_OCTET + MAX_HOSTS // HOSTS_PER_OCTET


def default_workdir() -> Path:
    """<checkout>/.lab/ssh-fleet from a checkout, else ./.lab/ssh-fleet (installed from a wheel)."""
    checkout = Path(k3fleet.__file__).resolve().parent.parent
    base = checkout if (checkout / "pyproject.toml").exists() else Path.cwd()
    return base / ".lab" / "ssh-fleet"


def resolve_workdir(workdir: Path | None) -> Path:
    return (workdir if workdir is not None else default_workdir()).expanduser().resolve()


@dataclass(frozen=True)
class Layout:
    """Every path under the work directory, in one place."""

    workdir: Path

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.workdir / ".lock"

    @property
    def fleet_dir(self) -> Path:
        return self.workdir / "fleet"

    @property
    def inventory(self) -> Path:
        return self.workdir / "inventory.yml"

    @property
    def ssh_dir(self) -> Path:
        return self.workdir / "ssh"

    @property
    def client_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.ssh_dir / "authorized_keys"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.workdir / "hosts"

    def host_dir(self, name: str) -> Path:
        return self.hosts_dir / name

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    @property
    def supervisor_spec(self) -> Path:
        return self.run_dir / "supervisor-spec.json"

    @property
    def supervisor_live(self) -> Path:
        return self.run_dir / "supervisor-live.json"

    @property
    def supervisor_log(self) -> Path:
        return self.run_dir / "supervisor.log"

    @property
    def owned(self) -> tuple[Path, ...]:
        """What `down` removes (the work directory itself stays, with its lock file)."""
        return (self.fleet_dir, self.ssh_dir, self.hosts_dir, self.run_dir, self.inventory, self.state_file)


class SshHost(BaseModel):
    name: str
    index: int
    netns: str
    veth: str
    address: str = Field(description="namespace side of the /30: where sshd listens and Ansible connects")
    host_address: str = Field(description="machine side of the /30")
    profile: str
    sshd: bool = Field(description="false for a host the fleet spec makes unreachable: a namespace, no sshd")


class SshFleetState(BaseModel):
    version: int = STATE_VERSION
    workdir: Path
    phase: str = Field(description="planned | starting | up | failed")
    hosts: list[SshHost]
    inventory: Path
    known_hosts: Path
    client_key: Path
    image: str
    created_privsep_dir: bool = Field(default=False, description="up made /run/sshd; down removes it")
    supervisor_pid: int | None = None
    supervisor_start_time: int | None = Field(default=None, description="guards against pid reuse")
    up_seconds: float | None = None
    error: str | None = None


def save_state(state: SshFleetState) -> None:
    """Atomic write: `status` and a `down` after kill -9 never see half a file."""
    state.workdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=state.workdir)
    with os.fdopen(fd, "w") as fh:
        fh.write(state.model_dump_json(indent=2))
    os.replace(tmp, Layout(state.workdir).state_file)


def load_state(workdir: Path) -> SshFleetState | None:
    path = Layout(workdir).state_file
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return SshFleetState.model_validate(json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise SshFleetError(f"ssh fleet: state file {path} is unreadable: {exc}") from exc
