"""The load curve: one row per step (client figures, the server's samples of the step's window) and the
step's verdict (``ok``, ``server``, ``context``, ``errors``, ``latency``, ``preempted``, ``queued``)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from k3fleet.accept.load.options import LoadObserver, LoadOptions
from k3fleet.accept.load.shots import SERVER_KINDS, Shot, percentile


class Curve:
    """The rows of a run, in step order; ``t0`` is the run's start and ``samples`` the monitor's."""

    def __init__(self, opts: LoadOptions, observer: LoadObserver, t0: float, samples: list[dict[str, Any]]) -> None:
        self.opts = opts
        self.obs = observer
        self.t0 = t0
        self.samples = samples
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.obs.step_finished(row)

    def row(self, phase: str, label: str, concurrency: int, shots: list[Shot], t_start: float,
            offered_s: float | None = None) -> dict[str, Any]:
        """The step's row; ``offered_s``: how long its sessions started requests (a timed step's length)."""
        t_end = time.monotonic()
        kept = self.measured(shots, t_start, offered_s)
        ok = [s for s in kept if s.ok]
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
        if len(kept) != len(shots):
            row["excluded"] = len(shots) - len(kept)
        mix = Counter(m for s in shots for m in s.mix)
        if mix:
            row["mix"] = dict(mix)
        retries = sum(s.retries for s in shots)
        if retries:
            row["retries"] = retries
            row["duplicate_tool_calls"] = sum(1 for s in shots if s.duplicate_tool_call)
        row.update(server_window(self.samples, t_start - self.t0, t_end - self.t0, offered_s))
        row["verdict"] = self.verdict(phase, row, shots)
        return row

    def measured(self, shots: list[Shot], t_start: float, offered_s: float | None) -> list[Shot]:
        """The shots whose figures count: a timed step leaves out those started in its first ``warmup_s`` and
        last ``cooldown_s`` seconds (failed ones always count: an error in the warm-up is still an error)."""
        if offered_s is None or not (self.opts.warmup_s or self.opts.cooldown_s):
            return shots
        lo = t_start - self.t0 + self.opts.warmup_s
        hi = t_start - self.t0 + offered_s - self.opts.cooldown_s
        return [s for s in shots if not s.ok or lo <= s.t <= hi]

    def verdict(self, phase: str, row: dict[str, Any], shots: list[Shot]) -> str:
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
        # ceiling: requests waited for most of the time the step offered its sessions (3 samples of it at
        # least) while the server ran fewer than the sessions offered (its --max-num-seqs). A request between
        # prefill and decode that shows as waiting for a moment while every session runs is no ceiling.
        if row.get("preemptions_delta"):
            return "preempted"
        running = row.get("running_max")
        if (row.get("waiting_p50") is not None and row["waiting_p50"] >= 1 and row.get("waiting_samples", 0) >= 3
                and running is not None and running < row["concurrency"]):
            return "queued"
        ttft, itl = row.get("ttft_p95_s"), row.get("itl_p95_s")
        if ttft is not None and ttft > self.opts.ttft_p95_slo_s:
            return "latency"
        if itl is not None and itl > self.opts.itl_p95_slo_s:
            return "latency"
        return "ok"


def server_window(samples: list[dict[str, Any]], a: float, b: float, offered_s: float | None = None) -> dict[str, Any]:
    """What the server's samples say of the step from ``a`` to ``b`` (run seconds). The queue is read only
    while the step offered all its sessions (its first ``offered_s`` seconds): after that the sessions that
    are done start nothing, and the queue drains whatever the server's ceiling."""
    inside = [s for s in samples if a <= s["t_s"] <= b]
    before = [s for s in samples if s["t_s"] < a][-1:]
    out: dict[str, Any] = {"samples": len(inside)}
    for key in ("running", "waiting", "kv_usage"):
        vals = [s[key] for s in inside if s.get(key) is not None]
        out[f"{key}_max"] = max(vals) if vals else None
    # The queue most of the step saw: a blip of one waiting request is not a ceiling. The median is the lower
    # middle sample of an even count, so it reads 1 or more only when more than half the samples do.
    q_end = b if offered_s is None else min(b, a + offered_s)
    waits = sorted(s["waiting"] for s in inside if s["t_s"] <= q_end and s.get("waiting") is not None)
    out["waiting_p50"] = waits[(len(waits) - 1) // 2] if waits else None
    out["waiting_samples"] = len(waits)
    for key in ("preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries",
                "prefix_cache_hits", "prompt_tokens_cached"):
        series = [s[key] for s in before + inside if s.get(key) is not None]
        out[f"{key}_delta"] = (series[-1] - series[0]) if len(series) >= 2 and series[-1] >= series[0] else None
    out["health_failures"] = sum(1 for s in inside if s.get("health") != 200)
    out["restarts"] = sum(1 for s in inside if s.get("restarted"))
    return out


def _mean(values: list[int | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return round(sum(xs) / len(xs), 1) if xs else None

