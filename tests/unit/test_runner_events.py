"""Runner event handling on recorded real ansible-runner events (tests/fixtures/runner/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.audit.runner import RESULT_JSON_KEY, RESULT_KEY, PlayResult, _outcome, _slim

FIXTURES = Path(__file__).parent.parent / "fixtures" / "runner"


@pytest.fixture(scope="module")
def events() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "events.jsonl").read_text().splitlines()]


def _play(events: list[dict]) -> PlayResult:
    play = PlayResult(playbook="play.yml", status="failed", rc=4)
    for e in events:
        out = _outcome(e)
        if out is not None:
            play.hosts.setdefault(out.host, []).append(out)
    return play


@pytest.mark.parametrize(
    ("host", "status", "message_part"),
    [
        ("ok-host", "ok", None),
        ("failed-host", "failed", "non-zero return code"),
        ("slow-host", "timeout", "Timed out after 2 second(s)"),
        ("gone-host", "unreachable", "Connection refused"),
    ],
)
def test_outcome_per_host(events: list[dict], host: str, status: str, message_part: str | None) -> None:
    last = _play(events).last(host)
    assert last is not None
    assert last.status == status
    if message_part:
        assert last.message is not None and message_part in last.message
    assert last.task == "One task, four outcomes"


def test_non_host_events_are_not_outcomes(events: list[dict]) -> None:
    names = {e["event"] for e in events if _outcome(e) is None}
    assert names == {"playbook_on_task_start", "playbook_on_stats"}


def test_results_with_key_only_from_ok_results(events: list[dict]) -> None:
    # Outcomes hold their events' results: a copy, so what this test adds stays out of the shared events.
    play = _play(json.loads(json.dumps(events)))
    assert play.results_with_key() == {}
    ok = play.last("ok-host")
    assert ok is not None and ok.result is not None
    ok.result[RESULT_KEY] = {"schema_version": "1.0"}
    failed = play.last("failed-host")
    assert failed is not None and failed.result is not None
    failed.result[RESULT_KEY] = {"schema_version": "1.0"}
    assert set(play.results_with_key()) == {"ok-host"}


def test_ignored_failure_is_not_a_failure(events: list[dict]) -> None:
    failed = next(e for e in events if e["event"] == "runner_on_failed" and e["event_data"]["host"] == "failed-host")
    failed = json.loads(json.dumps(failed))
    failed["event_data"]["ignore_errors"] = True
    out = _outcome(failed)
    assert out is not None and out.status == "ignored"


def test_slim_event_drops_module_payload(events: list[dict]) -> None:
    ok = json.loads(json.dumps(next(e for e in events if e["event"] == "runner_on_ok")))
    ok["event_data"]["res"][RESULT_KEY] = {"big": "x" * 1000}
    slim = _slim(ok)
    assert RESULT_KEY not in slim["event_data"]["res"]
    assert slim["event_data"]["res"]["has_result"] is True
    assert slim["event_data"]["host"] == "ok-host"
    assert "invocation" not in slim["event_data"]["res"]


def _ok_with(events: list[dict], text: object) -> dict:
    ok = json.loads(json.dumps(next(e for e in events if e["event"] == "runner_on_ok")))
    ok["event_data"]["res"][RESULT_JSON_KEY] = text
    return ok


def test_facts_sent_as_one_json_text_are_read_back_as_the_mapping(events: list[dict]) -> None:
    """The audit play's facts_format=json: the same facts, one string through Ansible's main process."""
    facts = {"schema_version": "1.0", "host": "ok-host", "driver": {"status": "ok", "gpus": [{"index": 0}]}}
    out = _outcome(_ok_with(events, json.dumps(facts, separators=(",", ":"))))
    assert out is not None and out.status == "ok" and out.result is not None
    assert out.result[RESULT_KEY] == facts and RESULT_JSON_KEY not in out.result
    play = PlayResult(playbook="audit.yml", status="successful", rc=0, hosts={"ok-host": [out]})
    assert play.results_with_key() == {"ok-host": facts}
    slim = _slim(_ok_with(events, json.dumps(facts)))
    assert RESULT_JSON_KEY not in slim["event_data"]["res"] and slim["event_data"]["res"]["has_result"] is True


@pytest.mark.parametrize(("text", "why"), [
    ('{"schema_version": "1.0", "driver": {', "k3fleet_json is not JSON: Expecting property name"),
    ("[1, 2]", "k3fleet_json is a JSON list, not an object"),
    (7, "k3fleet_json is a int, not a JSON text"),
])
def test_facts_text_that_cannot_be_read_fails_the_host_in_one_line(events: list[dict], text: object,
                                                                    why: str) -> None:
    out = _outcome(_ok_with(events, text))
    assert out is not None and out.status == "failed" and out.result is not None
    assert out.message is not None and out.message.startswith(f"the module's facts cannot be read: {why}")
    assert "\n" not in out.message and RESULT_KEY not in out.result
    play = PlayResult(playbook="audit.yml", status="failed", rc=2, hosts={"ok-host": [out]})
    assert play.results_with_key() == {}
