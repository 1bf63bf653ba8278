"""Scheduler check: the node in service.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from k3fleet.models.facts import HostFacts, SchedulerFacts
from k3fleet.verdict.check import Check, check
from k3fleet.verdict.rules.base import Emitter, HostContext

# The catalogue entries of this module's checks, in the order the catalogue lists them.
CHECKS: tuple[Check, ...] = (
    check("scheduler.state", "Node in service",
          "A drained or down node serves nothing; the change night must know which drains are ours.",
          "warning",
          "Resume the node (scontrol update state=resume) if its drain reason is understood.",
          source='docs/architecture.md "Flows" (drain reason k3fleet:<change-id>)'),
)


@lru_cache(maxsize=256)
def state_words(state: str | None) -> frozenset[str]:
    """Slurm writes "IDLE+DRAIN", "idle*", "mixed-": the base words, lower case, flags stripped.

    A fleet repeats a handful of states: each is split once.
    """
    if not state:
        return frozenset()
    return frozenset(w.strip("*~#!%$@^-") for w in state.lower().split("+") if w.strip("*~#!%$@^-"))


def scheduler(f: HostFacts, c: HostContext, e: Emitter) -> None:
    scheduler_state(f.scheduler, e)


def scheduler_state(sc: SchedulerFacts, e: Emitter) -> None:
    if sc.kind == "none" or (sc.status == "absent" and sc.kind is None):
        return
    if sc.status == "unknown" or not sc.state:
        e.unknown("scheduler.state", f"the {sc.kind or 'scheduler'} node state", sc.reason)
        return
    st = state_words(sc.state)
    if sc.state_flags:
        st = st | {x.lower() for x in sc.state_flags}
    down = bool(st & e.ct.down_states)
    if not down and not st & e.ct.oos_states:
        return  # in service: the common case, nothing to build
    # The collector already folds DRAIN into "drained"/"draining": show only flags that add something.
    shown = "+".join([sc.state, *(x for x in sc.state_flags if x.lower() not in sc.state.lower())])
    ev = {"kind": sc.kind, "node": sc.node, "state": sc.state, "flags": sc.state_flags, "reason": sc.reason}
    reason = f" ({sc.reason})" if sc.reason else ""
    if down:
        e.fail("scheduler.state", f"{sc.kind} reports the node {shown}{reason}", ev, severity="error")
    else:
        e.fail("scheduler.state", f"{sc.kind} reports the node {shown}{reason}: not serving", ev)


RULES: tuple[Callable[[HostFacts, HostContext, Emitter], None], ...] = (scheduler,)
