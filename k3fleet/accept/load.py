"""`accept load`: controlled load on a fixed schedule, with the server's own metrics beside it.

Phases (docs/acceptance-load.md, "Schedule"):

1. ``long_input``: one request at a time at each context length of the ladder (cold: a nonce opens
   every prompt), fixed output length: time to first token against context, and where the server
   refuses a context.
2. ``agent_ramp``: concurrent agent sessions (a shared system prompt and tools, tool calls and tool
   results carried turn to turn) ramped step by step; each step runs for ``step_s``.
3. ``sustained``: the highest concurrency the ramp held, kept for ``sustained_s`` in three windows.

``/metrics`` and ``/health`` are sampled through the whole run. Every failure is kept with the
request shape and the concurrency it happened at. The outcome is one of ``stable`` (the tested
envelope holds), ``ceiling`` (stable only up to a named concurrency: limit traffic), ``adjust_config``
(contexts inside the envelope are refused: the server's configuration is below it), ``collapse``
(the server fails: 5xx, cut streams, /health down, restarts, or not even one session within the SLO).

The HTTP client is aiohttp's: at a thousand concurrent streams it costs about a fifth of httpx's
CPU per request here (docs/acceptance-load.md, "Client"), and the load generator must not be the
bottleneck it measures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_redact import excerpt
from k3fleet.accept.client import Endpoint, EndpointError, error_from_status, max_model_len_of, model_card_from
from k3fleet.accept.metrics import SCRAPE_ACCEPT, MetricsError, MetricsSnapshot, metrics_url, parse_metrics
from k3fleet.accept.oom import engine_kv, oom_records
from k3fleet.accept.result import Finding, ProbeResult
from k3fleet.bounds import DURATIONS, cap_bytes, limit_hint

Outcome = Literal["stable", "ceiling", "adjust_config", "collapse"]
Phase = Literal["long_input", "agent_ramp", "sustained"]
PHASES: tuple[Phase, ...] = ("long_input", "agent_ramp", "sustained")
# Error kinds that say the server itself broke (as opposed to being slow or refusing input).
SERVER_KINDS = frozenset({"http_5xx", "stream_error", "stream_cut", "connect", "bad_response"})
_FAILURES_KEPT = 200
# The server's side of every step; a run that could not read one of them says so, and a run that read
# none of them is never a pass on client figures alone (docs/acceptance-load.md, "Server evidence").
SERVER_METRICS = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
                  "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total"}
_OOM = re.compile(r"out of memory|\bOOM\b", re.IGNORECASE)
_CONTEXT = re.compile(r"maximum context length|context length|too long|max_model_len", re.IGNORECASE)

_FILLER = ("drain", "node", "driver", "fabric", "manager", "rail", "queue", "token", "cache", "block", "prefix",
           "session", "agent", "tool", "schema", "latency", "window", "canary", "wave", "rollback", "journal",
           "evidence", "manifest", "verdict", "capacity", "envelope", "ceiling", "stream", "batch", "engine")


# The longest each seconds option may be (k3fleet.bounds DURATIONS).
_MAX_S = {span: DURATIONS[span].high for span in ("load step", "load slo", "request --timeout")}


class LoadOptions(BaseModel):
    """The schedule and its bounds. Defaults are small: a full run takes about two minutes."""

    # Finite numbers only: Infinity or NaN (JSON from --load-option) would unbound the run.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    phases: list[Phase] = Field(default_factory=lambda: list(PHASES))
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

    @model_validator(mode="after")
    def _sane(self) -> LoadOptions:
        if any(n < 16 for n in self.ladder_tokens) or self.ladder_tokens != sorted(self.ladder_tokens):
            raise ValueError("ladder_tokens must be ascending context lengths of at least 16 tokens")
        if any(c < 1 for c in self.ramp) or self.ramp != sorted(self.ramp):
            raise ValueError("ramp must be ascending concurrencies of at least 1")
        if max(self.ramp, default=1) > 4096 or (self.sustained_concurrency or 0) > 4096:
            raise ValueError("concurrency above 4096 is refused (bounded load)")
        return self

    @property
    def envelope(self) -> dict[str, Any]:
        return {"max_context_tokens": max(self.ladder_tokens) if "long_input" in self.phases else None,
                "max_concurrency": max(self.ramp) if "agent_ramp" in self.phases else self.sustained_concurrency,
                "duration_s": self.sustained_s if "sustained" in self.phases else None}


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


@dataclass
class Shot:
    """One request's measurements."""

    phase: str
    step: str
    concurrency: int
    context_tokens: int | None
    t: float
    ok: bool = False
    kind: str | None = None
    status: int | None = None
    message: str | None = None
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int = 0
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    rid: str | None = None  # the response's id: an OOM record names the last successful request by it


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _one_line(text: str, limit: int = 300) -> str:
    return str(excerpt(text, limit, tail=""))


def filler(words: int, seed: int) -> str:
    """Deterministic prose of ``words`` words (varied enough that no tokenizer merges it away)."""
    n = len(_FILLER)
    return " ".join(_FILLER[(seed * 7 + i * (i % 5 + 1)) % n] for i in range(words))


class _Budget(Exception):
    """The request or time bound was reached."""


