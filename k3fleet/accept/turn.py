"""One agent turn: a chat request sent, recorded, and judged at both layers.

The suite's cases (k3fleet/accept/agent.py) and a production profile's (k3fleet/accept/profile_cases.py)
send their requests through :func:`turn`: the raw HTTP response and the official ``openai`` SDK's
reading of the same bytes are each classified against what the case expects (``toolcheck``), and
every defect lands in the run's :class:`RunOutcome` with the layer it sits at.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from k3fleet.accept import toolcheck
from k3fleet.accept.client import Endpoint, Exchange, assemble_stream, post_json, stream_chat
from k3fleet.accept.record import Recorder
from k3fleet.accept.toolcheck import Expect, View
from k3fleet.evidence.redact import excerpt

if TYPE_CHECKING:
    import httpx

    from k3fleet.accept.agent import AgentOptions

PROBE = "agent"
SYSTEM = "You are the on-call agent for a GPU serving fleet. Use the tools when asked; answer briefly."

# Where structured outputs force the shape (tool_choice required or named, response_format), the server
# constrains every token and a string argument runs until the grammar lets it close: such a case gets at
# least this many tokens when --max-tokens is lower, so what is judged is what the model made of it.
FORCED_ROOM = 256


@dataclass
class RunOutcome:
    passed: bool
    defects: dict[str, str] = field(default_factory=dict)  # defect -> layer
    evidence: dict[str, str] = field(default_factory=dict)
    reasoning_field: str | None = None
    finish_reasons: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    client: httpx.AsyncClient
    endpoint: Endpoint
    opts: AgentOptions
    rec: Recorder

    def body(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.endpoint.model, "messages": messages}
        for key in ("temperature", "top_p", "max_tokens"):
            val = getattr(self.opts, key)
            if val is not None:
                body[key] = val
        choice = extra.get("tool_choice")
        if "max_tokens" in body and ("response_format" in extra or choice == "required" or isinstance(choice, dict)):
            body["max_tokens"] = max(body["max_tokens"], FORCED_ROOM)
        body.update(extra)
        body.update(self.opts.extra_body)
        return body


async def turn(ctx: Ctx, case: str, label: str, body: dict[str, Any], expect: Expect, *, stream: bool,
               outcome: RunOutcome, headers: Mapping[str, str] | None = None) -> tuple[View | None, Exchange]:
    """Send ``body``, record the exchange, and judge the answer against ``expect`` at both layers."""
    if stream:
        ex = await stream_chat(ctx.client, ctx.endpoint, body, probe=PROBE, label=f"{case}/{label}",
                               timeout_s=ctx.opts.timeout_s, headers=headers)
    else:
        ex = await post_json(ctx.client, ctx.endpoint, "/v1/chat/completions", body, probe=PROBE,
                             label=f"{case}/{label}", timeout_s=ctx.opts.timeout_s, headers=headers)
    ctx.rec.exchange(ex)
    if ex.error is not None:
        add_defect(outcome, "malformed_response" if ex.error_kind == "bad_response" else "http_error", "http",
                   short(ex.error))
        return None, ex
    if stream:
        raw = toolcheck.raw_stream_view(assemble_stream(ex.chunks).model_dump())
        sdk, sdk_err = toolcheck.sdk_stream_view(ex.chunks)
    else:
        raw_or_none = toolcheck.raw_view(ex.response)
        if raw_or_none is None:
            add_defect(outcome, "malformed_response", "http", short(json.dumps(ex.response)))
            return None, ex
        raw = raw_or_none
        sdk, sdk_err = toolcheck.sdk_view(ex.response)
    raw_defects = toolcheck.classify(raw, expect)
    for d, ev in raw_defects.items():
        add_defect(outcome, d, "http", ev)
    if sdk_err is not None:
        add_defect(outcome, "sdk_error", "client", sdk_err)
    elif sdk is not None:
        for d, ev in toolcheck.classify(sdk, expect).items():
            if d not in raw_defects:
                add_defect(outcome, d, "client", ev)
    outcome.reasoning_field = outcome.reasoning_field or raw.reasoning_field
    outcome.finish_reasons.append(raw.finish_reason or "none")
    return raw, ex


def add_defect(outcome: RunOutcome, defect: str, layer: str, evidence: str) -> None:
    """The run fails with ``defect`` at ``layer``; the first evidence of a defect is the one kept."""
    outcome.defects.setdefault(defect, layer)
    outcome.evidence.setdefault(defect, evidence)
    outcome.passed = False


def short(text: str, n: int = 200) -> str:
    return str(excerpt(text, n))
