"""`accept agent`: the agent tool-call contract suite, each case repeated under the intended sampling.

Every run is judged twice, on the same bytes: as the raw HTTP response says it and as the official
``openai`` SDK reads it (``toolcheck``). The result is a pass rate per case with counts, the defects
seen in each case and the layer each sits at. Which cases are critical is data (``CRITICAL``,
overridable). Cases, rules and sources: docs/acceptance.md ("accept agent").
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel, Field

from k3fleet.accept import identity, toolcheck
from k3fleet.accept.agent_profile import case_func
from k3fleet.accept.client import (
    Endpoint,
    EndpointError,
    Exchange,
    body_lines,
    dumps_body,
    error_from_exception,
    model_card,
)
from k3fleet.accept.profile_cases import is_profile_case
from k3fleet.accept.record import Recorder
from k3fleet.accept.result import ProbeResult, Status, finding
from k3fleet.accept.toolcheck import Expect, View
from k3fleet.accept.turn import PROBE, SYSTEM, Ctx, RunOutcome
from k3fleet.accept.turn import add_defect as _add
from k3fleet.accept.turn import short as _short
from k3fleet.accept.turn import turn as _turn
from k3fleet.contracts import Severity
from k3fleet.errors import UsageError
from k3fleet.models.findings import Finding

Progress = Callable[[str], None]

# --- tools the cases offer (fixed, so a run is comparable with the next) --------------------------
TOOLS: dict[str, dict[str, Any]] = {
    "get_node_status": {
        "description": "Return the health of one GPU node.",
        "parameters": {"type": "object", "properties": {"node": {"type": "string", "minLength": 1}},
                       "required": ["node"], "additionalProperties": False}},
    "open_ticket": {
        "description": "Open an incident ticket.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string", "minLength": 1},
            "labels": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "owner": {"type": "object", "properties": {"team": {"type": "string"}, "user": {"type": "string"}},
                      "required": ["team", "user"], "additionalProperties": False},
            "impact": {"type": "object", "properties": {
                "nodes": {"type": "array", "items": {"type": "string"}},
                "severity": {"type": "string", "enum": ["sev1", "sev2", "sev3"]}},
                "required": ["severity"]}},
            "required": ["title", "labels", "owner", "impact"], "additionalProperties": False}},
    "scale_replicas": {
        "description": "Scale a serving deployment.",
        "parameters": {"type": "object", "properties": {
            "deployment": {"type": "string", "pattern": "^[a-z0-9-]+$"},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 64},
            "mode": {"type": "string", "enum": ["rolling", "recreate"]}},
            "required": ["deployment", "replicas", "mode"], "additionalProperties": False}},
    "drain_node": {
        "description": "Drain a node before maintenance.",
        "parameters": {"type": "object", "properties": {"node": {"type": "string"}, "reason": {"type": "string"}},
                       "required": ["node", "reason"], "additionalProperties": False}},
    "lookup_runbook": {
        "description": "Fetch the runbook section for an alert.",
        "parameters": {"type": "object", "properties": {"alert": {"type": "string"}}, "required": ["alert"],
                       "additionalProperties": False}},
}

INCIDENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"node": {"type": "string"}, "severity": {"type": "string", "enum": ["sev1", "sev2", "sev3"]},
                   "actions": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["node", "severity", "actions"], "additionalProperties": False}

# Cases a go-live depends on; the rest are reported, not gating. Operators override with --critical.
CRITICAL = ("one_required_arg", "nested_args", "call_then_result", "no_tool_turn", "invalid_args",
            "timeout_retry", "multi_turn", "streaming_deltas", "reasoning_contract")
# BFCL's categories (parallel, multiple, irrelevance, missing parameter, long multi-turn; docs/acceptance.md
# "accept agent") are reported beside them, not gating unless named with --critical.
BFCL_CASES = ("parallel_calls", "many_functions", "irrelevance", "missing_param", "long_multi_turn")
CASES = ("one_required_arg", "nested_args", "call_then_result", "no_tool_turn", "invalid_args", "structured_output",
         "timeout_retry", "multi_turn", "streaming_deltas", "reasoning_contract", *BFCL_CASES)


def tool_defs(*names: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, **copy.deepcopy(TOOLS[n])}} for n in names]


class AgentOptions(BaseModel):
    repeats: int = Field(default=20, ge=1, le=1000)
    concurrency: int = Field(default=4, ge=1, le=256)
    cases: list[str] = Field(default_factory=lambda: list(CASES))
    critical: list[str] = Field(default_factory=lambda: list(CRITICAL))
    min_pass_rate: float = Field(default=0.95, ge=0, le=1)
    # The intended sampling settings: sent only when given, so the server's own defaults apply otherwise.
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # The first attempt of timeout_retry is abandoned after its first streamed chunk.
    timeout_s: float | None = Field(default=None, gt=0)
    # A production profile's tools and response schemas: the tool:<name> and schema:<name> cases
    # (k3fleet/accept/profile_cases.py).
    profile_tools: list[dict[str, Any]] = Field(default_factory=list)
    profile_schemas: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # A time budget for the suite (accept all --budget): rounds of every case run until it is spent; the
    # first round always runs, so every case is judged on at least one run.
    time_budget_s: float | None = Field(default=None, gt=0)


def _assistant_msg(view: View) -> dict[str, Any]:
    return {"role": "assistant", "content": view.content or None,
            "tool_calls": [{"id": c.get("id") or f"call_{i}", "type": "function",
                            "function": {"name": c.get("name"), "arguments": c.get("arguments") or "{}"}}
                           for i, c in enumerate(view.tool_calls)]}


def _tool_result(call: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.get("id") or "call_0", "content": json.dumps(result)}


# --- the cases ------------------------------------------------------------------------------------
def _expect(*names: str, values: dict[str, dict[str, Any]] | None = None) -> Expect:
    return Expect(calls=list(names), schemas={n: TOOLS[n]["parameters"] for n in names}, values=values or {})


def _question(text: str) -> list[dict[str, Any]]:
    """A conversation's start: the system prompt and the user's ``text``."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


