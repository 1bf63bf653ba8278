"""The host rules run group by group, once per node kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from k3fleet.models.facts import HostFacts, SchedulerFacts
from k3fleet.models.findings import SEVERITY_RANK, Finding
from k3fleet.models.target import Target
from k3fleet.verdict.rules import active, container, driver, fabric, gpu, packages, rdma, scheduler, workloads
from k3fleet.verdict.rules.base import CompiledTarget, Emitter, HostContext, host_context
from k3fleet.verdict.rules.driver import facts_schema
from k3fleet.verdict.rules.scheduler import scheduler_state

# Every host rule, group by group: a new check joins its group's RULES, a new group joins this list.
RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (
    *driver.RULES, *gpu.RULES, *packages.RULES, *fabric.RULES, *rdma.RULES, *container.RULES,
    *workloads.RULES, *active.RULES, *scheduler.RULES,
)


# Rules that read what differs between hosts of one kind (schema version aside, the scheduler's
# state); every other rule reads only what validate_facts' rule key covers.
PER_HOST_RULES = (facts_schema, scheduler.scheduler)
SHARED_RULES = tuple(rule for rule in RULES if rule not in PER_HOST_RULES)


def rule_key(facts: HostFacts) -> tuple[Any, ...] | None:
    """The rule key validate_facts set (None otherwise), read without pydantic's attribute hook,
    which costs more than the rules of a cached host."""
    private = facts.__pydantic_private__
    return private.get("_rule_key") if private else None


_set = object.__setattr__
_new = object.__new__


def _for_host(shared: list[Finding], host: str) -> list[Finding]:
    """A kind's findings for another host of the kind; the evidence stays shared (read-only).

    :func:`k3fleet.models.facts.replaced`, inlined: this runs for every finding of the fleet.
    """
    out: list[Finding] = []
    for f in shared:
        if f.host == host:
            out.append(f)
            continue
        fields = f.__dict__.copy()
        fields["host"] = host
        new = _new(Finding)
        _set(new, "__dict__", fields)
        _set(new, "__pydantic_fields_set__", f.__pydantic_fields_set__)
        _set(new, "__pydantic_extra__", f.__pydantic_extra__)
        _set(new, "__pydantic_private__", f.__pydantic_private__)
        out.append(new)
    return out


class RuleCache:
    """Host rules once per node kind: hosts with one rule key (validate_facts) share their context
    and the findings of SHARED_RULES, stamped with each host's name; PER_HOST_RULES run per host."""

    __slots__ = ("_own", "contexts", "ct", "findings", "kinds", "ranks")

    def __init__(self, ct: CompiledTarget) -> None:
        self.ct = ct
        self.contexts: dict[tuple[Any, ...], HostContext] = {}
        # Contexts shared by a kind (by id), with the kind's findings and their worst severity rank.
        self.kinds: set[int] = set()
        self.findings: dict[int, list[Finding]] = {}
        self.ranks: dict[int, int] = {}
        # The emitter of the per-host rules, reused host after host (its host and list are reset).
        self._own = Emitter(ct, "")

    def context(self, facts: HostFacts, host: str) -> HostContext:
        key = rule_key(facts)
        if key is None:
            return host_context(facts, self.ct, host)
        ctx = self.contexts.get(key)
        if ctx is None:
            ctx = self.contexts[key] = host_context(facts, self.ct, host)
            self.kinds.add(id(ctx))
        return ctx

    def run(self, facts: HostFacts, host: str, ctx: HostContext,
            scheduler: SchedulerFacts | None = None) -> tuple[list[Finding], int, bool]:
        """The host's findings, the highest SEVERITY_RANK among them, and whether they are exactly its
        kind's (no finding of its own): then whatever follows from the findings holds for the kind.

        ``facts`` may be the facts of another host of the kind (the streaming verdict keeps one per
        kind): ``scheduler`` is then the host's own scheduler section.
        """
        if id(ctx) not in self.kinds:
            findings = run_rules(facts, self.ct, host, ctx)[0]
            return findings, max((SEVERITY_RANK[f.severity] for f in findings), default=0), False
        shared = self.findings.get(id(ctx))
        if shared is None:
            em = Emitter(self.ct, host)
            for rule in SHARED_RULES:
                rule(facts, ctx, em)
            shared = self.findings[id(ctx)] = em.out
            self.ranks[id(ctx)] = max((SEVERITY_RANK[f.severity] for f in shared), default=0)
            stamped = list(shared)
        else:
            stamped = _for_host(shared, host)
        rank = self.ranks[id(ctx)]
        em = self._own
        em.host = host
        head = em.out = []
        facts_schema(facts, ctx, em)
        tail = em.out = []
        scheduler_state(facts.scheduler if scheduler is None else scheduler, em)
        if not head and not tail:
            return stamped, rank, True
        own = [*head, *tail]
        return [*head, *stamped, *tail], max(rank, *(SEVERITY_RANK[f.severity] for f in own)), False


def run_rules(
    facts: HostFacts, ct: CompiledTarget, host: str | None = None, ctx: HostContext | None = None
) -> tuple[list[Finding], HostContext]:
    """Every rule over one host; ``ct`` must have its strategy decided (:meth:`CompiledTarget.decide`)."""
    if ct.decision is None:
        raise ValueError(f"target {ct.target.name}: the serving strategy is not decided; call "
                         "CompiledTarget.decide(contexts) before running the rules")
    if ctx is None:
        ctx = host_context(facts, ct, host)
    em = Emitter(ct, host or ctx.host)
    for rule in RULES:
        rule(facts, ctx, em)
    return em.out, ctx


def evaluate_host(facts: HostFacts, target: Target) -> list[Finding]:
    """Findings for one host against ``target`` (empty: every applicable check passed).

    With ``gpus.strategy: auto`` the strategy is derived from this host alone.
    """
    ct = CompiledTarget(target)
    ctx = host_context(facts, ct)
    ct.decide([ctx])
    return run_rules(facts, ct, ctx=ctx)[0]
