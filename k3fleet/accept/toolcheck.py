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
from jsonschema.exceptions import SchemaError
from pydantic import ValidationError

from k3fleet.errors import validation_line
from k3fleet.evidence.redact import excerpt

# Kimi K2 markers (tokenizer special tokens) and the K3 channel markers named in vLLM PR 53249, plus
# the functions.NAME:INDEX call header both use.
MARKERS = re.compile(
    r"<\|tool_calls?_section_(?:begin|end)\|>|<\|tool_call_(?:begin|end|argument_begin)\|>"
    r"|<\|(?:open|close)\|>(?:tools|think|response)<\|sep\|>|\bfunctions\.[A-Za-z_][\w-]*:\d+")
THINK_TAGS = re.compile(r"</?think>")

# Defect ids and what each means (also the finding messages).
DEFECTS: dict[str, str] = {
    "empty_tool_calls": "empty tool_calls with the call text in reasoning or content (vLLM issue 53246)",
    "merged_stream_calls": "several streamed calls merged into one malformed entry (vLLM issue 24478)",
    "marker_in_reasoning": "tool-call markers leaked into the reasoning text (vLLM issue 30238)",
    "marker_in_content": "tool-call markers leaked into the content",
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
        errors = sorted(validator_cls(schema).iter_errors(instance), key=lambda e: list(e.path))
    except SchemaError as exc:
        return f"the schema itself is invalid: {exc.message}"
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


def _classify_call_turn(view: View, expect: Expect, out: dict[str, str]) -> None:
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
        json.loads(text)
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
        args = json.loads(raw)
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


def _classify_text_turn(view: View, expect: Expect, out: dict[str, str]) -> None:
    if view.tool_calls:
        out["unexpected_tool_call"] = ", ".join(c.get("name") or "?" for c in view.tool_calls)
    elif view.finish_reason == "tool_calls":
        out["wrong_finish_reason"] = "finish_reason tool_calls with no call"
    if MARKERS.search(view.reasoning):
        out["marker_in_reasoning"] = _short(view.reasoning)
    if MARKERS.search(view.content):
        out["marker_in_content"] = _short(view.content)
    if expect.structured_schema is not None:
        try:
            value = json.loads(view.content)
        except ValueError:
            out["invalid_structured_output"] = f"not JSON: {_short(view.content, 100)!r}"
            return
        problem = _schema_error(value, expect.structured_schema)
        if problem:
            out["invalid_structured_output"] = problem
    elif expect.content and not view.content.strip() and "length_cutoff" not in out:
        out["empty_content"] = f"finish_reason {view.finish_reason}"
