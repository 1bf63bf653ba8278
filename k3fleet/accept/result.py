"""What every acceptance probe returns: a status with its reason, findings, and the measured data.

A probe that could not gather its evidence says ``inconclusive`` or ``error``, never ``pass``: a
reviewer signs against these files (docs/acceptance.md, "Statuses and exit codes"). Its findings
are the one :class:`k3fleet.models.findings.Finding`, made by :func:`finding`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

from k3fleet.contracts import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, Severity, combine, is_failure
from k3fleet.models.findings import Finding, earlier_finding

Status = Literal["pass", "fail", "inconclusive", "error", "skipped"]

# An acceptance finding's id: accept.<probe>.<what>[.<detail>].
ACCEPT_ID = re.compile(r"^accept\.[a-z0-9_]+(\.[a-z0-9_]+)+$")


def finding(check_id: str, severity: Severity, message: str, *, layer: str | None = None,
            evidence: str | None = None) -> Finding:
    """One acceptance observation. A blocking one is a failure (kind fail), anything below a note;
    ``evidence`` is the text it rests on (``evidence.detail``)."""
    if not ACCEPT_ID.match(check_id):
        raise ValueError(f"not an acceptance finding id (accept.<probe>.<what>): {check_id!r}")
    return Finding(check_id=check_id, severity=severity, kind="fail" if is_failure("fail", severity) else "note",
                   message=message, layer=layer, evidence={"detail": evidence} if evidence is not None else {})


class ProbeResult(BaseModel):
    """The outcome of one probe; ``data`` holds its measurements (per-probe shape in docs/acceptance.md)."""

    model_config = ConfigDict(extra="forbid")

    probe: str
    status: Status
    reason: str
    findings: list[Finding] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("findings", mode="before")
    @classmethod
    def _earlier_findings(cls, v: Any) -> Any:
        # Result files written before the one Finding (id, fail / warn, evidence as text).
        return [earlier_finding(f) for f in v] if isinstance(v, list) else v

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
        return [f for f in self.findings if f.failed]


def combined_exit_code(results: Iterable[ProbeResult]) -> int:
    """One exit code for several probes, as the audit's: a definite failure (1) wins over missing
    evidence (3), so a caller that retries on 3 never retries a known no-go."""
    return combine(r.exit_code for r in results)


def result_from_json(data: Mapping[str, Any]) -> ProbeResult:
    """Read a ProbeResult back from a run directory (``exit_code`` is derived, so dropped)."""
    return ProbeResult.model_validate({k: v for k, v in data.items() if k != "exit_code"})
