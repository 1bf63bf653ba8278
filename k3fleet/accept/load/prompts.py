"""The requests a load run sends: deterministic filler prose, the agent sessions' tools, plain bodies."""

from __future__ import annotations

from typing import Any

_FILLER = ("drain", "node", "driver", "fabric", "manager", "rail", "queue", "token", "cache", "block", "prefix",
           "session", "agent", "tool", "schema", "latency", "window", "canary", "wave", "rollback", "journal",
           "evidence", "manifest", "verdict", "capacity", "envelope", "ceiling", "stream", "batch", "engine")

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup_runbook", "description": "Find the runbook section for a topic.",
        "parameters": {"type": "object", "properties": {"topic": {"type": "string"}},
                       "required": ["topic"]}}},
    {"type": "function", "function": {
        "name": "node_status", "description": "Read a node's drain and driver state.",
        "parameters": {"type": "object", "properties": {
            "node": {"type": "string"}, "fields": {"type": "array", "items": {"type": "string"}}},
            "required": ["node"]}}}]


def filler(words: int, seed: int) -> str:
    """Deterministic prose of ``words`` words (varied enough that no tokenizer merges it away)."""
    n = len(_FILLER)
    return " ".join(_FILLER[(seed * 7 + i * (i % 5 + 1)) % n] for i in range(words))


def plain_body(model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """One user message, streamed with usage, exactly ``max_tokens`` out."""
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}
