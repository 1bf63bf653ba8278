"""facts + target -> findings -> fleet verdict and change plan. Pure: no I/O.

Public API::

    evaluate_host(facts: HostFacts, target: Target) -> list[Finding]
    validate_facts(raw: Mapping[str, Any]) -> tuple[dict[str, HostFacts], dict[str, str]]
    evaluate_fleet(facts: Mapping[str, HostFacts], target: Target,
                   unreachable: Mapping[str, str] = {}, *, invalid: Mapping[str, str] = {},
                   wave_size: int | None = None) -> FleetVerdict
    evaluate_stream(hosts: Iterable[tuple[str, raw facts dict]], target: Target,
                    unreachable: Mapping[str, str] = {}, *, invalid: Mapping[str, str] = {},
                    wave_size: int | None = None) -> FleetVerdict   (validated and judged host by host)
    FleetFold(target, unreachable, invalid=...): .add(host, raw) / .add_facts(host, facts), then
                    .verdict(); .invalid and .measured for the run record
    CHECKS / catalogue() / catalogue_rows(target) / catalogue_markdown(target)
"""

from __future__ import annotations

from k3fleet.verdict.catalogue import CHECKS, Check, catalogue, catalogue_markdown, catalogue_rows
from k3fleet.verdict.fleet import FleetFold, evaluate_fleet, evaluate_stream, host_status
from k3fleet.verdict.intake import validate_facts
from k3fleet.verdict.rules import evaluate_host

__all__ = [
    "CHECKS",
    "Check",
    "FleetFold",
    "catalogue",
    "catalogue_markdown",
    "catalogue_rows",
    "evaluate_fleet",
    "evaluate_host",
    "evaluate_stream",
    "host_status",
    "validate_facts",
]
