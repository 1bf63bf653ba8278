"""What every acceptance probe returns: a status with its reason, findings, and the measured data.

A probe that could not gather its evidence says ``inconclusive`` or ``error``, never ``pass``: a
reviewer signs against these files (docs/acceptance.md, "Statuses and exit codes").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from k3fleet.errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, combine

Severity = Literal["fail", "warn", "info"]
Status = Literal["pass", "fail", "inconclusive", "error", "skipped"]

PROBE_NAMES = ("startup", "prefix_cache", "agent", "load")


class Finding(BaseModel):
    """One observation with a stable dotted id (``accept.<probe>.<what>``)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^accept\.[a-z0-9_]+(\.[a-z0-9_]+)+$")
    severity: Severity
    message: str
    # Where a defect sits: "http" (the raw response: model or server parser), "client" (the
    # reference SDK), "environment" (host, driver, topology), "config" (server flags), "traffic".
    layer: str | None = None
    evidence: str | None = None


class ProbeResult(BaseModel):
    """The outcome of one probe; ``data`` holds its measurements (per-probe shape in docs/acceptance.md)."""

    model_config = ConfigDict(extra="forbid")

    probe: str
    status: Status
    reason: str
    findings: list[Finding] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 3 inconclusive / error / skipped (the evidence is not there)."""
        if self.status == "pass":
            return EXIT_OK
        if self.status == "fail":
            return EXIT_FAILED
        return EXIT_INCOMPLETE

    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fail"]


def combined_exit_code(results: Iterable[ProbeResult]) -> int:
    """One exit code for several probes, as the audit's: a definite failure (1) wins over missing
    evidence (3), so a caller that retries on 3 never retries a known no-go."""
    return combine(r.exit_code for r in results)


def result_from_json(data: Mapping[str, Any]) -> ProbeResult:
    """Read a ProbeResult back from a run directory (``exit_code`` is derived, so dropped)."""
    return ProbeResult.model_validate({k: v for k, v in data.items() if k != "exit_code"})