async def _ask(ctx: Ctx, out: RunOutcome, case: str, label: str, text: str, tools: tuple[str, ...],
               expect: Expect, *, stream: bool = False, tool_choice: str = "auto") -> None:
    """A one-turn case: ``text`` asked with ``tools`` offered, the answer judged against ``expect``."""
    await _turn(ctx, case, label, ctx.body(_question(text), tools=tool_defs(*tools), tool_choice=tool_choice),
                expect, stream=stream, outcome=out)


async def case_one_required_arg(ctx: Ctx, out: RunOutcome) -> None:
    await _ask(ctx, out, "one_required_arg", "call", 'Check one node: call get_node_status with node="gpu-017".',
               ("get_node_status", "lookup_runbook"),
               _expect("get_node_status", values={"get_node_status": {"node": "gpu-017"}}))


async def case_nested_args(ctx: Ctx, out: RunOutcome) -> None:
    await _ask(ctx, out, "nested_args", "call",
               "Call open_ticket for 'NCCL timeouts on rail 3': labels nccl and rail-3, owner team infra and user "
               "ana, impact on nodes gpu-017 and gpu-018 at severity sev2.", ("open_ticket",), _expect("open_ticket"))


async def case_call_then_result(ctx: Ctx, out: RunOutcome) -> None:
    msgs = _question('Call get_node_status with node="gpu-002", then tell me what you found.')
    tools = tool_defs("get_node_status")
    view, _ = await _turn(ctx, "call_then_result", "call", ctx.body(msgs, tools=tools, tool_choice="auto"),
                          _expect("get_node_status"), stream=False, outcome=out)
    if view is None or not view.tool_calls:
        return
    msgs += [_assistant_msg(view),
             _tool_result(view.tool_calls[0], {"node": "gpu-002", "state": "healthy", "xid_errors": 0})]
    await _turn(ctx, "call_then_result", "answer", ctx.body(msgs, tools=tools, tool_choice="auto"),
                Expect(content=True), stream=False, outcome=out)


