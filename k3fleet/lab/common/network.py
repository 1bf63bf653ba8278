"""Network namespaces and veth pairs of the lab fleets: one /30 per host, link-local, nothing routed.

Each host gets a namespace with the namespace end of a veth pair as ``eth0``; the machine keeps the
other end. Everything is made with ``ip -batch`` (one process for all namespaces and the machine's
side, one per namespace for the inside), so hundreds of hosts cost hundreds of short processes, not
thousands. The names are the harness's own (its prefixes), which is how teardown finds them again
after a crash even when the state file is gone.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3fleet.lab.common import proc
from k3fleet.lab.common.processes import kill_until_gone

NETNS_RUN_DIR = Path("/run/netns")


@dataclass(frozen=True)
class HostLink:
    """One host's namespace and veth pair."""

    name: str  # the host, for messages
    netns: str
    link: str  # the machine's end of the pair
    host_address: str  # the machine's side of the /30
    address: str  # the namespace's side of the /30, on eth0


def create(links: Sequence[HostLink], label: str) -> None:
    """Namespace, veth pair (peer made inside as eth0), addresses on both ends, all links up."""
    if not links:
        return
    outside = []
    for h in links:
        outside += [f"netns add {h.netns}",
                    f"link add {h.link} type veth peer name eth0 netns {h.netns}",
                    f"addr add {h.host_address}/30 dev {h.link}",
                    f"link set {h.link} up"]
    what = f"{label} network: host {links[0].name} (netns {links[0].netns})" if len(links) == 1 else \
        f"{label} network: namespaces and veth pairs"
    proc.run(["ip", "-batch", "-"], what=what, input_text="\n".join(outside) + "\n")
    for h in links:
        inside = f"addr add {h.address}/30 dev eth0\nlink set eth0 up\nlink set lo up\n"
        proc.run(["ip", "-n", h.netns, "-batch", "-"], what=f"{label} network: host {h.name} (netns {h.netns})",
                 input_text=inside)


def list_netns(prefix: str) -> list[str]:
    """Our namespaces, by name prefix (what survives a crash even when the state file does not)."""
    if not NETNS_RUN_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_RUN_DIR.iterdir() if p.name.startswith(prefix))


def list_links(prefix: str, label: str) -> list[str]:
    """The machine's links whose name starts with ``prefix``."""
    result = proc.run(["ip", "-j", "link", "show"], what=f"{label} network: listing links", check=False)
    try:
        links = json.loads(result.stdout or "[]")
    except ValueError:
        return []
    return sorted(str(link.get("ifname", "")) for link in links if str(link.get("ifname", "")).startswith(prefix))


def _ns_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def netns_pids(names: Iterable[str]) -> dict[str, list[int]]:
    """Live pids inside each named namespace, in one pass over /proc (what `ip netns pids` does)."""
    ids = {}
    found: dict[str, list[int]] = {}
    for name in names:
        found[name] = []
        ns = _ns_id(str(NETNS_RUN_DIR / name))
        if ns is not None:
            ids[ns] = name
    if not ids:
        return found
    for pid in proc.all_pids():
        ns = _ns_id(f"/proc/{pid}/ns/net")
        if ns in ids and proc.pid_alive(pid):
            found[ids[ns]].append(pid)
    return found


def processes_inside(names: Iterable[str]) -> dict[int, str]:
    """Every live process inside the named namespaces, with its command line."""
    return {pid: " ".join(proc.cmdline(pid))[:120] for pids in netns_pids(names).values() for pid in pids}


def _inside(names: list[str]) -> list[int]:
    return [pid for pids in netns_pids(names).values() for pid in pids]


def clear_netns(names: Iterable[str], label: str) -> None:
    """Kill everything inside the namespaces, then delete them.

    Killing comes first: a process inside (an sshd session kept by ControlPersist, a guest) keeps
    the namespace alive, and the next ``ip netns add`` fails with "File exists"."""
    names = sorted(names)
    kill_until_gone(functools.partial(_inside, names))
    existing = [n for n in names if (NETNS_RUN_DIR / n).exists()]
    _batch([f"netns del {n}" for n in existing], f"{label} teardown: deleting namespaces")


def delete_links(names: Iterable[str], label: str) -> None:
    """Delete the machine's ends of veth pairs (a pair usually vanishes with its namespace)."""
    _batch([f"link del {n}" for n in names], f"{label} teardown: deleting links")


def _batch(lines: list[str], what: str) -> None:
    # -force: one line that fails (already gone) does not stop the rest; what is left is found
    # by the harness's leftover scan and named there.
    if lines:
        proc.run(["ip", "-force", "-batch", "-"], what=what, input_text="".join(f"{line}\n" for line in lines),
                 check=False)
