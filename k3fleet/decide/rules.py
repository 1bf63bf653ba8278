"""The decision table: evidence summary -> outcome, reasons, limits, approval. Pure: no I/O, no clock.

Each :class:`Rule` is one row of the table in docs/decision.md: when it fires, which outcome it
asks for, and whether it allows, limits or blocks approval. The decision takes the worst
outcome any rule asks for (``k3fleet.contracts.DECISION_PRECEDENCE``: rebuild_environment >
expand_capacity > observe_with_limits > go_live, the reason beside it) and lists every reason
with the evidence it rests on. Missing evidence is never a pass: a missing checklist item caps the
outcome at observe_with_limits and blocks approval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from k3fleet.accept import identity
from k3fleet.contracts import APPROVABLE_OUTCOMES, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, Outcome, worst_outcome
from k3fleet.decide.checklist import (
    OWNERS_ITEM,
    REVIEWER_ITEM,
    agent_item_of,
    bounded_agent_defects,
    build_checklist,
    chain_problems,
    is_custom,
    startup_of,
    topology_problems,
    triage_outside_audit,
    world_size,
)
from k3fleet.decide.envelope import envelope_gaps, tested_text, unproven
from k3fleet.evidence import layout
from k3fleet.models.evidence import (
    Baseline,
    ChecklistItem,
    Decision,
    EvidenceSummary,
    Limit,
    Reason,
    Ref,
)

# Rules that block only because something is not shown yet (exit 3, not 1): more evidence can lift them.
# The reason a decision the evidence would approve carries while it is unsigned (exit 3, a draft).
UNSIGNED_RULE = "signoff.unsigned"
NOT_DEFINITE = frozenset({"evidence.missing", "envelope.gap", "limits.unowned", "startup.other_server"})


@dataclass
class Hit:
    """One firing of a rule: what it saw, and the limit it sets when it allows with limits."""

    text: str
    evidence: list[Ref] = field(default_factory=list)
    limit: Limit | None = None


@dataclass(frozen=True)
class Rule:
    id: str
    outcome: Outcome
    approval: str  # allows, limits, blocks
    when: str
    test: Callable[[EvidenceSummary, list[ChecklistItem]], list[Hit]]


def _refs(*refs: Ref | None) -> list[Ref]:
    out: list[Ref] = []
    for r in refs:
        if r is not None and r not in out:
            out.append(r)
    return out


# -- rule tests --------------------------------------------------------------------------------------


def _chain(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    return [Hit(text, refs) for text, refs in chain_problems(s)]


def _change_incomplete(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    c = s.change
    if c is None or c.check:
        return []
    hits = []
    if c.failed_hosts:
        hits.append(Hit(f"change night {c.change_id or c.run}: {', '.join(c.failed_hosts)} did not reach the target "
                        "driver (failed or rolled back)", [c.ref]))
    if c.journal_problems:
        hits.append(Hit(f"change night {c.change_id or c.run}: journal damaged ({c.journal_problems[0]})", [c.ref]))
    return hits


def _load_oom(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    st = startup_of(s)
    if st is None or not st.model_load_oom:
        return []
    return [Hit(f"out of memory while loading the model: {f.message} (correct the environment or topology: "
                "parallel sizes, GPU memory utilisation, max-model-len; more traffic capacity does not help)",
                [f.ref]) for f in st.model_load_oom]


def _startup_failed(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    st = startup_of(s)
    if st is None or st.status != "fail":
        return []
    others = [f for f in st.findings if f.failed and f not in st.model_load_oom]
    return [Hit(f"start-up failed: {f.message}", [f.ref]) for f in others]


def _other_server(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    """The start-up log judged is of another server than the endpoint the live probes tested."""
    st = startup_of(s)
    if st is None or not st.server or s.accept is None:
        return []
    hits = []
    for name in ("prefix_cache", "agent", "load"):
        probe = getattr(s.accept, name)
        if probe is None or not probe.server:
            continue
        diff = identity.mismatches(st.server, probe.server)
        if diff:
            hits.append(Hit(f"the start-up evidence is from another server: the log ({st.ref.run}) and the endpoint "
                            f"{name} tested differ in {'; '.join(diff)}", _refs(st.ref, probe.ref)))
    return hits


def _prefix_no_reuse(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    pc = s.accept.prefix_cache if s.accept else None
    st = startup_of(s)
    if pc is None:
        return []
    flag_on = (st is not None and st.prefix_caching is True) or pc.caching_enabled is True
    no_reuse = pc.status == "fail" or pc.controlled_reuse is False
    if flag_on and no_reuse:
        return [Hit(f"prefix caching is switched on but no reuse was measured: {pc.reason or 'no cache hits'} "
                    "(no approval until fixed)", _refs(pc.ref, st.ref if st else None))]
    return []


def _prefix_off(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    if "--enable-prefix-caching" not in s.target.required_flags:
        return []
    st = startup_of(s)
    pc = s.accept.prefix_cache if s.accept else None
    off_refs = []
    if st is not None and st.prefix_caching is False:
        off_refs.append(st.ref)
    if pc is not None and pc.caching_enabled is False:
        off_refs.append(pc.ref)
    if not off_refs:
        return []
    return [Hit("prefix caching is off; the target serves with --enable-prefix-caching (off by default for "
                "Kimi K3)", off_refs)]


def _critical_repeated(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ag = s.accept.agent if s.accept else None
    if ag is None:
        return []
    n = s.policy.critical_repeated_failures
    return [Hit(f"{c.name} (critical path) failed {c.failures} of {c.runs} times"
                + (f": {', '.join(f'{k} x{v}' for k, v in sorted(c.defects.items()))}" if c.defects else "")
                + (f" at the {c.layer} layer" if c.layer else ""), [ag.ref])
            for c in ag.cases if c.critical and c.failures >= n]


def _noncritical_unbounded(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ag = s.accept.agent if s.accept else None
    if ag is None:
        return []
    cap = s.policy.max_noncritical_defect_rate
    return [Hit(f"{c.name} fails {c.failures}/{c.runs} ({c.failures / c.runs:.0%}), above the {cap:.0%} a "
                "non-critical feature may fail under limits", [ag.ref])
            for c in ag.cases if not c.critical and c.runs and c.failures and c.failures / c.runs > cap]


def _topology(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    a = s.audit
    out = []
    for text, refs in topology_problems(s):
        out.append(Hit(text, refs))
    # Too few GPUs for the strategy is the capacity rule's, not a topology correction.
    if a is not None and a.gpus_after_plan < a.gpus_required:
        out = [h for h in out if not h.text.startswith("start-up uses")]
    return out


def _only_topology_ooms(s: EvidenceSummary) -> bool:
    """Every OOM record of the load run is a topology OOM: uneven pressure, not a lack of memory."""
    ld = s.accept.load if s.accept else None
    return ld is not None and bool(ld.oom_records) and all(r.topology for r in ld.oom_records)


def _topology_oom(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None:
        return []
    tops = [r for r in ld.oom_records if r.topology]
    if not tops:
        return []
    r = tops[0]
    when = f"{r.t_s:g} s into the load run" if r.t_s is not None else "at an unrecorded time"
    step = " ".join(str(x) for x in (r.phase, r.step) if x is not None)
    where = ", ".join(x for x in (step, f"{r.concurrency} concurrent" if r.concurrency else None) if x)
    kv = ", ".join(f"engine {e} {v:.2f}" for e, v in sorted(r.kv_by_engine.items()))
    last = (f"the last successful request ended at {r.last_success_t_s:g} s (id {r.last_success_id or '?'})"
            if r.last_success_t_s is not None else "no request had succeeded before it")
    more = f"; {len(tops) - 1} more topology OOM record(s)" if len(tops) > 1 else ""
    return [Hit(f"topology OOM on node {r.node or '?'}, engine {r.engine or '?'}, {when}"
                + (f" ({where})" if where else "") + (f": KV usage {kv}" if kv else "") + f"; {last}{more}. "
                "Uneven KV pressure across engines is a configuration / topology fault that more capacity does "
                "not fix: rebalance the data-parallel ranks (--data-parallel-size and ranks per node), check the "
                "all-to-all backend (--all2all-backend) and the expert placement (--enable-eplb), then test again",
                _refs(ld.ref, ld.curves_ref))]


def _capacity(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    a = s.audit
    if a is None or a.gpus_after_plan >= a.gpus_required:
        return []
    return [Hit(f"{a.gpus_after_plan} GPUs healthy even after the planned driver change, {a.gpus_required} required "
                f"({a.strategy or 'strategy ?'})", [a.ref])]


def _above_profile_only(s: EvidenceSummary) -> bool:
    """The collapse happened only beyond the production profile, which the run held."""
    ld = s.accept.load if s.accept else None
    p = s.profile
    if ld is None or p is None or ld.outcome != "collapse":
        return False
    conc_above = ld.failed_concurrency is not None and ld.failed_concurrency > p.concurrency \
        and (ld.held_concurrency or 0) >= p.concurrency
    ctx_above = ld.failed_context is not None and ld.failed_context > p.context_max \
        and (ld.held_context or 0) >= p.context_p99
    conc_fine = ld.failed_concurrency is None or ld.failed_concurrency > p.concurrency
    ctx_fine = ld.failed_context is None or ld.failed_context > p.context_max
    return (conc_above or ctx_above) and conc_fine and ctx_fine


def _collapse(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None:
        return []
    out = []
    # A collapse whose every OOM was a topology OOM is load.topology_oom's: placement, not capacity.
    topology_only = _only_topology_ooms(s)
    if ld.outcome == "collapse" and not _above_profile_only(s) and not topology_only:
        out.append(Hit(f"the server collapsed under controlled load: {ld.reason or 'queue or OOM collapse'}",
                       _refs(ld.ref, ld.curves_ref)))
    counts = [(ld.restarts, "restart(s)"), (None if topology_only else ld.oom_events, "OOM event(s)")]
    seen = [f"{n} {what}" for n, what in counts if n]
    if seen and ld.outcome != "collapse":
        out.append(Hit(f"{', '.join(seen)} in the sustained run under the tested limits", [ld.ref]))
    return out


def _limit_above_profile(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    p = s.profile
    if ld is None or p is None or not _above_profile_only(s) or _only_topology_ooms(s):
        return []
    out = []
    if ld.failed_concurrency is not None:
        held = ld.held_concurrency or p.concurrency
        out.append(Hit(f"the server collapsed only above the production profile: at {ld.failed_concurrency} concurrent "
                       f"sessions ({ld.reason or 'OOM or queue collapse'}), the profile peaks at {p.concurrency} and "
                       f"{held} held: a documented limit, enforced by a rate limit", _refs(ld.ref, ld.curves_ref),
                       Limit(kind="concurrency_ceiling", value=str(held),
                             text=f"at most {held} concurrent requests (gateway or --max-num-seqs): the server "
                                  f"collapses at {ld.failed_concurrency}", owner=s.service_owner,
                             evidence=_refs(ld.ref, ld.curves_ref))))
    if ld.failed_context is not None:
        held_ctx = ld.held_context or p.context_max
        out.append(Hit(f"a {ld.failed_context}-token context fails, above the profile's maximum {p.context_max}: a "
                       "documented limit, enforced at the gateway", [ld.ref],
                       Limit(kind="max_context_tokens", value=str(held_ctx), text=f"context at most {held_ctx} tokens",
                             owner=s.service_owner, evidence=[ld.ref])))
    return out


def _below_profile(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    p = s.profile
    if ld is None or p is None or ld.outcome != "ceiling" or ld.ceiling is None or ld.ceiling >= p.concurrency:
        return []
    return [Hit(f"stable only up to {ld.ceiling} concurrent sessions within the SLOs, the production profile peaks "
                f"at {p.concurrency}: more capacity (or a configuration that holds it) is needed",
                _refs(ld.ref, ld.curves_ref, p.ref))]


def _context_below_profile(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    p = s.profile
    if ld is None or p is None or ld.outcome != "adjust_config":
        return []
    ctx = ld.failed_context or ld.envelope.get("max_context_tokens")
    if isinstance(ctx, int) and ctx > p.context_max:
        return []
    return [Hit(f"a {ctx or '?'}-token context is refused, within the production profile (max {p.context_max}, "
                f"p99 {p.context_p99}): adjust the configuration (--max-model-len, KV capacity) and test again",
                _refs(ld.ref, p.ref))]


def _ceiling(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None or ld.outcome != "ceiling":
        return []
    if s.profile is not None and ld.ceiling is not None and ld.ceiling < s.profile.concurrency:
        return []
    if ld.ceiling is None:
        return [Hit("stable only under a concurrency ceiling, but the ceiling was not recorded", [ld.ref])]
    return [Hit(f"stable only up to {ld.ceiling} concurrent sessions: limit traffic to that ceiling",
                _refs(ld.ref, ld.curves_ref),
                Limit(kind="concurrency_ceiling", value=str(ld.ceiling),
                      text=f"at most {ld.ceiling} concurrent requests (gateway or --max-num-seqs)",
                      owner=s.service_owner, evidence=_refs(ld.ref, ld.curves_ref)))]


def _adjust_config(s: EvidenceSummary, items: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None or ld.outcome != "adjust_config" or _context_below_profile(s, items):
        return []
    ctx = ld.envelope.get("max_context_tokens")
    return [Hit(f"long inputs fail above {ctx or '?'} tokens: limit the context to the tested envelope",
                [ld.ref], Limit(kind="max_context_tokens", value=str(ctx), text=f"context at most {ctx} tokens",
                                owner=s.service_owner, evidence=[ld.ref]))]


def _bounded_defect(s: EvidenceSummary, items: list[ChecklistItem]) -> list[Hit]:
    ag = s.accept.agent if s.accept else None
    if ag is None:
        return []
    by_id = {i.id: i for i in items}
    out = []
    for c in bounded_agent_defects(s):
        item = by_id.get(agent_item_of(c.name) or "")
        entry = item.owner if item is not None else None
        rate = entry.rate_limit if entry and entry.rate_limit else "rate limit to be set by the owner"
        doc = entry.documented if entry and entry.documented else "to be documented"
        out.append(Hit(f"{c.name}: {c.failures}/{c.runs} defects ({', '.join(sorted(c.defects)) or 'failed runs'}), "
                       "non-critical and bounded: serve it as a limited, documented feature", [ag.ref],
                       Limit(kind="rate_limit", value=rate, text=f"{c.name}: {rate}; documented: {doc}",
                             owner=entry.owner if entry else None, evidence=[ag.ref])))
    return out


def _critical_single(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ag = s.accept.agent if s.accept else None
    if ag is None:
        return []
    n = s.policy.critical_repeated_failures
    return [Hit(f"{c.name} (critical path) failed once in {c.runs} runs: the client must validate and retry",
                [ag.ref], Limit(kind="retry", value=c.name, text=f"{c.name}: schema validation with retry in the "
                                                                 "client", owner=s.service_owner, evidence=[ag.ref]))
            for c in ag.cases if c.critical and 0 < c.failures < n]


def _audit_limits(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    a = s.audit
    if a is None or a.outcome != "observe_with_limits":
        return []
    failed = sorted(h.host for h in a.hosts if h.status in ("fail", "unreachable"))
    out = [Hit(f"audit: {r}", [a.ref]) for r in a.reasons]
    if failed:
        out.append(Hit(f"serve without {', '.join(failed)}", [a.ref],
                       Limit(kind="hosts_left_out", value=",".join(failed),
                             text=f"hosts left out of serving: {', '.join(failed)}", owner=s.service_owner,
                             evidence=[a.ref])))
    return out


def _unexplained(s: EvidenceSummary, items: list[ChecklistItem]) -> list[Hit]:
    """A failed item no other rule explains still stops approval: a failure is never a pass."""
    explained = {"image.tag_digest", "vllm.version_channel", "container.cuda13", "chain.agree", "hosts.driver_branch",
                 "topology.parallel", "startup.model_load_memory", "load.no_termination", "prefix_cache.warm",
                 "agent.tool_schema", "agent.client_contract", "agent.retry", "build.digest"}
    return [Hit(f"{i.title}: {i.detail}", i.evidence) for i in items if i.status == "fail" and i.id not in explained]


def _no_profile(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    if s.profile is not None:
        return []
    ld = s.accept.load if s.accept else None
    tested = tested_text(ld)
    run_profile = s.accept.profile_name if s.accept else None
    hint = (f" (the acceptance run was tested against profile {run_profile!r}: give decide --profile)"
            if run_profile else " (give decide --profile FILE)")
    return [Hit("no production profile: production concurrency, p99 context, sustained duration, tools, schemas "
                f"and SLOs are unproven; serve only the tested envelope ({tested}){hint}",
                _refs(ld.ref if ld else None),
                Limit(kind="tested_envelope", value=tested, text=f"serve within the tested envelope: {tested}",
                      owner=s.service_owner, evidence=_refs(ld.ref if ld else None)))]


def _envelope_gap(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    return [Hit(f"the tested envelope does not cover the profile {s.profile.name!r}: {text}" if s.profile else text,
                refs) for text, refs in envelope_gaps(s)]


def _norm(name: str) -> str:
    return name.strip().lower().split("@", 1)[0]


def operators_of(s: EvidenceSummary) -> list[str]:
    """Everyone recorded as running an evidence run: command.json's user, an explicit --operator, the change
    night's operator. Operator-supplied captures (triage) are pasted, not run, and count too: the reviewer
    judges them."""
    names = {r.user for r in s.runs if r.user} | {r.operator for r in s.runs if r.operator}
    if s.change is not None and s.change.operator:
        names.add(s.change.operator)
    return sorted(names)


def _two_people(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    if not s.reviewer:
        return []
    ops = operators_of(s)
    out = []
    for who, role in ((s.reviewer, "reviewer"), (s.second_reviewer, "second reviewer")):
        if not who:
            continue
        same = [o for o in ops if _norm(o) == _norm(who)]
        if same:
            runs = [r.label for r in s.runs if (r.user and _norm(r.user) == _norm(who))
                    or (r.operator and _norm(r.operator) == _norm(who))]
            if s.change is not None and s.change.operator and _norm(s.change.operator) == _norm(who):
                runs.append(s.change.run)
            out.append(Hit(f"the {role} {who!r} is also the operator of {', '.join(sorted(set(runs))) or 'the runs'}: "
                           "a decision needs a second person who did not run the evidence",
                           [Ref(run=r, file=layout.COMMAND) for r in sorted(set(runs))]))
    if s.second_reviewer and _norm(s.second_reviewer) == _norm(s.reviewer):
        out.append(Hit(f"the second reviewer is the reviewer ({s.reviewer!r})", []))
    return out


def _missing(s: EvidenceSummary, items: list[ChecklistItem]) -> list[Hit]:
    return [Hit(f"missing evidence: {i.title}: {i.detail}", i.evidence) for i in items if i.status == "missing"]


RULES: tuple[Rule, ...] = (
    Rule("chain.mismatch", "rebuild_environment", "blocks",
         "a version or image mismatch anywhere in the image -> CUDA -> driver chain (audit, start-up, build, "
         "operator captures)", _chain),
    Rule("change.incomplete", "rebuild_environment", "blocks",
         "the change night left hosts failed or rolled back, or its journal is damaged", _change_incomplete),
    Rule("startup.model_load_oom", "rebuild_environment", "blocks",
         "out of memory while the model loads: correct the environment or topology", _load_oom),
    Rule("startup.failed", "rebuild_environment", "blocks",
         "start-up failed for another reason (CUDA init, NCCL, kernels, architecture)", _startup_failed),
    Rule("prefix_cache.flag_without_reuse", "rebuild_environment", "blocks",
         "prefix caching switched on but no reuse measured: no approval until fixed", _prefix_no_reuse),
    Rule("prefix_cache.off", "rebuild_environment", "blocks",
         "prefix caching off although the target serves with it", _prefix_off),
    Rule("agent.critical_repeated", "rebuild_environment", "blocks",
         "repeated protocol or parser failure on a critical path: no go-live", _critical_repeated),
    Rule("agent.noncritical_unbounded", "rebuild_environment", "blocks",
         "a non-critical agent defect above the bounded rate", _noncritical_unbounded),
    Rule("topology.mismatch", "rebuild_environment", "blocks",
         "GPU count, interconnect or parallel settings do not fit the hosts", _topology),
    Rule("load.topology_oom", "rebuild_environment", "blocks",
         "an OOM under load with uneven KV pressure across engines (accept.load.topology_oom): rebalance the "
         "data-parallel ranks, check the all-to-all backend and expert placement", _topology_oom),
    Rule("load.context_below_profile", "rebuild_environment", "blocks",
         "a context within the production profile is refused: adjust the configuration", _context_below_profile),
    Rule("capacity.short", "expand_capacity", "blocks",
         "too few healthy GPUs even after the planned driver change", _capacity),
    Rule("load.collapse", "expand_capacity", "blocks",
         "sustained OOM, restarts or queue collapse under controlled limits, at or below the profile", _collapse),
    Rule("load.below_profile", "expand_capacity", "blocks",
         "the SLOs hold only below the production profile's concurrency", _below_profile),
    Rule("load.limit_above_profile", "observe_with_limits", "limits",
         "OOM or collapse only above the production profile: a documented limit with the rate limit to enforce",
         _limit_above_profile),
    Rule("load.ceiling", "observe_with_limits", "limits",
         "stable only under a concurrency ceiling: the ceiling is named", _ceiling),
    Rule("load.context_envelope", "observe_with_limits", "limits",
         "long inputs fail above the tested envelope: the context is limited", _adjust_config),
    Rule("agent.bounded_defect", "observe_with_limits", "limits",
         "a bounded, non-critical agent defect: rate limit, owner, documented feature", _bounded_defect),
    Rule("agent.critical_single", "observe_with_limits", "limits",
         "one failure on a critical path (below the repeated threshold): client validates and retries",
         _critical_single),
    Rule("audit.limits", "observe_with_limits", "limits",
         "the audit serves without failed hosts or with warnings", _audit_limits),
    Rule("profile.missing", "observe_with_limits", "limits",
         "no production profile: what is unproven is named; served only within the tested envelope", _no_profile),
    Rule("startup.other_server", "observe_with_limits", "blocks",
         "the start-up log is of another server than the endpoint the live probes tested (version, model, "
         "max_model_len, cache settings or port differ): the start-up evidence is from another server",
         _other_server),
    Rule("envelope.gap", "observe_with_limits", "blocks",
         "the tested envelope does not cover the profile (concurrency, p99 context, sustained duration, SLOs, "
         "tools, schemas, multimodal): each gap named", _envelope_gap),
    Rule("signoff.same_person", "observe_with_limits", "blocks",
         "the reviewer (or second reviewer) also ran an evidence run: two people are required", _two_people),
    Rule("checklist.failed", "observe_with_limits", "blocks",
         "a failed checklist item that no rule above explains", _unexplained),
    Rule("evidence.missing", "observe_with_limits", "blocks",
         "a checklist item without evidence: never a pass, never go_live", _missing),
)


def decide(summary: EvidenceSummary) -> Decision:
    """The go-live decision over one evidence summary (pure)."""
    items = build_checklist(summary)
    reasons: list[Reason] = []
    limits: list[Limit] = []
    outcome: Outcome = "go_live"
    blocked = False
    definite = False
    for rule in RULES:
        hits = rule.test(summary, items)
        for hit in hits:
            reasons.append(Reason(rule=rule.id, outcome=rule.outcome, approval=rule.approval,  # type: ignore[arg-type]
                                  text=hit.text, evidence=hit.evidence))
            if hit.limit is not None:
                limits.append(hit.limit)
        if hits:
            outcome = worst_outcome([rule.outcome], floor=outcome)
            if rule.approval == "blocks":
                blocked = True
                definite = definite or rule.id not in NOT_DEFINITE
    # Every limit is someone's: an owner, a deadline and a rollback action, or the decision says which lack one.
    unowned = _own_limits(summary, limits)
    if unowned:
        reasons.append(Reason(rule="limits.unowned", outcome="observe_with_limits", approval="blocks",
                              text="limits without an owner, a deadline and a rollback action: " + "; ".join(unowned)
                              + " (give them in --owners FILE under limits:)",
                              evidence=[r for lim in limits for r in lim.evidence][:3]))
        blocked = True
        outcome = worst_outcome([outcome], floor="observe_with_limits")
    missing = [i.id for i in items if i.status == "missing"]
    if not reasons:
        reasons.append(Reason(rule="all.pass", outcome="go_live", approval="allows",
                              text=f"every checklist item passes ({len(items)} items) and no rule fired",
                              evidence=[r for i in items for r in i.evidence][:1]))
    approved = not blocked and outcome in APPROVABLE_OUTCOMES
    # "A reviewer has signed the final go-live outcome": what the evidence would approve is a draft
    # until it is signed, never an exit 0 (docs/decision.md "Drafts").
    draft = approved and not summary.signed
    if draft:
        approved = False
        reasons.append(Reason(rule=UNSIGNED_RULE, outcome=outcome, approval="blocks",
                              text=f"draft: the evidence supports {outcome}, but the decision is unsigned; "
                                   "run decide again with --sign-key KEY to approve it",
                              evidence=[]))
    exit_code = EXIT_OK if approved else EXIT_FAILED if definite else EXIT_INCOMPLETE

    warnings = triage_outside_audit(summary)
    run_sha = summary.accept.profile_sha256 if summary.accept else None
    if summary.profile is not None and run_sha and summary.profile.sha256 and run_sha != summary.profile.sha256:
        warnings.append(f"the acceptance run {summary.accept.run if summary.accept else '?'} was tested against "
                        f"another profile ({summary.accept.profile_name if summary.accept else '?'}) than the one "
                        f"decided against ({summary.profile.name})")
    return Decision(
        outcome=outcome, approved=approved, exit_code=exit_code, draft=draft,
        track="custom" if is_custom(summary) else "official",
        reasons=reasons, limits=limits, missing=missing, warnings=warnings,
        checklist=items, reviewer=summary.reviewer,
        reviewed_at=summary.reviewed_at, service_owner=summary.service_owner,
        second_reviewer=summary.second_reviewer, operators=operators_of(summary),
        rollback_owner=summary.rollback_owner, rate_limits=rate_limits_of(summary, limits) if approved else [],
        profile=summary.profile, unproven=unproven(summary),
        baseline=baseline_of(summary, limits) if approved else None,
    )


def _own_limits(s: EvidenceSummary, limits: list[Limit]) -> list[str]:
    """Attach the owners file's entry to each limit (by kind); the limits that still lack one, worded."""
    entries = s.owners.limits if s.owners is not None else {}
    lacking = []
    for lim in limits:
        entry = entries.get(lim.kind)
        if entry is not None:
            lim.owner, lim.deadline, lim.rollback = entry.owner, entry.deadline, entry.rollback
        absent = [what for what, v in (("owner", lim.owner), ("deadline", lim.deadline), ("rollback", lim.rollback))
                  if not v]
        if absent:
            lacking.append(f"{lim.kind} ({lim.text}): no {', '.join(absent)}")
    return lacking


