"""The SSH lab fleet's names, addresses, directory layout and saved state.

Names and addresses are disjoint from the real testbed's (``k3tb-`` namespaces on
169.254.77.0/24): both can be on the machine at once and neither teardown touches the other.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from k3fleet.lab.common import workdir as common
from k3fleet.lab.sshfleet.errors import SshFleetError

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


class Layout(common.WorkdirLayout):
    """Every path under the work directory, in one place (the shared ones in WorkdirLayout);
    <checkout>/.lab/ssh-fleet from a checkout, else ./.lab/ssh-fleet (installed from a wheel)."""

    default_parts = (".lab", "ssh-fleet")

    @property
    def fleet_dir(self) -> Path:
        return self.workdir / "fleet"

    @property
    def client_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.ssh_dir / "authorized_keys"

    @property
    def owned(self) -> tuple[Path, ...]:
        """What `down` removes (the work directory itself stays, with its lock file)."""
        return (self.fleet_dir, self.ssh_dir, self.hosts_dir, self.run_dir, self.inventory, self.state_file)


default_workdir = Layout.default_workdir
resolve_workdir = Layout.resolve


class SshHost(BaseModel):
    name: str
    index: int
    netns: str
    veth: str
    address: str = Field(description="namespace side of the /30: where sshd listens and Ansible connects")
    host_address: str = Field(description="machine side of the /30")
    profile: str
    sshd: bool = Field(description="false for a host the fleet spec makes unreachable: a namespace, no sshd")


class SshFleetState(common.SavedState):
    phase: str = Field(description="planned | starting | up | failed")
    hosts: list[SshHost]
    inventory: Path
    known_hosts: Path
    client_key: Path
    image: str
    created_privsep_dir: bool = Field(default=False, description="up made /run/sshd; down removes it")
    up_seconds: float | None = None


save_state = common.save_state


def load_state(workdir: Path) -> SshFleetState | None:
    return common.load_state(workdir, SshFleetState, SshFleetError, "ssh fleet")
