"""The shape of ``triage.json`` as its readers take it (``decide``, ``report``).

A triage run holds text an operator pasted: its record is validated before anything reads it,
so a file of the wrong shape (a list, a count where a list belongs, a finding without an id)
is one line naming the field, never a traceback (docs/safety.md "Bad input").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from k3fleet.errors import UsageError, validation_line
from k3fleet.models.findings import Finding, earlier_finding


class _Lenient(BaseModel):
    # Fields a reader does not use may be added by later versions: kept out, not refused.
    model_config = ConfigDict(extra="ignore")


class TriageFile(_Lenient):
    name: str
    kind: str
    original_sha256: str | None = None
    bytes: int | None = None
    stored: str | None = None


class TriageRecord(_Lenient):
    schema_version: str | None = None
    host: str | None = None
    kinds: list[str] = Field(default_factory=list)
    files: list[TriageFile] = Field(default_factory=list)
    driver_version: str | None = None
    image_digest: str | None = None
    findings: list[Finding] = Field(default_factory=list, description="each with evidence.file, the stored "
                                    "capture it was judged from")
    startup: dict[str, Any] | None = None
    metrics: dict[str, Any] | None = None
    exit_code: int | None = None

    @field_validator("findings", mode="before")
    @classmethod
    def _earlier_findings(cls, v: Any) -> Any:
        # Records written before the one Finding (id, the capture's file beside).
        return [earlier_finding(f) for f in v] if isinstance(v, list) else v

    @field_validator("exit_code")
    @classmethod
    def _known_code(cls, v: int | None) -> int | None:
        if v is not None and v not in (0, 1, 2, 3):
            raise ValueError(f"{v} is not a k3fleet exit code")
        return v


def parse_triage_record(data: Any, label: str) -> TriageRecord:
    """``triage.json``'s content as a typed record, or one UsageError naming the first bad field."""
    if not isinstance(data, dict):
        raise UsageError(f"run {label}: triage.json is not a JSON object (got {type(data).__name__})")
    try:
        return TriageRecord.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"run {label}: triage.json is not a triage record: {validation_line(exc)}") from None