async def case_no_tool_turn(ctx: Ctx, out: RunOutcome) -> None:
    await _ask(ctx, out, "no_tool_turn", "answer",
               "In one sentence, what does a canary host prove before a driver change? Answer from your own "
               "knowledge.", ("get_node_status", "drain_node"), Expect(content=True))


async def case_invalid_args(ctx: Ctx, out: RunOutcome) -> None:
    # Tight schema (pattern, range, enum, no extra properties): invalid or incomplete arguments show.
    await _ask(ctx, out, "invalid_args", "call", 'Call scale_replicas with deployment="kimi-k3-prod", replicas=12, '
               'mode="rolling".', ("scale_replicas",),
               _expect("scale_replicas", values={"scale_replicas": {"replicas": 12}}), tool_choice="required")


async def case_structured_output(ctx: Ctx, out: RunOutcome) -> None:
    msgs = _question("Summarise this incident as JSON: node gpu-017 lost its NVLink, severity sev2, actions: drain, "
                     "open a ticket.")
    fmt = {"type": "json_schema", "json_schema": {"name": "incident", "schema": INCIDENT_SCHEMA, "strict": True}}
    await _turn(ctx, "structured_output", "answer", ctx.body(msgs, response_format=fmt),
                Expect(structured_schema=INCIDENT_SCHEMA), stream=False, outcome=out)


async def case_timeout_retry(ctx: Ctx, out: RunOutcome) -> None:
    """A client gives up mid-stream, then retries with the same request id: one call, executed once."""
    body = ctx.body(_question('Call drain_node with node="gpu-031" reason="xid 79".'), tools=tool_defs("drain_node"),
                    tool_choice="auto")
    request_id = f"accept-{uuid.uuid4().hex[:16]}"
    headers = {"X-Request-Id": request_id}
    abandoned = await _abandon_after_first_chunk(ctx, body, headers)
    if abandoned is not None:
        _add(out, "http_error", "http", abandoned)
        return
    view, _ = await _turn(ctx, "timeout_retry", "retry", body, _expect("drain_node"), stream=True, outcome=out,
                           headers=headers)
    if view is None:
        return
    ledger: dict[str, list[str]] = {}
    for call in view.tool_calls:
        key = json.dumps([call.get("name"), call.get("arguments")])
        ledger.setdefault(request_id, []).append(key)
    executed = ledger.get(request_id, [])
    if len(executed) != len(set(executed)):
        _add(out, "duplicate_tool_call", "http", f"request {request_id}: {len(executed)} calls, "
                                                 f"{len(set(executed))} distinct")


async def _abandon_after_first_chunk(ctx: Ctx, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
    """Start the stream and drop the connection at its first data line (a client-side timeout)."""
    req = dict(body)
    req["stream"] = True
    url = ctx.endpoint.url("/v1/chat/completions")
    t0 = time.time()
    try:
        # One deadline for the attempt, as for every probe request (k3fleet.accept.client.fetch).
        async with asyncio.timeout(ctx.endpoint.timeout_s), \
                ctx.client.stream("POST", url, content=dumps_body(req),
                                  headers={"Content-Type": "application/json", **headers}) as resp:
            if resp.status_code >= 400:
                return f"first attempt answered {resp.status_code}"
            async for line in body_lines(resp, ctx.endpoint.display_url + "/v1/chat/completions"):
                if line.startswith("data:"):
                    break
    except EndpointError as exc:
        return exc.message
    except TimeoutError:
        return (f"{ctx.endpoint.display_url}/v1/chat/completions sent no first chunk within "
                f"{ctx.endpoint.timeout_s:g} s")
    except httpx.HTTPError as exc:
        return error_from_exception(exc, ctx.endpoint.display_url + "/v1/chat/completions").message
    ctx.rec.exchange(Exchange(probe=PROBE, label="timeout_retry/abandoned", path="/v1/chat/completions", request=req,
                              stream=True, started_at=t0, error="abandoned by the client after the first chunk",
                              error_kind="client_abort"))
    return None


async def case_multi_turn(ctx: Ctx, out: RunOutcome) -> None:
    tools = tool_defs("get_node_status", "drain_node")
    first_call = {"id": "functions.get_node_status:0", "type": "function",
                  "function": {"name": "get_node_status", "arguments": json.dumps({"node": "gpu-044"})}}
    msgs: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": 'Call get_node_status with node="gpu-044".'},
            {"role": "assistant", "content": None, "tool_calls": [first_call]},
            {"role": "tool", "tool_call_id": first_call["id"],
             "content": json.dumps({"node": "gpu-044", "state": "degraded", "xid_errors": 3})},
            {"role": "user", "content": 'It is degraded: call drain_node with node="gpu-044" reason="xid errors".'}]
    view, _ = await _turn(ctx, "multi_turn", "call", ctx.body(msgs, tools=tools, tool_choice="auto"),
                          _expect("drain_node", values={"drain_node": {"node": "gpu-044"}}), stream=False, outcome=out)
    if view is not None and any(c.get("id") == first_call["id"] for c in view.tool_calls):
        _add(out, "duplicate_tool_call", "http", "the new call reuses the earlier call's id")


