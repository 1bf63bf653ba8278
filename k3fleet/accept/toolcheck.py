"""Judge one assistant turn against the tool-call contract and name each known defect.

A turn is looked at twice: as the raw HTTP response says it (the model and the server's parsers)
and as the official ``openai`` SDK reads the same bytes (the reference client). A defect in the raw
view sits at the ``http`` layer; one that only the SDK view shows sits at the ``client`` layer.
Known Kimi shapes (docs/acceptance.md, "Known tool-call defects"): an empty ``tool_calls`` with the
call text in reasoning or content (vLLM issue 53246), several calls merged into one malformed entry
when streaming (vLLM issue 24478), tool-call markers leaking into reasoning (vLLM issue 30238).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from k3fleet.bounds import loads_json
from k3fleet.errors import validation_line
from k3fleet.evidence.redact import excerpt

# Kimi K2 markers (tokenizer special tokens) and the K3 channel markers named in vLLM PR 53249, plus
# the functions.NAME:INDEX call header both use.
MARKERS = re.compile(
    r"<\|tool_calls?_section_(?:begin|end)\|>|<\|tool_call_(?:begin|end|argument_begin)\|>"
    r"|<\|(?:open|close)\|>(?:tools|think|response|message)<\|sep\|>|\bfunctions\.[A-Za-z_][\w-]*:\d+")
THINK_TAGS = re.compile(r"</?think>")
# Kimi's channel marker leaked into content while the calls are dropped (vLLM issue 54273).
KIMI_LEAK = re.compile(r"<\|close\|>message<\|sep\|>")
# A tool call left as text: the Hermes/Qwen form (``<tool_call>{...}</tool_call>``) the parser should have taken.
RAW_CALL = re.compile(r"<tool_call>\s*\{.*?\}\s*(?:</tool_call>|$)", re.S)

# Defect ids and what each means (also the finding messages).
DEFECTS: dict[str, str] = {
    "empty_tool_calls": "empty tool_calls with the call text in reasoning or content (vLLM issue 53246)",
    "merged_stream_calls": "several streamed calls merged into one malformed entry (vLLM issue 24478)",
    "marker_in_reasoning": "tool-call markers leaked into the reasoning text (vLLM issue 30238)",
    "marker_in_content": "tool-call markers leaked into the content",
    "kimi_marker_leak": "Kimi's <|close|>message<|sep|> leaked into the content and the tool calls were dropped "
                        "(vLLM issue 54273)",
    "tool_call_text_in_content": "the tool call came back as text (<tool_call>{...}</tool_call>) in content with "
                                 "tool_calls empty: the tool-call parser did not run or did not match",
    "invented_argument": "a call made although a required argument was never given: the model must ask, not invent",
    "reasoning_in_content": "think tags in the content: the reasoning was not separated",
    "invalid_arguments": "tool-call arguments are not JSON or break the tool's schema",
    "missing_tool_call": "no tool call where one was required, and no call text anywhere",
    "unexpected_tool_call": "a tool call on a turn that must not call a tool",
    "wrong_tool": "a call to a tool that was not asked for",
    "wrong_call_count": "a different number of calls than asked for",
    "wrong_argument_value": "an argument value differs from the one the user gave",
    "wrong_finish_reason": "finish_reason does not match the turn (tool_calls with no call, or the reverse)",
    "empty_content": "no content on a turn that must answer in text",
    "invalid_structured_output": "structured output is not JSON or breaks the response_format schema",
    "length_cutoff": "the answer hit max_tokens (finish_reason length): raise the limit for agent turns",
    "duplicate_tool_call": "the retry after a timeout produced the same tool call twice",
    "sdk_error": "the reference SDK could not read the response",
    "http_error": "the request failed (transport or HTTP status)",
    "malformed_response": "the response is not a chat completion (no choices or message)",
    "invalid_schema_accepted": "a response_format whose schema is not a JSON Schema was served instead of refused",
    "invalid_schema_server_error": "a response_format whose schema is not a JSON Schema made the server fail (5xx)",
}


# Where each defect sits (the seeds' layers): the model's choice, the server's parsers, the HTTP path and
# gateway in front of it, or the client library reading it.
SEATS: dict[str, str] = {
    "empty_tool_calls": "parser", "merged_stream_calls": "parser", "marker_in_reasoning": "parser",
    "marker_in_content": "parser", "reasoning_in_content": "parser", "kimi_marker_leak": "parser",
    "tool_call_text_in_content": "parser", "invalid_arguments": "model", "missing_tool_call": "model",
    "unexpected_tool_call": "model", "wrong_tool": "model", "wrong_call_count": "model",
    "wrong_argument_value": "model", "invented_argument": "model", "wrong_finish_reason": "parser",
    "empty_content": "model", "invalid_structured_output": "model", "length_cutoff": "model",
    "duplicate_tool_call": "gateway", "http_error": "gateway", "malformed_response": "gateway",
    "sdk_error": "client", "invalid_schema_accepted": "parser", "invalid_schema_server_error": "parser",
}


# The fix each defect calls for, at its layer (what triage and the agent findings tell the operator).
FIXES: dict[str, str] = {
    "empty_tool_calls": "serve with the model's own --tool-call-parser (kimi_k3 for Kimi K3) and a vLLM with the "
                        "parser fix; until then the client validates tool_calls against the schema and retries",
    "kimi_marker_leak": "take the Kimi tool parser fix for vLLM issue 54273; until then the client must not show or "
                        "store such content and retries the turn",
    "tool_call_text_in_content": "start the server with --enable-auto-tool-choice and the model's --tool-call-parser "
                                 "(hermes for <tool_call> models); a client-side fallback may parse the text",
    "marker_in_content": "the tool parser left markers in content: update the parser (vLLM PR 31207 fixed the K2 path)",
    "marker_in_reasoning": "the reasoning parser kept tool markers: serve with the matching --reasoning-parser",
    "reasoning_in_content": "serve with the model's --reasoning-parser so reasoning is split from content",
    "merged_stream_calls": "update vLLM past issue 24478, or read calls non-streamed until then",
    "invalid_arguments": "validate arguments against the tool's schema and retry; constrain with tool_choice "
                         "required / a named tool (structured outputs) where the turn must call",
    "wrong_finish_reason": "the parser and the finish reason disagree: update the tool parser",
    "malformed_response": "a gateway or client cut the body: raise the proxy's buffer and read timeout, keep the "
                          "whole response",
    "invented_argument": "tell the model to ask for missing required values (system prompt) and reject calls whose "
                         "required arguments the user never gave",
}


def seat_of(defect: str, seen_at: str) -> str:
    """A defect's layer: the client when only the SDK's reading shows it, else where :data:`SEATS` puts it."""
    return "client" if seen_at == "client" else SEATS.get(defect, "model")


@dataclass
class View:
    """One reading of an assistant turn."""

    content: str = ""
    reasoning: str = ""
    reasoning_field: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    streamed: bool = False


@dataclass
class Expect:
    """What the turn must be."""

    calls: list[str] = field(default_factory=list)  # tool names, in order; empty: no call allowed
    schemas: dict[str, Any] = field(default_factory=dict)
    values: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool -> {property: value}
    content: bool = False
    structured_schema: dict[str, Any] | None = None
    # No call: the turn must ask for a missing required argument (a call is an invented argument).
    ask: bool = False
    # Parallel calls: each of these argument sets must be one call's (in any order).
    call_args: list[dict[str, Any]] = field(default_factory=list)


def _call(entry: Any) -> dict[str, Any]:
    fn = entry.get("function") if isinstance(entry, Mapping) else None
    fn = fn if isinstance(fn, Mapping) else {}
    return {"id": entry.get("id") if isinstance(entry, Mapping) else None,
            "name": fn.get("name") if isinstance(fn.get("name"), str) else "",
            "arguments": fn.get("arguments")}


def view_from_message(message: Mapping[str, Any], finish_reason: Any, *, streamed: bool = False) -> View:
    """The raw view of a non-streamed ``choices[0]`` (or an assembled stream)."""
    reasoning, rfield = "", None
    for key in ("reasoning", "reasoning_content"):
        if isinstance(message.get(key), str) and message.get(key):
            reasoning, rfield = message[key], key
            break
    content = message.get("content")
    calls = message.get("tool_calls") or []
    return View(content=content if isinstance(content, str) else "", reasoning=reasoning, reasoning_field=rfield,
                tool_calls=[_call(c) for c in calls if isinstance(c, Mapping)] if isinstance(calls, list) else [],
                finish_reason=finish_reason if isinstance(finish_reason, str) else None, streamed=streamed)


def raw_view(body: Any) -> View | None:
    """``None`` when the body is not a chat completion at all."""
    if not isinstance(body, Mapping):
        return None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    msg = choices[0].get("message")
    if not isinstance(msg, Mapping):
        return None
    return view_from_message(msg, choices[0].get("finish_reason"))


def raw_stream_view(assembled: Mapping[str, Any]) -> View:
    """The raw view of a stream, from ``client.assemble_stream``'s fold of the chunks."""
    msg = {"content": assembled.get("content") or None, "reasoning": assembled.get("reasoning") or None,
           "tool_calls": assembled.get("tool_calls") or []}
    return view_from_message(msg, assembled.get("finish_reason"), streamed=True)


