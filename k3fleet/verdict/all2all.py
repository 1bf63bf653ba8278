"""The all-to-all backend of the serving engine against the interconnect of the serving group.

vLLM's expert-parallel all-to-all backend is chosen with ``--all2all-backend`` (formerly the
``VLLM_ALL2ALL_BACKEND`` environment variable; docs/facts.md section 15). Each backend needs a
transport: the DeepEP family moves tokens between nodes over RDMA (every rail Active, GPUDirect
through ``nvidia_peermem`` or DMA-BUF), the FlashInfer NVLink family over a multi-node NVLink fabric
(every GPU of every node in one NVLink domain, a shared non-zero ClusterUUID and clique, with IMEX ready
on every node to share GPU memory across them). A backend on hosts
that lack its transport fails at start-up or runs on a fallback: an environment to rebuild, with
the fix named, never a serving limit.

Pure functions: the audit summarises the hosts (:func:`summarise`), the verdict judges the target's
backend and decide the backend the start-up log shows, both with :func:`judge`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import InterconnectSummary
from k3fleet.verdict.imex import ZERO_UUID, imex_state

Transport = Literal["rdma", "nvlink"]

# Backend name -> the cross-node transport it needs (None: none beyond NCCL's own choice).
# docs/facts.md section 15 (vLLM expert parallel deployment docs; Kimi K3 recipe).
BACKENDS: dict[str, Transport | None] = {
    "deepep_v2": "rdma",
    "deepep_high_throughput": "rdma",
    "deepep_low_latency": "rdma",
    "flashinfer_nvlink_one_sided": "nvlink",
    "flashinfer_nvlink_two_sided": "nvlink",
    "flashinfer_all2allv": "nvlink",
    "allgather_reducescatter": None,
    "naive": None,
    "pplx": None,
}
FLAG = "--all2all-backend"
ENV = "VLLM_ALL2ALL_BACKEND"
# Hosts named per problem in a message; the evidence lists up to MAX_LISTED.
SHOWN, MAX_LISTED = 4, 64


def backend_of(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(backend, where it was read) from a serve command line and its environment; the flag wins over
    the environment variable, as in vLLM, where the flag replaced it."""
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if name.replace("_", "-") == FLAG:
            if eq:
                return value.strip() or None, FLAG
            if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                return argv[i + 1].strip(), FLAG
    from_env = (env or {}).get(ENV)
    if from_env and from_env.strip():
        return from_env.strip(), ENV
    return None, None


def _rdma_state(f: HostFacts, min_rate: float) -> tuple[bool | None, str | None]:
    """(ready, why not): every port ACTIVE/LinkUp at the target's rate and a GPUDirect path."""
    rd = f.rdma
    if rd.status == "unknown":
        return None, f"RDMA not read: {rd.reason or 'no reason given'}"
    ports = [(d.name, p) for d in rd.devices for p in d.ports]
    if not ports:
        return False, "no RDMA device"
    down = [f"{n}/{p.port} {p.state or '?'}/{p.phys_state or '?'}" for n, p in ports
            if not ((p.state_code == 4 or (p.state or "").upper() == "ACTIVE")
                    and (p.phys_state_code == 5 or (p.phys_state or "").lower() == "linkup"))]
    slow = [f"{n}/{p.port} {p.rate or p.rate_gbps}" for n, p in ports
            if p.rate_gbps is not None and p.rate_gbps < min_rate]
    flavour = f.driver.kernel_module.flavour
    dmabuf_env = f.nccl.settings.get("NCCL_DMABUF_ENABLE")
    dmabuf = flavour == "open" and not (dmabuf_env is not None and dmabuf_env.value.strip() == "0")
    why = []
    if down:
        why.append(f"rail(s) not Active: {', '.join(down[:SHOWN])}")
    if slow:
        why.append(f"rail(s) below {min_rate:g} Gb/s: {', '.join(slow[:SHOWN])}")
    if not rd.nvidia_peermem_loaded and not dmabuf:
        if rd.nvidia_peermem_loaded is None and flavour is None:
            return None, "GPUDirect path not read (nvidia_peermem and the module flavour unknown)"
        why.append("no GPUDirect RDMA path (nvidia_peermem not loaded, no DMA-BUF)")
    return (False, "; ".join(why)) if why else (True, None)


