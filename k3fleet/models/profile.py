"""The production profile: what production looks like, so a test can be held against it.

``--profile FILE`` (YAML) on ``accept load``, ``accept agent``, ``accept all`` and ``decide``:
expected concurrency, context lengths (typical, p99, max), the request mix, the sustained
duration, the SLOs, the production tool schemas and response schemas (files next to the profile)
and the rate limits production enforces. ``k3fleet schema profile`` prints its JSON Schema; every
field is described in docs/decision.md ("The production profile").

Numbers are finite and bounded (an ``inf`` concurrency or a ``nan`` SLO is refused, not tested
forever), unknown keys are refused, and every referenced file is read through the bounded reader
and its schema checked, so a profile that loads is one the probes can run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from k3fleet.bounds import load_yaml, read_input
from k3fleet.errors import UsageError, validated

PROFILE_VERSION = "1.0"
MAX_CONCURRENCY = 4096  # the load probe's own bound
MAX_CONTEXT = 16 * 1024 * 1024
_DAY = 86400.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ContextLengths(_Strict):
    """Prompt plus output tokens of one request, as production sends them."""

    typical: int = Field(ge=16, le=MAX_CONTEXT, description="the median request's context, in tokens")
    p99: int = Field(ge=16, le=MAX_CONTEXT, description="the 99th percentile context: the envelope must reach it")
    max: int = Field(ge=16, le=MAX_CONTEXT, description="the longest context production allows (gateway or "
                                                        "--max-model-len)")

    @model_validator(mode="after")
    def _ordered(self) -> ContextLengths:
        if not self.typical <= self.p99 <= self.max:
            raise ValueError("context lengths must be ordered: typical <= p99 <= max")
        return self


class RequestMix(_Strict):
    """Share of requests (0 to 1 each; a request may count in several)."""

    tools: float = Field(default=0.0, ge=0, le=1, description="requests that offer tools")
    structured_output: float = Field(default=0.0, ge=0, le=1, description="requests with a response_format schema")
    streaming: float = Field(default=0.0, ge=0, le=1, description="streamed requests")
    multimodal: float = Field(default=0.0, ge=0, le=1, description="requests with an image part")
    long: float = Field(default=0.0, ge=0, le=1, description="conversations at the p99 context (the rest start at "
                                                             "the typical context)")


class Slo(_Strict):
    """What production promises; the load run judges every step by these."""

    ttft_p95_s: float = Field(gt=0, le=3600, description="time to first token, 95th percentile, seconds")
    itl_p95_s: float = Field(gt=0, le=3600, description="inter-token latency, 95th percentile, seconds")
    error_rate: float = Field(default=0.01, ge=0, le=1, description="share of requests that may fail")
    e2e_p95_s: float | None = Field(default=None, gt=0, le=86400, description="end-to-end request time, 95th "
                                                                             "percentile, seconds (optional)")


def _one_line_each(values: list[str], what: str, limit: int, forbidden: str) -> list[str]:
    """``values`` stripped; each must be a non-empty line of at most ``limit`` characters."""
    out = [x.strip() for x in values]
    if any(not x or len(x) > limit or any(ch in x for ch in forbidden) for x in out):
        raise ValueError(f"each {what} is one non-empty line of at most {limit} characters")
    return out


class DataProtection(_Strict):
    """What production promises about the data in logs and evidence: how long it is kept, who may read it."""

    log_retention_days: int = Field(ge=1, le=3650, description="days the serving side's logs are kept")
    run_retention_days: int = Field(ge=1, le=3650, description="days evidence run directories are kept "
                                                              "(k3fleet prune --older-than Nd)")
    evidence_readers: list[str] = Field(min_length=1, max_length=64,
                                        description="who may read the evidence (run directories, packages): "
                                                    "people or groups, one line each")
    request_logging: bool = Field(default=False, description="the server may log requests "
                                                             "(--enable-log-requests): prompts reach its logs")

    @field_validator("evidence_readers")
    @classmethod
    def _readers(cls, v: list[str]) -> list[str]:
        return _one_line_each(v, "reader", 128, "\n\r\t\x00")


class ProductionProfile(_Strict):
    """``--profile FILE``: the production envelope a go-live is decided against."""

    profile_version: str = Field(default=PROFILE_VERSION, pattern=r"^1\.\d+$")
    name: str = Field(min_length=1, max_length=128, description="what this profile describes")
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY, description="expected peak concurrent requests")
    context_tokens: ContextLengths
    mix: RequestMix = Field(default_factory=RequestMix)
    sustained_s: float = Field(gt=0, le=_DAY, description="how long the peak lasts, seconds: the sustained "
                                                           "run must last at least this long")
    slo: Slo
    request_rate_rps: float | None = Field(default=None, gt=0, le=10000,
                                           description="expected peak request rate (requests/s, optional): the "
                                                       "open-loop SLO search must find a rate at least this high")
    tools: list[str] = Field(default_factory=list, max_length=64,
                             description="files (JSON or YAML, relative to the profile) with the production tool "
                                         "definitions: a list of OpenAI tools or functions")
    response_schemas: list[str] = Field(default_factory=list, max_length=64,
                                        description="files with the production response schemas: a JSON Schema, "
                                                    "or {name, schema} as in response_format.json_schema")
    rate_limits: list[str] = Field(default_factory=list, max_length=32,
                                   description="rate limits production enforces (gateway), one line each")
    data_protection: DataProtection | None = Field(
        default=None, description="log and evidence retention and who may read the evidence; without it the "
                                  "checklist's data-protection items are missing, never a pass")

    @field_validator("name")
    @classmethod
    def _one_line(cls, v: str) -> str:
        v = v.strip()
        if not v or any(ch in v for ch in "\n\r\t\x00"):
            raise ValueError("must be one non-empty line")
        return v

    @field_validator("rate_limits")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        return _one_line_each(v, "rate limit", 200, "\n\r\x00")

    @field_validator("tools", "response_schemas")
    @classmethod
    def _files(cls, v: list[str]) -> list[str]:
        if any(not x.strip() or "\x00" in x for x in v):
            raise ValueError("each entry is a file path")
        if len(set(v)) != len(v):
            raise ValueError("a file is named twice")
        return v


def profile_json_schema() -> dict[str, Any]:
    """``k3fleet schema profile``."""
    schema = ProductionProfile.model_json_schema()
    schema["$id"] = f"https://k3fleet.invalid/schema/profile-{PROFILE_VERSION}.json"
    return schema


@dataclass
class LoadedProfile:
    """A validated profile with its tool and response-schema files read and checked."""

    profile: ProductionProfile
    path: Path
    text: str
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI function objects: name, parameters, ...
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> JSON Schema
    files: dict[str, str] = field(default_factory=dict)  # as named in the profile -> text

    @property
    def tool_names(self) -> list[str]:
        return [str(t["name"]) for t in self.tools]

    @property
    def multimodal(self) -> bool:
        return self.profile.mix.multimodal > 0


def _read_text(path: Path, what: str) -> str:
    raw = read_input(path, what, kind="a YAML or JSON file", limit="record")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text: {exc}") from exc


def _parse(text: str, path: Path, what: str) -> Any:
    try:
        return load_yaml(text, f"{what} {path}")  # JSON is YAML; depth and alias budget first (k3fleet.bounds)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{what} {path} is not valid YAML or JSON{where}") from exc


# The most tools a profile may name: OpenAI's chat API takes at most 128 functions per request (API reference,
# "Create chat completion", tools: "A max of 128 functions are supported"; docs/safety.md "Bounds"); a profile's
# tool files together stay within a few times that, never tens of thousands.
MAX_TOOLS = 512


def _local_refs_only(schema: dict[str, Any], where: str) -> None:
    """Refuse a reference out of the schema (``$ref: https://...``, ``other.json``): k3fleet never fetches a
    schema, so one would be unresolvable when a response is checked against it. Walked without recursion (the
    file's nesting is bounded when it is read, k3fleet.bounds)."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                    raise UsageError(f"{where}: {key} {value[:80]!r} at {at or '(top level)'}: only references "
                                     "inside the schema (#/...) are allowed; k3fleet never fetches a schema")
                stack.append((value, f"{at}/{key}"))
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))