async def case_streaming_deltas(ctx: Ctx, out: RunOutcome) -> None:
    await _ask(ctx, out, "streaming_deltas", "call",
               'Two calls: get_node_status with node="gpu-001", then lookup_runbook with alert="XidError79".',
               ("get_node_status", "lookup_runbook"), _expect("get_node_status", "lookup_runbook"), stream=True)


async def case_reasoning_contract(ctx: Ctx, out: RunOutcome) -> None:
    await _ask(ctx, out, "reasoning_contract", "call",
               'Think it through, then call lookup_runbook with alert="NVLinkDown".', ("lookup_runbook",),
               _expect("lookup_runbook"), stream=True)


# Distractors for many_functions: 21 plausible fleet tools beside the 5 above, so the right one is chosen
# among 26 (BFCL "multiple" offers several; production agents offer dozens).
_DISTRACTORS = [(f"{verb}_{noun}", f"{verb.capitalize()} the {noun.replace('_', ' ')}.")
                for verb in ("list", "restart", "cordon")
                for noun in ("pods", "jobs", "alerts", "gpus", "links", "queues", "rails")]
_DISTRACTOR_TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"],
                   "additionalProperties": False}}} for name, desc in _DISTRACTORS]


async def case_parallel_calls(ctx: Ctx, out: RunOutcome) -> None:
    """BFCL parallel: one turn, the same function called twice with different arguments."""
    expect = _expect("get_node_status", "get_node_status")
    expect.call_args = [{"node": "gpu-101"}, {"node": "gpu-102"}]
    await _ask(ctx, out, "parallel_calls", "call",
               'Check two nodes at once, in parallel: call get_node_status with node="gpu-101" and get_node_status '
               'with node="gpu-102".', ("get_node_status", "drain_node"), expect)


async def case_many_functions(ctx: Ctx, out: RunOutcome) -> None:
    """BFCL multiple: the right function among 26 offered."""
    tools = tool_defs(*TOOLS) + copy.deepcopy(_DISTRACTOR_TOOLS)
    await _turn(ctx, "many_functions", "call",
                ctx.body(_question('Which runbook covers alert "XidError48"? Use lookup_runbook with '
                                   'alert="XidError48".'), tools=tools, tool_choice="auto"),
                _expect("lookup_runbook", values={"lookup_runbook": {"alert": "XidError48"}}), stream=False,
                outcome=out)


async def case_irrelevance(ctx: Ctx, out: RunOutcome) -> None:
    """BFCL irrelevance: tools are offered, none fits the request: no call, an answer."""
    await _ask(ctx, out, "irrelevance", "answer",
               "Book me a train from Zurich to Milan for tomorrow morning.", ("get_node_status", "drain_node",
                                                                              "scale_replicas"), Expect(content=True))