def sdk_view(body: Any) -> tuple[View | None, str | None]:
    """The reference client's reading of a non-streamed body: ``(view, error)``."""
    from openai.types.chat import ChatCompletion  # lazy: the openai SDK is heavy (triage reads without it)

    try:
        completion = ChatCompletion.model_validate(body)
    except ValidationError as exc:
        return None, validation_line(exc, "ChatCompletion rejected the body")
    if not completion.choices:
        return None, "ChatCompletion has no choices"
    choice = completion.choices[0]
    return _sdk_message_view(choice.message, choice.finish_reason, streamed=False), None


def sdk_stream_view(chunks: Iterable[Any]) -> tuple[View | None, str | None]:
    """The reference client's reading of a stream, through the SDK's own chunk accumulator."""
    # lazy: the openai SDK is heavy (triage reads without it)
    from openai import OpenAIError
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    try:
        for chunk in chunks:
            if isinstance(chunk, Mapping):
                state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
        final = state.get_final_completion()
    except ValidationError as exc:
        return None, validation_line(exc, "ChatCompletionChunk rejected a chunk")
    except (OpenAIError, ValueError, KeyError, TypeError, AssertionError, RuntimeError) as exc:
        return None, f"the SDK stream accumulator failed: {type(exc).__name__}: {excerpt(exc, 200, tail='')}"
    if not final.choices:
        return None, "the SDK assembled no choice from the stream"
    choice = final.choices[0]
    return _sdk_message_view(choice.message, choice.finish_reason, streamed=True), None


