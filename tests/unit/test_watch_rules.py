"""The watch's rollback triggers as a table over sample sequences (the pure ``evaluate``), and its node-log
judge over recorded kernel logs (tests/fixtures/gpu_health/SOURCES.md, tests/fixtures/vllm_startup/SOURCES.md)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import pytest

from k3fleet.decide.watch import (
    Sample,
    WatchState,
    evaluate,
    judge_node_log,
    judge_pool,
    line_time,
    lines_since,
    parse_duration,
    queue_grows,
    real_traffic,
    rollback_artifact,
)
from k3fleet.errors import UsageError
from k3fleet.models.evidence import Baseline
from k3fleet.targets import load_target

FIX = Path(__file__).resolve().parent.parent / "fixtures"
# The accepted load: its sessions hit the prefix cache 80% of the time at a 50 ms TTFT p50, none waited.
TRAFFIC = {"hit_ratio": 0.8, "ttft_p50_s": 0.05, "waiting_max": 0.0, "rps": 10.0}
BASE = Baseline(image="vllm/vllm-openai:kimi-k3", image_digest="sha256:" + "ab" * 32, prefix_caching=True,
                launch_command="vllm serve moonshotai/Kimi-K3 --enable-prefix-caching", concurrency_ceiling=48,
                envelope={"max_concurrency": 64}, prefix_cache_hit_ratio=0.93, load_traffic=TRAFFIC,
                model="moonshotai/Kimi-K3", parallel={"tensor_parallel_size": 8, "data_parallel_size": 2},
                parsers={"tool_call_parser": "kimi_k3", "reasoning_parser": "kimi_k3"})


def counters(requests: float, queries: float, hits: float, prefill_s: float = 0.04) -> dict[str, float]:
    return {"requests": requests, "queries": queries, "hits": hits, "prompt_tokens": queries,
            "prefill_sum": requests * prefill_s, "prefill_count": requests}


def ok(t: float, **kw: Any) -> dict[str, Any]:
    """Interval ``t`` of real traffic at 30 requests an interval, 1000 queried tokens a request, 80% hits."""
    base = {"t_s": t, "at": 1000.0 + t, "health": 200, "running": 4.0, "waiting": 0.0,
            "counters": counters(30 * t, 30_000 * t, 24_000 * t), "caching_enabled": True, "process_start": 500.0,
            "agent": {"one_required_arg": "pass"}}
    base.update(kw)
    return base


def idle(t: int) -> dict[str, Any]:
    """No real traffic, only the watch's own probe: 3 requests, 1000 queried tokens each, no hit (its
    synthetic prompts share nothing), all between the sample's scrape and the scrape after the probe."""
    before = counters(3 * t, 3000 * t, 0.0)
    return ok(t, counters=before, probe_requests=3, after_probe=counters(3 * t + 3, 3000 * t + 3000, 0.0),
              after_probe_at=1000.5 + t)


def dropped(t: int, since: int, prefill_s: float = 0.4) -> dict[str, Any]:
    """From interval ``since`` on the hit ratio falls to 10% and (by default) prefill gets 10x slower."""
    reqs, q = 30 * t, 30_000 * t
    hits = 24_000 * since + 3000 * (t - since)
    c = counters(reqs, q, hits)
    c["prefill_sum"] = 30 * since * 0.04 + 30 * (t - since) * prefill_s
    return ok(t, counters=c)


def growing(t: int, rate: float = 30.0, step: float = 5.0) -> dict[str, Any]:
    """Requests arrive at ``rate`` an interval; the queue grows by ``step`` an interval from t=1."""
    waiting = step * (t - 1)
    done = rate * t - waiting  # what arrived and no longer waits
    return ok(t, waiting=waiting, counters=counters(done, 1000 * done, 800 * done))


def rising(t: int) -> dict[str, Any]:
    """The queue grows because twice as many requests arrive every interval: the traffic grows, not the server
    slows."""
    arrived = 30.0 * (2 ** t - 1)
    waiting = 5.0 * (t - 1)
    return ok(t, waiting=waiting, counters=counters(arrived - waiting, 1000 * arrived, 800 * arrived))


def with_counters(sample: dict[str, Any], **extra: float) -> dict[str, Any]:
    sample["counters"] = {**sample["counters"], **extra}
    return sample


