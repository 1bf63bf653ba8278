"""The watch's rollback triggers as a table over sample sequences (the pure ``evaluate``)."""

from __future__ import annotations

from typing import Any

import pytest

from k3fleet.decide.models import Baseline
from k3fleet.errors import UsageError
from k3fleet.watch import Sample, WatchState, evaluate, parse_duration, rollback_artifact

BASE = Baseline(image="vllm/vllm-openai:kimi-k3", image_digest="sha256:" + "ab" * 32, prefix_caching=True,
                launch_command="vllm serve moonshotai/Kimi-K3 --enable-prefix-caching", concurrency_ceiling=48,
                envelope={"max_concurrency": 64}, prefix_cache_hit_ratio=0.8, model="moonshotai/Kimi-K3",
                parallel={"tensor_parallel_size": 8, "data_parallel_size": 2},
                parsers={"tool_call_parser": "kimi_k3", "reasoning_parser": "kimi_k3"})


def ok(t: float, **kw: Any) -> dict[str, Any]:
    base = {"t_s": t, "at": 1000.0 + t, "health": 200, "running": 4.0, "waiting": 0.0, "queries": 1000.0 * t,
            "hits": 800.0 * t, "prompt_tokens": 1000.0 * t, "caching_enabled": True, "process_start": 500.0,
            "agent": {"one_required_arg": "pass"}}
    base.update(kw)
    return base


CASES: dict[str, tuple[list[dict[str, Any]], str | None, int | None]] = {
    # name -> (samples, trigger expected, index of the sample that fires it)
    "healthy": ([ok(t) for t in range(1, 8)], None, None),
    "no_traffic_no_cache_ratio": ([ok(t, queries=0.0, hits=0.0) for t in range(1, 6)], None, None),
    "queue_over_ceiling_once_is_not_enough": ([ok(1), ok(2, running=40.0, waiting=20.0), ok(3)], None, None),
    "queue_over_ceiling_twice": ([ok(1), ok(2, running=40.0, waiting=20.0), ok(3, running=48.0, waiting=9.0)],
                                 "queue_beyond_envelope", 2),
    "health_fails_twice": ([ok(1), ok(2, health=503), ok(3, health=None, health_error="/health: connection refused",
                                                     metrics_error="cannot read /metrics")],
                           "process_restart_or_oom", 2),
    "process_restarted": ([ok(1), ok(2), ok(3, process_start=900.0)], "process_restart_or_oom", 2),
    "counters_went_backwards": ([ok(1), ok(5), ok(6, prompt_tokens=10.0, process_start=None)],
                                "process_restart_or_oom", 2),
    "caching_switched_off": ([ok(1), ok(2, caching_enabled=False)], "cache_hit_regression", 1),
    "hit_ratio_dropped": ([ok(1), ok(2), ok(3, hits=1600.0), ok(4, hits=1600.0 + 50.0)], "cache_hit_regression", 3),
    "agent_fails_twice": ([ok(1), ok(2, agent={"one_required_arg": "empty_tool_calls"}),
                           ok(3, agent={"one_required_arg": "invalid_arguments"})], "schema_invalid_tool_calls", 2),
    "agent_fails_once": ([ok(1), ok(2, agent={"one_required_arg": "empty_tool_calls"}), ok(3)], None, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_triggers(name: str) -> None:
    samples, trigger, at = CASES[name]
    state = WatchState(baseline=BASE, repeat=2, cache_tolerance=0.5)
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
