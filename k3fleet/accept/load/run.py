"""The load schedule: calibration, the long-input ladder, the agent ramp and the sustained windows, run
over one :class:`Transport` while the :class:`Monitor` samples the server; :class:`Report` judges it."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from k3fleet.accept import explain, identity
from k3fleet.accept.client import Endpoint, EndpointError
from k3fleet.accept.load.monitor import Monitor
from k3fleet.accept.load.options import OPEN_LOOP, LoadObserver, LoadOptions
from k3fleet.accept.load.outcome import Report
from k3fleet.accept.load.prompts import TOOLS, filler, plain_body
from k3fleet.accept.load.rate import MAX_IN_FLIGHT, OpenLoop
from k3fleet.accept.load.repeats import combine
from k3fleet.accept.load.shots import Budget, Shot, Tally
from k3fleet.accept.load.steps import Curve
from k3fleet.accept.load.trace import load_trace
from k3fleet.accept.load.transport import Transport, endpoint_kind
from k3fleet.accept.record import Recorder
from k3fleet.accept.result import ProbeResult


class LoadRun:
    """One run of the schedule; built inside the event loop that runs it (the HTTP session is its loop's)."""

    def __init__(self, endpoint: Endpoint, opts: LoadOptions, observer: LoadObserver,
                 stop: threading.Event | None, recorder: Recorder | None = None) -> None:
        self.ep = endpoint
        self.opts = opts
        self.obs = observer
        self.tally = Tally(opts, observer, stop)
        top = max([*opts.ramp, opts.sustained_concurrency or 1, 1])
        if any(p in opts.phases for p in OPEN_LOOP):
            # Open loop: the connection pool must not queue what the server should (its own cap only).
            top = max(top, min(opts.max_concurrency or MAX_IN_FLIGHT, MAX_IN_FLIGHT))
        self.http = Transport(endpoint, opts, top + 2, self.tally.t0)
        self.monitor = Monitor(self.http, self.tally, recorder)
        self.curve = Curve(opts, observer, self.tally.t0, self.monitor.samples)
        self.open_loop = OpenLoop(self)
        # A bad trace is a usage error before any request (the CLI reads it first, before the run directory).
        self.trace = (load_trace(Path(opts.trace_path), speed=opts.trace_speed, limit=opts.max_requests)
                      if opts.trace_path and "trace" in opts.phases else None)
        self.tokens_per_word = 1.3
        self.calibrated = False
        self.base_tokens = 0
        self.refused_context: int | None = None
        self.max_model_len: int | None = None

    async def execute(self) -> ProbeResult:
        stop = self.tally.stop
        monitor: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        main = asyncio.current_task()
        try:
            self.max_model_len = await self.http.max_model_len()
            await self._calibrate()
            monitor = asyncio.ensure_future(self.monitor.run())
            watcher = asyncio.ensure_future(_watch(stop, main))
            try:
                await self._phases()
            except Budget:
                pass
            except asyncio.CancelledError:
                if not stop.is_set():
                    raise
                self.tally.interrupted = True
                _uncancel()
        finally:
            for task in (monitor, watcher):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (monitor, watcher) if t is not None), return_exceptions=True)
            await self.http.close()
            self.monitor.snapshot("load-end")
        result = Report(self.opts, self.tally, self.monitor, self.curve, self.ep.display_url,
                        search=self.open_loop.search, trace=self.trace.summary() if self.trace else None,
                        refused_context=self.refused_context, tokens_per_word=self.tokens_per_word,
                        calibrated=self.calibrated, max_model_len=self.max_model_len).result()
        result.data["explain"] = explain.window(self.monitor.first, self.monitor.last, self.ep.model)
        extra = explain.findings_of("load", result.data["explain"])
        result.findings.extend(extra)
        bad = [f for f in extra if f.failed]
        if bad and result.status != "fail":
            result.status, result.reason = "fail", bad[0].message
        return result

    async def _phases(self) -> None:
        phases = self.opts.phases
        if "long_input" in phases:
            await self._long_input()
            self.monitor.snapshot("load-long_input")
        if "agent_ramp" in phases:
            await self._agent_ramp()
            self.monitor.snapshot("load-agent_ramp")
        if "sustained" in phases:
            rows = self.curve.rows
            ramp_ok = [r["concurrency"] for r in rows if r["phase"] == "agent_ramp" and r["verdict"] == "ok"]
            ramp_run = any(r["phase"] == "agent_ramp" for r in rows)
            conc = self.opts.sustained_concurrency or (max(ramp_ok) if ramp_ok else
                                                       (None if ramp_run else max(self.opts.ramp)))
            if conc is not None and not any(r["verdict"] == "server" for r in rows):
                await self._sustained(conc)
        for phase in OPEN_LOOP:
            if phase in phases and not any(r["verdict"] == "server" for r in self.curve.rows):
                if phase == "rate_ramp":
                    await self.open_loop.ramp()
                elif phase == "slo_search":
                    await self.open_loop.slo_search()
                elif self.trace is not None:
                    await self.open_loop.replay(self.trace)
                self.monitor.snapshot(f"load-{phase}")

    async def _calibrate(self) -> None:
        """Tokens per filler word from the server's own usage (two tiny requests)."""
        counts = []
        for words in (0, 400):
            shot = Shot("calibration", "", 1, None, 0.0)
            await self.http.send(plain_body(self.ep.model, filler(words, 1), 1), shot, parse_all=False)
            if not shot.ok:
                # The calibration is the first traffic: a server that cannot answer it is reported
                # as one line (unreachable, 401, 404 model...).
                raise EndpointError(f"{self.ep.display_url}: first request failed: {shot.message}",
                                    kind=endpoint_kind(shot), status=shot.status)
            counts.append(shot.prompt_tokens)
        if counts[0] is not None and counts[1] is not None and counts[1] > counts[0]:
            self.tokens_per_word = (counts[1] - counts[0]) / 400
            self.calibrated = True
        self.base_tokens = counts[0] or 0

    def _words_for(self, tokens: int) -> int:
        return max(1, int((tokens - self.base_tokens) / self.tokens_per_word))

    def _start_step(self, phase: str, label: str, concurrency: int, seconds: float | None) -> float:
        self.tally.where.update(phase=phase, step=label, concurrency=concurrency)
        self.obs.step_started(phase, label, seconds)
        return time.monotonic()

    def _end_step(self, phase: str, label: str, concurrency: int, shots: list[Shot], t_start: float,
                  complete: bool, offered_s: float | None = None, **extra: Any) -> dict[str, Any]:
        """The step's row; an interrupted or bounded step still leaves its row (marked partial). ``offered_s``:
        how long a timed step's sessions started requests."""
        row = self.curve.row(phase, label, concurrency, shots, t_start, offered_s)
        row.update(extra)
        if not complete:
            row["partial"] = True
        self.curve.add(row)
        return row

    async def _long_input(self) -> None:
        opts = self.opts
        self.obs.phase_started("long_input", len(opts.ladder_tokens))
        for n, tokens in enumerate(opts.ladder_tokens):
            label = f"{tokens} tokens"
            # Checked against the server's context before the prompt is built: a rung far above max_model_len
            # is sent as twice the server's context (still refused there, with the server's own message), never
            # as the 60-million-token text it names.
            build = tokens if self.max_model_len is None else min(tokens, 2 * self.max_model_len)
            if build < tokens:
                self.obs.note(f"{tokens} tokens is above the server's max_model_len {self.max_model_len}: sending "
                              f"{build} tokens, enough to be refused")
            t_start = self._start_step("long_input", label, 1, None)
            shots: list[Shot] = []
            complete = False
            try:
                for rep in range(opts.ladder_repeats):
                    self.tally.admit()
                    nonce = f"run {self.tally.t0:.6f} ladder {n} repeat {rep}: "
                    text = nonce + filler(self._words_for(build), seed=n * 31 + rep)
                    shot = Shot("long_input", label, 1, tokens, 0.0)
                    await self.http.send(plain_body(self.ep.model, text, opts.ladder_output_tokens), shot,
                                         parse_all=False)
                    self.tally.record(shot)
                    shots.append(shot)
                    if shot.kind == "context_length":
                        break
                complete = True
            finally:
                if shots:
                    self._end_step("long_input", label, 1, shots, t_start, complete, context_tokens=tokens,
                                   max_tokens=opts.ladder_output_tokens)
            if any(s.kind == "context_length" for s in shots):
                self.refused_context = tokens
                self.obs.note(f"context of {tokens} tokens refused by the server")
                break

    def _system_prompt(self) -> str:
        # Shared by every session: the prefix a real agent fleet reuses (and a cache can hit).
        words = self._words_for(self.opts.system_prompt_tokens) if self.opts.system_prompt_tokens else 0
        return "You are the fleet operations agent. Use the tools when a question needs data. " + filler(words, 7)

    async def _agent_session(self, sid: int, phase: str, label: str, concurrency: int, until: float,
                             system: str, out: list[Shot]) -> None:
        opts = self.opts
        tools = opts.tools or TOOLS
        ask = (f"call node_status node=n{sid:03d}" if opts.tools is None
               else f"call {tools[0]['function'].get('name', 'the tool')} for n{sid:03d}")
        schemas = sorted(opts.response_schemas)
        convo = 0
        while time.monotonic() < until:
            # The mix (docs/acceptance-load.md "Request mix"), drawn per conversation and turn from a seeded
            # generator: the same run sends the same mix.
            rng = random.Random(f"{opts.mix_seed}:{phase}:{label}:{sid}:{convo}")
            long = rng.random() < opts.long_share
            question = f"Session {sid}.{convo}: is node n{sid:03d} drained? {ask}"
            if long and opts.long_context_tokens:
                pad = self._words_for(max(16, opts.long_context_tokens - opts.system_prompt_tokens))
                question += " Context: " + filler(pad, sid * 131 + convo)
            messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                              {"role": "user", "content": question}]
            for turn in range(opts.session_turns):
                if time.monotonic() >= until:
                    return
                self.tally.admit()
                offer_tools = rng.random() < opts.tools_share
                structured = bool(schemas) and rng.random() < opts.structured_share
                body: dict[str, Any] = {"model": self.ep.model, "messages": messages, "stream": True,
                                        "stream_options": {"include_usage": True},
                                        "max_tokens": opts.turn_output_tokens, "temperature": 0}
                if offer_tools:
                    body["tools"] = tools
                if structured:
                    name = schemas[rng.randrange(len(schemas))]
                    body["response_format"] = {"type": "json_schema", "json_schema": {
                        "name": name, "schema": opts.response_schemas[name]}}
                if opts.exact_turn_tokens:
                    body["ignore_eos"] = True
                shot = Shot(phase, label, concurrency, None, 0.0)
                shot.mix = tuple(m for m, on in (("tools", offer_tools), ("structured", structured), ("long", long))
                                 if on)
                await self._send_with_retries(body, shot)
                shot.context_tokens = shot.prompt_tokens
                self.tally.record(shot)
                out.append(shot)
                if not shot.ok:
                    # Do not spin on a server that fails fast: wait a moment, start a new conversation.
                    await asyncio.sleep(min(1.0, opts.step_s / 10))
                    break
                messages += _next_messages(shot, sid, turn)
            convo += 1

    async def _send_with_retries(self, body: dict[str, Any], shot: Shot) -> Shot:
        """Send as a production client does: a 429, a 503 or a timeout is sent again (``retry_max`` times at
        most, after ``retry_backoff_s`` doubled each time); each retry is a request the bounds count. A retry
        whose answer calls a tool an earlier attempt already streamed would run that tool twice."""
        opts = self.opts
        streamed: list[dict[str, Any]] = []
        while True:
            await self.http.send(body, shot, parse_all=True)
            if shot.ok or shot.retries >= opts.retry_max or not _retryable(shot):
                break
            streamed += shot.tool_calls
            shot.retried_kinds.append(shot.kind or "?")
            shot.retries += 1
            await asyncio.sleep(opts.retry_backoff_s * 2 ** (shot.retries - 1))
            self.tally.admit()
            _reset(shot)
        if shot.ok and streamed and any(_same_call(a, b) for a in streamed for b in shot.tool_calls):
            shot.duplicate_tool_call = True
        return shot

    async def _timed_step(self, phase: str, label: str, concurrency: int, seconds: float) -> dict[str, Any]:
        """One time-boxed step of ``concurrency`` agent sessions."""
        shots: list[Shot] = []
        t_start = self._start_step(phase, label, concurrency, seconds)
        complete = False
        try:
            until = time.monotonic() + seconds
            system = self._system_prompt()
            tasks = [asyncio.ensure_future(self._agent_session(i, phase, label, concurrency, until, system, shots))
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
            await self.monitor.settle()
            complete = True
        finally:
            row = self._end_step(phase, label, concurrency, shots, t_start, complete, offered_s=seconds)
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


def _next_messages(shot: Shot, sid: int, turn: int) -> list[dict[str, Any]]:
    """What the agent sends back after a turn: the tool results for its calls, else the next question."""
    if not shot.tool_calls:
        return [{"role": "assistant", "content": shot.content},
                {"role": "user", "content": f"Turn {turn + 1}: and what next? lookup_runbook topic=drain-{sid}"}]
    ids = [c.get("id") or f"call_{sid}_{turn}_{i}" for i, c in enumerate(shot.tool_calls)]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": ident, "type": "function", "function": c["function"]} for ident, c in zip(ids, shot.tool_calls,
                                                                                           strict=True)]}]
    for ident in ids:
        out.append({"role": "tool", "tool_call_id": ident,
                    "content": json.dumps({"node": f"n{sid:03d}", "drained": False, "driver": "580.95.05",
                                           "note": filler(40, turn)})})
    return out


