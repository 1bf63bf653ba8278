"""A testbed guest put on one stand-in driver release, installed exactly, held and loaded, its node idle
in Slurm: how a node looks before its first change night (README "Rehearse the night").

A fresh testbed's guests have no NVIDIA packages; `k3fleet lab testbed driver HOST... --release
575.57.08` makes them R575 nodes. The packages of any other stand-in release are removed, left-over
configuration files purged, and the guest rebooted when the loaded driver is not the release's.
"""

from __future__ import annotations

import subprocess

from k3fleet.lab.standin import install_pins
from k3fleet.lab.testbed.harness import ssh_argv, ssh_run, status, wait_host_ready
from k3fleet.lab.testbed.slurm import node_state, update_node
from k3fleet.lab.testbed.state import TestbedState

# The stand-in packages' name prefixes: what is NVIDIA's on a guest (k3fleet/lab/standin/builder.py).
_NVIDIA = ("nvidia-", "libnvidia-", "cuda-drivers-")


def loaded_release(state: TestbedState, host: str) -> str:
    """The loaded stand-in driver's version, or ``none``."""
    first = ssh_run(state, host, "head -1 /run/nvidia-sim/proc/driver/nvidia/version 2>/dev/null || true")
    return next((t for t in first.split() if t.count(".") == 2 and t.split(".")[0].isdigit()), "none")


def install_release(state: TestbedState, host: str, version: str) -> str:
    """Put ``host`` on ``version`` (held, loaded, back in service); returns one line saying so."""
    pins = install_pins(version)
    names = [p.split("=")[0] for p in pins]
    others = ("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | awk '$1==\"ii\"{print $2}' | grep -E '^("
              + "|".join(_NVIDIA) + ")' | grep -vxF -e " + " -e ".join(names) + " | sed 's/$/-/' || true")
    script = " && ".join([
        "export DEBIAN_FRONTEND=noninteractive",
        "(apt-mark showhold | xargs -r apt-mark unhold >/dev/null)",
        "dpkg --configure --pending >/dev/null",
        "apt-get update -q >/dev/null",
        f"apt-get install -y -q --allow-downgrades -o APT::Install-Recommends=no {' '.join(pins)} $({others})"
        " >/tmp/k3fleet-release.log 2>&1",
        "apt-mark hold " + " ".join(names) + " >/dev/null",
        "(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | awk '$1==\"rc\"{print $2}' | xargs -r dpkg --purge"
        " >/dev/null)",
    ])
    ssh_run(state, host, script, timeout=600)
    rebooted = False
    if loaded_release(state, host) != version:
        boots = status(state.workdir).host(host).boots
        subprocess.run(ssh_argv(state, host, "systemctl reboot"), capture_output=True, timeout=60, check=False)
        wait_host_ready(state.workdir, host, min_boots=boots + 1)
        rebooted = True
    node = state.host(host).slurm_node
    if node_state(state, node).drained:
        update_node(state, node, "resume")
    return f"{host}: {version} installed, held and loaded{' (rebooted)' if rebooted else ''}; {node} in service"
