"""The contracts every command shares, each written once (docs/architecture.md "Contracts").

Standard library only, so that any layer can import it without pulling in the rest.

Exit codes: 0 pass / go, 1 checks failed / no-go, 2 usage or bad input, 3 hosts unreachable or
evidence incomplete. When one command has several results (hosts, probes, slices, stages),
``combine`` picks the code it exits with: a usage error (2) says the command itself was wrong,
so it wins; then a definite failure (1), since a known no-go must not be retried by a caller that
retries on 3; then missing evidence (3); 0 only when every part passed.

Findings: one severity scale (info < warning < error < critical) and one kind (fail: a problem;
unknown: could not be read; note) for what the audit, acceptance, triage and the decision find.
A finding at error or above is blocking; a blocking finding of kind fail is a definite failure
(exit 1). The pydantic ``Finding`` (``k3fleet.models.findings``) is built on these.

Outcomes: the four answers the audit and the decision give (``go_live``, ``observe_with_limits``,
``rebuild_environment``, ``expand_capacity``; the audit adds ``incomplete`` when no host was
measured), their words and report status, and the two orders they are ranked in. The audit and
the decision rank ``expand_capacity`` and ``rebuild_environment`` differently on purpose; the reason
stands beside the two orders below and in docs/decision.md "Precedence".

The journal stages live in the collection (``module_utils/k3fleet_journal_format.py``): nodes
import them, and this package is not on a node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3

EXIT_CODES = (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE)

# Highest first: the code that wins when several apply.
_PRECEDENCE = (EXIT_USAGE, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK)


def combine(*codes: int | Iterable[int], empty: int = EXIT_INCOMPLETE) -> int:
    """One exit code for several results: 2 over 1 over 3 over 0.

    Each argument is a code or an iterable of codes. With no codes at all the result is
    ``empty`` (nothing was measured: evidence incomplete, unless the caller says otherwise).
    """
    seen: set[int] = set()
    for c in codes:
        if isinstance(c, int):
            seen.add(c)
        else:
            seen.update(c)
    if not seen:
        return empty
    unknown = seen.difference(EXIT_CODES)
    if unknown:
        raise ValueError(f"not a k3fleet exit code: {sorted(unknown)}")
    return next(c for c in _PRECEDENCE if c in seen)


def result_code(*, failed: bool, incomplete: bool = False) -> int:
    """The exit code of one result: 1 for a definite failure, else 3 when evidence is missing, else 0
    (``combine``'s order). Every command that turns its own result into a code calls this."""
    return combine(EXIT_FAILED if failed else EXIT_OK, EXIT_INCOMPLETE if incomplete else EXIT_OK)


# -- findings -------------------------------------------------------------------------------------

Severity = Literal["critical", "error", "warning", "info"]
FindingKind = Literal["fail", "unknown", "note"]
# What a report shows for a finding: fail (a definite problem), error (it could not be read),
# warn (a warning), pass (a note or an informative finding).
FindingStatus = Literal["fail", "error", "warn", "pass"]

# Lowest first.
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error", "critical")
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
FINDING_KINDS: tuple[FindingKind, ...] = ("fail", "unknown", "note")
# The two words of the scale acceptance results were written with before this one (fail / warn /
# info), as run directories of that time still hold them: the same meanings, read into this scale.
EARLIER_SEVERITY: dict[str, Severity] = {"fail": "error", "warn": "warning"}


def is_blocking(severity: str) -> bool:
    """error or critical: the host (or the served model) cannot be signed off while it stands."""
    return SEVERITY_RANK[severity] >= SEVERITY_RANK["error"]


def is_failure(kind: str, severity: str) -> bool:
    """A definite failure: a blocking finding of kind ``fail`` (a blocking ``unknown`` is missing evidence)."""
    return kind == "fail" and is_blocking(severity)


def finding_status(kind: str | None, severity: str | None) -> FindingStatus:
    """fail (a definite problem), error (a blocking fact could not be read), warn, pass (a note)."""
    if severity in ("critical", "error"):
        return "error" if kind == "unknown" else "fail"
    return "warn" if severity == "warning" else "pass"


# -- outcomes -------------------------------------------------------------------------------------

Outcome = Literal["go_live", "observe_with_limits", "rebuild_environment", "expand_capacity"]
# incomplete: no host was measured (every host unreachable or without readable facts): nothing to judge.
AuditOutcome = Literal[Outcome, "incomplete"]

OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
AUDIT_OUTCOMES: tuple[AuditOutcome, ...] = get_args(AuditOutcome)

# The audit's order: the first outcome that applies. The audit counts capacity *after* the planned
# driver change (the GPUs that would be healthy once the change plan ran), so a fleet still short of
# GPUs then cannot reach go-live through any driver or image work: expand_capacity comes before
# rebuild_environment, and the plan's rebuild is the second step.
AUDIT_PRECEDENCE: tuple[AuditOutcome, ...] = (
    "incomplete", "expand_capacity", "rebuild_environment", "observe_with_limits", "go_live")

# The decision's order: the worst outcome any rule asks for. Its capacity evidence (load ceilings,
# collapse, GPUs) was measured on the environment as it stands; an environment that must be rebuilt
# (a chain mismatch, a failed start-up, prefix caching off) makes those figures a measurement of the
# wrong thing, so rebuild_environment outranks expand_capacity: rebuild, then measure capacity again.
DECISION_PRECEDENCE: tuple[Outcome, ...] = (
    "rebuild_environment", "expand_capacity", "observe_with_limits", "go_live")

# The decision's rank (higher is worse), from DECISION_PRECEDENCE.
OUTCOME_RANK: dict[str, int] = {o: len(DECISION_PRECEDENCE) - 1 - i for i, o in enumerate(DECISION_PRECEDENCE)}

# The outcomes a decision may approve serving under (with nothing blocking): serve, limited or not.
APPROVABLE_OUTCOMES: frozenset[Outcome] = frozenset({"go_live", "observe_with_limits"})

# What each outcome reads as in a report title, and the report status (the finding status words plus
# missing) its badge wears.
OUTCOME_TEXT: dict[AuditOutcome, str] = {
    "go_live": "go live",
    "observe_with_limits": "observe with limits",
    "rebuild_environment": "rebuild the environment",
    "expand_capacity": "expand capacity",
    "incomplete": "incomplete: no host was measured",
}
OutcomeStatus = Literal["pass", "warn", "fail", "missing"]
OUTCOME_STATUS: dict[AuditOutcome, OutcomeStatus] = {
    "go_live": "pass", "observe_with_limits": "warn", "rebuild_environment": "fail",
    "expand_capacity": "missing", "incomplete": "missing",
}


def first_outcome(applies: Iterable[AuditOutcome]) -> AuditOutcome:
    """The audit's outcome: the first of ``AUDIT_PRECEDENCE`` among those that apply."""
    found = set(applies)
    for o in AUDIT_PRECEDENCE:
        if o in found:
            return o
    raise ValueError("no outcome applies")


def worst_outcome(outcomes: Iterable[Outcome], floor: Outcome = "go_live") -> Outcome:
    """The decision's outcome: the worst of ``outcomes`` by ``DECISION_PRECEDENCE`` (``floor`` when none is worse)."""
    worst = floor
    for o in outcomes:
        if OUTCOME_RANK[o] > OUTCOME_RANK[worst]:
            worst = o
    return worst