async def case_missing_param(ctx: Ctx, out: RunOutcome) -> None:
    """BFCL missing parameter: a required argument was never given: the model asks, it does not invent one."""
    await _ask(ctx, out, "missing_param", "ask",
               'Use drain_node on the failing node, reason "maintenance". I have not said which node: ask me first.',
               ("drain_node",), Expect(ask=True))


async def case_long_multi_turn(ctx: Ctx, out: RunOutcome) -> None:
    """BFCL long multi-turn: six earlier calls with their results, then a new request that must use the last
    user turn's values (not an earlier turn's)."""
    tools = tool_defs("get_node_status", "drain_node", "lookup_runbook")
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(6):
        node = f"gpu-2{i:02d}"
        call = {"id": f"functions.get_node_status:{i}", "type": "function",
                "function": {"name": "get_node_status", "arguments": json.dumps({"node": node})}}
        msgs += [{"role": "user", "content": f'Call get_node_status with node="{node}".'},
                 {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"],
                  "content": json.dumps({"node": node, "state": "healthy" if i % 3 else "degraded",
                                         "xid_errors": 0 if i % 3 else 2})},
                 {"role": "assistant", "content": f"{node} is {'healthy' if i % 3 else 'degraded'}."}]
    msgs.append({"role": "user", "content": 'Now call drain_node with node="gpu-203" reason="xid errors".'})
    await _turn(ctx, "long_multi_turn", "call", ctx.body(msgs, tools=tools, tool_choice="auto"),
                _expect("drain_node", values={"drain_node": {"node": "gpu-203"}}), stream=False, outcome=out)


CASE_FUNCS: dict[str, Callable[[Ctx, RunOutcome], Awaitable[None]]] = {
    "one_required_arg": case_one_required_arg, "nested_args": case_nested_args,
    "call_then_result": case_call_then_result, "no_tool_turn": case_no_tool_turn, "invalid_args": case_invalid_args,
    "structured_output": case_structured_output, "timeout_retry": case_timeout_retry, "multi_turn": case_multi_turn,
    "streaming_deltas": case_streaming_deltas, "reasoning_contract": case_reasoning_contract,
    "parallel_calls": case_parallel_calls, "many_functions": case_many_functions, "irrelevance": case_irrelevance,
    "missing_param": case_missing_param, "long_multi_turn": case_long_multi_turn,
}


def case_function(name: str) -> Callable[[Ctx, RunOutcome], Awaitable[None]]:
    """A built-in case, else a production profile's (tool:<name>, schema:<name>, invalid_schema, multimodal)."""
    if name in CASE_FUNCS:
        return CASE_FUNCS[name]
    return case_func(name)


# --- the suite ------------------------------------------------------------------------------------
async def run_agent(endpoint: Endpoint, opts: AgentOptions | None = None, *, recorder: Recorder | None = None,
                    progress: Progress | None = None, client: httpx.AsyncClient | None = None) -> ProbeResult:
    opts = opts or AgentOptions()
    unknown = [c for c in [*opts.cases, *opts.critical] if c not in CASE_FUNCS and not is_profile_case(c, opts)]
    if unknown:
        raise UsageError(f"unknown agent case(s): {', '.join(unknown)} (known: {', '.join(CASES)})")
    rec = recorder if recorder is not None else Recorder()
    say = progress or (lambda _m: None)
    if client is None:
        async with endpoint.async_client(opts.concurrency) as own:
            return await _suite(Ctx(own, endpoint, opts, rec), say)
    return await _suite(Ctx(client, endpoint, opts, rec), say)


