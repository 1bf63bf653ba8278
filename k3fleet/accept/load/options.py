"""The load run's schedule and bounds (:class:`LoadOptions`, :func:`load_options` from ``--load-option``) and
what it reports while it goes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from k3fleet.bounds import DURATIONS
from k3fleet.errors import UsageError, validation_line

Phase = Literal["long_input", "agent_ramp", "sustained", "rate_ramp", "slo_search", "trace"]
# Every phase in run order; the default schedule runs the first three (the open-loop phases are asked for).
PHASES: tuple[Phase, ...] = ("long_input", "agent_ramp", "sustained", "rate_ramp", "slo_search", "trace")
DEFAULT_PHASES: tuple[Phase, ...] = ("long_input", "agent_ramp", "sustained")
OPEN_LOOP: tuple[Phase, ...] = ("rate_ramp", "slo_search", "trace")
Arrival = Literal["poisson", "gamma", "closed"]



# The longest each seconds option may be (k3fleet.bounds DURATIONS).
_MAX_S = {span: DURATIONS[span].high for span in ("load step", "load slo", "request --timeout")}


# The longest prompt the load probe generates (ladder rungs, the agents' system prompt): about 30 MB of text.
# Rungs above the server's own max_model_len are not built at all (k3fleet.accept.load.run).
MAX_PROMPT_TOKENS = 1 << 22


class LoadOptions(BaseModel):
    """The schedule and its bounds. Defaults are small: a full run takes about two minutes."""

    # Finite numbers only: Infinity or NaN (JSON from --load-option) would unbound the run.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    phases: list[Phase] = Field(default_factory=lambda: list(DEFAULT_PHASES))
    ladder_tokens: list[int] = Field(default_factory=lambda: [1024, 4096, 16384])
    ladder_output_tokens: int = Field(default=32, ge=1)
    ladder_repeats: int = Field(default=2, ge=1, le=20)
    ramp: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16])
    step_s: float = Field(default=10.0, gt=0, le=_MAX_S["load step"])
    session_turns: int = Field(default=4, ge=1, le=50)
    turn_output_tokens: int = Field(default=64, ge=1)
    # Sessions' turns generate exactly turn_output_tokens (vLLM's ignore_eos) instead of stopping where the
    # model does: for a model that stops at random (random weights) or a test that must fill the KV cache or
    # the queue by design. Off by default: real agent turns end where the model ends them.
    exact_turn_tokens: bool = False
    system_prompt_tokens: int = Field(default=2048, ge=0)
    sustained_concurrency: int | None = Field(default=None, ge=1)
    sustained_s: float = Field(default=20.0, gt=0, le=_MAX_S["load step"])
    # Bounds: whatever the schedule says, no more requests and no longer than this.
    max_requests: int = Field(default=5000, ge=1)
    max_duration_s: float = Field(default=600.0, gt=0, le=_MAX_S["load step"])
    request_timeout_s: float = Field(default=120.0, gt=0, le=_MAX_S["request --timeout"])
    sample_interval_s: float = Field(default=1.0, gt=0, le=_MAX_S["load step"])
    # What "stable" means at a step.
    ttft_p95_slo_s: float = Field(default=5.0, gt=0, le=_MAX_S["load slo"])
    itl_p95_slo_s: float = Field(default=0.25, gt=0, le=_MAX_S["load slo"])
    error_rate_limit: float = Field(default=0.01, ge=0, le=1)
    # A request within every limit is goodput (docs/acceptance-load.md "Open-loop arrivals"): its TTFT, its
    # mean inter-token gap and (when set) its end-to-end time. A rate meets the SLO when at least
    # goodput_target of its requests do: 0.95 is what p95 limits promise.
    e2e_p95_slo_s: float | None = Field(default=None, gt=0, le=_MAX_S["load slo"])
    goodput_target: float = Field(default=0.95, gt=0, le=1)
    # Open loop: requests arrive at a rate whether or not the server keeps up.
    rates: list[float] = Field(default_factory=lambda: [1.0, 2.0, 4.0, 8.0])
    rate_step_s: float = Field(default=10.0, gt=0, le=_MAX_S["load step"])
    arrival: Arrival = "poisson"
    # Gamma shape of the inter-arrival times (vLLM bench's --burstiness): 1 is Poisson, below 1 burstier,
    # above 1 more even. ``closed``: max_concurrency sessions, each paced to its share of the rate.
    burstiness: float = Field(default=1.0, gt=0, le=100)
    max_concurrency: int | None = Field(default=None, ge=1, le=4096)
    rate_prompt_tokens: int = Field(default=256, ge=1)
    rate_output_tokens: int = Field(default=64, ge=1)
    arrival_seed: int = 0
    # The SLO search: bisect the rate between its bounds (default: the ramp's last held and first failed rate)
    # for at most search_steps steps, or until the bounds are within search_precision of each other.
    search_low_rps: float | None = Field(default=None, gt=0, le=10000)
    search_high_rps: float | None = Field(default=None, gt=0, le=10000)
    search_steps: int = Field(default=6, ge=1, le=30)
    search_precision: float = Field(default=0.05, gt=0, le=1)
    # Repeated runs (docs/acceptance-load.md "Repeated runs"): the schedule runs this many times, each figure
    # gets its spread and 95% interval; the bounds above hold for each run. A timed step's figures leave out
    # the requests started in its first warmup_s and its last cooldown_s seconds (errors always count).
    repeat: int = Field(default=1, ge=1, le=30)
    warmup_s: float = Field(default=0.0, ge=0, le=_MAX_S["load step"])
    cooldown_s: float = Field(default=0.0, ge=0, le=_MAX_S["load step"])
    # Trace replay (docs/acceptance-load.md "Trace replay"): the JSON Lines request log the trace phase replays,
    # its arrival offsets divided by trace_speed.
    trace_path: str | None = Field(default=None, min_length=1, max_length=4096)
    trace_speed: float = Field(default=1.0, gt=0, le=1000)
    # The request mix of the agent sessions (docs/acceptance-load.md "Request mix"): the tools they offer (None:
    # the two built-in ones), the share of turns that offer them, the response schemas and the share of turns
    # that ask for one (structured output), the share of conversations that open at long_context_tokens.
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tools_share: float = Field(default=1.0, ge=0, le=1)
    response_schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)
    structured_share: float = Field(default=0.0, ge=0, le=1)
    long_share: float = Field(default=0.0, ge=0, le=1)
    long_context_tokens: int | None = Field(default=None, ge=16)
    mix_seed: int = 0
    # Retries as a production client makes them: a 429, a 503 or a timeout is sent again, at most retry_max
    # times, after retry_backoff_s doubled each attempt (counted; a retry that repeats a tool call is a finding).
    retry_max: int = Field(default=0, ge=0, le=10)
    retry_backoff_s: float = Field(default=0.5, ge=0, le=_MAX_S["load slo"])
    # GPU telemetry: a DCGM exporter's /metrics URL, read with every sample (docs/acceptance-load.md "GPU
    # telemetry"); none: the run has no GPU curves and says so.
    telemetry_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$", max_length=2048)
    # The rate production peaks at (the profile's request_rate_rps): the SLO rate's margin is read against it.
    target_rps: float | None = Field(default=None, gt=0, le=10000)

    @model_validator(mode="after")
    def _sane(self) -> LoadOptions:
        if any(n < 16 for n in self.ladder_tokens) or self.ladder_tokens != sorted(self.ladder_tokens):
            raise ValueError("ladder_tokens must be ascending context lengths of at least 16 tokens")
        if max(self.ladder_tokens, default=0) > MAX_PROMPT_TOKENS or self.system_prompt_tokens > MAX_PROMPT_TOKENS:
            raise ValueError(f"a generated prompt is at most {MAX_PROMPT_TOKENS} tokens (k3fleet's bound on the "
                             "memory of one prompt; a rung above the server's max_model_len is sent at twice "
                             "that context)")
        if any(c < 1 for c in self.ramp) or self.ramp != sorted(self.ramp):
            raise ValueError("ramp must be ascending concurrencies of at least 1")
        if max(self.ramp, default=1) > 4096 or (self.sustained_concurrency or 0) > 4096:
            raise ValueError("concurrency above 4096 is refused (bounded load)")
        if any(not 0 < r <= 10000 for r in self.rates) or self.rates != sorted(self.rates):
            raise ValueError("rates must be ascending request rates above 0 and at most 10000 per second")
        if self.structured_share > 0 and not self.response_schemas:
            raise ValueError("structured_share above 0 needs response_schemas")
        if self.long_share > 0 and self.long_context_tokens is None:
            raise ValueError("long_share above 0 needs long_context_tokens")
        if self.tools is not None and not all(isinstance(t, dict) and t.get("type") == "function"
                                              and isinstance(t.get("function"), dict) for t in self.tools):
            raise ValueError("tools must be OpenAI tools ({\"type\": \"function\", \"function\": {...}})")
        if ("trace" in self.phases) != (self.trace_path is not None):
            raise ValueError("the trace phase and trace_path go together (--trace FILE)")
        if "rate_ramp" in self.phases and not self.rates:
            raise ValueError("the rate_ramp phase needs at least one rate")
        if self.arrival == "poisson" and self.burstiness != 1.0:
            raise ValueError("burstiness other than 1 needs arrival gamma (Poisson is gamma of shape 1)")
        if self.arrival == "closed" and self.max_concurrency is None:
            raise ValueError("arrival closed needs max_concurrency (the sessions that pace the rate)")
        if (self.search_low_rps and self.search_high_rps and self.search_low_rps >= self.search_high_rps):
            raise ValueError("search_low_rps must be below search_high_rps")
        shortest = min([*([self.step_s] if "agent_ramp" in self.phases else []),
                        *([self.sustained_s / 3] if "sustained" in self.phases else []),
                        *([self.rate_step_s] if any(p in self.phases for p in OPEN_LOOP) else [])], default=None)
        if shortest is not None and self.warmup_s + self.cooldown_s >= shortest:
            raise ValueError(f"warmup_s + cooldown_s must leave part of the shortest timed step ({shortest:g} s)")
        if len(set(self.phases)) != len(self.phases):
            raise ValueError("a phase is named twice")
        return self

    @property
    def envelope(self) -> dict[str, Any]:
        return {"max_context_tokens": max(self.ladder_tokens) if "long_input" in self.phases else None,
                "max_concurrency": max(self.ramp) if "agent_ramp" in self.phases else self.sustained_concurrency,
                "duration_s": self.sustained_s if "sustained" in self.phases else None,
                **({"max_rate_rps": max([*self.rates, self.search_high_rps or 0.0])}
                   if any(p in self.phases for p in OPEN_LOOP) else {})}


def load_options(overrides: Mapping[str, Any]) -> LoadOptions:
    """The load probe's options with the operator's overrides (``--load-option``); bad ones are one usage
    line, found before anything runs or is written."""
    fields = LoadOptions.model_fields
    # The field names (step_s, max_duration_s); a dash is read as an underscore.
    overrides = {str(k).replace("-", "_"): v for k, v in overrides.items()}
    unknown = [k for k in overrides if k not in fields]
    if unknown:
        raise UsageError(f"--load-option {unknown[0]}: not a load option (one of {', '.join(fields)})")
    try:
        return LoadOptions(**overrides)
    except ValidationError as exc:
        raise UsageError(validation_line(exc, at="--load-option ")) from exc


class LoadObserver:
    """What the run reports while it goes (the CLI draws a progress bar from it); no-ops here."""

    def phase_started(self, phase: str, steps: int) -> None:
        """A phase begins with this many steps."""

    def step_started(self, phase: str, label: str, seconds: float | None) -> None:
        """A step begins; ``seconds`` when it is time-boxed."""

    def requests(self, done: int, errors: int) -> None:
        """Running totals, after every finished request."""

    def step_finished(self, row: Mapping[str, Any]) -> None:
        """A curve row (one step's summary)."""

    def note(self, message: str) -> None:
        """Something worth a line (a refused context, a restart, an interruption)."""
