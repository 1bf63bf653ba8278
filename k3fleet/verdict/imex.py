"""IMEX on a node of a multi-node NVLink domain: is it ready to share GPU memory across the nodes?

One reading of a host's IMEX facts (docs/facts.md section 15), used by the host check ``fabric.imex``
and by the all-to-all judgement (k3fleet.verdict.all2all) for the FlashInfer NVLink backends across
nodes. Pure functions over validated facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3fleet.models.facts import HostFacts

ZERO_UUID = "00000000-0000-0000-0000-000000000000"
CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"
# Nodes and links named in a message; the evidence keeps the facts' own lists.
SHOWN = 4


@dataclass(frozen=True)
class ImexState:
    """ready: True (every condition holds), False (``problems`` says why), None (``unknown`` says what
    could not be read and nothing read so far fails)."""

    ready: bool | None
    problems: list[str] = field(default_factory=list)
    unknown: str | None = None


def cluster_uuid(f: HostFacts) -> str | None:
    """The host's multi-node NVLink domain: the first non-zero ClusterUUID of its GPUs, or None."""
    for g in f.driver.gpus:
        u = g.fabric_cluster_uuid
        if u and u != ZERO_UUID:
            return u
    return None


def imex_in_use(f: HostFacts) -> bool:
    """IMEX runs or is meant to run here (its unit active or enabled)."""
    im = f.imex
    return im is not None and im.status != "absent" and (im.unit.active == "active" or im.unit.enabled == "enabled")


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def imex_state(f: HostFacts) -> ImexState:
    """IMEX active, its node list and config present, channel0 there, every node of the domain READY with
    every link Connected and the domain UP (docs/facts.md section 15)."""
    im = f.imex
    if im is None:
        return ImexState(None, unknown="IMEX not read (facts of a collector without the IMEX reading)")
    if im.status == "absent":
        return ImexState(False, ["IMEX is not installed (no nvidia-imex.service, config or nvidia-imex-ctl)"])
    problems: list[str] = []
    unknown: str | None = None
    active = im.unit.active
    if active is None or active == "unknown":
        unknown = im.reason or "nvidia-imex.service state not read"
    elif active != "active":
        problems.append(f"nvidia-imex.service is {active}")
    if im.config_present is False:
        problems.append(f"no IMEX config {im.config_path or ''}".rstrip())
    if im.nodes_file_present is False:
        problems.append(f"no IMEX node list {im.nodes_file or ''}".rstrip())
    elif im.nodes_file_present and not im.node_list:
        problems.append(f"the IMEX node list {im.nodes_file} is empty")
    if im.channels is not None and 0 not in im.channels:
        problems.append(f"no IMEX channel0 ({CHANNELS_DIR}/channel0)")
    if im.domain_state is None and not im.nodes:
        unknown = unknown or im.ctl_reason or im.reason or "nvidia-imex-ctl -N gave no domain status"
    else:
        not_ready = [f"#{n.index} {n.address} {n.status or '?'}" for n in im.nodes if n.status != "READY"]
        if not_ready:
            problems.append(f"{len(not_ready)} of {len(im.nodes)} IMEX node(s) not READY ({_listed(not_ready)})")
        links = im.links_not_connected_count or len(im.links_not_connected)
        if links:
            problems.append(f"{links} IMEX link(s) not Connected ({_listed(im.links_not_connected)})")
        if im.domain_state != "UP":
            problems.append(f"IMEX Domain State {im.domain_state or 'not printed'}")
    if problems:
        return ImexState(False, problems)
    return ImexState(None if unknown else True, unknown=unknown)


__all__ = ["ImexState", "cluster_uuid", "imex_in_use", "imex_state"]
