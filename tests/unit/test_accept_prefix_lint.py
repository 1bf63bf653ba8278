"""accept prefix-lint on captured request bodies (synthetic captures built here, one breaker each)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from k3fleet.accept.prefix_lint import lint_captures
from k3fleet.cli.base import main
from k3fleet.errors import UsageError

SYSTEM = "You are the fleet assistant. Follow the runbook.\n" * 40
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look up a runbook.",
                                      "parameters": {"type": "object", "properties": {"alert": {"type": "string"}},
                                                     "required": ["alert"]}}},
    {"type": "function", "function": {"name": "drain", "description": "Drain a node.",
                                      "parameters": {"type": "object", "properties": {"node": {"type": "string"}},
                                                     "required": ["node"]}}},
]


def body(system: str = SYSTEM, tools: list[Any] | None = None, extra: list[dict[str, Any]] | None = None,
         user: str = "What now?") -> dict[str, Any]:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}, *(extra or [])]
    return {"model": "m", "messages": msgs, "tools": copy.deepcopy(TOOLS if tools is None else tools)}


def write(tmp_path: Path, rows: list[Any]) -> Path:
    p = tmp_path / "captures.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def ids(result) -> set[str]:
    return {f.check_id for f in result.findings}


def test_growing_conversation_keeps_the_prefix(tmp_path: Path) -> None:
    turn1 = body()
    turn2 = body(extra=[{"role": "assistant", "content": "Checking."}, {"role": "user", "content": "And then?"}])
    result = lint_captures(write(tmp_path, [turn1, turn2]))
    assert result.status == "pass" and result.exit_code == 0
    assert result.data["pairs"] == [{"a": 1, "b": 2, "kind": "turn", "breaks": []}]


@pytest.mark.parametrize(("second", "breaker"), [
    (body(system="Current time: 2026-08-14T09:12:03Z\n" + SYSTEM), "timestamp_in_system"),
    (body(system="request_id: 9f1c2ab4-77de-4c1b-9a0e-3b1f5c2d7e80\n" + SYSTEM), "id_in_system"),
    (body(tools=list(reversed(TOOLS))), "tools_reordered"),
    (body(system=SYSTEM.replace("\n", "  \n")), "whitespace"),
    (body(system=SYSTEM + "Be brief."), "system_changed"),
])
def test_each_breaker_is_named(tmp_path: Path, second: dict[str, Any], breaker: str) -> None:
    first = body(system=("Current time: 2026-08-13T22:01:59Z\n" + SYSTEM) if breaker == "timestamp_in_system"
                 else ("request_id: 0b7a9d1e-1c2d-4e5f-8a9b-0c1d2e3f4a5b\n" + SYSTEM) if breaker == "id_in_system"
                 else SYSTEM)
    result = lint_captures(write(tmp_path, [first, second]))
    assert result.status == "fail" and result.exit_code == 1
    assert f"accept.prefix_lint.{breaker}" in ids(result), result.findings


@pytest.mark.parametrize(("old", "new"), [
    ("2026-12-04T15:30:00Z", "2026-12-04T15:31:07Z"),          # only the minutes and seconds change
    ("2026-12-04T15:30:00.123+01:00", "2026-12-04T15:30:00.456+01:00"),
    ("2026-12-04 15:30:00", "2026-12-04 15:30:01"),
    ("1733325000", "1733325060"),
])
def test_an_iso_8601_timestamp_mid_prompt_is_named(tmp_path: Path, old: str, new: str) -> None:
    """The diff of two RFC 3339 times is a digit or two inside ``T15:30:00Z``, which has no word
    boundary around it: the timestamp is found in the whole prompt, where the change falls."""
    rows = [body(system=f"You are helpful. Current time: {t}. Be nice.\n" + SYSTEM) for t in (old, new)]
    assert "timestamp_in_system" in {f.check_id.rsplit(".", 1)[-1] for f in lint_captures(write(tmp_path, rows))
                                     .findings}


def test_tool_key_order_after_a_gateway(tmp_path: Path) -> None:
    before = body()
    after = body()
    fn = after["tools"][0]["function"]
    after["tools"][0]["function"] = {"parameters": fn["parameters"], "name": fn["name"],
                                     "description": fn["description"]}
    rows = [{"stage": "before", "body": before}, {"stage": "after", "body": after}]
    result = lint_captures(write(tmp_path, rows))
    assert ids(result) == {"accept.prefix_lint.tools_key_order"}
    assert result.data["pairs"][0]["kind"] == "gateway"


def test_multimodal_metadata(tmp_path: Path) -> None:
    def with_image(url: str) -> dict[str, Any]:
        b = body()
        b["messages"][1]["content"] = [{"type": "text", "text": "What is on this dashboard?"},
                                       {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}]
        return b

    first = with_image("https://cdn.example/d.png?sig=aaa111&expires=1723622400")
    second = with_image("https://cdn.example/d.png?sig=bbb222&expires=1723626000")
    second["messages"].append({"role": "user", "content": "Zoom in."})
    result = lint_captures(write(tmp_path, [first, second]))
    assert "accept.prefix_lint.multimodal_metadata" in ids(result)


def test_exchange_records_from_a_run_directory_are_read(tmp_path: Path) -> None:
    rows = [{"probe": "prefix_cache", "label": "warm_1", "request": body()},
            {"probe": "prefix_cache", "label": "warm_2", "request": body(user="Next case?")}]
    result = lint_captures(write(tmp_path, rows))
    assert result.status == "pass"


@pytest.mark.parametrize(("content", "msg"), [
    ("{not json\n{}\n", "not JSON"),
    (json.dumps(body()) + "\n", "at least two"),
    ('[1, 2]\n{"a": 1}\n', "JSON object"),
    ('{"model": "m"}\n{"model": "m"}\n', "no chat request"),
])
def test_bad_captures_are_usage_errors(tmp_path: Path, content: str, msg: str) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text(content)
    with pytest.raises(UsageError, match=msg):
        lint_captures(p)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write(tmp_path, [body(), body(tools=list(reversed(TOOLS)))])
    assert main(["accept", "prefix-lint", str(p)]) == 1
    assert "tools_reordered" in capsys.readouterr().out
    assert main(["accept", "prefix-lint", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
