"""Fabric checks: Fabric Manager on NVSwitch systems and IMEX on multi-node NVLink domains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.models.target import version_tuple
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.imex import cluster_uuid, imex_in_use, imex_state
from k3fleet.verdict.rules.base import Emitter, HostContext

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("fabricmanager.present", "Fabric Manager installed on NVSwitch systems",
          "NVSwitch systems need Fabric Manager to bring up the NVLink fabric.",
          "critical",
          "Install nvidia-fabricmanager-{target_branch} at exactly the driver's version and enable it.",
          source='docs/facts.md section 3 (Fabric Manager on NVSwitch systems)'),
    check("fabricmanager.active", "Fabric Manager running",
          "Without a running Fabric Manager the GPUs on an NVSwitch system do not finish fabric training.",
          "critical",
          "systemctl enable --now nvidia-fabricmanager; check its log for a version mismatch.",
          source='docs/facts.md section 3 (nvidia-fabricmanager.service)'),
    check("fabricmanager.version_match", "Fabric Manager version equals the driver version",
          "Fabric Manager refuses to run against a different driver version; they must match exactly.",
          "error",
          "Install the Fabric Manager package of exactly the loaded driver's version and hold both.",
          source='docs/facts.md section 3 (cuda-drivers-fabricmanager-580 depends on nvidia-fabricmanager-580 (= '
          'exact))'),
    check("fabric.imex", "IMEX ready on multi-node NVLink nodes",
          "On a multi-node NVLink domain (GB200/GB300 NVL72: GPUs with a non-zero ClusterUUID) GPU memory is "
          "shared across the nodes' operating systems only through IMEX: without its daemon running, the IMEX "
          "channel device and every node of the domain READY, CUDA cannot import another node's memory and NCCL's "
          "and FlashInfer's multi-node NVLink paths fail.",
          "error",
          "List every compute tray of the NVLink domain in the IMEX node list (IMEX_NODE_CONFIG_FILE, default "
          "/etc/nvidia-imex/nodes_config.cfg: one IP per line, the same file on every node), systemctl enable --now "
          "nvidia-imex on every node, create /dev/nvidia-caps-imex-channels/channel0 (mknod with the major of "
          "nvidia-caps-imex-channels in /proc/devices), then check that nvidia-imex-ctl -N shows every node READY "
          "and Domain State UP.",
          source='docs/facts.md section 15 (NVIDIA IMEX guide: nvidia-imex service, IMEX_NODE_CONFIG_FILE node list, '
          'IMEX channels; nvidia-imex-ctl -N node states and Domain State)'),
)


def _fabricmanager(f: HostFacts, c: HostContext, e: Emitter) -> None:
    spec = e.ct.target.fabric_manager
    if not spec.required_when_nvswitch:
        return
    fm = f.fabricmanager
    if c.fm_required is None:
        if not c.driver_failed:
            e.unknown("fabricmanager.present", "whether NVSwitches are present (Fabric Manager needed)",
                      fm.reason, error=True)
        return
    if not c.fm_required:
        return
    unit = fm.unit
    # The collector says "absent" only when no package, unit or binary exists.
    installed = False if fm.status == "absent" else unit.installed
    ev: dict[str, Any] = {"nvswitch_count": fm.nvswitch_count, "installed": installed,
                          "active": unit.active, "enabled": unit.enabled, "version": fm.version}
    if installed is False:
        e.fail("fabricmanager.present",
               f"Fabric Manager is not installed on an NVSwitch system ({fm.nvswitch_count or '?'} switches)", ev)
        return
    if installed is None:
        e.unknown("fabricmanager.present", "whether Fabric Manager is installed", fm.reason, error=True)
    if spec.must_be_active:
        if unit.active is None or unit.active == "unknown":
            e.unknown("fabricmanager.active", "the nvidia-fabricmanager unit state", fm.reason, error=True)
        elif unit.active != "active":
            e.fail("fabricmanager.active", f"nvidia-fabricmanager.service is {unit.active}", ev)
    if spec.version_must_match_driver:
        _fm_version(f, c, e)


def _fm_version(f: HostFacts, c: HostContext, e: Emitter) -> None:
    if c.platform_note is not None:
        return  # driver.platform says why: no data-center driver for a Fabric Manager to match
    fm = f.fabricmanager
    driver = c.version
    if fm.version and driver:
        vf, vd = version_tuple(fm.version), version_tuple(driver)
        matches = vf == vd if vf and vd else fm.version_matches_driver
    else:
        matches = fm.version_matches_driver
    if matches is None:
        e.unknown("fabricmanager.version_match", "the Fabric Manager version", fm.reason, error=True)
    elif not matches:
        e.fail("fabricmanager.version_match",
               f"Fabric Manager {fm.version or '?'} does not equal driver {driver or fm.driver_version or '?'}",
               {"fabricmanager_version": fm.version, "driver_version": driver}, chain=c.below_target)


# -- IMEX (multi-node NVLink domains) -------------------------------------------------------------


def _imex(f: HostFacts, c: HostContext, e: Emitter) -> None:
    """A node of a multi-node NVLink domain (a non-zero ClusterUUID, or IMEX set to run) needs IMEX ready:
    the unit active, channel0 present, every node of its node list READY (docs/facts.md section 15)."""
    if c.driver_failed:
        return
    domain = cluster_uuid(f)
    if domain is None and not imex_in_use(f):
        return
    state = imex_state(f)
    im = f.imex
    where = f"multi-node NVLink domain {domain}" if domain else "an IMEX domain"
    if state.problems:
        ev: dict[str, Any] = {"cluster_uuid": domain, "problems": state.problems}
        if im is not None:
            ev.update(unit_active=im.unit.active, channels=im.channels, domain_state=im.domain_state,
                      nodes_not_ready={str(n.index): f"{n.address} {n.status}" for n in im.nodes
                                       if n.status != "READY"},
                      node_list=im.nodes_file)
        e.fail("fabric.imex", f"IMEX is not ready on this node of {where}: {'; '.join(state.problems)}", ev)
    elif state.ready is None:
        e.unknown("fabric.imex", f"the IMEX state of this node of {where}", state.unknown, error=True)


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (_fabricmanager, _imex,)