def _nvlink_state(f: HostFacts) -> tuple[str | None, str | None, bool]:
    """(the NVLink domain or None, why no/unknown domain, known).

    The domain is the GPUs' ClusterUUID, with their CliqueId where one is reported ("<uuid> clique 32766"):
    GPUs of one cluster in different cliques (NVLink partitions) do not reach each other (docs/facts.md
    section 15). The zero UUID stays bare: NVLink only inside the node.
    """
    gpus = f.driver.gpus
    if not gpus:
        return None, f"no GPU read ({f.driver.reason or f.driver.status})", False
    states = {g.fabric_state for g in gpus}
    if states - {"completed"}:
        if None in states:
            return None, "GPU fabric state not read", False
        return None, f"GPU fabric state {', '.join(sorted(s for s in states if s))} (not completed)", True
    uuids = {g.fabric_cluster_uuid for g in gpus}
    if None in uuids:
        return None, "GPU ClusterUUID not read", False
    if len(uuids) > 1:
        return None, f"GPUs in {len(uuids)} NVLink domains", True
    uuid = uuids.pop()
    cliques = {g.fabric_clique_id for g in gpus}
    if uuid == ZERO_UUID or cliques == {None}:
        return uuid, None, True
    if len(cliques) > 1:
        return None, f"GPUs in {len(cliques)} NVLink cliques of ClusterUUID {uuid}", True
    return f"{uuid} clique {cliques.pop()}", None, True


def summarise(serving: Iterable[tuple[str, HostFacts]], multi_node: bool, min_rate: float) -> InterconnectSummary:
    """What the serving group's hosts offer each transport (one pass over the hosts, in name order).

    Hosts of one node kind may share one facts object (the streaming verdict): each object is read once.
    """
    out = InterconnectSummary(multi_node=multi_node)
    rdma_unknown, rdma_missing = out.rdma_unknown, out.rdma_missing
    nvlink_missing, nvlink_unknown = out.nvlink_missing, out.nvlink_unknown
    imex_not_ready, imex_unknown = out.imex_not_ready, out.imex_unknown
    # id -> (the object itself, which keeps the id from being reused while it is in here, its states)
    seen: dict[int, tuple[HostFacts, tuple[bool | None, str | None], tuple[str | None, str | None, bool],
                          tuple[bool | None, str | None]]] = {}
    count = 0
    for name, f in serving:
        count += 1
        hit = seen.get(id(f))
        if hit is None:
            nvlink = _nvlink_state(f)
            imex: tuple[bool | None, str | None] = (True, None)
            if nvlink[0] is not None and nvlink[0] != ZERO_UUID:
                # A node of a multi-node NVLink domain: IMEX shares GPU memory across its nodes.
                st = imex_state(f)
                imex = (st.ready, "; ".join(st.problems) or st.unknown)
            hit = seen[id(f)] = (f, _rdma_state(f, min_rate), nvlink, imex)
        _, (ready, why), (uuid, nwhy, known), (imex_ready, iwhy) = hit
        if imex_ready is False:
            imex_not_ready[name] = iwhy or "IMEX not ready"
        elif imex_ready is None:
            imex_unknown[name] = iwhy or "unknown"
        if ready is None:
            rdma_unknown[name] = why or "unknown"
        elif not ready:
            rdma_missing[name] = why or "not ready"
        if uuid is not None:
            out.nvlink_domains[uuid] = out.nvlink_domains.get(uuid, 0) + 1
            if uuid == ZERO_UUID:
                out.nvlink_single_node.append(name)
        elif known:
            nvlink_missing[name] = nwhy or "no NVLink fabric"
        else:
            nvlink_unknown[name] = nwhy or "unknown"
    if count:
        out.serving_hosts = count  # one assignment: the model's attribute hook costs more than the count
    return out


@dataclass(frozen=True)
class Judgement:
    kind: Literal["fail", "unknown"]
    message: str
    fix: str
    hosts: dict[str, str]


def _listed(hosts: Mapping[str, str]) -> str:
    names = sorted(hosts)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return "; ".join(f"{h}: {hosts[h]}" for h in names[:SHOWN]) + more


