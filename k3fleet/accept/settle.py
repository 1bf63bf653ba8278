"""Read ``/metrics`` after a request only once the server has published that request's figures.

vLLM records a step's statistics after it has handed the step's outputs to the waiting requests
(the API server's output handler: outputs first, then the Prometheus loggers), so a client that
scrapes the moment its stream ends can read the counters before its own request is in them.
A probe that attributes counter deltas to requests therefore waits, after each request, until

* the request is counted: ``vllm:request_success`` (else ``vllm:prompt_tokens``) rose above the
  reading taken before the request, and
* two reads in a row agree on every counter the probe attributes,

polling with a growing interval within a bound; how long it waited and how many reads it took are
recorded beside the result. A counter that never moves within the bound is reported as such, never
read as zero. Rules: docs/acceptance.md ("accept prefix-cache", "Settled counters").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from k3fleet.accept.metrics import MetricsError, MetricsSnapshot, scrape

# Counters whose rise shows that a finished request has been published, in order of preference.
COUNTED_BY = ("vllm:request_success", "vllm:prompt_tokens")
_FIRST_POLL_S = 0.02
_MAX_POLL_S = 0.25


class Settle(BaseModel):
    """How one post-request read of ``/metrics`` came to rest."""

    window: str
    reads: int
    waited_s: float
    settled: bool
    counted: bool
    # The counter that showed the request was counted (None: the page has neither; agreement only).
    counted_by: str | None = None
    error: str | None = None

    def problem(self, bound_s: float) -> str | None:
        """One line when this read cannot be attributed, else None."""
        if self.error is not None:
            return f"/metrics could not be read after {self.window} ({self.error})"
        if not self.counted:
            return (f"{self.counted_by} did not move within {bound_s:g} s after {self.window} "
                    f"({self.reads} reads): the server's counters do not count this request")
        if not self.settled:
            return (f"the counters kept changing for {bound_s:g} s after {self.window} ({self.reads} reads): "
                    "other traffic on the server is in the window")
        return None


def readings(snap: MetricsSnapshot, names: Sequence[str], model: str | None) -> dict[str, float | None]:
    return {name: snap.counter(name, model) for name in names}


def counted_by(snap: MetricsSnapshot | None, model: str | None) -> str | None:
    """The first of :data:`COUNTED_BY` the page carries, None when it has neither."""
    if snap is None:
        return None
    return next((n for n in COUNTED_BY if snap.counter(n, model) is not None), None)


async def settled_snapshot(client: httpx.AsyncClient, base_url: str, *, before: MetricsSnapshot | None,
                           names: Sequence[str], model: str | None, window: str, bound_s: float,
                           scrape_timeout_s: float | None = None) -> tuple[MetricsSnapshot | None, Settle]:
    """The first ``/metrics`` page that counts the request just finished and that the next read agrees
    with, or the last page read when ``bound_s`` ran out (with why in the :class:`Settle`)."""
    by = counted_by(before, model)
    floor = before.counter(by, model) if before is not None and by is not None else None
    watched = [*names, *([by] if by is not None and by not in names else [])]
    t0 = time.monotonic()
    deadline = t0 + bound_s
    pause = _FIRST_POLL_S
    reads = 0
    last: MetricsSnapshot | None = None
    last_values: dict[str, float | None] | None = None
    counted = floor is None
    while True:
        try:
            snap = await scrape(client, base_url, timeout_s=scrape_timeout_s)
        except MetricsError as exc:
            return last, Settle(window=window, reads=reads, waited_s=round(time.monotonic() - t0, 3), settled=False,
                                counted=counted, counted_by=by, error=str(exc))
        reads += 1
        values = readings(snap, watched, model)
        if floor is not None and by is not None:
            now_count = values.get(by)
            counted = now_count is not None and now_count > floor
        agreed = last_values is not None and values == last_values
        last, last_values = snap, values
        if counted and agreed:
            return snap, Settle(window=window, reads=reads, waited_s=round(time.monotonic() - t0, 3), settled=True,
                                counted=True, counted_by=by)
        if time.monotonic() >= deadline:
            return snap, Settle(window=window, reads=reads, waited_s=round(time.monotonic() - t0, 3), settled=False,
                                counted=counted, counted_by=by)
        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, _MAX_POLL_S)


def summary(settles: Sequence[Settle]) -> dict[str, Any]:
    """What the result records of the waits: each read's outcome, the longest wait, the reads in all."""
    return {"reads": [s.model_dump() for s in settles],
            "max_waited_s": max((s.waited_s for s in settles), default=0.0),
            "total_reads": sum(s.reads for s in settles)}
