"""Is a warm answer the cold answer? Greedy (temperature 0) answers of one request, compared.

A prefix-cache hit must not change what the model says: on a hybrid model a hit that is not clamped
to a recurrent-state checkpoint resumes the recurrence mid-stream and answers wrongly at full cache
speed (docs/acceptance.md, "Correctness beside reuse"). The comparison uses the most exact thing the
server gives: the sampled tokens from ``logprobs`` (with each step's best alternatives, so a step
where the two best tokens were within :data:`NEAR_TIE_NATS` of each other is told apart from a
changed answer: a different summation order may flip such a tie on a healthy server), else the text
(reasoning, content and tool calls as streamed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

# Two candidates this close in log-probability are a tie that floating-point order may break either way.
NEAR_TIE_NATS = 0.02


class Answer(BaseModel):
    """One streamed answer: its tokens (with the step's margin to the runner-up) when logprobs came back,
    and its text."""

    label: str
    tokens: list[str] | None = None
    margins: list[float | None] = Field(default_factory=list)
    text: str = ""


class Comparison(BaseModel):
    warm: str
    cold: str
    basis: str                  # "tokens" or "text"
    same: bool
    near_tie: bool = False      # the first difference is at a step the cold answer itself nearly tied
    first_difference: int | None = None
    cold_excerpt: str = ""
    warm_excerpt: str = ""


def answer_of(label: str, chunks: Sequence[Any]) -> Answer:
    """An :class:`Answer` from a stream's ``chat.completion.chunk`` objects."""
    tokens: list[str] = []
    margins: list[float | None] = []
    has_logprobs = False
    text: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            continue
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                for key in ("reasoning", "reasoning_content", "content"):
                    if isinstance(delta.get(key), str):
                        text.append(delta[key])
                for call in delta.get("tool_calls") or []:
                    fn = call.get("function") if isinstance(call, Mapping) else None
                    if isinstance(fn, Mapping):
                        text.extend(str(fn.get(k) or "") for k in ("name", "arguments"))
            logprobs = choice.get("logprobs")
            content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
            if isinstance(content, list):
                for step in content:
                    if not isinstance(step, Mapping) or not isinstance(step.get("token"), str):
                        continue
                    has_logprobs = True
                    tokens.append(step["token"])
                    margins.append(_margin(step))
    return Answer(label=label, tokens=tokens if has_logprobs else None, margins=margins if has_logprobs else [],
                  text="".join(text))


def _margin(step: Mapping[str, Any]) -> float | None:
    """The sampled token's lead over the best other candidate, in nats; None when the server gave none."""
    chosen = step.get("logprob")
    others = [float(t["logprob"]) for t in step.get("top_logprobs") or []
              if isinstance(t, Mapping) and t.get("token") != step.get("token")
              and isinstance(t.get("logprob"), int | float)]
    if not isinstance(chosen, int | float) or not others:
        return None
    return float(chosen) - max(others)


def compare(cold: Answer, warm: Answer) -> Comparison:
    """The warm answer held against the cold answer of the same request."""
    if cold.tokens is not None and warm.tokens is not None:
        first = _first_difference(cold.tokens, warm.tokens)
        if first is None:
            return Comparison(warm=warm.label, cold=cold.label, basis="tokens", same=True)
        margin = cold.margins[first] if first < len(cold.margins) else None
        return Comparison(warm=warm.label, cold=cold.label, basis="tokens", same=False, first_difference=first,
                          near_tie=margin is not None and margin < NEAR_TIE_NATS,
                          cold_excerpt="".join(cold.tokens[first:first + 8])[:120],
                          warm_excerpt="".join(warm.tokens[first:first + 8])[:120])
    first = _first_difference(list(cold.text), list(warm.text))
    if first is None:
        return Comparison(warm=warm.label, cold=cold.label, basis="text", same=True)
    return Comparison(warm=warm.label, cold=cold.label, basis="text", same=False, first_difference=first,
                      cold_excerpt=cold.text[first:first + 60], warm_excerpt=warm.text[first:first + 60])


def _first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
