"""The NCCL pair test of ``audit --active full``: which nodes pair up, in which rounds, and how each
node is judged from its pairs (docs/facts.md section 17). Pure: no I/O.

Public API::

    ring_rounds(hosts) -> list of rounds, each a list of (launching host, partner)
    plan_pairs(facts) -> PairPlan (rounds over every group of like nodes, hosts not paired and why)
    judge_pairs(runs, not_paired, target) -> {host: [Finding]} for check active.nccl_pair_busbw

Nodes pair within a group of like nodes (the same GPU model and GPU count) in name order, along a
ring: round 1 pairs (0,1), (2,3), ...; round 2 pairs (1,2), (3,4), ..., (n-1,0). An odd ring cannot
close in two rounds of disjoint pairs, so round 3 runs its last edge (n-1,0) alone; two nodes make
one pair. Every node is then in two pairs (one with two nodes), and no node runs two pairs at once.

Judging, per node, from its pairs against ``active.nccl_pair_busbw_min_gbs[<GPU model>]``:

- any ``#wrong`` or out-of-bounds value in a pair fails both its nodes (error): data is corrupted;
- a node in two or more low pairs is the common cause: it fails (error);
- a node whose one low pair is with such a node is explained by it: a note, or unknown when the
  node has no good pair of its own to show;
- a low pair whose nodes both reach the floor with another partner is the path between them: a
  warning on both, naming the partner;
- otherwise a low pair with no good pair beside it fails the node (error): nothing tells it apart
  from its partner (two nodes), or its partner is good with another node;
- a pair that did not run, ran short, or has no floor for its GPU model is unknown on both nodes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from k3fleet.models.facts import HostFacts
from k3fleet.models.findings import Finding, FindingKind, Severity
from k3fleet.models.pairs import PairRun
from k3fleet.models.target import Target
from k3fleet.verdict.check import Check, check, render, template_values

CHECK = "active.nccl_pair_busbw"

# The pair check's catalogue entry (docs/architecture.md "Adding a check").
CHECKS: tuple[Check, ...] = (
    check("active.nccl_pair_busbw", "NCCL all-reduce bandwidth between nodes",
          "all_reduce_perf across each pair of like nodes (mpirun, one rank per GPU, NCCL_ALGO=Ring) measures what "
          "the RDMA rails, cables and switches carry between them, which the loopback ib_write_bw cannot see; its "
          "peak busbw at the largest message is judged against active.nccl_pair_busbw_min_gbs for the GPU model. "
          "Each node is in two pairs: one in two low pairs is the cause, a low pair of two otherwise good nodes "
          "is the path between them, and #wrong results mean corrupted data.",
          "error",
          "On the node named: ibstat and ib_write_bw to its partner per rail, the rails' cables and switch ports "
          "(ibdiagnet, port counters), GPUDirect RDMA (nvidia_peermem, NCCL_DEBUG=INFO shows GDRDMA) and PCIe "
          "ACS; for a low path between two good nodes, the leaf/spine ports between them. Drain it from "
          "multi-node serving until audit --active full passes.",
          source='docs/facts.md section 17 (nccl-tests issues 290 and 319: 46-48 GB/s busbw per NDR 400 Gb/s NIC with '
          'NCCL_ALGO=Ring between two nodes)'),
)
UNKNOWN_FIX = ("Make the pair test runnable on both nodes: mpirun and all_reduce_perf (nccl-tests built with "
               "MPI=1) on the PATH, SSH between the nodes without a password for the audit's user, both nodes "
               "idle; evidence.reason says what was missing; then re-run audit --active full.")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def ring_rounds(hosts: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint pairs along the ring of ``hosts`` (in the order given); the first of each
    pair launches. Fewer than two hosts: no round."""
    n = len(hosts)
    if n < 2:
        return []
    if n == 2:
        return [[(hosts[0], hosts[1])]]
    first = [(hosts[i], hosts[i + 1]) for i in range(0, n - 1, 2)]
    second = [(hosts[i], hosts[(i + 1) % n]) for i in range(1, n, 2)]
    rounds = [first, second]
    if n % 2:
        rounds.append([(hosts[n - 1], hosts[0])])
    return rounds


def host_shape(f: HostFacts) -> tuple[str | None, int | None]:
    """The node's GPU model (the most common name) and GPU count, as the facts give them."""
    names = [g.name for g in f.driver.gpus if g.name]
    model = Counter(names).most_common(1)[0][0] if names else None
    count = f.driver.gpu_count if f.driver.gpu_count is not None else (len(f.driver.gpus) or None)
    return model, count


