"""What the testbed needs of the machine: root, and the programs its harness calls itself."""

from __future__ import annotations

from k3fleet.lab.common import proc
from k3fleet.lab.testbed.errors import MissingToolError, NotRootError

# Commands the harness itself calls on the machine (the guests' own tools live in the image).
HOST_TOOLS: tuple[str, ...] = (
    "debootstrap",
    "systemd-nspawn",
    "ip",
    "nsenter",
    "mount",
    "umount",
    "tar",
    "ssh",
    "ssh-keygen",
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "scontrol",
    "sinfo",
    "podman",
    "runc",
    "mknod",
)


def require_root() -> None:
    """Fail with one line unless we run as root (namespaces, mounts and nspawn need it)."""
    proc.require_root("testbed", "network namespaces, overlay mounts, systemd-nspawn", NotRootError)


def require_tools() -> dict[str, str]:
    """Resolve every tool to its absolute path, or name all the missing ones in one error."""
    found, missing = proc.find_tools(HOST_TOOLS)
    if missing:
        raise MissingToolError(f"testbed: missing programs {', '.join(missing)}; install them with "
                               "scripts/testbed-deps.sh")
    return found
