"""The node's system configuration: os-release, environment files and the systemd units collectors ask about."""

from __future__ import annotations

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_sources as sources
from k3fleet.lab.render.node import Part, Recording, kv_block


class SystemView(Part):
    """The files under /etc and ``systemctl show`` of the units the host module reads."""

    def os_release(self) -> str:
        return self.os.os_release

    def nccl_conf(self) -> str | None:
        if self.p.nccl_conf is None:
            return None
        return kv_block(list(self.p.nccl_conf.items()))

    def etc_environment(self) -> str:
        path = ('PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/games:'
                '/usr/local/games:/snap/bin"\n') if self.os.family == "debian" else ""
        return path + kv_block(list(self.p.environment.items()))

    def systemctl_show(self) -> Recording:
        argv = sources.COMMANDS["systemctl_show"]
        units = [a for a in argv[argv.index("-p") + 2:] if not a.startswith("-")]
        blocks = [self._unit_block(unit) for unit in units]
        return Recording(stdout="\n".join(blocks))

    def _unit_block(self, unit: str) -> str:
        fm = self.p.fabricmanager
        u = self.p.unattended_upgrades
        sub_of = {"active": "running", "failed": "failed", "inactive": "dead", "activating": "start"}
        state: tuple[str, str, str, str] | None = None  # load, active, sub, unit-file
        if unit == "nvidia-fabricmanager.service" and fm.installed and self.p.fabricmanager_version:
            state = ("loaded", fm.active, sub_of[fm.active], fm.enabled)
        elif unit == "nvidia-persistenced.service" and self.drv is not None:
            if self.p.gpus.persistence_mode and self.node.module_loaded:
                state = ("loaded", "active", "running", "enabled")
            else:
                state = ("loaded", "inactive", "dead", "disabled")
        elif unit == "nvidia-imex.service" and self.p.imex is not None and self.p.imex.installed:
            im = self.p.imex
            state = ("loaded", im.active, sub_of[im.active], im.enabled)
        elif unit == "unattended-upgrades.service" and self.os.family == "debian" and u.installed:
            # The service is the shutdown-time hook and runs either way; the apt.conf.d flags decide.
            state = ("loaded", "active", "running", "enabled")
        elif unit == "dnf-automatic.timer" and self.os.family == "redhat" and u.installed:
            state = ("loaded", "active", "waiting", "enabled") if u.enabled else \
                ("loaded", "inactive", "dead", "disabled")
        if state is None:
            state = ("not-found", "inactive", "dead", "")
        load, active, sub, file_state = state
        return kv_block([("Id", unit), ("LoadState", load), ("ActiveState", active),
                          ("SubState", sub), ("UnitFileState", file_state)])