def _not_eligible(f: HostFacts) -> str | None:
    """Why the node cannot take part in a pair, or None."""
    a = f.active
    if a is None or a.level != "full":
        return "the node ran no active checks at the full level"
    if a.skipped:
        return f"active checks did not run: {a.skipped}"
    if a.status != "ok" and a.dcgm is None:
        return f"active checks did not run: {a.reason or 'no result'}"
    model, count = host_shape(f)
    if not model or not count:
        return "the node's GPU model or count could not be read"
    if f.rdma.status != "ok" or not any(p.state == "ACTIVE" for d in f.rdma.devices for p in d.ports):
        return "the node has no ACTIVE RDMA rail (rdma facts)"
    return None


@dataclass
class PairPlan:
    """The pairs to run, round by round, and per node what the launcher needs."""

    rounds: list[list[tuple[str, str]]] = field(default_factory=list)
    not_paired: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    # How the launcher reaches a node: its own hostname when it reported one, else its inventory name.
    addresses: dict[str, str] = field(default_factory=dict)


def plan_pairs(facts: Mapping[str, HostFacts]) -> PairPlan:
    """Group the eligible nodes by GPU model and count and schedule each group's ring; round k of
    every group runs together. Deterministic: groups and nodes in name order."""
    plan = PairPlan()
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for name in sorted(facts):
        f = facts[name]
        why = _not_eligible(f)
        if why is not None:
            plan.not_paired[name] = why
            continue
        model, count = host_shape(f)
        assert model is not None and count is not None
        groups[(model, count)].append(name)
        plan.gpus[name], plan.models[name] = count, model
        plan.addresses[name] = f.hostname or name
    for (model, count), names in sorted(groups.items()):
        if len(names) < 2:
            plan.not_paired[names[0]] = f"no other eligible node with {count}x {model} to pair with"
            continue
        for k, pairs in enumerate(ring_rounds(names)):
            if k == len(plan.rounds):
                plan.rounds.append([])
            plan.rounds[k].extend(pairs)
    return plan


def max_bytes_of(size: str) -> int:
    """``8G`` -> 8589934592, as all_reduce_perf reads its ``-e`` (binary multiples)."""
    unit = size[-1:].upper() if size[-1:].isalpha() else ""
    return int(size[: len(size) - len(unit)]) * _UNITS[unit]


@dataclass
class _Judged:
    run: PairRun
    outcome: str  # good, low, wrong, unknown
    floor: float | None
    why: str | None = None

    def partner(self, host: str) -> str:
        a, b = self.run.hosts
        return b if host == a else a

    def row(self) -> dict[str, Any]:
        r = self.run
        return {"hosts": r.hosts, "round": r.round, "outcome": self.outcome, "peak_busbw_gbs": r.peak_busbw_gbs,
                "min_gbs": self.floor, "max_bytes": r.max_bytes, "ranks": r.ranks, "gpus": r.gpus,
                "wrong": r.wrong, "out_of_bounds": r.out_of_bounds, "rc": r.rc, "reason": self.why or r.reason}


def _judge_run(r: PairRun, target: Target) -> _Judged:
    floor = target.active.nccl_pair_busbw_min_gbs.get(r.gpu_model or "")
    where = f"on {r.hosts[0]}"
    if not r.ran or r.error:
        return _Judged(r, "unknown", floor, f"{where}: {r.reason or r.error or 'not run'}")
    if r.peak_busbw_gbs is None:
        return _Judged(r, "unknown", floor, f"{where}: {r.reason or 'no result row in its output'}")
    if r.wrong or r.out_of_bounds:
        return _Judged(r, "wrong", floor)
    want = max_bytes_of(target.active.nccl_max_bytes)
    if r.max_bytes is not None and r.max_bytes < want:
        return _Judged(r, "unknown", floor, f"{where}: the run stopped at {r.max_bytes} B of {want} B"
                       + (f" ({r.reason})" if r.reason else ""))
    if r.ranks is not None and r.gpus and r.ranks != 2 * r.gpus:
        return _Judged(r, "unknown", floor, f"{where}: it ran {r.ranks} ranks, {2 * r.gpus} expected (one per GPU)")
    if floor is None:
        return _Judged(r, "unknown", None, f"the target's active.nccl_pair_busbw_min_gbs has no entry for "
                       f"{r.gpu_model or 'this GPU'} (measured {r.peak_busbw_gbs:g} GB/s)")
    return _Judged(r, "good" if r.peak_busbw_gbs >= floor else "low", floor)


def _bw(j: _Judged, host: str) -> str:
    return f"{j.partner(host)} {j.run.peak_busbw_gbs:g} GB/s"


