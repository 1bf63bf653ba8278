"""The serving strategy: named by the target, or derived from the fleet's GPU memory.

``gpus.strategy: auto`` asks the verdict to work the layout out from the hardware: one
node of a GPU model holds ``per_node`` GPUs of that model's memory; where that covers
``gpus.weights_memory`` the fleet can serve ``single_node_tp``, otherwise it must spread
each instance over nodes (``gpus.multi_node_strategy``: 16 GPUs and RDMA on every node).
A fleet with any GPU model whose node cannot hold the weights is judged multi-node:
those nodes cannot serve alone, and one serving layout is judged per fleet.

Memory is compared in GiB (nvidia-smi reports MiB): against a figure given in GB, GiB
is the smaller reading of a node, so an estimate that sits on the edge never makes a
node look big enough when it is not.

Pure and O(n): one pass over the hosts' (GPU model, per-GPU memory) pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from k3fleet.models.findings import NodeMemory, StrategyDecision
from k3fleet.models.target import MIB_PER_GIB, Strategy, Target, is_multi_node


@dataclass(slots=True)
class _Model:
    hosts: int = 0
    min_mib: int = 0


def _weights_text(target: Target) -> str:
    w = target.gpus.weights_memory
    assert w is not None
    what = f"the {w.format} weights" if w.format else "the weights"
    flag = "" if w.confirmed else " (unconfirmed estimate: override gpus.weights_memory.gb)"
    return f"about {w.gb:g} GB that {what} need{flag}"


def _node_text(n: NodeMemory, per_node: int) -> str:
    return f"one node of {per_node}x {n.gpu_model} has {n.node_memory_gib:g} GiB of GPU memory"


def _down(x: float) -> float:
    # Shown rounded down: a node just short of the weights never reads as exactly enough.
    return math.floor(x * 10) / 10


def decide_strategy(hosts: Iterable[tuple[str | None, int | None]], target: Target) -> StrategyDecision:
    """The strategy to judge the fleet by, from each host's (GPU model, smallest per-GPU memory in MiB).

    A host whose memory is unknown counts under its GPU model when another host of that
    model reported memory; otherwise it is counted in ``hosts_unknown_memory``.
    """
    gpus = target.gpus
    models: dict[str, _Model] = {}
    unknown_models: dict[str | None, int] = {}
    for model, mib in hosts:
        if model is None or mib is None or mib <= 0:
            unknown_models[model] = unknown_models.get(model, 0) + 1
            continue
        m = models.get(model)
        if m is None:
            models[model] = _Model(1, mib)
        else:
            m.hosts += 1
            if mib < m.min_mib:
                m.min_mib = mib
    unknown = 0
    for model, n in unknown_models.items():
        if model is not None and model in models:
            models[model].hosts += n
        else:
            unknown += n

    w = gpus.weights_memory
    nodes: list[NodeMemory] = []
    for name, m in models.items():
        gib = m.min_mib / MIB_PER_GIB
        node = gib * gpus.per_node
        nodes.append(NodeMemory(gpu_model=name, hosts=m.hosts, gpu_memory_gib=_down(gib),
                                node_memory_gib=_down(node), holds_weights=w is not None and node >= w.gb))
    nodes.sort(key=lambda n: (-n.node_memory_gib, n.gpu_model))
    short = [n for n in nodes if not n.holds_weights]

    def decision(strategy: Strategy, derived: bool, reason: str) -> StrategyDecision:
        return StrategyDecision(
            strategy=strategy, setting=gpus.strategy, derived=derived, reason=reason,
            rdma_required=target.rdma_required_for(strategy), nodes=nodes, hosts_unknown_memory=unknown,
            weights_gb=w.gb if w else None, weights_confirmed=w.confirmed if w else None,
            weights_source=w.source if w else None, tensor_parallel_size=target.tensor_parallel_size(strategy),
            serve_command=target.serve_argv(strategy))

    explicit = gpus.explicit_strategy
    if explicit is not None:
        reason = f"gpus.strategy names {explicit}"
        if w is not None and short and not is_multi_node(explicit):
            reason += f"; but {_node_text(short[-1], gpus.per_node)}, below {_weights_text(target)}"
        return decision(explicit, False, reason)

    multi: Strategy = gpus.multi_node_strategy
    need = gpus.min_total_by_strategy.get(multi, gpus.per_node)
    if short:
        # The smallest node decides: it cannot serve the model alone.
        strategy: Strategy = multi
        reason = (f"{_node_text(short[-1], gpus.per_node)}, below {_weights_text(target)}: each instance "
                  f"spans nodes ({multi}: at least {need} GPUs, RDMA on every node)")
    elif nodes:
        strategy = "single_node_tp"
        smallest = nodes[-1]
        reason = (f"{_node_text(smallest, gpus.per_node)}, enough for {_weights_text(target)}: "
                  f"one node serves an instance")
    else:
        strategy = multi
        reason = (f"no host reported its GPU memory, so whether one node holds {_weights_text(target)} is "
                  f"unknown; judged as {multi} (at least {need} GPUs, RDMA on every node) until it is read")
    return decision(strategy, True, reason)