class _Run:
    def __init__(self, endpoint: Endpoint, opts: LoadOptions, observer: LoadObserver,
                 stop: threading.Event | None, recorder: Any = None) -> None:
        self.ep = endpoint
        self.recorder = recorder
        self.last_raw: str | None = None
        self.opts = opts
        self.obs = observer
        self.stop = stop or threading.Event()
        self.url = endpoint.url("/v1/chat/completions")
        self.t0 = time.monotonic()
        self.deadline = self.t0 + opts.max_duration_s
        self.shots: list[Shot] = []
        self.samples: list[dict[str, Any]] = []
        self.curves: list[dict[str, Any]] = []
        self.findings: list[Finding] = []
        self.failures: list[dict[str, Any]] = []
        self.where = {"phase": "", "step": "", "concurrency": 0}
        self.health_failures = 0
        self.restarts = 0
        self.metrics_errors: list[str] = []
        self.tokens_per_word = 1.3
        self.calibrated = False
        self.interrupted = False
        self.budget_hit: str | None = None
        self.errors = 0
        self._last_start: float | None = None
        self._last_counters: dict[str, float] = {}
        self.old_names: list[str] = []
        self.base_tokens = 0
        self.refused_context: int | None = None
        self.max_model_len: int | None = None
        self.session: aiohttp.ClientSession | None = None

    # -- plumbing --------------------------------------------------------------------------------
    def _check_budget(self) -> None:
        if self.stop.is_set():
            self.interrupted = True
            raise _Budget("interrupted")
        if len(self.shots) >= self.opts.max_requests:
            self.budget_hit = f"request bound reached ({self.opts.max_requests} requests)"
            raise _Budget(self.budget_hit)
        if time.monotonic() >= self.deadline:
            self.budget_hit = f"time bound reached ({self.opts.max_duration_s:.0f} s)"
            raise _Budget(self.budget_hit)

    def _client(self, concurrency: int) -> aiohttp.ClientSession:
        # verify_tls False is the operator's explicit --insecure; True keeps aiohttp's default checks.
        ssl_ctx: ssl.SSLContext | bool = bool(self.ep.verify_tls)
        conn = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, ssl=ssl_ctx, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=self.opts.request_timeout_s, sock_connect=min(10.0,
                                                                                             self.opts.request_timeout_s))
        return aiohttp.ClientSession(connector=conn, timeout=timeout, headers=self.ep.headers())

    def _record(self, shot: Shot) -> None:
        self.shots.append(shot)
        if not shot.ok:
            self.errors += 1
            if len(self.failures) < _FAILURES_KEPT:
                self.failures.append({"t_s": round(shot.t, 3), "phase": shot.phase, "step": shot.step,
                                      "concurrency": shot.concurrency, "context_tokens": shot.context_tokens,
                                      "kind": shot.kind, "status": shot.status, "message": shot.message})
        self.obs.requests(len(self.shots), self.errors)

    async def _send(self, body: dict[str, Any], shot: Shot, *, parse_all: bool) -> Shot:
        """POST one streaming chat completion; fills ``shot`` with timings, usage and errors."""
        assert self.session is not None
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        t0 = time.perf_counter()
        shot.t = time.monotonic() - self.t0
        last: float | None = None
        done = False
        calls: dict[int, dict[str, Any]] = {}
        content: list[str] = []
        try:
            async with self.session.post(self.url, data=data, headers={"Content-Type": "application/json"}) as resp:
                shot.status = resp.status
                if resp.status != 200:
                    text = (await resp.content.read(4000)).decode("utf-8", "replace")
                    shot.kind, shot.message = _classify_status(resp.status, text, self.ep)
                    return shot
                async for raw in resp.content:
                    if not raw.startswith(b"data:"):
                        continue
                    payload = raw[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    now = time.perf_counter()
                    shot.chunks += 1
                    if parse_all or shot.ttft is None or _needs_parse(payload):
                        try:
                            obj = json.loads(payload)
                        except ValueError:
                            shot.kind, shot.message = "bad_response", "a streamed chunk is not JSON"
                            return shot
                        if not isinstance(obj, dict):
                            continue
                        if shot.rid is None and isinstance(obj.get("id"), str):
                            shot.rid = obj["id"][:80]
                        if obj.get("error") or obj.get("object") == "error":
                            err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
                            shot.kind = "stream_error"
                            shot.message = _one_line(str(err.get("message") if isinstance(err, dict) else err))
                            return shot
                        usage = obj.get("usage")
                        if isinstance(usage, dict):
                            _take_usage(shot, usage)
                        token = _delta_token(obj, content if parse_all else None, calls if parse_all else None)
                    else:
                        token = True
                    if token:
                        if shot.ttft is None:
                            shot.ttft = now - t0
                        elif last is not None:
                            shot.gaps.append(now - last)
                        last = now
        except TimeoutError:
            shot.kind, shot.message = "timeout", f"no complete answer within {self.opts.request_timeout_s:g} s"
            return shot
        except aiohttp.ClientConnectorError as exc:
            shot.kind, shot.message = "connect", _one_line(f"cannot connect: {exc.os_error or exc}")
            return shot
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            shot.kind, shot.message = "stream_cut", _one_line(f"connection closed mid-response: {exc}")
            return shot
        except aiohttp.ClientError as exc:
            shot.kind, shot.message = "bad_response", _one_line(f"{type(exc).__name__}: {exc}")
            return shot
        except ValueError as exc:  # a line longer than the stream reader's limit
            shot.kind, shot.message = "bad_response", _one_line(str(exc))
            return shot
        shot.e2e = time.perf_counter() - t0
        if not done:
            shot.kind, shot.message = "stream_cut", "the stream ended before [DONE]"
            return shot
        if shot.ttft is None:
            shot.kind, shot.message = "bad_response", "the stream carried no token"
            return shot
        if shot.completion_tokens is None:
            shot.completion_tokens = len(shot.gaps) + 1
        shot.content = "".join(content)
        shot.tool_calls = [calls[i] for i in sorted(calls)]
        shot.ok = True
        return shot

    # -- monitoring ------------------------------------------------------------------------------
    async def _monitor(self) -> None:
        assert self.session is not None
        health_url = self.ep.url("/health")
        while True:
            row: dict[str, Any] = {"t_s": round(time.monotonic() - self.t0, 3), **self.where}
            try:
                async with self.session.get(health_url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    row["health"] = r.status
                    await r.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                row["health"] = _one_line(f"{type(exc).__name__}: {exc}", 120)
            if row["health"] != 200:
                self.health_failures += 1
            snap = await self._scrape()
            if snap is not None:
                row.update({k: v for k, v in snap.summary(self.ep.model).items()})
                by_engine = engine_kv(snap, self.ep.model)
                if by_engine:
                    row["kv_by_engine"] = by_engine
                row.update(self._restart_check(snap))
            self.samples.append(row)
            await asyncio.sleep(self.opts.sample_interval_s)

    async def _scrape(self) -> MetricsSnapshot | None:
        assert self.session is not None
        try:
            async with self.session.get(metrics_url(self.ep.base_url), headers={"Accept": SCRAPE_ACCEPT},
                                        timeout=aiohttp.ClientTimeout(total=10)) as r:
                # At most the metrics cap (k3fleet.bounds), read in pieces, never the whole page first.
                cap, page = cap_bytes("metrics"), bytearray()
                async for piece in r.content.iter_chunked(1 << 16):
                    page += piece
                    if len(page) > cap:
                        raise MetricsError(f"/metrics answered more than {cap} bytes ({limit_hint('metrics')})")
                text = page.decode(r.get_encoding() if r.charset else "utf-8", errors="replace")
                if r.status != 200:
                    raise MetricsError(f"/metrics answered {r.status}")
                snap = parse_metrics(text, r.headers.get("Content-Type"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._metrics_error(_one_line(f"/metrics unreachable: {type(exc).__name__}: {exc}"))
            return None
        except MetricsError as exc:
            self._metrics_error(str(exc))
            return None
        if snap.is_old_server and not self.old_names:
            self.old_names = snap.old_names()
        if self.last_raw is None:
            self._snapshot("load-start", snap.raw)
        self.last_raw = snap.raw
        return snap

    def _snapshot(self, window: str, raw: str | None) -> None:
        """Raw /metrics pages for the run directory (``metrics/<window>.txt``), when a recorder is given."""
        if self.recorder is not None and raw is not None:
            self.recorder.snapshot(window, raw)

    def _metrics_error(self, message: str) -> None:
        if message not in self.metrics_errors and len(self.metrics_errors) < 20:
            self.metrics_errors.append(message)

    def _restart_check(self, snap: MetricsSnapshot) -> dict[str, Any]:
        """A new process start time, or a counter that went down, is a server restart."""
        start = snap.process_start_time()
        counters = {k: v for k, v in (("prompt_tokens", snap.counter("vllm:prompt_tokens", self.ep.model)),
                                      ("generation_tokens", snap.counter("vllm:generation_tokens", self.ep.model)))
                    if v is not None}
        restarted = False
        if start is not None and self._last_start is not None and start > self._last_start + 0.5:
            restarted = True
        if any(v < self._last_counters.get(k, 0.0) for k, v in counters.items()):
            restarted = True
        if start is not None:
            self._last_start = start
        self._last_counters = counters
        if restarted:
            self.restarts += 1
            self.obs.note(f"server restart seen during {self.where['phase']} {self.where['step']}")
        return {"restarted": restarted} if restarted else {}

    # -- phases ----------------------------------------------------------------------------------
    async def _check_model(self) -> None:
        """The model must be in /v1/models (exit 2 otherwise), as for every probe; its max_model_len is kept."""
        assert self.session is not None
        url = self.ep.display_url + "/v1/models"
        try:
            async with self.session.get(self.ep.url("/v1/models"), timeout=aiohttp.ClientTimeout(total=30)) as r:
                raw = await r.content.read(cap_bytes("models") + 1)
                status = r.status
        except aiohttp.ClientConnectorError as exc:
            raise EndpointError(f"cannot connect to {url}: {_one_line(str(exc.os_error or exc))}",
                                kind="unreachable") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EndpointError(f"{url}: {_one_line(f'{type(exc).__name__}: {exc}')}", kind="unreachable") from exc
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        if status != 200:
            raise error_from_status(status, body, url, self.ep)
        _, card = model_card_from(body, self.ep)
        self.max_model_len = max_model_len_of(card)

    async def _calibrate(self) -> None:
        """Tokens per filler word from the server's own usage (two tiny requests)."""
        counts = []
        for words in (0, 400):
            shot = Shot("calibration", "", 1, None, 0.0)
            body = self._plain_body(filler(words, 1), 1)
            await self._send(body, shot, parse_all=False)
            if not shot.ok:
                # The calibration is the first traffic: a server that cannot answer it is reported
                # as one line (unreachable, 401, 404 model...).
                raise EndpointError(f"{self.ep.display_url}: first request failed: {shot.message}",
                                    kind=_endpoint_kind(shot), status=shot.status)
            counts.append(shot.prompt_tokens)
        if counts[0] is not None and counts[1] is not None and counts[1] > counts[0]:
            self.tokens_per_word = (counts[1] - counts[0]) / 400
            self.calibrated = True
        self.base_tokens = counts[0] or 0

    def _words_for(self, tokens: int) -> int:
        return max(1, int((tokens - self.base_tokens) / self.tokens_per_word))

    def _plain_body(self, text: str, max_tokens: int) -> dict[str, Any]:
        return {"model": self.ep.model, "messages": [{"role": "user", "content": text}], "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0}

    async def _long_input(self) -> None:
        opts = self.opts
        self.obs.phase_started("long_input", len(opts.ladder_tokens))
        for n, tokens in enumerate(opts.ladder_tokens):
            label = f"{tokens} tokens"
            self.where.update(phase="long_input", step=label, concurrency=1)
            self.obs.step_started("long_input", label, None)
            t_start = time.monotonic()
            shots: list[Shot] = []
            complete = False
            try:
                for rep in range(opts.ladder_repeats):
                    self._check_budget()
                    nonce = f"run {self.t0:.6f} ladder {n} repeat {rep}: "
                    text = nonce + filler(self._words_for(tokens), seed=n * 31 + rep)
                    shot = Shot("long_input", label, 1, tokens, 0.0)
                    await self._send(self._plain_body(text, opts.ladder_output_tokens), shot, parse_all=False)
                    self._record(shot)
                    shots.append(shot)
                    if shot.kind == "context_length":
                        break
                complete = True
            finally:
                if shots:
                    row = self._row("long_input", label, 1, shots, t_start)
                    row["context_tokens"] = tokens
                    row["max_tokens"] = opts.ladder_output_tokens
                    if not complete:
                        row["partial"] = True
                    self._curve(row)
            if any(s.kind == "context_length" for s in shots):
                self.refused_context = tokens
                self.obs.note(f"context of {tokens} tokens refused by the server")
                break

    def _tools(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {
                "name": "lookup_runbook", "description": "Find the runbook section for a topic.",
                "parameters": {"type": "object", "properties": {"topic": {"type": "string"}},
                               "required": ["topic"]}}},
            {"type": "function", "function": {
                "name": "node_status", "description": "Read a node's drain and driver state.",
                "parameters": {"type": "object", "properties": {
                    "node": {"type": "string"}, "fields": {"type": "array", "items": {"type": "string"}}},
                    "required": ["node"]}}}]

    def _system_prompt(self) -> str:
        # Shared by every session: the prefix a real agent fleet reuses (and a cache can hit).
        words = self._words_for(self.opts.system_prompt_tokens) if self.opts.system_prompt_tokens else 0
        return "You are the fleet operations agent. Use the tools when a question needs data. " + filler(words, 7)

    async def _agent_session(self, sid: int, phase: str, label: str, concurrency: int, until: float,
                       system: str, tools: list[dict[str, Any]], out: list[Shot]) -> None:
        opts = self.opts
        convo = 0
        while time.monotonic() < until:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Session {sid}.{convo}: is node n{sid:03d} drained? "
                                            f"call node_status node=n{sid:03d}"}]
            for turn in range(opts.session_turns):
                if time.monotonic() >= until:
                    return
                self._check_budget()
                body = {"model": self.ep.model, "messages": messages, "tools": tools, "stream": True,
                        "stream_options": {"include_usage": True}, "max_tokens": opts.turn_output_tokens,
                        "temperature": 0}
                if opts.exact_turn_tokens:
                    body["ignore_eos"] = True
                shot = Shot(phase, label, concurrency, None, 0.0)
                await self._send(body, shot, parse_all=True)
                shot.context_tokens = shot.prompt_tokens
                self._record(shot)
                out.append(shot)
                if not shot.ok:
                    # Do not spin on a server that fails fast: wait a moment, start a new conversation.
                    await asyncio.sleep(min(1.0, opts.step_s / 10))
                    break
                if shot.tool_calls:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [
                        {"id": c.get("id") or f"call_{sid}_{turn}_{i}", "type": "function",
                         "function": c["function"]} for i, c in enumerate(shot.tool_calls)]})
                    for i, c in enumerate(shot.tool_calls):
                        messages.append({"role": "tool", "tool_call_id": c.get("id") or f"call_{sid}_{turn}_{i}",
                                         "content": json.dumps({"node": f"n{sid:03d}", "drained": False,
                                                                "driver": "580.95.05", "note": filler(40, turn)})})
                else:
                    messages.append({"role": "assistant", "content": shot.content})
                    messages.append({"role": "user", "content": f"Turn {turn + 1}: and what next? "
                                                                f"lookup_runbook topic=drain-{sid}"})
            convo += 1

    async def _concurrent_step(self, phase: str, label: str, concurrency: int, seconds: float,
                               shots: list[Shot]) -> None:
        self.where.update(phase=phase, step=label, concurrency=concurrency)
        self.obs.step_started(phase, label, seconds)
        until = time.monotonic() + seconds
        system, tools = self._system_prompt(), self._tools()
        tasks = [asyncio.ensure_future(self._agent_session(i, phase, label, concurrency, until, system, tools,
                                                           shots))
                 for i in range(concurrency)]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise
        for res in results:
            if isinstance(res, BaseException):
                raise res

    async def _timed_step(self, phase: str, label: str, concurrency: int, seconds: float) -> dict[str, Any]:
        """One time-boxed step; an interrupted or bounded step still leaves its row (marked partial)."""
        shots: list[Shot] = []
        t_start = time.monotonic()
        complete = False
        try:
            await self._concurrent_step(phase, label, concurrency, seconds, shots)
            complete = True
        finally:
            row = self._row(phase, label, concurrency, shots, t_start)
            if not complete:
                row["partial"] = True
            self._curve(row)
        return row

    async def _agent_ramp(self) -> None:
        self.obs.phase_started("agent_ramp", len(self.opts.ramp))
        for c in self.opts.ramp:
            row = await self._timed_step("agent_ramp", f"{c} sessions", c, self.opts.step_s)
            if row["verdict"] != "ok":
                break

    async def _sustained(self, concurrency: int) -> None:
        self.obs.phase_started("sustained", 3)
        window = self.opts.sustained_s / 3
        for w in range(3):
            await self._timed_step("sustained", f"{concurrency} sessions, window {w + 1}/3", concurrency, window)

    # -- rows and outcome ------------------------------------------------------------------------
    def _row(self, phase: str, label: str, concurrency: int, shots: list[Shot], t_start: float) -> dict[str, Any]:
        t_end = time.monotonic()
        ok = [s for s in shots if s.ok]
        kinds = Counter(s.kind for s in shots if not s.ok)
        ttft = [s.ttft for s in ok if s.ttft is not None]
        gaps = [g for s in ok for g in s.gaps]
        e2e = [s.e2e for s in ok if s.e2e is not None]
        dur = max(t_end - t_start, 1e-9)
        row: dict[str, Any] = {
            "phase": phase, "step": label, "concurrency": concurrency,
            "t_start_s": round(t_start - self.t0, 3), "duration_s": round(dur, 3),
            "requests": len(shots), "ok": len(ok), "errors": dict(kinds),
            "rps": round(len(ok) / dur, 3),
            "output_tokens_per_s": round(sum(s.completion_tokens or 0 for s in ok) / dur, 1),
            "prompt_tokens_mean": _mean([s.prompt_tokens for s in ok]),
            "cached_tokens_mean": _mean([s.cached_tokens for s in ok]),
        }
        for name, values in (("ttft", ttft), ("itl", gaps), ("e2e", e2e)):
            for q in (50, 90, 95, 99):
                v = percentile(values, q)
                row[f"{name}_p{q}_s"] = None if v is None else round(v, 4)
        row.update(self._server_window(t_start - self.t0, t_end - self.t0))
        row["verdict"] = self._verdict(phase, row, shots)
        return row

    def _server_window(self, a: float, b: float) -> dict[str, Any]:
        inside = [s for s in self.samples if a <= s["t_s"] <= b]
        before = [s for s in self.samples if s["t_s"] < a][-1:]
        out: dict[str, Any] = {"samples": len(inside)}
        for key in ("running", "waiting", "kv_usage"):
            vals = [s[key] for s in inside if s.get(key) is not None]
            out[f"{key}_max"] = max(vals) if vals else None
        # The queue most of the step saw: a blip of one waiting request is not a ceiling.
        waits = sorted(s["waiting"] for s in inside if s.get("waiting") is not None)
        out["waiting_p50"] = waits[len(waits) // 2] if waits else None
        for key in ("preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries",
                    "prefix_cache_hits", "prompt_tokens_cached"):
            series = [s[key] for s in before + inside if s.get(key) is not None]
            out[f"{key}_delta"] = (series[-1] - series[0]) if len(series) >= 2 and series[-1] >= series[0] else None
        out["health_failures"] = sum(1 for s in inside if s.get("health") != 200)
        out["restarts"] = sum(1 for s in inside if s.get("restarted"))
        return out

    def _verdict(self, phase: str, row: dict[str, Any], shots: list[Shot]) -> str:
        n = max(len(shots), 1)
        server = sum(1 for s in shots if s.kind in SERVER_KINDS)
        if row["health_failures"] or row["restarts"] or (server and server / n > self.opts.error_rate_limit):
            return "server"
        if any(s.kind == "context_length" for s in shots):
            return "context"
        if phase == "long_input":
            return "ok" if all(s.ok for s in shots) else "errors"
        timeouts = sum(1 for s in shots if s.kind == "timeout")
        other = sum(1 for s in shots if not s.ok) - server
        if timeouts or not shots:
            return "latency"
        if other / n > self.opts.error_rate_limit:
            return "errors"
        # Load pressure the server itself reports: the KV cache ran full (preemptions), or a concurrency
        # ceiling: requests waited for most of the step (3 samples at least) while the server ran fewer
        # than the sessions offered (its --max-num-seqs). A request between prefill and decode that shows
        # as waiting for a moment while every session runs is no ceiling.
        if row.get("preemptions_delta"):
            return "preempted"
        running = row.get("running_max")
        if (row.get("waiting_p50") is not None and row["waiting_p50"] >= 1 and row.get("samples", 0) >= 3
                and running is not None and running < row["concurrency"]):
            return "queued"
        ttft, itl = row.get("ttft_p95_s"), row.get("itl_p95_s")
        if ttft is not None and ttft > self.opts.ttft_p95_slo_s:
            return "latency"
        if itl is not None and itl > self.opts.itl_p95_slo_s:
            return "latency"
        return "ok"

    def _curve(self, row: dict[str, Any]) -> None:
        self.curves.append(row)
        self.obs.step_finished(row)

    def _outcome(self) -> tuple[Outcome | None, int | None, str, list[Finding]]:
        rows = self.curves
        findings: list[Finding] = []
        server_rows = [r for r in rows if r["verdict"] == "server"]
        if server_rows or self.restarts or (self.health_failures and rows):
            r = server_rows[0] if server_rows else None
            where = (f"{r['phase']} at {r['step']}" if r else "during the run")
            why = self._server_why(r)
            findings.append(Finding(id="accept.load.collapse", severity="fail", layer="environment",
                                    message=f"the server failed under load ({where}): {why}",
                                    evidence=json.dumps(self.failures[:3], default=str)))
            return "collapse", None, f"collapse {where}: {why}; expand capacity", findings
        envelope = self.opts.envelope["max_context_tokens"]
        refused = self.refused_context
        ctx_rows = [r for r in rows if r["verdict"] == "context" and r["phase"] != "long_input"]
        if (refused is not None and (envelope is None or refused <= envelope)) or ctx_rows:
            what = (f"a {refused}-token context" if refused is not None else
                    f"agent contexts of about {ctx_rows[0].get('prompt_tokens_mean') or '?'} tokens")
            findings.append(Finding(id="accept.load.context_refused", severity="fail", layer="config",
                                    message=f"{what} is refused by the server inside the tested envelope "
                                            f"({envelope} tokens): raise --max-model-len (and KV capacity) "
                                            "or lower the envelope"))
            return "adjust_config", None, f"{what} is refused inside the envelope", findings
        for r in rows:
            if r["phase"] == "long_input" and r["verdict"] == "errors":
                findings.append(Finding(id="accept.load.long_input_errors", severity="warn", layer="traffic",
                                        message=f"long input {r['step']}: {self._slo_text(r)}"))
        # A step cut short by Ctrl-C or a bound says nothing about latency at its concurrency.
        ramp = [r for r in rows if r["phase"] == "agent_ramp" and not r.get("partial")]
        sustained = [r for r in rows if r["phase"] == "sustained" and not r.get("partial")]
        ok_ramp = [r["concurrency"] for r in ramp if r["verdict"] == "ok"]
        bad = [r for r in ramp if r["verdict"] != "ok"] or [r for r in sustained if r["verdict"] != "ok"]
        if bad:
            first_bad = bad[0]
            held = [c for c in ok_ramp if c < first_bad["concurrency"]]
            if not held:
                findings.append(Finding(id="accept.load.collapse", severity="fail", layer="environment",
                                        message=f"not even {first_bad['concurrency']} session(s) stay within the SLO "
                                                f"({self._slo_text(first_bad)})"))
                return "collapse", None, (f"no tested concurrency holds the SLO ({self._slo_text(first_bad)}); "
                                          "expand capacity"), findings
            ceiling = max(held)
            findings.append(Finding(id="accept.load.ceiling", severity="warn", layer="traffic",
                                    message=f"stable up to {ceiling} concurrent sessions; at "
                                            f"{first_bad['concurrency']} ({first_bad['phase']}): "
                                            f"{self._pressure_text(first_bad)}; limit traffic to {ceiling}"))
            return "ceiling", ceiling, (f"stable only up to {ceiling} concurrent sessions "
                                        f"({self._pressure_text(first_bad)} at {first_bad['concurrency']})"), findings
        if not [r for r in rows if not r.get("partial")]:
            return None, None, "no step completed", findings
        return "stable", None, self._stable_text(rows), findings

    def _stable_text(self, rows: list[dict[str, Any]]) -> str:
        """The figures behind "stable", for the terminal: what was tested and what it held."""
        done = [r for r in rows if not r.get("partial")]
        loaded = [r for r in done if r["phase"] != "long_input"] or done
        top = max(r["concurrency"] for r in loaded)
        p95 = [r["ttft_p95_s"] for r in loaded if r.get("ttft_p95_s") is not None]
        ttft = (f"TTFT p95 {max(p95):.2f} s (worst step; SLO {self.opts.ttft_p95_slo_s:g} s)" if p95
                else "no TTFT measured")
        return (f"stable up to {top} concurrent sessions (the most tested): {len(self.shots)} requests, {ttft}, "
                f"{self.errors} errors, no ceiling found")

    def _server_why(self, row: Mapping[str, Any] | None) -> str:
        parts = []
        if row is not None and row.get("errors"):
            parts.append(", ".join(f"{n} {k}" for k, n in row["errors"].items()))
        if self.health_failures:
            parts.append(f"{self.health_failures} /health failure(s)")
        if self.restarts:
            parts.append(f"{self.restarts} restart(s)")
        first = next((f for f in self.failures if f["kind"] in SERVER_KINDS), None)
        if first and first.get("message"):
            parts.append(f"first: {first['message']}")
        return "; ".join(parts) or "server errors"

    def _pressure_text(self, row: Mapping[str, Any]) -> str:
        """What the server said at a step that did not hold: its queue, its preemptions, else the SLO."""
        if row.get("verdict") == "queued":
            running = f", {row['running_max']:.0f} running at most" if row.get("running_max") is not None else ""
            return (f"the server queued requests (vllm:num_requests_waiting {row['waiting_p50']:.0f} for most of the "
                    f"step, up to {row['waiting_max']:.0f}{running})")
        if row.get("verdict") == "preempted":
            return (f"the KV cache ran full: {row['preemptions_delta']:.0f} preemption(s) "
                    "(vllm:num_preemptions_total)")
        return self._slo_text(row)

    def _slo_text(self, row: Mapping[str, Any]) -> str:
        bits = []
        if row.get("errors"):
            bits.append("errors " + ", ".join(f"{n} {k}" for k, n in row["errors"].items()))
        if row.get("ttft_p95_s") is not None:
            bits.append(f"TTFT p95 {row['ttft_p95_s']:.2f} s (SLO {self.opts.ttft_p95_slo_s:g})")
        if row.get("itl_p95_s") is not None:
            bits.append(f"ITL p95 {row['itl_p95_s'] * 1000:.0f} ms (SLO {self.opts.itl_p95_slo_s * 1000:g})")
        if row.get("waiting_max"):
            bits.append(f"up to {row['waiting_max']:.0f} waiting")
        return ", ".join(bits) or row.get("verdict", "")

    # -- the run ---------------------------------------------------------------------------------
    async def execute(self) -> ProbeResult:
        top = max([*self.opts.ramp, self.opts.sustained_concurrency or 1, 1])
        self.session = self._client(top + 2)
        monitor: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        main = asyncio.current_task()
        try:
            await self._check_model()
            await self._calibrate()
            monitor = asyncio.ensure_future(self._monitor())
            watcher = asyncio.ensure_future(_watch(self.stop, main))
            try:
                if "long_input" in self.opts.phases:
                    await self._long_input()
                    self._snapshot("load-long_input", self.last_raw)
                if "agent_ramp" in self.opts.phases:
                    await self._agent_ramp()
                    self._snapshot("load-agent_ramp", self.last_raw)
                if "sustained" in self.opts.phases:
                    ramp_ok = [r["concurrency"] for r in self.curves if r["phase"] == "agent_ramp"
                               and r["verdict"] == "ok"]
                    ramp_run = any(r["phase"] == "agent_ramp" for r in self.curves)
                    conc = self.opts.sustained_concurrency or (max(ramp_ok) if ramp_ok else
                                                               (None if ramp_run else max(self.opts.ramp)))
                    if conc is not None and not any(r["verdict"] == "server" for r in self.curves):
                        await self._sustained(conc)
            except _Budget:
                pass
            except asyncio.CancelledError:
                if not self.stop.is_set():
                    raise
                self.interrupted = True
                _uncancel()
        finally:
            for task in (monitor, watcher):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (monitor, watcher) if t is not None), return_exceptions=True)
            await self.session.close()
            self._snapshot("load-end", self.last_raw)
        return self._result()

    def _result(self) -> ProbeResult:
        outcome, ceiling, reason, findings = self._outcome()
        findings = [*findings, *self._side_findings()]
        ran = sorted({r["phase"] for r in self.curves}, key=PHASES.index)
        incomplete = self.interrupted or self.budget_hit is not None
        status: Literal["pass", "fail", "inconclusive"]
        if self.interrupted:
            status, reason = "inconclusive", f"interrupted: {len(self.shots)} requests measured; {reason}"
        elif outcome is None:
            status = "inconclusive"
        elif outcome == "stable" and incomplete:
            status, reason = "inconclusive", f"{self.budget_hit}: the envelope was not fully tested"
        elif outcome == "stable" and self._unread():
            status = "inconclusive"
            reason = ("stable on client figures only: the server's " + ", ".join(self._unread())
                      + " could not be read, and missing server evidence is not stability")
        else:
            status = "pass" if outcome == "stable" else "fail"
        kinds = Counter(s.kind for s in self.shots if not s.ok)
        data: dict[str, Any] = {
            "outcome": outcome, "ceiling": ceiling, "envelope": self.opts.envelope,
            "phases": ran, "curves": self.curves, "samples": self.samples, "failures": self.failures,
            "counts": {"requests": len(self.shots), "ok": len(self.shots) - self.errors, "errors": dict(kinds),
                       "timeouts": kinds.get("timeout", 0), "health_failures": self.health_failures,
                       "restarts": self.restarts,
                       "oom_events": sum(1 for s in self.shots if s.message and _OOM.search(s.message)),
                       "preemptions": _delta_total(self.samples, "preemptions")},
            "oom_records": oom_records(self.shots, self.samples, self.ep.display_url),
            "calibration": {"tokens_per_word": round(self.tokens_per_word, 4), "from_usage": self.calibrated},
            "options": self.opts.model_dump(mode="json"),
            "interrupted": self.interrupted, "bound": self.budget_hit,
            "metrics_errors": self.metrics_errors, "old_metric_names": self.old_names,
            "unread_metrics": self._unread(), "max_model_len": self.max_model_len,
            "elapsed_s": round(time.monotonic() - self.t0, 3),
        }
        return ProbeResult(probe="load", status=status, reason=reason, findings=findings, data=data)

    def _unread(self) -> list[str]:
        """The server metrics no sample of the run could read (all of them when nothing was sampled)."""
        return _unread_of(self.samples)

    def _side_findings(self) -> list[Finding]:
        out: list[Finding] = []
        if self.old_names:
            out.append(Finding(id="accept.load.old_metric_names", severity="warn", layer="config",
                               message="the server exposes only removed metric names (" + ", ".join(self.old_names)
                                       + "): queue and KV curves are missing; upgrade vLLM"))
        if self.metrics_errors:
            out.append(Finding(id="accept.load.metrics_unavailable", severity="warn", layer="http",
                               message=f"/metrics could not be read during the run: {self.metrics_errors[0]}"))
        for name in self._unread():
            out.append(Finding(id="accept.load.metric_unread", severity="warn", layer="http",
                               message=f"{name} could not be read during the run: what it shows (running, "
                                       "waiting, KV usage, preemptions) is unknown, not fine", evidence=name))
        pre = _delta_total(self.samples, "preemptions")
        if pre:
            first = next((r for r in self.curves if r.get("preemptions_delta")), None)
            where = f", first at {first['concurrency']} session(s) ({first['phase']})" if first else ""
            out.append(Finding(id="accept.load.preemptions", severity="warn", layer="traffic",
                               message=f"{pre:.0f} preemption(s) during the run{where}: the KV cache ran full: load "
                                       "pressure, not a fault; limit traffic or give the KV cache more room"))
        for rec in oom_records(self.shots, self.samples, self.ep.display_url):
            if rec["topology"]:
                kv = ", ".join(f"engine {e} {v:.2f}" for e, v in sorted(rec["memory_before"]["kv_by_engine"].items()))
                out.append(Finding(id="accept.load.topology_oom", severity="warn", layer="environment",
                                   message=f"OOM at {rec['t_s']:g}s ({rec['phase']} {rec['step']}) with uneven KV "
                                           f"pressure across engines ({kv}): a topology OOM, not capacity; check "
                                           "the data-parallel placement and expert balance", evidence=rec["message"]))
                break
        if not self.calibrated and self.shots:
            out.append(Finding(id="accept.load.no_usage", severity="info", layer="http",
                               message="the server reports no usage: context lengths are estimated at "
                                       f"{self.tokens_per_word} tokens per word"))
        if self.budget_hit:
            out.append(Finding(id="accept.load.bound", severity="warn", layer="traffic", message=self.budget_hit))
        return out


