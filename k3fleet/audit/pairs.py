"""The NCCL pair test of ``audit --active full`` (docs/facts.md section 17): after the per-host play,
each round of pairs (:func:`k3fleet.verdict.pairs.plan_pairs`) runs as one ``playbooks/active_pairs.yml``
play on the rounds' launching nodes, every pair of a round at once.

Bounded: the launcher runs under the target's NCCL timeout (``active.timeouts.nccl_s``), the task under
that plus :data:`PAIR_MARGIN_S`, the round's play under that plus the margin again; the whole phase
under rounds x (timeout + 2 x margin), which ``pairs.json`` records as ``bound_s``. A pair whose node
does not answer, times out or returns nothing readable is recorded as not run, with why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from k3fleet.audit.runner import Observer, PlayResult, run_playbook
from k3fleet.errors import validation_line
from k3fleet.evidence import RunDir, layout
from k3fleet.models.facts import HostFacts
from k3fleet.models.pairs import PairPhase, PairRun
from k3fleet.models.target import Target
from k3fleet.verdict.pairs import PairPlan, plan_pairs

PLAYBOOK = "active_pairs.yml"
# The play's start-up and the launcher's fan-out to the partner, on top of the NCCL timeout.
PAIR_MARGIN_S = 30


def phase_bound(target: Target, rounds: int) -> tuple[int, int]:
    """(each pair's timeout, the whole phase's bound) in seconds."""
    timeout = target.active.timeouts.nccl_s
    return timeout, rounds * (timeout + 2 * PAIR_MARGIN_S)


def run_pair_phase(inventory: Path, rd: RunDir, facts: Mapping[str, HostFacts], target: Target,
                   spec: Mapping[str, Any], *, forks: int = 20, cancel: threading.Event | None = None,
                   host_key_checking: bool = True, observer: Observer | None = None) -> PairPhase:
    """Plan the pairs of the audited ``facts``, run them round by round and return what each measured.

    ``spec`` is the node module's active spec (:func:`k3fleet.audit.run.active_spec`). Fewer than two
    eligible nodes: no play runs, and the phase says why each node was not paired. ``observer`` sees
    each round's play as the audit's own (the CLI's progress: a round can take the NCCL timeout)."""
    plan = plan_pairs(facts)
    timeout, bound = phase_bound(target, len(plan.rounds))
    phase = PairPhase(timeout_s=timeout, bound_s=bound, not_paired=dict(plan.not_paired),
                      rounds=[[list(p) for p in pairs] for pairs in plan.rounds])
    started = time.monotonic()
    for k, pairs in enumerate(plan.rounds, 1):
        if phase.interrupted or (cancel is not None and cancel.is_set()):
            phase.interrupted = True
            phase.runs += [_not_run(a, b, k, plan, "interrupted before its round ran") for a, b in pairs]
            continue
        tag = f"{layout.PAIRS_PLAY}-{k}"
        extravars = {
            "k3fleet_pair_hosts": [a for a, _ in pairs],
            "k3fleet_pairs": {a: {"peer": b, "addresses": [plan.addresses[a], plan.addresses[b]], "gpus": plan.gpus[a]}
                              for a, b in pairs},
            "k3fleet_active_spec": dict(spec),
            "k3fleet_pair_task_timeout": timeout + PAIR_MARGIN_S,
        }
        play = run_playbook(PLAYBOOK, inventory, rd, artifacts_name=layout.ansible_dir(tag), extravars=extravars,
                            forks=max(1, min(forks, len(pairs))), observer=observer or Observer(), cancel=cancel,
                            timeout=timeout + 2 * PAIR_MARGIN_S, hosts=len(pairs),
                            host_key_checking=host_key_checking)
        rd.write_jsonl(layout.events_file(tag), play.events)
        results = play.results_with_key()
        phase.runs += [_run_of(a, b, k, plan, results.get(a), play) for a, b in pairs]
        phase.interrupted = play.interrupted
    phase.wall_s = round(time.monotonic() - started, 3)
    return phase


def _base(a: str, b: str, k: int, plan: PairPlan) -> dict[str, Any]:
    return {"hosts": [a, b], "round": k, "gpus": plan.gpus.get(a), "gpu_model": plan.models.get(a),
            "addresses": [plan.addresses.get(a, a), plan.addresses.get(b, b)]}


def _not_run(a: str, b: str, k: int, plan: PairPlan, reason: str) -> PairRun:
    return PairRun.model_validate({**_base(a, b, k, plan), "ran": False, "reason": reason})


def _run_of(a: str, b: str, k: int, plan: PairPlan, result: dict[str, Any] | None, play: PlayResult) -> PairRun:
    """The pair's run from its launching node's module result, or not run with what the play says."""
    if result is None:
        last = play.last(a)
        if last is None:
            why = "interrupted before the node answered" if play.interrupted else "no result (the play ended first)"
        elif last.status == "timeout":
            why = f"timed out: {last.message or 'task timeout'}"
        else:
            why = f"{last.status}: {last.message or 'the module failed without a message'}"
        return _not_run(a, b, k, plan, why)
    data = result.get("pair")
    if not isinstance(data, dict):
        return _not_run(a, b, k, plan, "the node's result has no pair section")
    base = _base(a, b, k, plan)
    try:
        return PairRun.model_validate({**data, **base, "addresses": data.get("addresses") or base["addresses"]})
    except ValidationError as exc:
        return _not_run(a, b, k, plan, validation_line(exc, "the node's result could not be read"))
