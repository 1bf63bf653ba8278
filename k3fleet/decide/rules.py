"""The decision table: evidence summary -> outcome, reasons, limits, approval. Pure: no I/O, no clock.

Each :class:`Rule` is one row of the table in docs/decision.md: when it fires, which outcome it
asks for, and whether it allows, limits or blocks approval. The decision takes the worst
outcome any rule asks for (rebuild_environment > expand_capacity > observe_with_limits >
go_live) and lists every reason with the evidence it rests on. Missing evidence is never a
pass: a missing checklist item caps the outcome at observe_with_limits and blocks approval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    world_size,
)
from k3fleet.decide.models import (
    OUTCOME_RANK,
    Baseline,
    ChecklistItem,
    Decision,
    EvidenceSummary,
    Limit,
    Outcome,
    Reason,
    Ref,
)
from k3fleet.errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK


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
    others = [f for f in st.findings if f.severity == "fail" and f not in st.model_load_oom]
    return [Hit(f"start-up failed: {f.message}", [f.ref]) for f in others]


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


def _capacity(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    a = s.audit
    if a is None or a.gpus_after_plan >= a.gpus_required:
        return []
    return [Hit(f"{a.gpus_after_plan} GPUs healthy even after the planned driver change, {a.gpus_required} required "
                f"({a.strategy or 'strategy ?'})", [a.ref])]


def _collapse(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None:
        return []
    out = []
    if ld.outcome == "collapse":
        out.append(Hit(f"the server collapsed under controlled load: {ld.reason or 'queue or OOM collapse'}",
                       _refs(ld.ref, ld.curves_ref)))
    counts = [(ld.restarts, "restart(s)"), (ld.oom_events, "OOM event(s)")]
    seen = [f"{n} {what}" for n, what in counts if n]
    if seen and ld.outcome != "collapse":
        out.append(Hit(f"{', '.join(seen)} in the sustained run under the tested limits", [ld.ref]))
    return out


def _ceiling(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None or ld.outcome != "ceiling":
        return []
    if ld.ceiling is None:
        return [Hit("stable only under a concurrency ceiling, but the ceiling was not recorded", [ld.ref])]
    return [Hit(f"stable only up to {ld.ceiling} concurrent sessions: limit traffic to that ceiling",
                _refs(ld.ref, ld.curves_ref),
                Limit(kind="concurrency_ceiling", value=str(ld.ceiling),
                      text=f"at most {ld.ceiling} concurrent requests (gateway or --max-num-seqs)",
                      owner=s.service_owner, evidence=_refs(ld.ref, ld.curves_ref)))]


def _adjust_config(s: EvidenceSummary, _: list[ChecklistItem]) -> list[Hit]:
    ld = s.accept.load if s.accept else None
    if ld is None or ld.outcome != "adjust_config":
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
    Rule("capacity.short", "expand_capacity", "blocks",
         "too few healthy GPUs even after the planned driver change", _capacity),
    Rule("load.collapse", "expand_capacity", "blocks",
         "sustained OOM, restarts or queue collapse under controlled limits", _collapse),
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
            if OUTCOME_RANK[rule.outcome] > OUTCOME_RANK[outcome]:
                outcome = rule.outcome
            if rule.approval == "blocks":
                blocked = True
                definite = definite or rule.id != "evidence.missing"
    missing = [i.id for i in items if i.status == "missing"]
    if not reasons:
        reasons.append(Reason(rule="all.pass", outcome="go_live", approval="allows",
                              text=f"every checklist item passes ({len(items)} items) and no rule fired",
                              evidence=[r for i in items for r in i.evidence][:1]))
    approved = not blocked and outcome in ("go_live", "observe_with_limits")
    exit_code = EXIT_OK if approved else EXIT_FAILED if definite else EXIT_INCOMPLETE
    from k3fleet.decide.checklist import triage_outside_audit

    return Decision(
        outcome=outcome, approved=approved, exit_code=exit_code, track="custom" if is_custom(summary) else "official",
        reasons=reasons, limits=limits, missing=missing, warnings=triage_outside_audit(summary),
        checklist=items, reviewer=summary.reviewer,
        reviewed_at=summary.reviewed_at, service_owner=summary.service_owner,
        baseline=baseline_of(summary, limits) if approved else None,
    )


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
        prefix_cache_hit_ratio=pc.hit_ratio if pc else None,
        base_url=s.accept.base_url if s.accept else None, model=s.accept.model if s.accept else None,
        rollback_image=s.build.rollback_image if s.build else None,
        evidence=_refs(st.ref, ld.ref if ld else None, pc.ref if pc else None, s.audit.ref if s.audit else None),
    )


__all__ = ["OWNERS_ITEM", "REVIEWER_ITEM", "RULES", "Rule", "baseline_of", "decide"]