async def _suite(ctx: Ctx, say: Progress) -> ProbeResult:
    opts = ctx.opts
    outcomes: dict[str, list[RunOutcome]] = {c: [] for c in opts.cases}
    sem = asyncio.Semaphore(opts.concurrency)

    async def one(case: str) -> None:
        async with sem:
            out = RunOutcome(passed=True)
            await case_function(case)(ctx, out)
            outcomes[case].append(out)

    t0 = time.monotonic()
    # The model must be served (exit 2 otherwise), as for every probe, before any case runs.
    await model_card(ctx.client, ctx.endpoint)
    seen = await identity.live(ctx.client, ctx.endpoint)
    await _reference_client(ctx, say)
    # Round by round (every case once a round), so a time budget cut leaves every case measured alike.
    rounds = 0
    for rnd in range(1, opts.repeats + 1):
        spent = time.monotonic() - t0
        if rnd > 1 and opts.time_budget_s is not None and spent >= opts.time_budget_s:
            say(f"agent: time budget {opts.time_budget_s:.0f} s spent after {rounds} of {opts.repeats} rounds")
            break
        say(f"agent: round {rnd}/{opts.repeats} ({len(opts.cases)} cases, {spent:.0f} s so far)")
        await asyncio.gather(*(one(case) for case in opts.cases))
        rounds = rnd
    result = _result(outcomes, opts, ctx.rec)
    result.data.update(rounds=rounds, repeats_planned=opts.repeats, elapsed_s=round(time.monotonic() - t0, 3),
                       server=seen)
    if rounds < opts.repeats:
        result.findings.append(finding(check_id="accept.agent.budget", severity="info",
                                       message=f"the time budget ({opts.time_budget_s:.0f} s) allowed {rounds} of "
                                               f"{opts.repeats} runs per case"))
    return result


async def _reference_client(ctx: Ctx, say: Progress) -> None:
    """One call through the official SDK's own HTTP path on the same endpoint: the reference client must
    work end to end before its reading of the raw bytes means anything."""
    # lazy: the openai SDK is heavy; only the reference client's one call needs it
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient, OpenAIError

    say("agent: reference client (openai SDK) on the same endpoint")
    # The SDK brings its own HTTP stack; it gets the same TLS setting and the same key, from the environment.
    sdk = AsyncOpenAI(base_url=ctx.endpoint.url("/v1"), api_key=ctx.endpoint.api_key() or "unused",
                      http_client=DefaultAsyncHttpxClient(verify=ctx.endpoint.verify_tls),
                      timeout=ctx.endpoint.timeout_s, max_retries=0)
    t0 = time.time()
    body = ctx.body([{"role": "user", "content": 'Call get_node_status with node="gpu-001".'}],
                    tools=tool_defs("get_node_status"), tool_choice="auto")
    kwargs = {k: v for k, v in body.items() if k not in ("model", "messages")}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in ("tools", "tool_choice", "temperature", "top_p",
                                                                 "max_tokens")}
    try:
        # The SDK's timeout bounds each read; one deadline bounds the whole call, as for every probe request
        # (k3fleet.accept.client.fetch), so a server that trickles its answer cannot hold the probe.
        async with asyncio.timeout(ctx.endpoint.timeout_s):
            completion: Any = await sdk.chat.completions.create(model=body["model"], messages=body["messages"],
                                                                extra_body=extra or None, **kwargs)
        if isinstance(completion, BaseModel):
            ctx.rec.exchange(Exchange(probe=PROBE, label="reference_client", path="/v1/chat/completions",
                                      request=body, status=200, response=completion.model_dump(mode="json"),
                                      started_at=t0))
        else:
            # The SDK hands back the body as text when it is not JSON.
            ctx.rec.exchange(Exchange(probe=PROBE, label="reference_client", path="/v1/chat/completions",
                                      request=body, status=200, response=_short(str(completion), 2000),
                                      started_at=t0, error="the SDK got a body that is not a chat completion",
                                      error_kind="sdk_error"))
    except TimeoutError:
        ctx.rec.exchange(Exchange(probe=PROBE, label="reference_client", path="/v1/chat/completions", request=body,
                                  started_at=t0, error=f"the openai SDK's request did not finish within "
                                                       f"{ctx.endpoint.timeout_s:g} s (one deadline for the whole "
                                                       "request)", error_kind="deadline"))
    except (OpenAIError, ValueError, TypeError, RecursionError, httpx.HTTPError) as exc:
        # (A RecursionError: the SDK parses an answer nested deeper than Python recurses with its own json.)
        # Not only the SDK's own errors: a 200 whose body is not JSON raises a JSONDecodeError (a ValueError)
        # from inside the SDK. Either way it is evidence about the endpoint, never a crash of the probe.
        ctx.rec.exchange(Exchange(probe=PROBE, label="reference_client", path="/v1/chat/completions", request=body,
                                  started_at=t0, error=f"{type(exc).__name__}: {_short(str(exc))}",
                                  error_kind="sdk_error"))
    finally:
        await sdk.close()


