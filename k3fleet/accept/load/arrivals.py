"""When open-loop requests arrive: the offsets of a step's arrivals at a rate, and goodput.

Inter-arrival times are gamma-distributed with shape ``burstiness`` and mean ``1 / rate`` (the
process vLLM's ``vllm bench serve --request-rate R --burstiness B`` draws from): shape 1 is a Poisson
process (exponential gaps), below 1 burstier, above 1 more even. The offsets are drawn from a seeded
generator before the step starts, so a step is the same schedule every time it runs with the same seed
(docs/acceptance-load.md "Open-loop arrivals").
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from k3fleet.accept.load.shots import Shot


def arrival_offsets(rate: float, seconds: float, *, burstiness: float = 1.0, seed: int = 0,
                    limit: int | None = None) -> list[float]:
    """Arrival offsets (seconds from the step's start, ascending, all below ``seconds``) of requests at
    ``rate`` per second; at most ``limit`` of them."""
    if rate <= 0 or seconds <= 0:
        return []
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    out: list[float] = []
    t = 0.0
    while limit is None or len(out) < limit:
        t += rng.gammavariate(burstiness, scale)
        if t >= seconds:
            break
        out.append(t)
    return out


def meets_slo(shot: Shot, ttft_s: float, itl_s: float, e2e_s: float | None) -> bool:
    """One request is goodput: answered, first token within ``ttft_s``, its mean inter-token gap within
    ``itl_s`` and (when given) all of it within ``e2e_s``."""
    if not shot.ok or shot.ttft is None or shot.ttft > ttft_s:
        return False
    if shot.gaps and sum(shot.gaps) / len(shot.gaps) > itl_s:
        return False
    return not (e2e_s is not None and (shot.e2e is None or shot.e2e > e2e_s))


def goodput(shots: Sequence[Shot], ttft_s: float, itl_s: float, e2e_s: float | None) -> float | None:
    """The share of ``shots`` that meet the limits (failures count against it); ``None`` without shots."""
    if not shots:
        return None
    return sum(1 for s in shots if meets_slo(s, ttft_s, itl_s, e2e_s)) / len(shots)
