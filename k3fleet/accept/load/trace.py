"""``--trace FILE``: a production request log replayed at its own arrival times (docs/acceptance-load.md
"Trace replay").

One JSON object a line (JSON Lines; ``#`` lines and blank lines are skipped):

    {"arrival_s": 0.25, "prompt_tokens": 1800, "output_tokens": 120, "session_id": "s-17",
     "tools": [...], "response_format": {...}}

``arrival_s`` (seconds from the trace's start, required), ``prompt`` (the text) or ``prompt_tokens`` (its
length: a deterministic filler prompt of that size is sent), ``output_tokens`` (required: the answer is
generated to exactly that length), ``tools`` (OpenAI tool definitions), ``response_format`` (as the chat
API takes it), ``session_id`` (requests of one session are one conversation: each turn carries the turns
before it and the answers to them, and waits for the previous one). Prompt text is passed through the
project's redactor as it is read (a key, a token or a password in a production prompt is never sent nor
kept), and the run keeps only lengths and a digest of the file, never a prompt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3fleet.bounds import loads_json, read_input
from k3fleet.errors import UsageError, validated
from k3fleet.evidence.redact import redact_text

MAX_TRACE_REQUESTS = 1_000_000


class TraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    arrival_s: float = Field(ge=0, le=7 * 86400)
    prompt: str | None = Field(default=None, max_length=4_000_000)
    prompt_tokens: int | None = Field(default=None, ge=1, le=16_777_216)
    output_tokens: int = Field(ge=1, le=1_000_000)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    response_format: dict[str, Any] | None = None
    session_id: str | None = Field(default=None, min_length=1, max_length=200)


@dataclass
class Trace:
    """A trace as read: its requests in arrival order (offsets already divided by ``speed``)."""

    source: str
    sha256: str
    speed: float
    requests: list[TraceRequest] = field(default_factory=list)
    redacted_prompts: int = 0

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        """What the run keeps of the trace: never a prompt."""
        sessions = {r.session_id for r in self.requests if r.session_id is not None}
        return {"file": self.source, "sha256": self.sha256, "speed": self.speed, "requests": len(self.requests),
                "duration_s": round(self.duration_s, 3), "sessions": len(sessions),
                "with_tools": sum(1 for r in self.requests if r.tools),
                "with_response_format": sum(1 for r in self.requests if r.response_format),
                "prompt_text": sum(1 for r in self.requests if r.prompt is not None),
                "redacted_prompts": self.redacted_prompts}


def load_trace(path: Path, *, speed: float = 1.0, limit: int | None = None) -> Trace:
    """The trace at ``path``, its arrival offsets divided by ``speed`` (2 replays twice as fast). Every
    problem is one usage line naming the file and the line."""
    if not 0 < speed <= 1000:
        raise UsageError(f"--trace-speed {speed:g}: must be above 0 and at most 1000")
    data = read_input(path, "--trace", kind="a JSON Lines request trace", limit="requests", text=True)
    trace = Trace(source=path.name, sha256=hashlib.sha256(data).hexdigest(), speed=speed)
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            raw = loads_json(text)
        except ValueError:
            raise UsageError(f"--trace {path.name} line {n}: not a JSON object") from None
        req = validated(TraceRequest, raw, f"--trace {path.name} line {n}", "not a JSON object")
        if (req.prompt is None) == (req.prompt_tokens is None):
            raise UsageError(f"--trace {path.name} line {n}: give prompt or prompt_tokens, one of them")
        if req.prompt is not None:
            clean = redact_text(req.prompt)
            if clean != req.prompt:
                trace.redacted_prompts += 1
            req.prompt = clean
        req.arrival_s = req.arrival_s / speed
        trace.requests.append(req)
        if len(trace.requests) > (limit or MAX_TRACE_REQUESTS):
            raise UsageError(f"--trace {path.name}: more than {limit or MAX_TRACE_REQUESTS} requests (bounded load)")
    if not trace.requests:
        raise UsageError(f"--trace {path.name}: no request in it")
    trace.requests.sort(key=lambda r: r.arrival_s)
    return trace
