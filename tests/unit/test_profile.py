"""The production profile (``--profile FILE``): validation as a table, and the schedule and agent
cases derived from it. The shipped examples load and validate against ``k3fleet schema profile``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from k3fleet.accept.agent import CASES, AgentOptions
from k3fleet.accept.profile_cases import (
    agent_options_from_profile,
    is_profile_case,
    load_options_from_profile,
    ramp_to,
)
from k3fleet.errors import UsageError
from k3fleet.models.profile import load_profile, profile_json_schema

PROFILES = Path(__file__).resolve().parents[2] / "k3fleet" / "targets" / "profiles"
TOOLS = [{"type": "function", "function": {"name": "get_gpu_health", "parameters": {
    "type": "object", "properties": {"node": {"type": "string"}}, "required": ["node"]}}}]
SCHEMA = {"name": "summary", "schema": {"type": "object", "properties": {"node": {"type": "string"}}}}


def _profile(tmp: Path, **change: Any) -> Path:
    (tmp / "tools.json").write_text(json.dumps(TOOLS))
    (tmp / "summary.json").write_text(json.dumps(SCHEMA))
    data: dict[str, Any] = {"name": "t", "concurrency": 8, "context_tokens": {"typical": 512, "p99": 4096,
                                                                              "max": 8192},
                            "mix": {"tools": 0.5, "structured_output": 0.1, "multimodal": 0.0},
                            "sustained_s": 60, "slo": {"ttft_p95_s": 2, "itl_p95_s": 0.1},
                            "tools": ["tools.json"], "response_schemas": ["summary.json"]}
    for key, value in change.items():
        obj = data
        *head, last = key.split(".")
        for part in head:
            obj = obj[part]
        if value is None:
            obj.pop(last, None)
        else:
            obj[last] = value
    p = tmp / "profile.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_the_shipped_profiles_load_and_validate_against_the_published_schema() -> None:
    schema = profile_json_schema()
    for path in sorted(PROFILES.glob("*.yaml")):
        loaded = load_profile(path)
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
        assert loaded.tool_names and loaded.schemas, path
        # Every shipped profile states its data protection, so a decision against it can approve.
        assert loaded.profile.data_protection is not None and loaded.profile.data_protection.evidence_readers, path


def test_schema_profile_command_prints_it() -> None:
    proc = subprocess.run([str(Path(sys.executable).parent / "k3fleet"), "schema", "profile"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["properties"]["concurrency"]["maximum"] == 4096


BAD = {
    "infinite_concurrency": ({"concurrency": float("inf")}, "concurrency"),
    "nan_slo": ({"slo.ttft_p95_s": float("nan")}, "slo.ttft_p95_s"),
    "zero_sustained": ({"sustained_s": 0}, "sustained_s"),
    "sustained_beyond_a_day": ({"sustained_s": 86401}, "sustained_s"),
    "concurrency_beyond_bound": ({"concurrency": 5000}, "concurrency"),
    "unordered_context": ({"context_tokens.p99": 100000}, "typical <= p99 <= max"),
    "share_above_one": ({"mix.multimodal": 1.5}, "mix.multimodal"),
    "unknown_key": ({"concurency": 8}, "concurency: unknown key"),
    "missing_slo": ({"slo": None}, "slo: Field required"),
    "missing_tool_file": ({"tools": ["absent.json"]}, "tools: absent.json"),
    "tools_in_mix_without_file": ({"tools": []}, "no tools file is named"),
    "schemas_in_mix_without_file": ({"response_schemas": []}, "no response_schemas file"),
    "data_protection_without_readers": ({"data_protection": {"log_retention_days": 7, "run_retention_days": 30,
                                                             "evidence_readers": []}},
                                        "data_protection.evidence_readers"),
    "data_protection_zero_retention": ({"data_protection": {"log_retention_days": 0, "run_retention_days": 30,
                                                            "evidence_readers": ["sre"]}},
                                       "data_protection.log_retention_days"),
    "data_protection_misspelt": ({"data_protection": {"log_retention_days": 7, "run_retention_day": 30,
                                                      "evidence_readers": ["sre"]}},
                                 "data_protection.run_retention_days: Field required"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_profile_is_one_line_naming_the_field(case: str, tmp_path: Path) -> None:
    change, words = BAD[case]
    path = _profile(tmp_path, **change)
    with pytest.raises(UsageError) as exc:
        load_profile(path)
    assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_an_invalid_tool_schema_or_response_schema_is_refused(tmp_path: Path) -> None:
    path = _profile(tmp_path)
    bad_tool = [{"name": "x", "parameters": {"type": "no-such-type"}}]
    (tmp_path / "tools.json").write_text(json.dumps(bad_tool))
    with pytest.raises(UsageError, match="tool x: parameters: not a valid JSON Schema"):
        load_profile(path)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    (tmp_path / "summary.json").write_text(json.dumps({"type": "object", "required": "node"}))
    with pytest.raises(UsageError, match=r"summary\.json: not a valid JSON Schema"):
        load_profile(path)


def test_the_load_schedule_reaches_the_profile_envelope(tmp_path: Path) -> None:
    loaded = load_profile(_profile(tmp_path))
    opts = load_options_from_profile(loaded)
    assert opts.ladder_tokens == [512, 4096, 8192]
    assert opts.ramp == [1, 2, 4, 8] and opts.sustained_concurrency == 8 and opts.sustained_s == 60
    assert (opts.ttft_p95_slo_s, opts.itl_p95_slo_s, opts.error_rate_limit) == (2, 0.1, 0.01)
    assert opts.envelope == {"max_context_tokens": 8192, "max_concurrency": 8, "duration_s": 60}
    # The run's bounds follow the schedule: it is not cut before the sustained run ends.
    assert opts.max_duration_s >= 60 + 4 * opts.step_s
    # The operator's overrides win over the profile's.
    assert load_options_from_profile(loaded, {"step-s": 2.0}).step_s == 2.0


@pytest.mark.parametrize(("target", "steps"), [(1, [1]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]),
                                               (64, [1, 2, 4, 8, 16, 32, 64])])
def test_ramp_doubles_to_the_target(target: int, steps: list[int]) -> None:
    assert ramp_to(target) == steps


def test_agent_cases_cover_every_production_tool_and_schema(tmp_path: Path) -> None:
    loaded = load_profile(_profile(tmp_path, **{"mix.multimodal": 0.2}))
    opts = agent_options_from_profile(loaded, AgentOptions(repeats=3))
    extra = ["tool:get_gpu_health", "schema:summary", "invalid_schema", "multimodal"]
    assert opts.cases == [*CASES, *extra]
    assert set(extra) <= set(opts.critical)
    assert all(is_profile_case(c, opts) for c in extra)
    assert not is_profile_case("tool:not_in_profile", opts)
    no_image = agent_options_from_profile(load_profile(_profile(tmp_path)), AgentOptions())
    assert "multimodal" not in no_image.cases


def test_the_data_protection_block_reaches_the_decision(tmp_path: Path) -> None:
    from k3fleet.decide.envelope import profile_brief

    block = {"log_retention_days": 7, "run_retention_days": 30, "evidence_readers": ["sre-oncall"]}
    brief = profile_brief(load_profile(_profile(tmp_path, data_protection=block)), None)
    assert brief.data_protection is not None and brief.data_protection.model_dump() == {**block,
                                                                                       "request_logging": False}
    assert profile_brief(load_profile(_profile(tmp_path)), None).data_protection is None
