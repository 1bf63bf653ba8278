"""Open-loop phases: requests arrive at a rate whether or not the server keeps up (``rate_ramp``), and the
search for the highest rate whose goodput meets the SLO (``slo_search``).

A closed loop (the agent ramp) slows down with the server and never offers more than its sessions; an open
loop keeps arriving, so a rate past the server's capacity builds the queue production would see. The queue
is read from the server's own ``vllm:num_requests_waiting`` while the step runs (the monitor's samples).
Each step's arrivals come from :func:`arrival_offsets`; a request meets the SLO when its TTFT, mean
inter-token gap and end-to-end time are within the limits (:func:`meets_slo`), and a rate holds when at
least ``goodput_target`` of its requests do and the errors stay within ``error_rate_limit``
(docs/acceptance-load.md "Open-loop arrivals").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from k3fleet.accept.load.arrivals import arrival_offsets, goodput
from k3fleet.accept.load.options import LoadOptions
from k3fleet.accept.load.prompts import filler, plain_body
from k3fleet.accept.load.shots import SERVER_KINDS, Budget, Shot, percentile
from k3fleet.accept.load.trace import Trace, TraceRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from k3fleet.accept.load.run import LoadRun

# Never more requests in flight than this, whatever the rate (docs/acceptance-load.md: bounded load).
MAX_IN_FLIGHT = 4096


class OpenLoop:
    """The open-loop steps of one :class:`LoadRun` (its transport, tally, curve and calibration)."""

    def __init__(self, run: LoadRun) -> None:
        self.run = run
        self.opts: LoadOptions = run.opts
        self.search: dict[str, Any] | None = None
        self._steps = 0

    async def ramp(self) -> None:
        """Each rate of ``rates`` for ``rate_step_s``; the ramp stops at the first rate that does not hold."""
        self.run.obs.phase_started("rate_ramp", len(self.opts.rates))
        for rate in self.opts.rates:
            row = await self.step("rate_ramp", rate)
            if row["verdict"] != "ok":
                break

    async def slo_search(self) -> None:
        """Bisect the rate between the highest rate known to hold and the lowest known to fail."""
        opts = self.opts
        rows = [r for r in self.run.curve.rows if r["phase"] == "rate_ramp" and not r.get("partial")]
        held = [r["rate_rps"] for r in rows if r["verdict"] == "ok"]
        failed = [r["rate_rps"] for r in rows if r["verdict"] != "ok"]
        # What the ramp measured wins over the configured bounds: those are for a search without a ramp.
        lo = max(held) if held else opts.search_low_rps
        hi = min(failed) if failed else opts.search_high_rps
        if lo is not None and hi is not None and lo >= hi:
            lo = None
        lo_ok = lo is not None and lo in held
        hi_failed = hi is not None and hi in failed
        found: dict[str, Any] = {"low_rps": lo, "high_rps": hi, "steps": 0}
        self.search = found
        self.run.obs.phase_started("slo_search", opts.search_steps)
        steps = 0
        if lo is None:
            lo = (hi or opts.rates[0]) / 2
        while steps < opts.search_steps:
            if not lo_ok:
                rate = lo
            elif hi is None:
                rate = lo * 2          # nothing failed yet: look higher
            elif hi_failed and (hi - lo) / hi <= opts.search_precision:
                break
            elif not hi_failed:
                rate = hi
            else:
                rate = (lo + hi) / 2
            row = await self.step("slo_search", rate)
            steps += 1
            if row.get("partial"):
                break
            if row["verdict"] == "ok":
                lo, lo_ok = rate, True
                if hi is not None and rate >= hi:
                    hi, hi_failed = None, False
            elif not lo_ok:
                # Even the low bound fails: the highest rate that holds is below it.
                hi, hi_failed, lo = rate, True, rate / 2
            else:
                hi, hi_failed = rate, True
        best = [r for r in self.run.curve.rows if r["phase"] in ("rate_ramp", "slo_search")
                and r["verdict"] == "ok" and not r.get("partial") and r["rate_rps"] == lo] if lo_ok else []
        found.update(steps=steps, rps=lo if lo_ok else None, upper_rps=hi if hi_failed else None,
                     goodput=best[-1]["goodput"] if best else None,
                     precision=round((hi - lo) / lo, 4) if lo_ok and hi_failed and hi is not None else None,
                     target_rps=opts.target_rps,
                     margin=round(lo / opts.target_rps - 1, 4) if lo_ok and opts.target_rps else None)

    async def step(self, phase: str, rate: float) -> dict[str, Any]:
        """One step at ``rate`` requests per second for ``rate_step_s`` seconds; waits for every request
        it sent, so the next step starts on an empty server."""
        run, opts = self.run, self.opts
        label = f"{rate:.4g} req/s"
        cap = opts.max_concurrency
        seed = opts.arrival_seed * 1_000_003 + self._steps
        self._steps += 1
        t_start = run._start_step(phase, label, cap or 0, opts.rate_step_s)
        shots: list[Shot] = []
        tasks: list[asyncio.Future[None]] = []
        gate = asyncio.Semaphore(min(cap or MAX_IN_FLIGHT, MAX_IN_FLIGHT))
        words = run._words_for(opts.rate_prompt_tokens)
        state = {"in_flight": 0, "peak": 0, "offered": 0}
        complete = False

        async def one(i: int, scheduled: float, lag: float | None = None) -> None:
            shot = Shot(phase, label, cap or 0, opts.rate_prompt_tokens, 0.0)
            shot.scheduled = round(scheduled, 6)
            shot.lag = lag if lag is not None else time.monotonic() - run.tally.t0 - scheduled
            async with gate:
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
                try:
                    body = plain_body(run.ep.model, f"request {seed}.{i}: " + filler(words, i),
                                      opts.rate_output_tokens)
                    await run.http.send(body, shot, parse_all=False)
                finally:
                    state["in_flight"] -= 1
            self._record(shot, shots)

        try:
            async with _settled(tasks):
                if opts.arrival == "closed":
                    await self._closed(rate, one, tasks, state)
                else:
                    offsets = arrival_offsets(rate, opts.rate_step_s, burstiness=opts.burstiness, seed=seed,
                                              limit=opts.max_requests)
                    base = time.monotonic()
                    for i, off in enumerate(offsets):
                        delay = base + off - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        run.tally.admit()
                        state["offered"] += 1
                        # The arrival error is the dispatcher's: how late this request left the schedule.
                        lag = time.monotonic() - base - off
                        tasks.append(asyncio.ensure_future(one(i, base - run.tally.t0 + off, lag)))
                await _all(tasks)
            complete = True
        finally:
            row = self._row(phase, label, rate, shots, t_start, complete, state, opts.rate_step_s)
        return row

    async def replay(self, trace: Trace) -> dict[str, Any]:
        """The trace's requests at their own (scaled) arrival times: one step. A session's turns are one
        conversation, each waiting for the turn before it (its wait is not arrival lag)."""
        run, opts = self.run, self.opts
        label = f"{len(trace.requests)} requests x{trace.speed:g}"
        span = max(trace.duration_s, 1e-3)
        rate = len(trace.requests) / span
        self.run.obs.phase_started("trace", 1)
        t_start = run._start_step("trace", label, opts.max_concurrency or 0, span)
        shots: list[Shot] = []
        tasks: list[asyncio.Future[None]] = []
        gate = asyncio.Semaphore(min(opts.max_concurrency or MAX_IN_FLIGHT, MAX_IN_FLIGHT))
        sessions: dict[str, tuple[asyncio.Lock, list[dict[str, Any]]]] = {}
        state = {"in_flight": 0, "peak": 0, "offered": 0}
        complete = False

        async def one(i: int, req: TraceRequest, scheduled: float, lag: float) -> None:
            shot = Shot("trace", label, opts.max_concurrency or 0, req.prompt_tokens, 0.0)
            shot.scheduled = round(scheduled, 6)
            shot.lag = lag
            text = req.prompt if req.prompt is not None else (
                f"request {i}: " + filler(run._words_for(req.prompt_tokens or 1), i))
            slot = sessions.setdefault(req.session_id, (asyncio.Lock(), [])) if req.session_id else None
            async with slot[0] if slot is not None else _NoLock():
                history = slot[1] if slot is not None else []
                messages = [*history, {"role": "user", "content": text}]
                body: dict[str, Any] = {"model": run.ep.model, "messages": messages, "stream": True,
                                        "stream_options": {"include_usage": True}, "max_tokens": req.output_tokens,
                                        "ignore_eos": True, "temperature": 0}
                if req.tools:
                    body["tools"] = req.tools
                if req.response_format:
                    body["response_format"] = req.response_format
                async with gate:
                    state["in_flight"] += 1
                    state["peak"] = max(state["peak"], state["in_flight"])
                    try:
                        await run.http.send(body, shot, parse_all=slot is not None)
                    finally:
                        state["in_flight"] -= 1
                if slot is not None and shot.ok:
                    history += [{"role": "user", "content": text}, {"role": "assistant", "content": shot.content}]
            self._record(shot, shots)

        try:
            async with _settled(tasks):
                base = time.monotonic()
                for i, req in enumerate(trace.requests):
                    delay = base + req.arrival_s - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    run.tally.admit()
                    state["offered"] += 1
                    lag = time.monotonic() - base - req.arrival_s
                    tasks.append(asyncio.ensure_future(one(i, req, base - run.tally.t0 + req.arrival_s, lag)))
                await _all(tasks)
            complete = True
        finally:
            row = self._row("trace", label, round(rate, 3), shots, t_start, complete, state, span)
        return row

    def _record(self, shot: Shot, shots: list[Shot]) -> None:
        """A finished request: its prompt is its context, the tally counts it and the step keeps it."""
        if shot.prompt_tokens is not None:
            shot.context_tokens = shot.prompt_tokens
        self.run.tally.record(shot)
        shots.append(shot)

    async def _closed(self, rate: float, one: Any, tasks: list[asyncio.Future[None]], state: dict[str, int]) -> None:
        """``max_concurrency`` sessions, each waiting for its answer before the next request, paced to its
        share of ``rate``: the same mean rate while the server keeps up, slower when it does not."""
        run, opts = self.run, self.opts
        sessions = opts.max_concurrency or 1
        every = sessions / rate
        base = time.monotonic()
        until = base + opts.rate_step_s
        count = [0]

        async def session(k: int) -> None:
            due = base + k / rate
            while due < until:
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                run.tally.admit()
                state["offered"] += 1
                i = count[0]
                count[0] += 1
                await one(i, due - run.tally.t0)
                # Behind its pace (the server is slower than the rate), a session sends at once: never a burst.
                due = max(due + every, time.monotonic())

        tasks.extend(asyncio.ensure_future(session(k)) for k in range(sessions))
        await _all(tasks)

    def _row(self, phase: str, label: str, rate: float, shots: list[Shot], t_start: float, complete: bool,
             state: dict[str, int], offered_s: float) -> dict[str, Any]:
        run, opts = self.run, self.opts
        row = run.curve.row(phase, label, opts.max_concurrency or state["peak"], shots, t_start, offered_s)
        kept = run.curve.measured(shots, t_start, offered_s)
        good = goodput(kept, opts.ttft_p95_slo_s, opts.itl_p95_slo_s, opts.e2e_p95_slo_s)
        lags = [s.lag for s in shots if s.lag is not None]
        lag_p50, lag_p99 = percentile(lags, 50), percentile(lags, 99)
        row.update({
            "rate_rps": rate, "arrival": opts.arrival, "burstiness": opts.burstiness,
            "max_concurrency": opts.max_concurrency, "offered": state["offered"],
            "offered_rps": round(state["offered"] / offered_s, 3), "in_flight_max": state["peak"],
            "goodput": None if good is None else round(good, 4),
            "goodput_rps": None if good is None else round(good * len(kept) / max(row["duration_s"], 1e-9), 3),
            "arrival_lag_p50_s": None if lag_p50 is None else round(lag_p50, 5),
            "arrival_lag_p99_s": None if lag_p99 is None else round(lag_p99, 5),
            "arrival_lag_max_s": round(max(lags), 5) if lags else None,
        })
        row["verdict"] = rate_verdict(row, shots, opts)
        if not complete:
            row["partial"] = True
        run.curve.add(row)
        return row


def rate_verdict(row: dict[str, Any], shots: list[Shot], opts: LoadOptions) -> str:
    """A rate step holds (``ok``) when its goodput meets the target and its errors stay within the limit;
    otherwise the server's own words say why (its queue, preemptions), else ``latency`` or ``errors``."""
    if row["verdict"] in ("server", "context"):
        return str(row["verdict"])
    if not shots:
        return "latency"
    n = len(shots)
    failed = sum(1 for s in shots if not s.ok)
    if failed / n > opts.error_rate_limit and not any(s.kind == "timeout" for s in shots):
        return "server" if sum(1 for s in shots if s.kind in SERVER_KINDS) / n > opts.error_rate_limit else "errors"
    if (row.get("goodput") or 0.0) >= opts.goodput_target and failed / n <= opts.error_rate_limit:
        return "ok"
    if row.get("preemptions_delta"):
        return "preempted"
    if row.get("waiting_p50") is not None and row["waiting_p50"] >= 1 and row.get("waiting_samples", 0) >= 3:
        return "queued"
    return "latency"


