"""IMEX on an NVL72 tray: its config, node list and channel devices, and ``nvidia-imex-ctl -N``
(k3fleet/lab/imex_data/SOURCES.md; docs/facts.md section 15)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.render.node import HostImage, Part, Recording

_IMEX_DATA = Path(__file__).resolve().parent.parent / "imex_data"
# The connectivity legend nvidia-imex-ctl -N prints first (570.172, tests/fixtures/imex/SOURCES.md).
LEGEND = """Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
R - Recovering - Connection was lost, but clean up has not yet been triggered.
D - Disconnected - Connection was lost, and clean up has been triggreed.
A - Authenticating - If GSSAPI enabled, client has initiated mutual authentication.
!V! - Version mismatch, communication disabled.
!M! - Node map mismatch, communication disabled.
C - Connected - Ready for operation
"""
# The lab's clock (node.LAB_TIMESTAMP) in the tool's own timestamp form.
CTL_TIMESTAMP = "9/15/2025 09:00:00.000"


class ImexView(Part):
    """The files and the one command of IMEX; the same on every node of the domain (host-independent)."""

    def render(self, img: HostImage) -> None:
        im = self.p.imex
        if im is None or not im.installed:
            return
        f = img.files
        f[sources.FILES["imex_config"]] = (_IMEX_DATA / "config.cfg").read_text(encoding="utf-8")
        f[sources.FILES["imex_nodes_config"]] = "".join(f"{node}\n" for node in im.nodes)
        channels = sources.FILES["imex_channels_dir"]
        f[channels] = None
        for n in range(im.channels):
            f[f"{channels}/channel{n}"] = ""
        img.record(sources.COMMANDS["imex_ctl_nodes"], Recording(stdout=self.imex_ctl_nodes()))

    def imex_ctl_nodes(self) -> str:
        im = self.p.imex
        assert im is not None
        version = im.version or (self.drv.running_version if self.drv else "")
        count = len(im.nodes)
        down = set(range(count)) if im.active != "active" else set(im.unavailable)
        lines = ["", CTL_TIMESTAMP, "Nodes:"]
        for i, address in enumerate(im.nodes):
            label = f"#{i}"
            if i in down:
                lines.append(f"Node {label:<5}- {address:<16}- {'UNAVAILABLE':<21}- Version:")
            else:
                lines.append(f"Node {label:<5}- {address:<16}- {'READY':<21}- Version: {version}")
        lines += ["", " Nodes From\\To  " + "".join(f"{j:<4}" for j in range(count)).rstrip()]
        for i in range(count):
            codes = ["I" if i in down else ("N" if j in down else "C") for j in range(count)]
            lines.append(f"{i:>8}        " + "   ".join(codes))
        state = "UP" if not down else ("DOWN" if len(down) == count else "DEGRADED")
        lines += ["", f"Domain State: {state}"]
        return LEGEND + "\n".join(lines) + "\n"
