"""facts + target -> findings -> fleet verdict and change plan. Pure: no I/O.

Public API::

    evaluate_host(facts: HostFacts, target: Target) -> list[Finding]
    validate_facts(raw: Mapping[str, Any]) -> tuple[dict[str, HostFacts], dict[str, str]]
    evaluate_fleet(facts: Mapping[str, HostFacts], target: Target,
                   unreachable: Mapping[str, str] = {}, *, invalid: Mapping[str, str] = {},
                   wave_size: int | None = None) -> FleetVerdict
    CHECKS / catalogue() / catalogue_rows(target) / catalogue_markdown(target)
"""

from __future__ import annotations

from k3fleet.verdict.catalogue import CHECKS, Check, catalogue, catalogue_markdown, catalogue_rows
from k3fleet.verdict.fleet import evaluate_fleet, host_status
from k3fleet.verdict.intake import validate_facts
from k3fleet.verdict.rules import evaluate_host

__all__ = [
    "CHECKS",
    "Check",
    "catalogue",
    "catalogue_markdown",
    "catalogue_rows",
    "evaluate_fleet",
    "evaluate_host",
    "host_status",
    "validate_facts",
]