def _result(outcomes: dict[str, list[RunOutcome]], opts: AgentOptions, rec: Recorder) -> ProbeResult:
    cases: dict[str, Any] = {}
    findings: list[Finding] = []
    total_runs = 0
    errored = 0
    for case, runs in outcomes.items():
        n = len(runs)
        passed = sum(1 for r in runs if r.passed)
        total_runs += n
        errored += sum(1 for r in runs if set(r.defects) <= {"http_error", "malformed_response"} and r.defects)
        counts: Counter[str] = Counter()
        layers: dict[str, str] = {}
        evidence: dict[str, str] = {}
        for r in runs:
            for d, layer in r.defects.items():
                counts[d] += 1
                # A defect seen in any raw response is the server's, whatever the SDK also did.
                layers[d] = "http" if layer == "http" or layers.get(d) == "http" else layer
                evidence.setdefault(d, r.evidence.get(d, ""))
        case_layer = "http" if "http" in layers.values() else ("client" if layers else None)
        critical = case in opts.critical
        seats = {d: toolcheck.seat_of(d, seen_at) for d, seen_at in layers.items()}
        cases[case] = {"runs": n, "passed": passed, "pass_rate": round(passed / n, 4) if n else None,
                       "defects": dict(counts), "defect_layers": layers, "defect_seats": seats,
                       "layer": case_layer, "critical": critical,
                       "reasoning_fields": dict(Counter(r.reasoning_field or "none" for r in runs)),
                       "finish_reasons": dict(Counter(f for r in runs for f in r.finish_reasons))}
        for d, count in sorted(counts.items()):
            sev: Severity = "error" if critical and (passed / n if n else 0) < opts.min_pass_rate else "warning"
            findings.append(finding(
                check_id=f"accept.agent.{d}", severity=sev, layer=layers[d],
                message=f"{case}: {toolcheck.DEFECTS.get(d, d)}: {count}/{n} runs ({seats[d]} layer, seen in the "
                        f"{'raw response' if layers[d] == 'http' else 'SDK reading'})",
                evidence=_short(evidence.get(d, ""), 300)))
    ref = next((e for e in rec.exchanges.get(PROBE, []) if e.get("label") == "reference_client"), None)
    if ref is not None and ref.get("error"):
        findings.append(finding(check_id="accept.agent.reference_client", severity="warning", layer="client",
                                message=f"the openai SDK's own request failed on this endpoint: {ref['error']}"))
    data = {"cases": cases, "repeats": opts.repeats, "min_pass_rate": opts.min_pass_rate,
            "sampling": {k: getattr(opts, k) for k in ("temperature", "top_p", "max_tokens")} | {
                "extra_body": opts.extra_body}}
    status: Status
    if total_runs == 0 or errored == total_runs:
        status, reason = "error", "no run reached the model (every request failed)"
        findings.insert(0, finding(check_id="accept.endpoint.unreachable", severity="error", layer="http",
                                   message=reason))
    else:
        low = [c for c, v in cases.items() if v["critical"] and v["pass_rate"] is not None
               and v["pass_rate"] < opts.min_pass_rate]
        if low:
            status = "fail"
            reason = f"critical case(s) below the {opts.min_pass_rate:.0%} pass rate: " + ", ".join(
                f"{c} {cases[c]['passed']}/{cases[c]['runs']}" for c in low)
        else:
            status = "pass"
            reason = f"every critical case at or above {opts.min_pass_rate:.0%} over {opts.repeats} runs"
    return ProbeResult(probe=PROBE, status=status, reason=reason, findings=findings, data=data)