def _sdk_message_view(message: Any, finish_reason: Any, *, streamed: bool) -> View:
    extra = getattr(message, "model_extra", None) or {}
    reasoning, rfield = "", None
    for key in ("reasoning", "reasoning_content"):
        if isinstance(extra.get(key), str) and extra.get(key):
            reasoning, rfield = extra[key], key
            break
    calls = []
    for tc in getattr(message, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        calls.append({"id": getattr(tc, "id", None), "name": getattr(fn, "name", "") or "",
                      "arguments": getattr(fn, "arguments", None)})
    content = getattr(message, "content", None)
    return View(content=content if isinstance(content, str) else "", reasoning=reasoning, reasoning_field=rfield,
                tool_calls=calls, finish_reason=finish_reason if isinstance(finish_reason, str) else None,
                streamed=streamed)


def _schema_error(instance: Any, schema: Any) -> str | None:
    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(schema)
        # An empty registry: a reference out of the schema is never fetched, it fails to resolve (one line).
        validator = validator_cls(schema, registry=referencing.Registry())
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    except SchemaError as exc:
        return f"the schema itself is invalid: {exc.message}"
    except referencing.exceptions.Unresolvable as exc:
        return f"the schema refers to {str(getattr(exc, 'ref', exc))[:120]!r}, which k3fleet does not fetch"
    if not errors:
        return None
    e = errors[0]
    where = "/".join(str(p) for p in e.path) or "(root)"
    return f"{where}: {e.message}"


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def classify(view: View, expect: Expect) -> dict[str, str]:
    """Defects of one view: ``{defect id: evidence}``; empty means the turn meets the contract."""
    out: dict[str, str] = {}
    if view.finish_reason == "length":
        out["length_cutoff"] = "finish_reason length"
    if THINK_TAGS.search(view.content):
        out["reasoning_in_content"] = _short(view.content)
    if expect.calls:
        _classify_call_turn(view, expect, out)
    else:
        _classify_text_turn(view, expect, out)
    return out


def _dropped_call_text(view: View, out: dict[str, str]) -> bool:
    """Tool calls dropped with their text left in the content, as a known parser failure; True when found."""
    if view.tool_calls:
        return False
    if KIMI_LEAK.search(view.content):
        out["kimi_marker_leak"] = f"tool_calls empty, content {_short(view.content, 120)!r}"
        return True
    if RAW_CALL.search(view.content):
        out["tool_call_text_in_content"] = f"tool_calls empty, content {_short(view.content, 120)!r}"
        return True
    return False


def _classify_call_turn(view: View, expect: Expect, out: dict[str, str]) -> None:
    if _dropped_call_text(view, out):
        return
    if not view.tool_calls:
        where = [name for name, text in (("reasoning", view.reasoning), ("content", view.content))
                 if MARKERS.search(text) or any(n and n in text for n in expect.calls if _looks_like_call(text, n))]
        if where:
            out["empty_tool_calls"] = f"tool_calls empty, call text in {' and '.join(where)}; finish_reason " \
                                      f"{view.finish_reason}"
        elif "length_cutoff" not in out:
            out["missing_tool_call"] = (f"no call; finish_reason {view.finish_reason}; "
                                        f"content {_short(view.content, 80)!r}")
        return
    merged = _merged(view, expect)
    if merged:
        out["merged_stream_calls"] = merged
    else:
        if len(view.tool_calls) != len(expect.calls):
            out["wrong_call_count"] = f"{len(view.tool_calls)} call(s), expected {len(expect.calls)}"
        for call in view.tool_calls:
            _check_call(call, expect, out)
        _check_parallel(view, expect, out)
    if MARKERS.search(view.reasoning):
        out["marker_in_reasoning"] = _short(MARKERS.search(view.reasoning).group(0) + " in reasoning")  # type: ignore[union-attr]
    if MARKERS.search(view.content):
        out["marker_in_content"] = _short(view.content)
    if view.finish_reason not in ("tool_calls", "length"):
        out["wrong_finish_reason"] = f"finish_reason {view.finish_reason} with {len(view.tool_calls)} call(s)"


def _looks_like_call(text: str, name: str) -> bool:
    # The call text of a tool name followed by its JSON arguments, as a model writes it when unparsed,
    # or the call as a JSON object in the text ({"name": "get_weather", "arguments": {...}}).
    return (re.search(rf"{re.escape(name)}\W{{0,40}}\{{", text) is not None
            or re.search(rf'"name"\s*:\s*"{re.escape(name)}"\s*,\s*"(?:arguments|parameters)"\s*:', text) is not None)


def _merged(view: View, expect: Expect) -> str | None:
    """Several expected calls folded into fewer entries whose arguments are not one JSON value."""
    if not view.streamed or len(expect.calls) < 2 or len(view.tool_calls) >= len(expect.calls):
        return None
    for call in view.tool_calls:
        args = call.get("arguments")
        if not isinstance(args, str):
            continue
        if MARKERS.search(args) or "}{" in args.replace(" ", "") or _not_json(args):
            return f"{len(view.tool_calls)} entry for {len(expect.calls)} calls; arguments {_short(args, 120)!r}"
        if call.get("name") not in expect.calls and any(n in (call.get("name") or "") for n in expect.calls):
            return f"merged name {call.get('name')!r}"
    return None


def _not_json(text: str) -> bool:
    try:
        loads_json(text)
    except ValueError:
        return True
    return False


def _check_call(call: Mapping[str, Any], expect: Expect, out: dict[str, str]) -> None:
    name = call.get("name") or ""
    if name not in expect.calls:
        out["wrong_tool"] = f"called {name!r}, expected {expect.calls}"
        return
    raw = call.get("arguments")
    if not isinstance(raw, str):
        out["invalid_arguments"] = f"{name}: arguments is {type(raw).__name__}, not a JSON string"
        return
    try:
        args = loads_json(raw)
    except ValueError as exc:
        out["invalid_arguments"] = f"{name}: not JSON ({exc.args[0] if exc.args else exc}): {_short(raw, 100)!r}"
        return
    schema = expect.schemas.get(name)
    if schema is not None:
        problem = _schema_error(args, schema)
        if problem:
            out["invalid_arguments"] = f"{name}: {problem}"
            return
    for prop, want in expect.values.get(name, {}).items():
        if isinstance(args, Mapping) and args.get(prop) != want:
            out["wrong_argument_value"] = f"{name}.{prop} = {args.get(prop)!r}, the user gave {want!r}"


def _check_parallel(view: View, expect: Expect, out: dict[str, str]) -> None:
    """Every expected argument set is one call's (BFCL's parallel category)."""
    seen = []
    for call in view.tool_calls:
        try:
            seen.append(loads_json(call.get("arguments") or ""))
        except (TypeError, ValueError):
            seen.append(None)
    for want in expect.call_args:
        if not any(isinstance(a, Mapping) and all(a.get(k) == v for k, v in want.items()) for a in seen):
            out.setdefault("wrong_argument_value", f"no call with {want}; calls {_short(json.dumps(seen), 120)}")


def _classify_text_turn(view: View, expect: Expect, out: dict[str, str]) -> None:
    if _dropped_call_text(view, out):
        return
    if view.tool_calls and expect.ask:
        out["invented_argument"] = ", ".join(f"{c.get('name') or '?'}({_short(str(c.get('arguments')), 60)})"
                                             for c in view.tool_calls)
    elif view.tool_calls:
        out["unexpected_tool_call"] = ", ".join(c.get("name") or "?" for c in view.tool_calls)
    elif view.finish_reason == "tool_calls":
        out["wrong_finish_reason"] = "finish_reason tool_calls with no call"
    if MARKERS.search(view.reasoning):
        out["marker_in_reasoning"] = _short(view.reasoning)
    if MARKERS.search(view.content):
        out["marker_in_content"] = _short(view.content)
    if expect.structured_schema is not None:
        try:
            value = loads_json(view.content)
        except ValueError:
            out["invalid_structured_output"] = f"not JSON: {_short(view.content, 100)!r}"
            return
        problem = _schema_error(value, expect.structured_schema)
        if problem:
            out["invalid_structured_output"] = problem
    elif (expect.content or expect.ask) and not view.content.strip() and "length_cutoff" not in out:
        out["empty_content"] = f"finish_reason {view.finish_reason}"