def rate_limits_of(s: EvidenceSummary, limits: list[Limit]) -> list[str]:
    """The rate limits in force with an approved decision: each limit, then the profile's envelope and its
    gateway limits."""
    out = [lim.text for lim in limits if lim.kind in ("concurrency_ceiling", "max_context_tokens", "rate_limit",
                                                       "tested_envelope")]
    p = s.profile
    if p is not None:
        out.append(f"at most {p.concurrency} concurrent requests and {p.context_max} context tokens (the production "
                   f"profile {p.name!r})")
        out += p.rate_limits
    return out


def baseline_of(s: EvidenceSummary, limits: list[Limit]) -> Baseline | None:
    """The accepted configuration: what a rollback of the serving side returns to."""
    st = startup_of(s)
    if st is None:
        return None
    ld = s.accept.load if s.accept else None
    pc = s.accept.prefix_cache if s.accept else None
    env = dict(s.audit.nccl) if s.audit else {}
    env.update(st.env)
    ceiling = next((int(lim.value) for lim in limits if lim.kind == "concurrency_ceiling"), None)
    return Baseline(
        image=st.image, image_digest=st.image_digest, vllm_version=st.vllm_version, launch_command=st.launch_command,
        runtime_env=env,
        parallel={"tensor_parallel_size": st.tensor_parallel_size, "pipeline_parallel_size": st.pipeline_parallel_size,
                  "data_parallel_size": st.data_parallel_size, "expert_parallel_size": st.expert_parallel_size,
                  "enable_expert_parallel": st.enable_expert_parallel, "world_size": world_size(st)},
        parsers={"tool_call_parser": st.tool_call_parser, "reasoning_parser": st.reasoning_parser},
        max_model_len=st.max_model_len, prefix_caching=st.prefix_caching,
        envelope=dict(ld.envelope) if ld else {}, concurrency_ceiling=ceiling,
        prefix_cache_hit_ratio=pc.hit_ratio if pc else None, load_traffic=dict(ld.traffic) if ld else {},
        base_url=s.accept.base_url if s.accept else None, model=s.accept.model if s.accept else None,
        rollback_image=s.build.rollback_image if s.build else None,
        evidence=_refs(st.ref, ld.ref if ld else None, pc.ref if pc else None, s.audit.ref if s.audit else None),
    )


__all__ = ["OWNERS_ITEM", "REVIEWER_ITEM", "RULES", "Rule", "baseline_of", "decide"]
