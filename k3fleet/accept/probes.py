"""The acceptance probes, each declared once: its name, what it needs, the evidence it writes, its share
of ``accept all --budget`` and its result model.

``accept all`` (:mod:`k3fleet.accept.run`), ``--skip``, the reports (:func:`k3fleet.report.view.accept_view`)
and ``decide`` (:mod:`k3fleet.decide.readers`, :mod:`k3fleet.decide.views`) iterate :data:`PROBES` in
its order, which is the order the probes run in and a report lists them. A new probe is one
:func:`register` call here, its module, and its reader in ``decide`` (docs/acceptance.md "Probes").
This module imports nothing of the probes themselves: the layers below ``accept`` can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3fleet.accept.result import ProbeResult
from k3fleet.evidence import layout


@dataclass(frozen=True)
class Probe:
    name: str
    title: str
    # An acceptance run needs its result: absent, the run's evidence is incomplete (exit 3).
    required: bool
    # What it needs beyond the endpoint; None: the endpoint is enough.
    needs: str | None
    # Its share of accept all --budget (k3fleet.accept.run.Budget).
    budget: str
    # It sends requests to the endpoint (recorded in requests/<probe>.jsonl).
    sends: bool = True
    # The model its <probe>.json holds (ProbeResult; its data's shape per probe in docs/acceptance.md).
    result: type[ProbeResult] = ProbeResult

    @property
    def evidence(self) -> tuple[str, ...]:
        """The run-directory files it writes: its result, and every request it sent."""
        return (layout.probe_file(self.name), *([layout.requests_file(self.name)] if self.sends else []))


PROBES: dict[str, Probe] = {}


def register(probe: Probe) -> Probe:
    if probe.name in PROBES:
        raise ValueError(f"probe {probe.name!r} is registered twice")
    PROBES[probe.name] = probe
    return probe


register(Probe("startup", "Start-up log", required=False, needs="--log (the server's start-up log)",
               budget="none: it reads a file", sends=False))
register(Probe("prefix_cache", "Prefix cache", required=True, needs=None,
               budget="its fixed requests first (repetitions + 2 chat requests, up to 5 /tokenize)"))
register(Probe("agent", "Agent contract", required=True, needs=None,
               budget="a share of what the prefix-cache probe left, in whole rounds"))
register(Probe("load", "Load", required=True, needs="the load probe in this build (k3fleet.accept.load)",
               budget="the rest, less a margin for its calibration"))

NAMES: tuple[str, ...] = tuple(PROBES)
REQUIRED: tuple[str, ...] = tuple(p.name for p in PROBES.values() if p.required)
