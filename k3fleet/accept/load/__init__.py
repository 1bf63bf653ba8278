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

The run is split by what each part owns:

    options.py    the schedule and its bounds (LoadOptions, load_options), the observer the CLI draws from
    shots.py      one Shot a request; the Tally of them, with the request / time / Ctrl-C bounds
    transport.py  the HTTP session (aiohttp) and the reading of a stream into a Shot
    monitor.py    /health and /metrics sampled through the run, restarts, raw pages for the run directory
    steps.py      the curve: one row per step and its verdict
    outcome.py    the outcome, its findings and words, the probe result
    run.py        the schedule itself (calibration, ladder, ramp, sustained)
    constant.py   a flat closed-loop run for the benchmark
"""

from __future__ import annotations

from k3fleet.accept.load.constant import ConstantResult, run_constant
from k3fleet.accept.load.monitor import SERVER_METRICS
from k3fleet.accept.load.options import PHASES, LoadObserver, LoadOptions, Phase, load_options
from k3fleet.accept.load.outcome import Outcome
from k3fleet.accept.load.prompts import filler
from k3fleet.accept.load.run import run_load
from k3fleet.accept.load.shots import SERVER_KINDS, Shot, percentile

__all__ = ["PHASES", "SERVER_KINDS", "SERVER_METRICS", "ConstantResult", "LoadObserver", "LoadOptions", "Outcome",
           "Phase", "Shot", "filler", "load_options", "percentile", "run_constant", "run_load"]