def _check_schema(schema: Any, where: str) -> dict[str, Any]:
    # lazy: jsonschema is heavy; decide and report read profile records without it
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        raise UsageError(f"{where}: a JSON Schema is an object")
    _local_refs_only(schema, where)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise UsageError(f"{where}: not a valid JSON Schema at {path}: {exc.message[:200]}") from None
    return schema


def _tools_of(data: Any, where: str) -> list[dict[str, Any]]:
    items = data.get("tools") if isinstance(data, dict) and "tools" in data else data
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise UsageError(f"{where}: expected a list of tools (OpenAI tools or functions)")
    if len(items) > MAX_TOOLS:
        raise UsageError(f"{where}: {len(items)} tools: at most {MAX_TOOLS} per profile (each is proven by the "
                         "agent suite, and every request carries them all)")
    out = []
    for i, item in enumerate(items):
        fn = item.get("function") if isinstance(item, dict) and item.get("type") == "function" else item
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"].strip():
            raise UsageError(f"{where}: tool {i}: needs a name")
        name = fn["name"].strip()
        if len(name) > 64 or not all(ch.isalnum() or ch in "_-" for ch in name):
            raise UsageError(f"{where}: tool {name[:64]!r}: a tool name is 1-64 letters, digits, _ or -")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        _check_schema(params, f"{where}: tool {name}: parameters")
        out.append({"name": name, "description": str(fn.get("description") or ""), "parameters": params})
    return out


