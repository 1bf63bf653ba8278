"""The server's side of a load run: /health and /metrics sampled through the whole run, restarts seen
in them, and the raw pages kept for the run directory."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from typing import Any

from k3fleet.accept.gpu_telemetry import gpus_of
from k3fleet.accept.load.shots import Tally
from k3fleet.accept.load.transport import Transport
from k3fleet.accept.metrics import MetricsError, MetricsSnapshot
from k3fleet.accept.oom import engine_kv
from k3fleet.accept.record import Recorder

# The server's side of every step; a run that could not read one of them says so, and a run that read
# none of them is never a pass on client figures alone (docs/acceptance-load.md, "Server evidence").
SERVER_METRICS = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
                  "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions_total"}
# The counters a step's closing sample waits on until two reads in a row agree (docs/acceptance-load.md,
# "Server evidence"), and the most it waits.
SETTLE_KEYS = ("preemptions", "prompt_tokens", "generation_tokens")
SETTLE_BOUND_S = 2.0


class Monitor:
    """The samples (one row per ``sample_interval_s``: health, the metrics summary, where the run was)."""

    def __init__(self, transport: Transport, tally: Tally, recorder: Recorder | None) -> None:
        self.http = transport
        self.tally = tally
        self.recorder = recorder
        self.model = transport.ep.model
        self.samples: list[dict[str, Any]] = []
        self.health_failures = 0
        self.restarts = 0
        self.metrics_errors: list[str] = []
        self.old_names: list[str] = []
        self.last_raw: str | None = None
        self._last_start: float | None = None
        self._last_counters: dict[str, float] = {}
        self.telemetry_url = tally.opts.telemetry_url
        self.telemetry_errors: list[str] = []
        # The run's first and last pages: the failure-explaining metrics over the run (k3fleet.accept.explain).
        self.first: MetricsSnapshot | None = None
        self.last: MetricsSnapshot | None = None

    async def run(self) -> None:
        while True:
            row: dict[str, Any] = {"t_s": round(self.tally.elapsed(), 3), **self.tally.where}
            await self._complete(row, None)
            await asyncio.sleep(self.tally.opts.sample_interval_s)

    async def settle(self, bound_s: float = SETTLE_BOUND_S) -> None:
        """One more sample when a step's requests are done, once the counters of :data:`SETTLE_KEYS` read the
        same twice in a row (or ``bound_s`` ran out). vLLM publishes a step's statistics after its outputs,
        and a preemption only with the preempted request's next output: the periodic sample, taken every
        ``sample_interval_s`` on a busy machine, could close a step before its last counts (a real server's
        preemption step read none). The sample is marked ``settled`` with how long it waited."""
        t0 = time.monotonic()
        pause, last = 0.02, None
        while True:
            snap = await self._scrape()
            if snap is None:
                return
            summary = snap.summary(self.model)
            values = tuple(summary.get(k) for k in SETTLE_KEYS)
            if values == last or time.monotonic() - t0 >= bound_s:
                break
            last = values
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.25)
        row: dict[str, Any] = {"t_s": round(self.tally.elapsed(), 3), **self.tally.where,
                               "settled": values == last, "settle_waited_s": round(time.monotonic() - t0, 3)}
        await self._complete(row, snap)

    async def _complete(self, row: dict[str, Any], snap: MetricsSnapshot | None) -> None:
        """A sample's health, server side (``snap``, or a page read now) and GPUs, then the sample kept."""
        row["health"] = await self.http.health()
        if row["health"] != 200:
            self.health_failures += 1
        if snap is None:
            snap = await self._scrape()
        if snap is not None:
            self._fill(row, snap)
        if self.telemetry_url is not None:
            gpus = await self._gpus()
            if gpus is not None:
                row["gpus"] = gpus
        self._add(row)

    def _fill(self, row: dict[str, Any], snap: MetricsSnapshot) -> None:
        """A sample's server side: the metrics summary, the KV cache per engine, a restart seen."""
        row.update(snap.summary(self.model))
        by_engine = engine_kv(snap, self.model)
        if by_engine:
            row["kv_by_engine"] = by_engine
        row.update(self._restart_check(snap))

    def _add(self, row: dict[str, Any]) -> None:
        # In time order: a periodic sample begun before a step's settled one may end after it.
        bisect.insort(self.samples, row, key=lambda r: r["t_s"])

    def snapshot(self, window: str) -> None:
        """The last raw /metrics page for the run directory (``metrics/<window>.txt``), when a recorder is
        given."""
        self._snapshot(window, self.last_raw)

    def unread(self) -> list[str]:
        """The server metrics no sample of the run could read (all of them when nothing was sampled)."""
        return unread_of(self.samples)

    def delta_total(self, key: str) -> float | None:
        return delta_total(self.samples, key)

    async def _scrape(self) -> MetricsSnapshot | None:
        try:
            snap = await self.http.metrics()
        except MetricsError as exc:
            message = str(exc)
            if message not in self.metrics_errors and len(self.metrics_errors) < 20:
                self.metrics_errors.append(message)
            return None
        if snap.is_old_server and not self.old_names:
            self.old_names = snap.old_names()
        if self.last_raw is None:
            self._snapshot("load-start", snap.raw)
            self.first = snap
        self.last_raw = snap.raw
        self.last = snap
        return snap

    async def _gpus(self) -> dict[str, dict[str, float]] | None:
        """The GPUs' readings from the telemetry URL; a page that cannot be read, or has no GPU, is noted once."""
        assert self.telemetry_url is not None
        try:
            gpus = gpus_of(await self.http.metrics(self.telemetry_url))
        except MetricsError as exc:
            self._telemetry_error(str(exc).replace("/metrics", "the telemetry page"))
            return None
        if not gpus:
            self._telemetry_error("the telemetry page has no DCGM GPU series (DCGM_FI_DEV_FB_USED...)")
            return None
        return gpus

    def _telemetry_error(self, message: str) -> None:
        if message not in self.telemetry_errors and len(self.telemetry_errors) < 20:
            self.telemetry_errors.append(message)

    def _snapshot(self, window: str, raw: str | None) -> None:
        if self.recorder is not None and raw is not None:
            self.recorder.snapshot(window, raw)

    def _restart_check(self, snap: MetricsSnapshot) -> dict[str, Any]:
        """A new process start time, or a counter that went down, is a server restart."""
        start = snap.process_start_time()
        counters = {k: v for k, v in (("prompt_tokens", snap.counter("vllm:prompt_tokens", self.model)),
                                      ("generation_tokens", snap.counter("vllm:generation_tokens", self.model)))
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
            where = self.tally.where
            self.tally.obs.note(f"server restart seen during {where['phase']} {where['step']}")
        return {"restarted": restarted} if restarted else {}


def unread_of(samples: list[dict[str, Any]]) -> list[str]:
    return [name for key, name in SERVER_METRICS.items() if not any(s.get(key) is not None for s in samples)]


def delta_total(samples: list[dict[str, Any]], key: str) -> float | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    if len(vals) < 2:
        return None
    # Sum the rises, skipping resets (a restart zeroes counters).
    return float(sum(b - a for a, b in itertools.pairwise(vals) if b >= a))
