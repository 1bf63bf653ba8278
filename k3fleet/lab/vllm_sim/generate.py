"""What the simulated model answers: deterministic text, tool calls from JSON Schemas, defects.

Rules (docs/acceptance-load.md, "Simulator"):

* The chat is rendered with a Kimi-like template (tools first, then the turns) and tokenised; the
  answer is a reasoning sentence then content, words drawn from a fixed vocabulary seeded by the
  prompt, so the same request gets the same answer.
* Tool calls, only when tools are offered and the last turn is the user's: ``tool_choice`` naming a
  function calls it; ``required`` calls the tools the user names (else the first tool); ``auto`` (or
  absent) calls the tools whose names appear in the user's last message, in order; ``none`` never
  calls. Arguments are generated from the tool's ``parameters`` schema and valid by default; a
  ``prop=value`` in the user's message sets that property.
* After a tool result the model answers in content. ``response_format`` json_schema gives content
  that validates against the schema.
* Defects (each at its configured rate, seeded): ``empty_tool_calls`` (call text in reasoning,
  ``tool_calls`` empty, finish ``stop``: vLLM 53246), ``merged_stream_calls`` (streamed turns with two
  or more calls: all under index 0 as one entry with concatenated arguments: vLLM 24478),
  ``marker_in_reasoning`` (tool-call markers in the reasoning text: vLLM 30238), ``invalid_arguments``
  (the first call's arguments cut off as JSON, or missing a required property), ``warm_answer_changed``
  (the engine's: a request admitted with a prefix-cache hit answers with its first word changed, as a
  hybrid model whose hit resumes the recurrence mid-stream does: ROCm/ATOM PR 1759).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

from k3fleet.lab.vllm_sim import tokenizer

WORDS = ("the", "fleet", "serves", "requests", "with", "cached", "prefix", "blocks", "and", "a", "steady",
         "queue", "of", "agent", "sessions", "while", "each", "node", "keeps", "its", "driver", "current",
         "so", "latency", "stays", "low", "under", "load", "tokens", "stream", "back", "quickly", "to",
         "clients", "that", "check", "every", "answer", "against", "schema", "before", "trusting", "it")

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


class RequestError(ValueError):
    """A request the server refuses with 400 (message as vLLM words it where known)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    schema: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """The answer as a token stream: each item is (channel, text); channel is ``reasoning``,
    ``content``, or ``tool:<i>`` (the first item of a call carries its name, the rest its arguments)."""

    items: list[tuple[str, str]] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    defects: list[str] = field(default_factory=list)
    merged_stream: bool = False


def render_prompt(body: dict[str, Any]) -> str:
    """The chat as the model sees it: tool declarations, then each turn between role markers."""
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append("<|im_system|>tool_declare<|im_middle|>" + json.dumps(tools, ensure_ascii=False) + "<|im_end|>")
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            raise RequestError("each message must be an object")
        role = str(msg.get("role", ""))
        content = msg.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        text = "" if content is None else str(content)
        if msg.get("tool_calls"):
            text += json.dumps(msg["tool_calls"], ensure_ascii=False)
        parts.append(f"<|im_{role}|>{role}<|im_middle|>{text}<|im_end|>")
    parts.append("<|im_assistant|>assistant<|im_middle|>")
    return "".join(parts)


def _seed_of(text: str) -> int:
    return zlib.crc32(text.encode())


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def _user_text(messages: list[dict[str, Any]]) -> str:
    for msg in reversed(messages):
        if msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def _named_tools(text: str, names: list[str]) -> list[tuple[str, str]]:
    """Each mention of a tool's name, in order, with the text up to the next mention (its argument hints
    first, then the whole message): a name said twice is two parallel calls."""
    found = []
    for name in names:
        for m in re.finditer(rf"(?<![\w.]){re.escape(name)}(?![\w])", text):
            found.append((m.start(), name))
    found.sort()
    out = []
    for i, (pos, name) in enumerate(found):
        end = found[i + 1][0] if i + 1 < len(found) else len(text)
        out.append((name, text[pos:end] + " " + text))
    return out


def _hint(text: str, prop: str) -> str | None:
    m = re.search(rf"(?<![\w]){re.escape(prop)}\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s,;]+)", text)
    if not m:
        return None
    value = m.group(1)
    return value[1:-1] if value[:1] in "\"'" else value


