"""What a load run records: one :class:`Shot` a request, and the :class:`Tally` of them that holds the
run's bounds (requests, time, Ctrl-C) and the failures kept for the evidence."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from k3fleet.accept.load.options import LoadObserver, LoadOptions
from k3fleet.evidence.redact import excerpt

# Error kinds that say the server itself broke (as opposed to being slow or refusing input).
SERVER_KINDS = frozenset({"http_5xx", "stream_error", "stream_cut", "connect", "bad_response"})
_FAILURES_KEPT = 200


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
    # Open loop: when the request was due (run seconds) and how late its arrival was (seconds).
    scheduled: float | None = None
    lag: float | None = None
    # The request mix and the retry policy: what the turn asked for, how often it was sent again, and the tool
    # calls an attempt streamed before it failed (a retry that streams them again runs the tool twice).
    mix: tuple[str, ...] = ()
    retries: int = 0
    retried_kinds: list[str] = field(default_factory=list)
    duplicate_tool_call: bool = False


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def one_line(text: str, limit: int = 300) -> str:
    return str(excerpt(text, limit, tail=""))


class Budget(Exception):
    """The request or time bound was reached."""


class Tally:
    """Every request of the run in order, its failures (the first ones, with where they happened) and
    the bounds: ``check()`` raises :class:`Budget` once a bound is reached or the run is stopped."""

    def __init__(self, opts: LoadOptions, observer: LoadObserver, stop: threading.Event | None) -> None:
        self.opts = opts
        self.obs = observer
        self.stop = stop or threading.Event()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + opts.max_duration_s
        self.shots: list[Shot] = []
        # Requests sent, finished or not: the request bound counts these, so sessions in flight
        # when it is reached never take the run past it.
        self.started = 0
        self.failures: list[dict[str, Any]] = []
        self.errors = 0
        self.interrupted = False
        self.budget_hit: str | None = None
        # Where the run is now: the monitor's samples carry it.
        self.where: dict[str, Any] = {"phase": "", "step": "", "concurrency": 0}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def admit(self) -> None:
        """Before each request: raise :class:`Budget` when the run is stopped or a bound is reached, else
        count the request as sent."""
        if self.stop.is_set():
            self.interrupted = True
            raise Budget("interrupted")
        if self.started >= self.opts.max_requests:
            self.budget_hit = f"request bound reached ({self.opts.max_requests} requests)"
            raise Budget(self.budget_hit)
        if time.monotonic() >= self.deadline:
            self.budget_hit = f"time bound reached ({self.opts.max_duration_s:.0f} s)"
            raise Budget(self.budget_hit)
        self.started += 1

    def record(self, shot: Shot) -> None:
        self.shots.append(shot)
        if not shot.ok:
            self.errors += 1
            if len(self.failures) < _FAILURES_KEPT:
                self.failures.append({"t_s": round(shot.t, 3), "phase": shot.phase, "step": shot.step,
                                      "concurrency": shot.concurrency, "context_tokens": shot.context_tokens,
                                      "kind": shot.kind, "status": shot.status, "message": shot.message})
        self.obs.requests(len(self.shots), self.errors)
