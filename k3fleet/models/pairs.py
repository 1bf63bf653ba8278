"""The NCCL pair test of ``audit --active full`` (docs/facts.md section 17): what each pair of nodes
measured and the schedule it ran on, as the audit's run directory keeps it (``pairs.json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from k3fleet.models.facts import NcclRun


class PairRun(NcclRun):
    """One all_reduce_perf across two nodes; ``gpus`` ranks on each, ``hosts[0]`` ran the launcher."""

    hosts: list[str] = Field(description="the pair's inventory names, the launching node first")
    round: int = Field(ge=1, description="the round the pair ran in (its nodes ran nothing else then)")
    addresses: list[str] = Field(default_factory=list, description="the nodes as the launcher reached them")
    gpu_model: str | None = None


class PairPhase(BaseModel):
    """``pairs.json``: the schedule, every pair's run and the hosts that were not paired (with why)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: int = Field(description="each pair's bound: the target's active.timeouts.nccl_s")
    bound_s: int = Field(description="the whole phase's bound: rounds x (timeout + the play's margin)")
    rounds: list[list[list[str]]] = Field(default_factory=list, description="per round, its pairs")
    runs: list[PairRun] = Field(default_factory=list)
    not_paired: dict[str, str] = Field(default_factory=dict, description="host -> why it ran no pair")
    interrupted: bool = False
    wall_s: float = 0.0