def judge_pairs(runs: Iterable[PairRun], not_paired: Mapping[str, str], target: Target) -> dict[str, list[Finding]]:
    """Per node, its findings of check ``active.nccl_pair_busbw`` (none for a node whose pairs are all good)."""
    fix = render(CHECKS[0].fix, template_values(target))
    every = [_judge_run(r, target) for r in runs]
    per_host: dict[str, list[_Judged]] = defaultdict(list)
    for j in every:
        for h in j.run.hosts:
            per_host[h].append(j)
    low = {h: [j for j in js if j.outcome == "low"] for h, js in per_host.items()}
    good = {h: [j for j in js if j.outcome == "good"] for h, js in per_host.items()}
    # GPU models whose every judged pair (two or more) is low: a cause the nodes share, not one node.
    tally = Counter((j.run.gpu_model, j.outcome) for j in every)
    shared_cause = {m for (m, outcome), n in tally.items() if outcome == "low" and n >= 2 and not tally[(m, "good")]}
    out: dict[str, list[Finding]] = defaultdict(list)

    def add(host: str, severity: Severity, kind: FindingKind, message: str, judged: Sequence[_Judged],
            cause: str | None = None) -> None:
        floor = next((j.floor for j in judged if j.floor is not None), None)
        ev: dict[str, Any] = {"pairs": [j.row() for j in judged], "min_gbs": floor,
                              "gpu_model": judged[0].run.gpu_model if judged else None}
        how = (f"None on this node: {cause}'s finding names the cause; re-run audit --active full once it is "
               "fixed." if cause else UNKNOWN_FIX if kind == "unknown" else fix)
        out[host].append(Finding(check_id=CHECK, severity=severity, kind=kind, host=host,
                                 message=message, evidence=ev, fix=how))

    for h in sorted(per_host):
        js = per_host[h]
        wrong = [j for j in js if j.outcome == "wrong"]
        if wrong:
            add(h, "error", "fail", "all_reduce_perf across the node and "
                + ", ".join(j.partner(h) for j in wrong) + " reports wrong results ("
                + ", ".join(f"{j.run.wrong or 0} #wrong, {j.run.out_of_bounds or 0} out of bounds" for j in wrong)
                + "): data is corrupted between the nodes", wrong)
        mine, ok = low[h], good[h]
        if mine and mine[0].run.gpu_model in shared_cause:
            add(h, "error", "fail", f"every pair of the {mine[0].run.gpu_model} nodes is below {mine[0].floor:g} "
                f"GB/s (this node's: {'; '.join(_bw(j, h) for j in mine)}): a cause they share (NCCL settings, "
                "GPUDirect RDMA, the fabric) or a floor above what their rails carry, not one node", mine)
        elif len(mine) >= 2:
            add(h, "error", "fail", f"{len(mine)} of the node's pairs are below {mine[0].floor:g} GB/s "
                f"({'; '.join(_bw(j, h) for j in mine)}): the node they share is the cause", mine)
        elif mine:
            j = mine[0]
            p = j.partner(h)
            head = f"the pair with {_bw(j, h)} is below {j.floor:g} GB/s"
            if len(low.get(p, ())) >= 2:
                if ok:
                    add(h, "info", "note", f"{head}; {p} is in {len(low[p])} low pairs and is judged the cause, "
                        f"while this node reaches the floor with {', '.join(_bw(g, h) for g in ok)}", [j, *ok],
                        cause=p)
                else:
                    add(h, "warning", "unknown", f"{head}, and {p} is in {len(low[p])} low pairs: this node has no "
                        "pair at the floor to show its own bandwidth", [j])
            elif ok and good.get(p):
                add(h, "warning", "fail", f"{head}, while both nodes reach the floor with other partners "
                    f"(this node with {', '.join(_bw(g, h) for g in ok)}): the path between the node and {p} "
                    "is the suspect", [j, *ok])
            elif ok:
                add(h, "info", "note", f"{head}; {p} has no pair at the floor, while this node reaches it with "
                    f"{', '.join(_bw(g, h) for g in ok)}", [j, *ok], cause=p)
            else:
                why = (f"and {p} reaches the floor with another node" if good.get(p)
                       else "and no other pair tells the node apart from its partner")
                add(h, "error", "fail", f"{head}, {why}", [j])
        unread: dict[str, list[_Judged]] = defaultdict(list)
        for j in js:
            if j.outcome == "unknown":
                unread[j.why or "no result"].append(j)
        for why, judged in unread.items():
            partners = ", ".join(j.partner(h) for j in judged)
            add(h, "warning", "unknown", f"the NCCL pair test with {partners} could not be judged: {why}", judged)
    for h in sorted(not_paired):
        if h not in per_host:
            add(h, "warning", "unknown", f"the NCCL pair test could not run: not paired: {not_paired[h]}", [])
    return dict(out)
