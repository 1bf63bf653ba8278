"""Serving strategy: named by the target, or derived from the hosts' GPU memory (strategy: auto).

Inputs are (GPU model, smallest per-GPU memory in MiB) per host, as the rules' host
context gives them. 143771 MiB is what the lab's H200s report through nvidia-smi
(tests/fixtures/verdict/host_r580_h200_hgx.json), 183359 MiB the B200 fixture's.
"""

from __future__ import annotations

from typing import Any

import pytest

from k3fleet.models.target import Target
from k3fleet.targets import load_target
from k3fleet.verdict.strategy import decide_strategy

TARGET = load_target(None)
H200, B200 = ("NVIDIA H200", 143771), ("NVIDIA B200", 183359)
# 8 GPUs of this many MiB hold exactly the target's 1561 GB (the measured 1.42 TiB; compared as GiB).
HOLDS = 1561 * 1024 // 8
BIG = ("big GPU", HOLDS)


def _gpus(**update: Any) -> Target:
    return TARGET.model_copy(update={"gpus": TARGET.gpus.model_copy(update=update)})


def _rdma(**update: Any) -> Target:
    return TARGET.model_copy(update={"rdma": TARGET.rdma.model_copy(update=update)})


SINGLE = _gpus(strategy="single_node_tp")
DEP = _gpus(strategy="multi_node_dep")
SMALLER_WEIGHTS = _gpus(weights_memory=TARGET.gpus.weights_memory.model_copy(  # type: ignore[union-attr]
    update={"gb": 1000.0, "confirmed": True}))

# (case, hosts, target, strategy, derived, rdma required, phrase in the reason)
CASES: list[tuple[str, list[tuple[str | None, int | None]], Target, str, bool, bool, str]] = [
    ("lab: 8x H200 cannot hold the weights", [H200] * 8, TARGET, "multi_node_tp_dp", True, True,
     "one node of 8x NVIDIA H200 has 1123.2 GiB of GPU memory, below about 1561 GB that the MXFP4 weights need"),
    ("8x B200", [B200] * 2, TARGET, "multi_node_tp_dp", True, True, "8x NVIDIA B200 has 1432.4 GiB"),
    ("a node that holds the weights", [BIG] * 3, TARGET, "single_node_tp", True, False,
     "enough for about 1561 GB"),
    ("one MiB short", [("big GPU", HOLDS - 1)], TARGET, "multi_node_tp_dp", True, True,
     "has 1560.9 GiB of GPU memory, below about 1561 GB"),
    ("mixed fleet: the smaller nodes cannot serve alone", [BIG, H200, BIG], TARGET, "multi_node_tp_dp", True, True,
     "8x NVIDIA H200"),
    ("no memory read anywhere", [(None, None), ("NVIDIA H200", None)], TARGET, "multi_node_tp_dp", True, True,
     "no host reported its GPU memory"),
    ("no hosts at all", [], TARGET, "multi_node_tp_dp", True, True, "no host reported its GPU memory"),
    ("a corrected weights figure", [H200] * 4, SMALLER_WEIGHTS, "single_node_tp", True, False,
     "enough for about 1000 GB that the MXFP4 weights need:"),
    ("explicit single-node wins, says it does not fit", [H200], SINGLE, "single_node_tp", False, False,
     "gpus.strategy names single_node_tp; but one node of 8x NVIDIA H200 has 1123.2 GiB"),
    ("explicit multi-node on big nodes", [BIG], DEP, "multi_node_dep", False, True,
     "gpus.strategy names multi_node_dep"),
    ("auto's multi-node strategy is configurable", [H200], _gpus(multi_node_strategy="multi_node_tp_pp"),
     "multi_node_tp_pp", True, True, "(multi_node_tp_pp: at least 16 GPUs"),
    ("rdma.required false wins over the derivation", [H200], _rdma(required=False), "multi_node_tp_dp", True, False,
     "8x NVIDIA H200"),
]


@pytest.mark.parametrize(("case", "hosts", "target", "strategy", "derived", "rdma", "phrase"), CASES,
                         ids=[c[0] for c in CASES])
def test_decide_strategy(case: str, hosts: list[tuple[str | None, int | None]], target: Target, strategy: str,
                         derived: bool, rdma: bool, phrase: str) -> None:
    d = decide_strategy(hosts, target)
    assert (d.strategy, d.derived, d.rdma_required) == (strategy, derived, rdma), case
    assert phrase in d.reason, d.reason
    assert d.setting == target.gpus.strategy


def test_explicit_strategy_that_fits_says_nothing_more() -> None:
    assert decide_strategy([BIG], SINGLE).reason == "gpus.strategy names single_node_tp"


def test_unconfirmed_estimate_is_flagged_in_the_reason_and_evidence() -> None:
    # The packaged figure is the measured deployment's (llm-d), confirmed; the recipe's pre-release
    # estimate, marked unconfirmed, is flagged.
    d = decide_strategy([H200], TARGET)
    assert "unconfirmed" not in d.reason and d.weights_gb == 1561 and d.weights_confirmed is True
    assert d.weights_source and "llm-d" in d.weights_source
    estimate = _gpus(weights_memory=TARGET.gpus.weights_memory.model_copy(  # type: ignore[union-attr]
        update={"gb": 1680.0, "confirmed": False, "source": "Kimi K3 recipe: pre-release estimate"}))
    flagged = decide_strategy([H200], estimate)
    assert "unconfirmed estimate: override gpus.weights_memory.gb" in flagged.reason
    assert flagged.weights_confirmed is False


def test_node_evidence_per_model() -> None:
    d = decide_strategy([H200, BIG, ("NVIDIA H200", None), ("NVIDIA H200", 143000), (None, None), BIG], TARGET)
    assert [(n.gpu_model, n.hosts, n.holds_weights) for n in d.nodes] == [
        ("big GPU", 2, True), ("NVIDIA H200", 3, False)]
    h200 = d.nodes[1]
    # The smallest reading of a model counts: the strategy must work on every host of it.
    assert (h200.gpu_memory_gib, h200.node_memory_gib) == (139.6, 1117.1)
    # A host of unknown model and memory cannot be placed; the H200 without memory counts as an H200.
    assert d.hosts_unknown_memory == 1


def test_decision_is_independent_of_host_order() -> None:
    hosts = [H200, BIG, B200, ("NVIDIA H200", None), (None, None)]
    assert decide_strategy(hosts, TARGET) == decide_strategy(list(reversed(hosts)), TARGET)
