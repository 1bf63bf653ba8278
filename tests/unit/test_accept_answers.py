"""Warm answer against cold answer (k3fleet/accept/answers.py) on a recorded real vLLM 0.32 stream with logprobs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from k3fleet.accept.answers import NEAR_TIE_NATS, answer_of, compare

# Recorded from the lab's real vLLM (tests/fixtures/serving/SOURCES.md).
SSE = Path(__file__).resolve().parents[1] / "fixtures" / "serving" / "cpu_0_32_stream_logprobs.sse"


def _chunks() -> list[Any]:
    out: list[Any] = []
    for line in SSE.read_text().splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    return out


def _steps(chunks: list[Any]) -> list[dict[str, Any]]:
    return [step for c in chunks if isinstance(c, dict) for ch in c["choices"]
            for step in ((ch.get("logprobs") or {}).get("content") or [])]


def test_tokens_and_margins_come_from_logprobs() -> None:
    ans = answer_of("cold", _chunks())
    assert ans.tokens is not None and len(ans.tokens) == 6
    assert all(m is not None and m >= 0 for m in ans.margins)
    assert compare(ans, answer_of("replay_1", _chunks())).same


def test_a_changed_token_is_a_changed_answer_unless_the_cold_step_was_a_near_tie() -> None:
    cold = _chunks()
    warm = copy.deepcopy(cold)
    step = _steps(warm)[2]
    step["token"] = "XYZ"
    c = compare(answer_of("cold", cold), answer_of("replay_1", warm))
    assert (c.basis, c.same, c.first_difference, c.near_tie) == ("tokens", False, 2, False)
    # The same change where the cold answer's two best tokens were within NEAR_TIE_NATS: a tie broken, not a change.
    tied = copy.deepcopy(cold)
    cold_step = _steps(tied)[2]
    cold_step["top_logprobs"][1]["logprob"] = cold_step["logprob"] - NEAR_TIE_NATS / 2
    assert compare(answer_of("cold", tied), answer_of("replay_1", warm)).near_tie


def test_text_is_compared_when_the_server_gives_no_logprobs() -> None:
    plain = [{"choices": [{"delta": {"content": "the fleet"}, "logprobs": None}]}, "[DONE]"]
    other = [{"choices": [{"delta": {"content": "the flee t"}, "logprobs": None}]}, "[DONE]"]
    c = compare(answer_of("cold", plain), answer_of("replay_1", other))
    assert (c.basis, c.same, c.first_difference) == ("text", False, 8)
