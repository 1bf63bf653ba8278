"""What the change-night system tests share: the driver versions, the serving smoke's one-node launch
file, the guest's loaded driver and package fingerprint, and the reset of a guest to an R575 node as it
looks before its first night."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from k3fleet.lab import testbed
from k3fleet.lab.standin import install_pins

OLD, NEW = "575.57.08", "580.95.05"
OLD_PINS = install_pins(OLD)
NEW_PINS = install_pins(NEW)
OLD_NAMES = [p.split("=")[0] for p in OLD_PINS]
NEW_NAMES = [p.split("=")[0] for p in NEW_PINS]

# Runs the k3fleet CLI in a process of its own (a night the test can signal or leave running).
LAUNCHER = """
import sys
from k3fleet import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def wait_for(check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    """Poll ``check`` every ``every`` seconds until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout:.0f}s"
        time.sleep(every)


def smoke_launch(directory: Path) -> Path:
    """A one-node command for the serving smoke (--launch-file). The guests are 8x H200 nodes, so the
    audit derives a strategy over two nodes, which one changed host cannot serve alone; a night without
    a one-node command is refused (docs/change-night.md "Serving smoke")."""
    path = Path(directory) / "smoke-launch.sh"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# one node of the recipe, a shorter context for the smoke\n"
                    "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --max-model-len 4096\n")
    return path


def ssh(state: testbed.TestbedState, host: str, command: str, timeout: float = 300) -> str:
    return testbed.ssh_run(state, host, command, timeout=timeout)


def loaded(state: testbed.TestbedState, host: str) -> str:
    first = ssh(state, host, "head -1 /run/nvidia-sim/proc/driver/nvidia/version 2>/dev/null || true")
    return next((t for t in first.split() if t.count(".") == 2 and t.split(".")[0].isdigit()), "none")


def packages(state: testbed.TestbedState, host: str) -> str:
    """Every installed package with version and selection: the before/after fingerprint."""
    return ssh(state, host, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' | sort")


def reboot(state: testbed.TestbedState, host: str) -> None:
    boots = testbed.status(state.workdir).host(host).boots
    subprocess.run(testbed.ssh_argv(state, host, "systemctl reboot"), capture_output=True, timeout=60, check=False)
    testbed.wait_host_ready(state.workdir, host, min_boots=boots + 1)


def put_on_575(state: testbed.TestbedState, hosts: list[str]) -> None:
    """R575 packages installed exactly and held, R575 loaded, Fabric Manager running, node idle in Slurm."""
    script = " && ".join([
        "export DEBIAN_FRONTEND=noninteractive",
        "(apt-mark showhold | xargs -r apt-mark unhold >/dev/null)",
        "dpkg --configure --pending >/dev/null",
        "apt-get update -q >/dev/null",
        "apt-get install -y -q --allow-downgrades -o APT::Install-Recommends=no "
        + " ".join(OLD_PINS) + " " + " ".join(f"{n}-" for n in NEW_NAMES) + " >/tmp/k3fleet-reset.log 2>&1",
        "apt-mark hold " + " ".join(OLD_NAMES) + " >/dev/null",
        # An earlier test's R580 left as config files ("rc") is not how an R575 node looks before
        # its first night; a rollback restores the node's packages, not another test's leftovers.
        "(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | awk '$1==\"rc\"{print $2}'"
        " | xargs -r dpkg --purge >/dev/null)",
    ])
    for host in hosts:
        ssh(state, host, script)
        if loaded(state, host) != OLD:
            reboot(state, host)
        assert loaded(state, host) == OLD, f"{host}: R575 not loaded after reset"
        node = state.host(host).slurm_node
        if testbed.node_state(state, node).drained:
            testbed.update_node(state, node, "resume")