def judge(backend: str | None, s: InterconnectSummary) -> Judgement | None:
    """A mismatch (fail), facts that could not be read (unknown), or None when the backend fits."""
    if backend is None or not s.serving_hosts:
        return None
    transport = BACKENDS.get(backend)
    if backend not in BACKENDS:
        return Judgement("unknown", f"all-to-all backend {backend} is not one k3fleet knows the transport of",
                         f"Check the backend's transport by hand, or use one of {', '.join(sorted(BACKENDS))}.", {})
    if transport == "rdma":
        if not s.multi_node:
            return None  # one node: DeepEP's intranode kernels run over NVLink
        if s.rdma_missing:
            return Judgement(
                "fail", f"{backend} moves tokens between nodes over RDMA, but {len(s.rdma_missing)} of "
                f"{s.serving_hosts} serving host(s) have no working RDMA path ({_listed(s.rdma_missing)})",
                "Bring every rail of every serving node up at full rate (cabling, subnet manager) and give "
                "GPUDirect a path (modprobe nvidia_peermem, or open modules with DMA-BUF), or leave those hosts "
                "out of the serving group; on a multi-node NVLink fabric use --all2all-backend "
                "flashinfer_nvlink_one_sided instead.", dict(s.rdma_missing))
        if s.rdma_unknown:
            return Judgement("unknown", f"{backend} needs RDMA on every node; not read on {_listed(s.rdma_unknown)}",
                             "Make the RDMA facts readable (sysfs infiniband, lsmod) and re-run the audit.",
                             dict(s.rdma_unknown))
        return None
    if transport == "nvlink":
        if s.nvlink_missing:
            return Judgement(
                "fail", f"{backend} needs an NVLink fabric, but {_listed(s.nvlink_missing)}",
                "Start Fabric Manager (and NVLink Subnet Manager / IMEX on NVL72 racks) until every GPU's fabric "
                "state is Completed, or use --all2all-backend deepep_v2 over RDMA.", dict(s.nvlink_missing))
        if s.nvlink_unknown:
            return Judgement("unknown", f"{backend} needs an NVLink fabric; not read on {_listed(s.nvlink_unknown)}",
                             "Make the GPUs' fabric state and ClusterUUID readable (NVML or nvidia-smi -q) and "
                             "re-run the audit.", dict(s.nvlink_unknown))
        if s.multi_node:
            domains = [u for u in s.nvlink_domains if u != ZERO_UUID]
            if s.nvlink_single_node or len(domains) != 1:
                why = (f"{len(s.nvlink_single_node)} host(s) have NVLink only inside the node (ClusterUUID zero: "
                       f"{', '.join(sorted(s.nvlink_single_node)[:SHOWN])})" if s.nvlink_single_node
                       else f"the hosts are in {len(domains)} NVLink domains")
                return Judgement(
                    "fail", f"{backend} needs one multi-node NVLink domain across the serving group, but {why}",
                    "Serve across nodes with --all2all-backend deepep_v2 over RDMA (every rail Active, "
                    "nvidia_peermem or DMA-BUF), or place the serving group inside one NVLink domain "
                    "(GB200/GB300 NVL72 with IMEX).",
                    {h: "NVLink only inside the node" for h in s.nvlink_single_node[:MAX_LISTED]})
            if s.imex_not_ready:
                return Judgement(
                    "fail", f"{backend} shares GPU memory across the nodes of the NVLink domain through IMEX, but "
                    f"IMEX is not ready on {len(s.imex_not_ready)} of {s.serving_hosts} serving host(s) "
                    f"({_listed(s.imex_not_ready)})",
                    "Start nvidia-imex on every node of the domain with the domain's node list "
                    "(IMEX_NODE_CONFIG_FILE, default /etc/nvidia-imex/nodes_config.cfg: every compute tray's IP, the "
                    "same file on every node; systemctl enable --now nvidia-imex), create "
                    "/dev/nvidia-caps-imex-channels/channel0, and wait until nvidia-imex-ctl -N shows every node "
                    "READY and Domain State UP; or leave those hosts out of the serving group.",
                    dict(s.imex_not_ready))
            if s.imex_unknown:
                return Judgement("unknown", f"{backend} needs IMEX ready across the NVLink domain; not read on "
                                 f"{_listed(s.imex_unknown)}",
                                 "Make the IMEX state readable (systemctl, /etc/nvidia-imex, nvidia-imex-ctl -N) and "
                                 "re-run the audit.", dict(s.imex_unknown))
    return None


__all__ = ["BACKENDS", "ENV", "FLAG", "ZERO_UUID", "Judgement", "backend_of", "judge", "summarise"]