def _schema_of(data: Any, file: str, where: str) -> tuple[str, dict[str, Any]]:
    if isinstance(data, dict) and isinstance(data.get("schema"), dict) and isinstance(data.get("name"), str):
        name, schema = data["name"].strip(), data["schema"]
    else:
        name, schema = Path(file).stem, data

    if not name or len(name) > 64 or not all(ch.isalnum() or ch in "_-" for ch in name):
        raise UsageError(f"{where}: schema name {name[:64]!r}: 1-64 letters, digits, _ or -")
    return name, _check_schema(schema, where)


def load_profile(path: Path) -> LoadedProfile:
    """Read, validate and resolve a profile; every problem is one UsageError line naming the file and field."""
    text = _read_text(path, "profile")
    data = _parse(text, path, "profile")
    profile = validated(ProductionProfile, data, f"profile {path}",
                        "expected a mapping (name, concurrency, context_tokens, ...)")
    loaded = LoadedProfile(profile=profile, path=path, text=text)
    base = path.parent
    for rel in profile.tools:
        where = f"profile {path}: tools: {rel}"
        body = _read_text(base / rel, where)
        loaded.files[rel] = body
        for tool in _tools_of(_parse(body, base / rel, where), where):
            if tool["name"] in loaded.tool_names:
                raise UsageError(f"{where}: tool {tool['name']} is defined twice")
            loaded.tools.append(tool)
        if len(loaded.tools) > MAX_TOOLS:
            raise UsageError(f"{where}: more than {MAX_TOOLS} tools in the profile's tool files together")
    for rel in profile.response_schemas:
        where = f"profile {path}: response_schemas: {rel}"
        body = _read_text(base / rel, where)
        loaded.files[rel] = body
        name, schema = _schema_of(_parse(body, base / rel, where), rel, where)
        if name in loaded.schemas:
            raise UsageError(f"{where}: schema {name} is defined twice")
        loaded.schemas[name] = schema
    if profile.mix.tools > 0 and not loaded.tools:
        raise UsageError(f"profile {path}: mix.tools is {profile.mix.tools:g} but no tools file is named: the "
                         "production tool schemas are what the agent suite must prove")
    if profile.mix.structured_output > 0 and not loaded.schemas:
        raise UsageError(f"profile {path}: mix.structured_output is {profile.mix.structured_output:g} but no "
                         "response_schemas file is named")
    return loaded


def profile_record(loaded: LoadedProfile) -> dict[str, Any]:
    """What a run directory keeps of the profile (``profile.json``): the envelope, the tool and schema
    names with their JSON, so a decision reads the same profile the test ran against."""
    return {"profile": loaded.profile.model_dump(mode="json"), "file": str(loaded.path),
            "tools": loaded.tools, "schemas": loaded.schemas,
            "sha256": _sha256(loaded.text)}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
