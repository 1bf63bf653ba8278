"""The step rule's queue reading on a real vLLM's samples: the queue is judged while the step offers all its
sessions, not in the drain after (docs/acceptance-load.md, "A step's verdict")."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from k3fleet.accept.load import LoadObserver, LoadOptions
from k3fleet.accept.load.shots import Shot
from k3fleet.accept.load.steps import Curve, server_window

# Recorded from the lab's real vLLM (the CPU build 0.32.0 on the tiny model, `--max-num-seqs 2`): an agent ramp
# of 1, 2, 4 sessions, 12 s a step, 200 tokens a turn; tests/fixtures/load/SOURCES.md.
RAMP = json.loads((Path(__file__).parents[1] / "fixtures" / "load" / "lab_vllm_cpu_ramp_1_2_4.json").read_text())
OPTS = LoadOptions(**RAMP["options"])


def _window(row: dict[str, Any], offered_s: float | None) -> dict[str, Any]:
    a = row["t_start_s"]
    return server_window(RAMP["samples"], a, a + row["duration_s"], offered_s)


def _verdict(row: dict[str, Any], window: dict[str, Any], opts: LoadOptions = OPTS) -> str:
    shots = [Shot(row["phase"], row["step"], row["concurrency"], None, 0.0, ok=True, ttft=0.1, e2e=1.0)
             for _ in range(row["requests"])]
    curve = Curve(opts, LoadObserver(), time.monotonic(), RAMP["samples"])
    return curve.verdict(row["phase"], {**window, "concurrency": row["concurrency"]}, shots)


def test_the_recorded_4_session_step_queued_while_it_offered_4_and_drained_after() -> None:
    row = RAMP["rows"][2]
    assert (row["step"], row["verdict"], row["waiting_p50"]) == ("4 sessions", "ok", 0.0)  # as it was judged
    # Over the whole step, drain included, the median sample reads an empty queue...
    whole = _window(row, None)
    assert (whole["waiting_p50"], whole["waiting_samples"]) == (0.0, 23)
    # ...though 2 requests waited in 9 of the 13 samples while the step sent from 4 sessions; the 10 samples
    # after it stopped (the sessions that finished sent nothing more) all read 0.
    offered = _window(row, OPTS.step_s)
    assert (offered["waiting_p50"], offered["waiting_samples"], offered["samples"]) == (2.0, 13, 23)
    assert _verdict(row, offered) == "queued"
    # Everything else still reads the whole step.
    assert offered["running_max"] == whole["running_max"] == 2.0 and offered["samples"] == whole["samples"]


@pytest.mark.parametrize("index", [0, 1])
def test_steps_where_every_session_ran_are_not_queued(index: int) -> None:
    row = RAMP["rows"][index]
    window = _window(row, OPTS.step_s)
    assert window["running_max"] == row["concurrency"]
    assert _verdict(row, window) == "ok"


def test_a_queue_in_half_the_samples_is_not_most_of_them() -> None:
    row = RAMP["rows"][2]
    t0 = row["t_start_s"]
    # The 4 recorded samples from 3 s to 7 s into the 4-session step read 2 waiting, 0, 0, 2: half is not most
    # (the median of an even count is its lower middle sample).
    window = server_window(RAMP["samples"], t0 + 3.0, t0 + 7.0)
    assert (window["waiting_p50"], window["waiting_samples"], window["waiting_max"]) == (0.0, 4, 2.0)
    assert _verdict(row, window) == "ok"
    # From 2 s, one sample more (2 waiting): 3 of 5, most of them.
    window = server_window(RAMP["samples"], t0 + 2.0, t0 + 7.0)
    assert (window["waiting_p50"], window["waiting_samples"]) == (2.0, 5)
    assert _verdict(row, window) == "queued"


def test_too_few_samples_while_offered_is_no_queue() -> None:
    row = RAMP["rows"][2]
    # Had the step offered 4 sessions for 2 s only: 2 samples of a waiting queue are a blip, not a ceiling.
    window = _window(row, 2.0)
    assert (window["waiting_p50"], window["waiting_samples"]) == (2.0, 2)
    assert _verdict(row, window) == "ok"


def test_a_step_that_held_its_queue_but_not_the_slo_is_latency() -> None:
    # The recorded 2-session step: every session ran (no queue), its TTFT p95 0.26 s. Within the default 5 s SLO
    # it holds; against a 0.25 s SLO it is a latency ceiling, the queue rule aside.
    row = RAMP["rows"][1]
    judged = {**_window(row, OPTS.step_s), "ttft_p95_s": row["ttft_p95_s"], "itl_p95_s": row["itl_p95_s"]}
    assert _verdict(row, judged) == "ok"
    assert _verdict(row, judged, LoadOptions(**{**RAMP["options"], "ttft_p95_slo_s": 0.25})) == "latency"
