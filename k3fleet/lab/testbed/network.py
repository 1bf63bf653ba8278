"""Network namespaces and veth pairs for the guests (link-local /30 per host, nothing routed)."""

from __future__ import annotations

import json
from pathlib import Path

from k3fleet.lab.testbed.proc import run
from k3fleet.lab.testbed.state import NETNS_PREFIX, VETH_GUEST_TMP_PREFIX, VETH_HOST_PREFIX, HostState

NETNS_RUN_DIR = Path("/run/netns")


def list_netns(prefix: str = NETNS_PREFIX) -> list[str]:
    """Our namespaces, by name prefix (what survives a crash even when the state file does not)."""
    if not NETNS_RUN_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_RUN_DIR.iterdir() if p.name.startswith(prefix))


def list_links(prefix: str = VETH_HOST_PREFIX) -> list[str]:
    proc = run(["ip", "-j", "link", "show"], what="testbed network: listing links", check=False)
    try:
        links = json.loads(proc.stdout or "[]")
    except ValueError:
        return []
    return sorted(str(link.get("ifname", "")) for link in links if str(link.get("ifname", "")).startswith(prefix))


def netns_pids(name: str) -> list[int]:
    proc = run(["ip", "netns", "pids", name], what=f"testbed network: pids in {name}", check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit()]


def create_host_network(host: HostState) -> None:
    """netns + veth pair, peer moved in as eth0, addresses on both ends, all links up."""
    ns = host.netns
    guest_tmp = f"{VETH_GUEST_TMP_PREFIX}{host.index}"
    what = f"testbed network: host {host.name} (netns {ns})"
    run(["ip", "netns", "add", ns], what=what)
    run(["ip", "link", "add", host.veth_host, "type", "veth", "peer", "name", guest_tmp], what=what)
    run(["ip", "link", "set", guest_tmp, "netns", ns], what=what)
    run(["ip", "-n", ns, "link", "set", guest_tmp, "name", "eth0"], what=what)
    run(["ip", "addr", "add", f"{host.host_address}/30", "dev", host.veth_host], what=what)
    run(["ip", "link", "set", host.veth_host, "up"], what=what)
    run(["ip", "-n", ns, "addr", "add", f"{host.address}/30", "dev", "eth0"], what=what)
    run(["ip", "-n", ns, "link", "set", "eth0", "up"], what=what)
    run(["ip", "-n", ns, "link", "set", "lo", "up"], what=what)


def delete_netns(name: str) -> None:
    run(["ip", "netns", "del", name], what=f"testbed teardown: deleting netns {name}")


def delete_link(name: str) -> None:
    # The pair usually vanished with its namespace; a leftover host end is removed here.
    proc = run(["ip", "link", "del", name], what=f"testbed teardown: deleting link {name}", check=False)
    if proc.returncode != 0 and name in list_links(name):
        run(["ip", "link", "del", name], what=f"testbed teardown: deleting link {name}")