def instance(schema: Any, rng: random.Random, hints: str = "", depth: int = 0) -> Any:
    """A value valid against ``schema`` (the JSON Schema subset tool definitions use)."""
    if not isinstance(schema, dict) or depth > 6:
        return "value"
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], rng, hints, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged: dict[str, Any] = {}
        for sub in schema["allOf"]:
            if isinstance(sub, dict):
                merged = {**merged, **sub, "properties": {**merged.get("properties", {}), **sub.get("properties", {})},
                          "required": [*merged.get("required", []), *sub.get("required", [])]}
        return instance(merged, rng, hints, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        out: dict[str, Any] = {}
        props = schema.get("properties") or {}
        for name, sub in props.items():
            hint = _hint(hints, name)
            out[name] = _coerce(hint, sub) if hint is not None else instance(sub, rng, hints, depth + 1)
        return out
    if kind == "array":
        n = max(int(schema.get("minItems", 1)), 1)
        n = min(n, int(schema.get("maxItems", n)))
        return [instance(schema.get("items") or {}, rng, hints, depth + 1) for _ in range(n)]
    if kind == "integer":
        lo = int(schema.get("minimum", 1))
        hi = int(schema.get("maximum", lo + 9))
        return rng.randint(lo, max(lo, hi))
    if kind == "number":
        flo = float(schema.get("minimum", 0.0))
        fhi = float(schema.get("maximum", flo + 100.0))
        return round(rng.uniform(flo, max(flo, fhi)), 2)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    fmt = schema.get("format")
    if fmt == "date":
        return "2026-01-15"
    if fmt == "date-time":
        return "2026-01-15T09:30:00Z"
    if fmt == "email":
        return "ops@example.org"
    if fmt in ("uri", "url"):
        return "https://example.org/item"
    text = _words(rng, 2)
    lo_len = int(schema.get("minLength", 0))
    hi_len = int(schema.get("maxLength", 64))
    while len(text) < lo_len:
        text += " " + rng.choice(WORDS)
    return text[:hi_len]


def _coerce(value: str, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
        if kind == "boolean":
            return value.lower() in ("true", "1", "yes")
        if kind in ("object", "array"):
            return json.loads(value)
    except ValueError:
        return value
    return value


def plan_answer(body: dict[str, Any], prompt: str, *, stream: bool, defect_rates: dict[str, float],
                defect_rng: random.Random, request_id: str) -> Plan:
    """The whole answer, before any token is generated (token timing is the engine's job)."""
    messages = body.get("messages") or []
    rng = random.Random(_seed_of(prompt))
    plan = Plan()
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = not (isinstance(kwargs, dict) and kwargs.get("thinking") is False)
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    by_name = {t["function"].get("name"): t["function"] for t in tools}
    last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    user = _user_text(messages)

    calls: list[tuple[str, str]] = []
    choice = body.get("tool_choice", "auto")
    asks = ASK_FIRST.search(user) is not None
    if tools and last_role == "user" and choice != "none":
        if isinstance(choice, dict):
            forced = (choice.get("function") or {}).get("name")
            if not isinstance(forced, str) or forced not in by_name:
                raise RequestError(f"tool_choice names function {forced!r}, which is not in tools")
            calls = [(forced, user)]
        else:
            if _draw(defect_rates, defect_rng, "stale_turn") and _tool_results(messages) >= 3:
                # Long conversations: the call follows the first user turn, not the last.
                user = _first_user_text(messages)
            calls = _named_tools(user, list(by_name))
            if asks and choice != "required" and not _draw(defect_rates, defect_rng, "invent_argument"):
                # A required argument was never given ("ask me first"): a healthy model asks.
                calls = []
            if choice == "auto" and not calls and not asks and _draw(defect_rates, defect_rng, "irrelevant_call"):
                calls = [(next(iter(by_name)), user)]
            if choice == "required" and not calls:
                calls = [(next(iter(by_name)), user)]
            if len(calls) > 1 and _draw(defect_rates, defect_rng, "parallel_collapsed"):
                first: dict[str, str] = {}
                for name, hints in calls:
                    first.setdefault(name, hints)
                calls = list(first.items())
            if len(tools) >= 20 and calls and _draw(defect_rates, defect_rng, "wrong_function"):
                order = list(by_name)
                calls = [(order[(order.index(n) + 1) % len(order)], h) for n, h in calls]

    reasoning = ""
    if thinking:
        reasoning = ("The user wants " + _words(rng, 5) + "; " +
                     (f"I will call {', '.join(n for n, _ in calls)}." if calls else "I can answer directly."))
    content = ""
    fmt = body.get("response_format") or {}
    if calls:
        for i, (name, hints) in enumerate(calls):
            schema = (by_name[name] or {}).get("parameters") or {"type": "object"}
            args = instance(schema, rng, hints)
            plan.tool_calls.append(ToolCall(id=f"chatcmpl-tool-{request_id[-12:]}{i}", name=name,
                                            arguments=json.dumps(args, ensure_ascii=False),
                                            schema=schema if isinstance(schema, dict) else {}))
    elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
        content = json.dumps(instance(schema, rng, user), ensure_ascii=False)
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        content = json.dumps({"answer": _words(rng, 6)})
    elif asks:
        content = "Which one should I use? Tell me the missing value and I will go ahead."
    elif last_role == "tool":
        content = "The tool returned its result; " + _words(rng, 10 + rng.randrange(10)) + "."
    else:
        content = _words(rng, 24 + rng.randrange(40)).capitalize() + "."

    _apply_defects(plan, defect_rates, defect_rng, stream)
    call_text = "".join(f"{CALL_BEGIN}functions.{c.name}:{i}{ARG_BEGIN}{c.arguments}{CALL_END}"
                        for i, c in enumerate(plan.tool_calls))
    if "empty_tool_calls" in plan.defects:
        reasoning += SECTION_BEGIN + call_text + SECTION_END
        plan.tool_calls = []
    elif "kimi_marker_leak" in plan.defects:
        content = "<|close|>message<|sep|>" + call_text
        plan.tool_calls = []
    elif "call_text_in_content" in plan.defects:
        content = "".join("<tool_call>" + json.dumps({"name": c.name, "arguments": json.loads(c.arguments)})
                          + "</tool_call>" for c in plan.tool_calls)
        plan.tool_calls = []
    elif "marker_in_reasoning" in plan.defects:
        reasoning += f" {SECTION_BEGIN}{CALL_BEGIN}functions.{plan.tool_calls[0].name}:0"

    plan.items = [("reasoning", p) for p in tokenizer.pieces(reasoning)]
    plan.items += [("content", p) for p in tokenizer.pieces(content)]
    for i, call in enumerate(plan.tool_calls):
        plan.items.append((f"tool:{i}", call.name))
        plan.items += [(f"tool:{i}", p) for p in tokenizer.pieces(call.arguments)]
    plan.finish_reason = "tool_calls" if plan.tool_calls else "stop"
    return plan


# "ask me first": the user says a required value is still to come (the missing_param case).
ASK_FIRST = re.compile(r"\bask me first\b", re.I)


def _draw(rates: dict[str, float], rng: random.Random, name: str) -> bool:
    """A defect's draw, made only when it is configured (the seeded sequence of the others is unchanged)."""
    rate = rates.get(name, 0.0)
    return rate > 0 and rng.random() < rate


def _tool_results(messages: list[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    return _user_text([next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), {})])


def _apply_defects(plan: Plan, rates: dict[str, float], rng: random.Random, stream: bool) -> None:
    if not plan.tool_calls:
        return
    # One draw per defect per tool turn, in a fixed order, so each rate holds on its own.
    draws = {name: rng.random() < rates.get(name, 0.0) for name in
             ("empty_tool_calls", "merged_stream_calls", "marker_in_reasoning", "invalid_arguments")}
    if draws["empty_tool_calls"]:
        plan.defects.append("empty_tool_calls")
        return
    # Drawn only when configured, so seeded runs of the defects above draw as before.
    for name in ("kimi_marker_leak", "call_text_in_content"):
        if _draw(rates, rng, name):
            plan.defects.append(name)
            return
    if draws["merged_stream_calls"] and stream and len(plan.tool_calls) >= 2:
        plan.defects.append("merged_stream_calls")
        plan.merged_stream = True
    if draws["marker_in_reasoning"]:
        plan.defects.append("marker_in_reasoning")
    if draws["invalid_arguments"]:
        plan.defects.append("invalid_arguments")
        first = plan.tool_calls[0]
        required = [r for r in first.schema.get("required") or [] if isinstance(r, str)]
        args = json.loads(first.arguments)
        if required and isinstance(args, dict) and rng.random() < 0.5:
            # Valid JSON that breaks the schema: the first required property is missing.
            args.pop(required[0], None)
            first.arguments = json.dumps(args, ensure_ascii=False)
        else:
            # Not JSON at all: the closing of the object is cut off.
            first.arguments = first.arguments[: max(1, len(first.arguments) - 2)]


def change_answer(plan: Plan) -> None:
    """``warm_answer_changed``: the first reasoning or content word differs from the cold answer's."""
    for i, (channel, text) in enumerate(plan.items):
        if channel in ("reasoning", "content"):
            plan.items[i] = (channel, " stale" if text.strip() != "stale" else " state")
            plan.defects.append("warm_answer_changed")
            return


def extend_to(plan: Plan, n_tokens: int, prompt: str) -> None:
    """``ignore_eos`` / ``min_tokens``: keep generating content until ``n_tokens``."""
    rng = random.Random(_seed_of(prompt) ^ 0x5EED)
    while len(plan.items) < n_tokens:
        plan.items += [("content", p) for p in tokenizer.pieces(" " + _words(rng, 16))]