def _unread_of(samples: list[dict[str, Any]]) -> list[str]:
    return [name for key, name in SERVER_METRICS.items() if not any(s.get(key) is not None for s in samples)]


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


async def _watch(stop: threading.Event, task: asyncio.Task[Any] | None) -> None:
    """Turn a Ctrl-C (set from the signal handler's thread) into cancelling the run's main task."""
    while not stop.is_set():
        await asyncio.sleep(0.1)
    if task is not None:
        task.cancel()


def _delta_total(samples: list[dict[str, Any]], key: str) -> float | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    if len(vals) < 2:
        return None
    # Sum the rises, skipping resets (a restart zeroes counters).
    return float(sum(b - a for a, b in itertools.pairwise(vals) if b >= a))


def _mean(values: list[int | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return round(sum(xs) / len(xs), 1) if xs else None


def _needs_parse(payload: bytes) -> bool:
    """Chunks that carry more than a token: usage, an error, or the finish reason."""
    if b'"usage"' in payload or b'"error"' in payload:
        return True
    return b"finish_reason" in payload and b'"finish_reason":null' not in payload and \
        b'"finish_reason": null' not in payload


def _take_usage(shot: Shot, usage: Mapping[str, Any]) -> None:
    if isinstance(usage.get("prompt_tokens"), int):
        shot.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        shot.completion_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, Mapping) and isinstance(details.get("cached_tokens"), int):
        shot.cached_tokens = details["cached_tokens"]


def _delta_token(obj: Mapping[str, Any], content: list[str] | None, calls: dict[int, dict[str, Any]] | None) -> bool:
    token = False
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(delta, Mapping):
            continue
        for key in ("content", "reasoning", "reasoning_content"):
            if delta.get(key):
                token = True
                if key == "content" and content is not None:
                    content.append(str(delta[key]))
        for tc in delta.get("tool_calls") or []:
            token = True
            if calls is None or not isinstance(tc, Mapping):
                continue
            raw_idx = tc.get("index")
            idx = raw_idx if isinstance(raw_idx, int) else len(calls)
            slot = calls.setdefault(idx, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn_raw = tc.get("function")
            fn: Mapping[str, Any] = fn_raw if isinstance(fn_raw, Mapping) else {}
            if isinstance(fn.get("name"), str):
                slot["function"]["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                slot["function"]["arguments"] += fn["arguments"]
    return token


def _classify_status(status: int, text: str, endpoint: Endpoint) -> tuple[str, str]:
    try:
        body: Any = json.loads(text)
    except ValueError:
        body = text
    message = error_from_status(status, body, endpoint.display_url + "/v1/chat/completions", endpoint).message
    if status == 400 and _CONTEXT.search(text):
        return "context_length", message
    if status in (401, 403):
        return "auth", message
    if status == 404:
        return "not_found", message
    if status >= 500:
        return "http_5xx", message
    return "http_4xx", message


def _endpoint_kind(shot: Shot) -> str:
    return {"auth": "auth", "not_found": "not_found", "connect": "unreachable", "timeout": "timeout",
            "http_5xx": "server"}.get(shot.kind or "", "bad_response")


async def run_load(endpoint: Endpoint, opts: LoadOptions, observer: LoadObserver | None = None, *,
                   stop: threading.Event | None = None, recorder: Any = None) -> ProbeResult:
    """Run the load schedule against ``endpoint``. A first request that fails (unreachable, 401, unknown
    model) raises :class:`EndpointError`; everything after it is measured and returned. ``stop`` (set
    from a signal handler) ends the run early with what was measured; ``recorder`` (``snapshot(window,
    raw)``) receives raw /metrics pages at the start, after each phase and at the end."""
    return await _Run(endpoint, opts, observer or LoadObserver(), stop, recorder).execute()


# -- a flat closed-loop run: the benchmark's workload ----------------------------------------------------

class ConstantResult(BaseModel):
    requests: int
    ok: int
    errors: dict[str, int]
    wall_s: float
    rps: float
    output_tokens: int
    ttft_p50_s: float | None
    itl_p50_s: float | None


async def run_constant(endpoint: Endpoint, *, concurrency: int, requests: int, prompt_words: int,
                       output_tokens: int, timeout_s: float = 300.0,
                       on_done: Callable[[int], None] | None = None) -> ConstantResult:
    """``concurrency`` streams sending ``requests`` identical-shape chat completions (prompt of
    ``prompt_words`` words, ``output_tokens`` out): what ``make bench-load`` compares with guidellm."""
    opts = LoadOptions(max_requests=requests + 10, request_timeout_s=timeout_s, max_duration_s=max(timeout_s, 3600),
                       phases=["sustained"], ramp=[concurrency])
    run = _Run(endpoint, opts, LoadObserver(), None)
    run.session = run._client(concurrency)
    left = list(range(requests))
    shots: list[Shot] = []

    async def worker() -> None:
        while left:
            i = left.pop()
            shot = Shot("bench", "", concurrency, None, 0.0)
            await run._send(run._plain_body(f"request {i}: " + filler(prompt_words, i), output_tokens), shot,
                            parse_all=False)
            shots.append(shot)
            if on_done is not None:
                on_done(len(shots))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await run.session.close()
    wall = time.perf_counter() - t0
    ok = [s for s in shots if s.ok]
    return ConstantResult(requests=len(shots), ok=len(ok), errors=dict(Counter(s.kind or "?" for s in shots
                                                                                if not s.ok)),
                          wall_s=round(wall, 3), rps=round(len(ok) / wall, 3),
                          output_tokens=sum(s.completion_tokens or 0 for s in ok),
                          ttft_p50_s=percentile([s.ttft for s in ok if s.ttft is not None], 50),
                          itl_p50_s=percentile([g for s in ok for g in s.gaps], 50))