def rate_envelope(rows: list[dict[str, Any]], search: dict[str, Any] | None, opts: LoadOptions) -> dict[str, Any]:
    """What the open-loop steps held: the highest rate that met the SLO, the lowest that did not, the
    search's answer and its margin over the profile's rate."""
    done = [r for r in rows if r["phase"] in ("rate_ramp", "slo_search", "trace") and not r.get("partial")]
    ok = [r["rate_rps"] for r in done if r["verdict"] == "ok"]
    bad = [r["rate_rps"] for r in done if r["verdict"] != "ok"]
    held = max(ok) if ok else None
    slo = dict(search) if search is not None else None
    return {"held_rps": held, "failed_rps": min(bad) if bad else None, "slo": slo,
            "goodput_target": opts.goodput_target, "target_rps": opts.target_rps,
            "limits": {"ttft_s": opts.ttft_p95_slo_s, "itl_s": opts.itl_p95_slo_s, "e2e_s": opts.e2e_p95_slo_s},
            "arrival": opts.arrival, "burstiness": opts.burstiness, "max_concurrency": opts.max_concurrency}


class _NoLock:
    """A request outside any session waits for nothing."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


@contextlib.asynccontextmanager
async def _settled(tasks: list[asyncio.Future[None]]) -> AsyncIterator[None]:
    """On a failure while the tasks run: at the budget's end they finish (each records its shot), on any
    other they are cancelled; either way none is left running when the failure goes on up."""
    try:
        yield
    except Budget:
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _all(tasks: list[asyncio.Future[None]]) -> None:
    """Wait for every task; the first failure (not a request's: those are shots) is raised."""
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for res in results:
        if isinstance(res, BaseException):
            raise res