CASES: dict[str, tuple[list[dict[str, Any]], str | None, int | None]] = {
    # name -> (samples, trigger expected, index of the sample that fires it)
    "healthy": ([ok(t) for t in range(1, 8)], None, None),
    # The defect this table guards: the probe's synthetic prompts never hit the cache, the idle server
    # had no other traffic, and the old watch judged the probe's 0.0 ratio against the cache probe's.
    "idle_server_own_probe_only": ([idle(t) for t in range(1, 12)], None, None),
    "no_traffic_no_cache_ratio": ([ok(t, counters=counters(0, 0, 0)) for t in range(1, 6)], None, None),
    "too_little_traffic_to_judge": ([ok(t, counters=counters(2 * t, 2000 * t, 200 * t, 0.4)) for t in range(1, 8)],
                                    None, None),
    "ratio_dropped_prefill_rose": ([ok(1), ok(2), *(dropped(t, 2) for t in range(3, 6))], "cache_hit_regression", 3),
    "ratio_dropped_prefill_flat": ([ok(1), ok(2), *(dropped(t, 2, prefill_s=0.04) for t in range(3, 8))], None, None),
    "queue_grows_at_a_flat_rate": ([growing(t) for t in range(1, 6)], "queue_growth", 2),
    "queue_grows_with_the_traffic": ([rising(t) for t in range(1, 5)], None, None),
    "queue_over_ceiling_once_is_not_enough": ([ok(1), ok(2, running=40.0, waiting=20.0), ok(3)], None, None),
    "queue_over_ceiling_twice": ([ok(1), ok(2, running=40.0, waiting=20.0), ok(3, running=48.0, waiting=9.0)],
                                 "queue_beyond_envelope", 2),
    "health_fails_twice": ([ok(1), ok(2, health=503), ok(3, health=None, health_error="/health: connection refused",
                                                     metrics_error="cannot read /metrics")],
                           "process_restart_or_oom", 2),
    "process_restarted": ([ok(1), ok(2), ok(3, process_start=900.0)], "process_restart_or_oom", 2),
    "counters_went_backwards": ([ok(1), ok(5), ok(6, counters=counters(1, 10, 8), process_start=None)],
                                "process_restart_or_oom", 2),
    "caching_switched_off": ([ok(1), ok(2, caching_enabled=False)], "cache_hit_regression", 1),
    "agent_fails_twice": ([ok(1), ok(2, agent={"one_required_arg": "empty_tool_calls"}),
                           ok(3, agent={"one_required_arg": "invalid_arguments"})], "schema_invalid_tool_calls", 2),
    "agent_fails_once": ([ok(1), ok(2, agent={"one_required_arg": "empty_tool_calls"}), ok(3)], None, None),
    # vLLM 0.30+ counters that explain failures (k3fleet/accept/explain.py).
    "corrupted_request_fires_at_once": ([with_counters(ok(1), corrupted=0.0), with_counters(ok(2), corrupted=1.0)],
                                        "corrupted_requests", 1),
    "admission_rejections_twice": ([with_counters(ok(t), rejected=5.0 * max(0, t - 1)) for t in range(1, 4)],
                                   "admission_rejections", 2),
    "admission_rejections_once": ([with_counters(ok(1), rejected=0.0), with_counters(ok(2), rejected=3.0),
                                   with_counters(ok(3), rejected=3.0)], None, None),
    "node_error_line": ([ok(1), ok(2, node_errors=["gpu-b01: kernel log since boot: Xid 79"])], "node_errors", 1),
    "node_note_only": ([ok(1), ok(2, node_notes=["gpu-b01: Xid 13 (application fault)"])], None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_triggers(name: str) -> None:
    samples, trigger, at = CASES[name]
    state = WatchState(baseline=BASE, repeat=2, cache_tolerance=0.5, min_requests=20)
    fired_at: list[tuple[int, str]] = []
    for i, raw in enumerate(samples):
        for t in evaluate(state, Sample.model_validate(raw)):
            fired_at.append((i, t.id))
            assert t.message and t.sample
    if trigger is None:
        assert fired_at == []
    else:
        assert (at, trigger) in fired_at, fired_at
        assert min(i for i, _ in fired_at) == at


def test_real_traffic_leaves_the_probe_out() -> None:
    prev, now = Sample.model_validate(idle(1)), Sample.model_validate(ok(2, counters=counters(36, 9000, 2400)))
    window = real_traffic(prev, now)
    # From the scrape after the probe (6 requests, 6000 tokens) to now: 30 real requests.
    assert window is not None and window["requests"] == 30 and window["queries"] == 3000 and window["hits"] == 2400
    assert window["seconds"] == pytest.approx(0.5)  # since the scrape after the probe
    # The closing scrape failed: the probe's 3 requests are taken out by count, its tokens are unknown.
    blind = Sample.model_validate({**idle(1), "after_probe": None, "after_probe_at": None})
    window = real_traffic(blind, now)
    assert window is not None and window["requests"] == 30 and window["queries"] is None
    # A counter that went backwards: a restart, the interval's traffic is unknown.
    assert real_traffic(Sample.model_validate(ok(5)), Sample.model_validate(ok(6, counters=counters(1, 1, 1)))) \
        is None


@pytest.mark.parametrize(("pool", "low", "regressed"), [
    ({"queries": 1000.0, "hits": 800.0, "prefill_sum": 1.0, "prefill_count": 20.0}, 0.05, False),
    ({"queries": 1000.0, "hits": 100.0, "prefill_sum": 8.0, "prefill_count": 20.0}, 0.05, True),
    ({"queries": 1000.0, "hits": 100.0, "prefill_sum": 1.0, "prefill_count": 20.0}, 0.05, False),
    ({"queries": 1000.0, "hits": 100.0, "ttft_sum": 8.0, "ttft_count": 20.0}, 0.05, True),
    ({"queries": 1000.0, "hits": 100.0, "prefill_sum": 8.0, "prefill_count": 20.0}, None, False),
    ({"queries": 0.0, "hits": 0.0}, 0.05, False),
])
def test_judge_pool(pool: dict[str, float], low: float | None, regressed: bool) -> None:
    assert judge_pool(pool, 0.8, low, 0.5, 0.5)[0] is regressed


@pytest.mark.parametrize(("history", "grows"), [
    ([(0, 30), (5, 30), (10, 31)], True),
    ([(0, 30), (5, 30), (10, 70)], False),   # the rate doubled: more traffic, not a slower server
    ([(0, 30), (5, 30), (4, 30)], False),    # the queue shrank again
    ([(0, 0), (0.5, 0), (0.9, 0)], False),   # nothing arrives
    ([(0, 30), (5, 30)], False),             # too short to tell
])
def test_queue_grows(history: list[tuple[float, float]], grows: bool) -> None:
    assert queue_grows(history, 2, 0.0) is grows


APPROVED = _dt.datetime(2026, 12, 1, 12, 0, tzinfo=_dt.UTC)


@pytest.mark.parametrize(("line", "when"), [
    ("2026-12-01T12:30:00+0000 gpu-b01 kernel: NVRM: Xid", _dt.datetime(2026, 12, 1, 12, 30, tzinfo=_dt.UTC)),
    ("2026-12-01T12:30:00.5Z kernel: x", _dt.datetime(2026, 12, 1, 12, 30, 0, 500000, tzinfo=_dt.UTC)),
    ("[Fri Aug 30 11:43:09 2024] NVRM: Xid", _dt.datetime(2024, 8, 30, 11, 43, 9, tzinfo=_dt.UTC)),
    ("Dec  1 11:00:00 gpu-b01 kernel: NVRM", _dt.datetime(2026, 12, 1, 11, 0, tzinfo=_dt.UTC)),
    ("[ 1234.567] NVRM: Xid", None),
    ("kernel: NVRM: Xid", None),
])
def test_line_time(line: str, when: _dt.datetime | None) -> None:
    assert line_time(line, 2026) == when


def test_lines_since_keep_the_undated_and_the_new() -> None:
    text = "Dec  1 11:00:00 old\n[ 12.5] undated\n2026-12-01T12:00:01+00:00 new"
    assert lines_since(text, APPROVED).splitlines() == ["[ 12.5] undated", "2026-12-01T12:00:01+00:00 new"]


@pytest.mark.parametrize(("fixture", "errors", "notes"), [
    ("gpu_health/xid79_line_nvsentinel155.txt", ["Xid 79"], []),
    ("gpu_health/xid94_line_gpud1174.txt", ["Xid 94"], []),
    # Xid 13 is often the application's own fault: a note, not a rollback (and these lines are from 2024).
    ("gpu_health/dmesg_ctime_xid13_109_gpud46.txt", [], []),
    ("vllm_startup/nccl_unhandled_system_error.log", ["NCCL error"], []),
])
def test_judge_node_log(fixture: str, errors: list[str], notes: list[str]) -> None:
    text = (FIX / fixture).read_text()
    found, noted = judge_node_log(text, APPROVED, load_target(None), "gpu-b01")
    assert len(found) == len(errors) and all(w in f for w, f in zip(errors, found, strict=True)), found
    assert all(f.startswith("gpu-b01: ") for f in found)
    assert len(noted) == len(notes), noted


def test_xid13_after_the_approval_is_a_note() -> None:
    text = (FIX / "gpu_health/dmesg_ctime_xid13_109_gpud46.txt").read_text()
    found, noted = judge_node_log(text, None, load_target(None), "gpu-b01")
    assert any("Xid 13" in n for n in noted + found)


def test_queue_limit_falls_back_to_the_tested_envelope() -> None:
    state = WatchState(baseline=BASE.model_copy(update={"concurrency_ceiling": None}))
    assert state.queue_limit == 64
    assert WatchState(baseline=Baseline()).queue_limit is None


def test_rollback_artifact_names_image_by_digest_and_launch_configuration() -> None:
    art = rollback_artifact(BASE)
    assert art["image"] == f"vllm/vllm-openai:kimi-k3@sha256:{'ab' * 32}"
    assert art["launch_command"].startswith("vllm serve") and art["parsers"]["tool_call_parser"] == "kimi_k3"


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0),
                                               ("0.5m", 30.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text)
