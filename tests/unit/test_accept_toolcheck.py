"""The tool-call defect classifiers on recorded real responses (tests/fixtures/tool_calls/SOURCES.md)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from k3fleet.accept import toolcheck
from k3fleet.accept.client import assemble_stream
from k3fleet.accept.toolcheck import Expect

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tool_calls"
WEATHER = {"type": "object", "properties": {"location": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["location", "unit"]}


def load(name: str) -> Any:
    return json.loads((FIX / name).read_text())


def both(body: Any, expect: Expect) -> tuple[dict[str, str], dict[str, str]]:
    raw = toolcheck.raw_view(body)
    sdk, err = toolcheck.sdk_view(body)
    assert raw is not None and sdk is not None, err
    return toolcheck.classify(raw, expect), toolcheck.classify(sdk, expect)


def test_valid_openai_call_has_no_defect_at_either_layer() -> None:
    raw, sdk = both(load("openai_format_valid_call.json"),
                    Expect(calls=["get_weather"], schemas={"get_weather": WEATHER},
                           values={"get_weather": {"location": "San Francisco, CA"}}))
    assert raw == {} and sdk == {}


def test_k2_call_text_in_content_is_empty_tool_calls() -> None:
    raw, sdk = both(load("k2_call_text_in_content.json"), Expect(calls=["TodoWrite"]))
    assert "empty_tool_calls" in raw and "in content" in raw["empty_tool_calls"]
    assert "empty_tool_calls" in sdk  # the SDK sees the same empty list: the defect is the server's


def test_k2_thinking_call_in_reasoning_is_empty_tool_calls_not_a_marker_leak() -> None:
    raw, _ = both(load("k2_thinking_call_in_reasoning.json"), Expect(calls=["list_directory"]))
    assert "empty_tool_calls" in raw and "reasoning" in raw["empty_tool_calls"]
    # With no parsed call the leak is the empty-call defect; a marker leak is counted only beside a real call.
    assert "marker_in_reasoning" not in raw


def test_reasoning_content_field_is_read_by_both_views() -> None:
    body = load("k2_thinking_call_in_reasoning.json")
    raw = toolcheck.raw_view(body)
    sdk, _ = toolcheck.sdk_view(body)
    assert raw is not None and sdk is not None
    assert raw.reasoning_field == sdk.reasoning_field == "reasoning_content"


def test_k3_trapped_turn_is_empty_tool_calls_and_the_sdk_cannot_read_end_turn() -> None:
    body = load("k3_turn_trapped_in_reasoning.json")
    raw = toolcheck.raw_view(body)
    assert raw is not None
    defects = toolcheck.classify(raw, Expect(calls=["get_weather"]))
    assert "empty_tool_calls" in defects and "end_turn" in defects["empty_tool_calls"]
    # finish_reason "end_turn" is outside the OpenAI enum: the reference client rejects the body.
    sdk, err = toolcheck.sdk_view(body)
    assert sdk is None and err is not None and "finish_reason" in err


def test_marker_beside_a_parsed_call_is_marker_in_reasoning() -> None:
    body = load("openai_format_valid_call.json")
    body["choices"][0]["message"]["reasoning"] = ("Weather it is. <|tool_calls_section_begin|><|tool_call_begin|>"
                                                  "functions.get_weather:0")
    raw, _ = both(body, Expect(calls=["get_weather"], schemas={"get_weather": WEATHER}))
    assert set(raw) == {"marker_in_reasoning"}


def test_k25_streamed_merged_calls() -> None:
    fx = load("k25_stream_merged_calls.json")
    view = toolcheck.raw_stream_view(fx["assembled"])
    defects = toolcheck.classify(view, Expect(calls=["bash", "bash"]))
    assert "merged_stream_calls" in defects
    assert "invalid_arguments" not in defects  # the merge is the cause; not double counted


def test_malformed_arguments() -> None:
    raw, sdk = both(load("k2_malformed_arguments.json"), Expect(calls=["process"]))
    assert "not JSON" in raw["invalid_arguments"] and "invalid_arguments" in sdk


def test_schema_violation_and_wrong_value() -> None:
    body = load("openai_format_valid_call.json")
    fn = body["choices"][0]["message"]["tool_calls"][0]["function"]
    fn["arguments"] = json.dumps({"location": "San Francisco, CA", "unit": "kelvin"})
    raw, _ = both(body, Expect(calls=["get_weather"], schemas={"get_weather": WEATHER}))
    assert "unit: 'kelvin' is not one of" in raw["invalid_arguments"]
    fn["arguments"] = json.dumps({"location": "Boston, MA", "unit": "celsius"})
    raw, _ = both(body, Expect(calls=["get_weather"], schemas={"get_weather": WEATHER},
                               values={"get_weather": {"location": "San Francisco, CA"}}))
    assert set(raw) == {"wrong_argument_value"}


def test_text_turn_defects() -> None:
    body = load("openai_format_valid_call.json")
    raw, _ = both(body, Expect(content=True))
    assert "unexpected_tool_call" in raw
    msg = body["choices"][0]["message"]
    msg["tool_calls"], msg["content"] = [], "<think>plan</think>Hello."
    body["choices"][0]["finish_reason"] = "tool_calls"
    raw, _ = both(body, Expect(content=True))
    assert {"reasoning_in_content", "wrong_finish_reason"} <= set(raw)


def test_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = load("openai_format_valid_call.json")
    msg = body["choices"][0]["message"]
    msg["tool_calls"], body["choices"][0]["finish_reason"] = [], "stop"
    for content, expected in (('{"a": 1}', set()), ('{"a": "x"}', {"invalid_structured_output"}),
                              ("not json", {"invalid_structured_output"})):
        msg["content"] = content
        raw, _ = both(body, Expect(structured_schema=schema))
        assert set(raw) == expected, content


def test_client_layer_only_when_the_sdk_reads_differently() -> None:
    # A body the raw check accepts but the SDK's model rejects (a tool call without its type): the
    # reference client cannot read what the server sent, a client-layer finding.
    body = copy.deepcopy(load("openai_format_valid_call.json"))
    del body["choices"][0]["message"]["tool_calls"][0]["type"]
    body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = 7
    raw = toolcheck.raw_view(body)
    sdk, err = toolcheck.sdk_view(body)
    assert raw is not None and sdk is None and err and "rejected" in err


def test_sdk_stream_accumulator_matches_our_fold() -> None:
    chunks: list[Any] = [
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": "Plan."}, "finish_reason": None}]},
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                            "function": {"name": "lookup", "arguments": "{\"a"}}]},
                      "finish_reason": None}]},
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
         "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "lert\": \"x\"}"}}]},
                      "finish_reason": "tool_calls"}]},
        "[DONE]"]
    raw = toolcheck.raw_stream_view(assemble_stream(chunks).model_dump())
    sdk, err = toolcheck.sdk_stream_view(chunks)
    assert err is None and sdk is not None
    for v in (raw, sdk):
        assert v.tool_calls[0]["name"] == "lookup" and json.loads(v.tool_calls[0]["arguments"]) == {"alert": "x"}
        assert v.reasoning == "Plan." and v.finish_reason == "tool_calls"