def _retryable(shot: Shot) -> bool:
    return shot.status in (429, 503) or shot.kind == "timeout"


def _reset(shot: Shot) -> None:
    """A shot ready for its next attempt: what the failed one measured is gone (its retries stay)."""
    shot.ok, shot.kind, shot.status, shot.message = False, None, None, None
    shot.ttft, shot.e2e, shot.chunks, shot.content = None, None, 0, ""
    shot.gaps, shot.tool_calls = [], []
    shot.prompt_tokens = shot.completion_tokens = shot.cached_tokens = None


def _same_call(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same tool call: the same function, and the earlier (perhaps cut) arguments a prefix of the later."""
    fa, fb = a.get("function") or {}, b.get("function") or {}
    if not fa.get("name") or fa.get("name") != fb.get("name"):
        return False
    return str(fb.get("arguments") or "").startswith(str(fa.get("arguments") or ""))


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


async def run_load(endpoint: Endpoint, opts: LoadOptions, observer: LoadObserver | None = None, *,
                   stop: threading.Event | None = None, recorder: Recorder | None = None) -> ProbeResult:
    """Run the load schedule against ``endpoint``. A first request that fails (unreachable, 401, unknown
    model) raises :class:`EndpointError`; everything after it is measured and returned. ``stop`` (set
    from a signal handler) ends the run early with what was measured; ``recorder`` (``snapshot(window,
    raw)``) receives raw /metrics pages at the start, after each phase and at the end."""
    # What the run saw of the server, for holding start-up evidence against it (k3fleet.accept.identity).
    async with endpoint.async_client(1) as client:
        seen = await identity.live(client, endpoint)
    obs = observer or LoadObserver()
    results = [await LoadRun(endpoint, opts, obs, stop, recorder).execute()]
    while len(results) < opts.repeat and not results[-1].data.get("interrupted") and not (stop and stop.is_set()):
        obs.note(f"run {len(results) + 1} of {opts.repeat}")
        results.append(await LoadRun(endpoint, opts, obs, stop, recorder).execute())
    result = combine(results) if opts.repeat > 1 else results[0]
    result.data["server"] = seen
    return result
