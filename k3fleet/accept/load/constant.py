"""A flat closed-loop run: the benchmark's workload (``make bench-load`` compares it with guidellm)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from pydantic import BaseModel

from k3fleet.accept.client import Endpoint
from k3fleet.accept.load.options import LoadOptions
from k3fleet.accept.load.prompts import filler, plain_body
from k3fleet.accept.load.shots import Shot, percentile
from k3fleet.accept.load.transport import Transport


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
    ``prompt_words`` words, ``output_tokens`` out) through the load run's own transport."""
    opts = LoadOptions(max_requests=requests + 10, request_timeout_s=timeout_s, max_duration_s=max(timeout_s, 3600),
                       phases=["sustained"], ramp=[concurrency])
    http = Transport(endpoint, opts, concurrency, time.monotonic())
    left = list(range(requests))
    shots: list[Shot] = []

    async def worker() -> None:
        while left:
            i = left.pop()
            shot = Shot("bench", "", concurrency, None, 0.0)
            body = plain_body(endpoint.model, f"request {i}: " + filler(prompt_words, i), output_tokens)
            await http.send(body, shot, parse_all=False)
            shots.append(shot)
            if on_done is not None:
                on_done(len(shots))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await http.close()
    wall = time.perf_counter() - t0
    ok = [s for s in shots if s.ok]
    return ConstantResult(requests=len(shots), ok=len(ok), errors=dict(Counter(s.kind or "?" for s in shots
                                                                                if not s.ok)),
                          wall_s=round(wall, 3), rps=round(len(ok) / wall, 3),
                          output_tokens=sum(s.completion_tokens or 0 for s in ok),
                          ttft_p50_s=percentile([s.ttft for s in ok if s.ttft is not None], 50),
                          itl_p50_s=percentile([g for s in ok for g in s.gaps], 50))
