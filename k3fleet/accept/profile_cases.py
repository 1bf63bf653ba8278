"""The acceptance schedule and cases a production profile asks for (``--profile FILE``).

- :func:`load_options_from_profile`: the load probe's schedule: the long-input ladder up to the
  profile's p99 and maximum context, the agent ramp up to its concurrency, the sustained run at that
  concurrency for its duration, its SLOs as the step verdict's limits.
- :func:`agent_options_from_profile`: the agent suite plus one case per production tool
  (``tool:<name>``: the model calls it with arguments that satisfy its schema), one per production
  response schema (``schema:<name>``: structured output that validates), ``invalid_schema`` (a
  response_format whose schema is not a JSON Schema must be refused with a 4xx, never served or
  answered with a 5xx) and ``multimodal`` when the mix has image requests; the cases themselves are
  in k3fleet/accept/agent_profile.py.
- :func:`write_profile_evidence`: the profile as the run was tested against it, for decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from k3fleet.bounds import DURATIONS
from k3fleet.evidence import layout
from k3fleet.models.profile import profile_record

if TYPE_CHECKING:
    from k3fleet.accept.agent import AgentOptions
    from k3fleet.accept.load import LoadOptions
    from k3fleet.models.profile import LoadedProfile

TOOL_PREFIX = "tool:"
SCHEMA_PREFIX = "schema:"
INVALID_SCHEMA = "invalid_schema"
MULTIMODAL = "multimodal"


def ramp_to(concurrency: int) -> list[int]:
    """1, 2, 4, ... below the target, then the target itself: every step a doubling at most."""
    steps, c = [], 1
    while c < concurrency:
        steps.append(c)
        c *= 2
    steps.append(concurrency)
    return steps


def rate_ramp_to(rate: float) -> list[float]:
    """A quarter, a half, the rate itself, then 1.5 and 2 times it: the ramp brackets the profile's rate, so
    the SLO search starts from a held and a missed rate around it."""
    return [round(rate * f, 6) for f in (0.25, 0.5, 1.0, 1.5, 2.0)]


def load_options_from_profile(loaded: LoadedProfile, overrides: Mapping[str, Any] | None = None) -> LoadOptions:
    """The load schedule that tests the profile's envelope; ``overrides`` (``--load-option``) win."""
    # lazy: the load probe (and aiohttp with it) loads only when a load schedule is asked for
    from k3fleet.accept.load.options import load_options

    p = loaded.profile
    ladder = sorted({p.context_tokens.typical, p.context_tokens.p99, p.context_tokens.max})
    ramp = ramp_to(p.concurrency)
    base: dict[str, Any] = {"ladder_tokens": ladder, "ramp": ramp, "sustained_concurrency": p.concurrency,
                            "sustained_s": p.sustained_s, "ttft_p95_slo_s": p.slo.ttft_p95_s,
                            "itl_p95_slo_s": p.slo.itl_p95_s, "error_rate_limit": p.slo.error_rate}
    # The request mix of the agent sessions: the profile's tools, schemas and shares.
    if loaded.tools:
        base.update(tools=[{"type": "function", "function": dict(t)} for t in loaded.tools], tools_share=p.mix.tools)
    if loaded.schemas:
        base.update(response_schemas={k: dict(v) for k, v in loaded.schemas.items()},
                    structured_share=p.mix.structured_output)
    if p.mix.long > 0:
        base.update(long_share=p.mix.long, long_context_tokens=p.context_tokens.p99)
    if p.slo.e2e_p95_s is not None:
        base["e2e_p95_slo_s"] = p.slo.e2e_p95_s
    if p.request_rate_rps is not None:
        # The open-loop phases: a ramp to the profile's rate and past it, then the search for the SLO rate.
        base.update(target_rps=p.request_rate_rps, rates=rate_ramp_to(p.request_rate_rps))
    merged = {**base, **{str(k).replace("-", "_"): v for k, v in (overrides or {}).items()}}
    # The bounds follow the schedule: a 30-minute sustained run is not cut at the default 10 minutes.
    step = float(merged.get("step_s", 10.0))
    ladder_s = len(merged["ladder_tokens"]) * float(merged.get("ladder_repeats", 2)) * float(
        merged.get("request_timeout_s", 120.0))
    planned = ladder_s + len(merged["ramp"]) * step + float(merged["sustained_s"])
    # The open-loop steps (when a phase asks for them): each rate of the ramp and each search step.
    rates = [float(r) for r in merged.get("rates") or [1.0, 2.0, 4.0, 8.0]]
    open_steps = (len(rates) + int(merged.get("search_steps", 6))) * float(merged.get("rate_step_s", 10.0))
    planned += open_steps
    merged.setdefault("max_duration_s", min(DURATIONS["load step"].high, max(600.0, planned * 1.5)))
    peak = max([*merged["ramp"], merged.get("sustained_concurrency") or 1])
    merged.setdefault("max_requests", int(min(10_000_000, max(5000, math.ceil(peak * planned * 4),
                                                              math.ceil(max(rates) * 2 * open_steps)))))
    return load_options(merged)


def profile_cases(loaded: LoadedProfile) -> list[str]:
    cases = [TOOL_PREFIX + n for n in loaded.tool_names] + [SCHEMA_PREFIX + n for n in loaded.schemas]
    cases.append(INVALID_SCHEMA)
    if loaded.multimodal:
        cases.append(MULTIMODAL)
    return cases


def agent_options_from_profile(loaded: LoadedProfile, base: AgentOptions) -> AgentOptions:
    """The suite of ``base`` plus the profile's cases; production tools and schemas are critical flows."""
    extra = profile_cases(loaded)
    cases = [*base.cases, *(c for c in extra if c not in base.cases)]
    critical = [*base.critical, *(c for c in extra if c not in base.critical)]
    return base.model_copy(update={"cases": cases, "critical": critical,
                                   "profile_tools": [dict(t) for t in loaded.tools],
                                   "profile_schemas": {k: dict(v) for k, v in loaded.schemas.items()}})


def is_profile_case(name: str, opts: AgentOptions) -> bool:
    if name in (INVALID_SCHEMA, MULTIMODAL):
        return True
    if name.startswith(TOOL_PREFIX):
        return any(t.get("name") == name[len(TOOL_PREFIX):] for t in opts.profile_tools)
    if name.startswith(SCHEMA_PREFIX):
        return name[len(SCHEMA_PREFIX):] in opts.profile_schemas
    return False


def write_profile_evidence(rd: Any, loaded: LoadedProfile) -> None:
    """``profile.json`` (the envelope, tool and schema names with their JSON) and the files as given,
    under ``inputs/``: the decision reads the profile the run was tested against."""
    rd.write_json(layout.PROFILE, profile_record(loaded))
    rd.write_text(layout.PROFILE_SOURCE, loaded.text)
    for i, (rel, text) in enumerate(sorted(loaded.files.items())):
        rd.write_text(f"{layout.PROFILE_FILES}/{i:02d}-{_safe_name(rel)}", text)


def _safe_name(rel: str) -> str:
    name = PurePath(rel).name or "file"
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)[:80]
