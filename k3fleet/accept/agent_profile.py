"""The agent cases a production profile adds (k3fleet/accept/profile_cases.py names them): one call of
each production tool (``tool:<name>``), structured output in each production response schema
(``schema:<name>``), an invalid response_format schema refused with a 4xx (``invalid_schema``), and a
text-and-image request (``multimodal``).

They send their requests as the suite's cases do (k3fleet/accept/turn.py): same exchange, same
two-layer judging.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from k3fleet.accept.client import post_json
from k3fleet.accept.profile_cases import INVALID_SCHEMA, MULTIMODAL, SCHEMA_PREFIX, TOOL_PREFIX
from k3fleet.accept.toolcheck import Expect
from k3fleet.accept.turn import PROBE, SYSTEM, Ctx, RunOutcome, add_defect, short, turn

# A response_format schema no validator accepts: "type" must be a JSON type name or a list of them.
BROKEN_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"node": {"type": "not-a-json-type"}},
                                 "required": "node"}
# A 1x1 PNG, so the request carries a real image part (a data URL needs no network).
PIXEL_PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
             "hQGAhKmMIQAAAABJRU5ErkJggg==")


def case_func(name: str) -> Callable[[Ctx, RunOutcome], Awaitable[None]]:
    """The case function of a profile case (``is_profile_case`` said it is one)."""
    if name == INVALID_SCHEMA:
        return _invalid_schema
    if name == MULTIMODAL:
        return _multimodal
    if name.startswith(TOOL_PREFIX):
        tool = name[len(TOOL_PREFIX):]
        return lambda ctx, out: _production_tool(ctx, out, tool)
    schema = name[len(SCHEMA_PREFIX):]
    return lambda ctx, out: _production_schema(ctx, out, schema)


async def _production_tool(ctx: Ctx, out: RunOutcome, name: str) -> None:
    fn = next(t for t in ctx.opts.profile_tools if t.get("name") == name)
    tools = [{"type": "function", "function": json.loads(json.dumps(t))} for t in ctx.opts.profile_tools]
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Call {name} once now, with arguments that satisfy its parameters "
                                        f"({fn.get('description') or 'production tool'})."}]
    await turn(ctx, TOOL_PREFIX + name, "call", ctx.body(msgs, tools=tools, tool_choice="auto"),
                Expect(calls=[name], schemas={name: fn.get("parameters") or {}}), stream=False, outcome=out)


async def _production_schema(ctx: Ctx, out: RunOutcome, name: str) -> None:
    schema = ctx.opts.profile_schemas[name]
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Answer as JSON in the {name} format: node gpu-017 lost its NVLink, "
                                        "severity sev2, actions: drain, open a ticket."}]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    await turn(ctx, SCHEMA_PREFIX + name, "answer", ctx.body(msgs, response_format=fmt),
                Expect(structured_schema=schema), stream=False, outcome=out)


async def _invalid_schema(ctx: Ctx, out: RunOutcome) -> None:
    """An invalid response_format schema is the client's error: 400, not output and not a crash."""
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Summarise the incident on gpu-017 as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "broken", "schema": BROKEN_SCHEMA, "strict": True}}
    body = ctx.body(msgs, response_format=fmt)
    ex = await post_json(ctx.client, ctx.endpoint, "/v1/chat/completions", body, probe=PROBE,
                         label=f"{INVALID_SCHEMA}/request", timeout_s=ctx.opts.timeout_s)
    ctx.rec.exchange(ex)
    if ex.status is None:
        add_defect(out, "http_error", "http", short(ex.error or "no answer"))
    elif ex.status >= 500:
        add_defect(out, "invalid_schema_server_error", "http", f"answered {ex.status}: {short(ex.error or '')}")
    elif 200 <= ex.status < 300:
        add_defect(out, "invalid_schema_accepted", "http", "an invalid response_format schema was served with status "
                                                     f"{ex.status}")


async def _multimodal(ctx: Ctx, out: RunOutcome) -> None:
    """One text-and-image request, as the mix's multimodal share sends them: a text answer comes back."""
    msgs: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "Describe this image in one sentence."},
                                         {"type": "image_url", "image_url": {"url": PIXEL_PNG}}]}]
    await turn(ctx, MULTIMODAL, "answer", ctx.body(msgs), Expect(content=True), stream=False, outcome=out)
