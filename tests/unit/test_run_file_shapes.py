"""Run files that verify against their manifest but hold the wrong shapes (a list where an object
belongs, a count where a list belongs, text where a number belongs) are bad input: one line,
exit 2, never a traceback, for every reader: ``report`` in all four formats and ``decide``
(docs/safety.md "Bad input"). Captures from outside with fields of the wrong type are read as
absent, never a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3fleet.accept.result import ProbeResult
from k3fleet.cli import main
from k3fleet.evidence import RunDir

FIX = Path(__file__).resolve().parents[1] / "fixtures"
FORMATS = ("md", "html", "junit", "prom")


def _run(tmp_path: Path, kind: str, files: dict[str, Any]) -> Path:
    rd = RunDir.create(tmp_path / "runs", kind, ["k3fleet", kind])
    for name, obj in files.items():
        rd.write_json(name, obj)
    rd.write_manifest()
    return rd.path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    got = capsys.readouterr()
    assert "Traceback" not in got.err
    return rc, got.out, got.err


def _agent(cases: Any) -> dict[str, Any]:
    r = ProbeResult(probe="agent", status="fail", reason="2 of 3 cases failed", data={"cases": cases})
    return r.model_dump(mode="json")


TRIAGE_OK: dict[str, Any] = {"schema_version": "1.0", "host": "gpu-7", "kinds": ["nvidia_smi"],
                             "files": [{"name": "smi.txt", "kind": "nvidia_smi"}],
                             "findings": [{"id": "driver.branch", "severity": "error", "kind": "fail",
                                           "message": "575 is below R580"}], "exit_code": 1}


@pytest.mark.parametrize(("kind", "files", "words"), [
    ("triage", {"triage.json": [TRIAGE_OK]}, "triage.json is not a JSON object"),
    ("triage", {"triage.json": {**TRIAGE_OK, "findings": 1}}, "findings"),
    ("triage", {"triage.json": {**TRIAGE_OK, "files": True}}, "files"),
    ("triage", {"triage.json": {**TRIAGE_OK, "kinds": [True]}}, "kinds.0"),
    ("triage", {"triage.json": {**TRIAGE_OK, "findings": [{"check_id": "driver.branch", "severity": "error"}]}},
     "findings.0.message"),
    ("triage", {"triage.json": {**TRIAGE_OK, "exit_code": "s[/bold]"}}, "exit_code"),
    ("accept", {"accept.json": {}, "agent.json": _agent(1)}, "data.cases"),
    ("accept", {"accept.json": {}, "agent.json": _agent(["tool_call"])}, "data.cases"),
    ("accept", {"accept.json": {}, "agent.json": _agent({"tool_call": {"runs": "many"}})}, "tool_call.runs"),
    ("accept", {"accept.json": {}, "agent.json": _agent({"tool_call": {"defects": [1]}})}, "tool_call.defects"),
    ("accept", {"accept.json": {}, "agent.json": _agent({"tool_call": 7})}, "tool_call"),
])
def test_wrong_shapes_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str,
                                          files: dict[str, Any], words: str) -> None:
    run = _run(tmp_path, kind, files)
    for fmt in FORMATS:
        rc, _, err = _cli(capsys, "report", str(run), "--format", fmt)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and words in lines[0], (fmt, err)
    rc, _, err = _cli(capsys, "decide", str(run), "--reviewer", "zed", "--out", str(tmp_path / "decision"))
    assert rc == 2 and words in err, err
    assert not (tmp_path / "decision").exists()


def test_a_well_formed_triage_record_renders_in_every_format(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, "triage", {"triage.json": TRIAGE_OK})
    for fmt in FORMATS:
        rc, out, err = _cli(capsys, "report", str(run), "--format", fmt)
        assert rc == 0, (fmt, err)
        assert "driver.branch" in out


def test_an_exit_code_of_the_wrong_type_is_left_out_of_the_textfile(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    agent = _agent({"tool_call": {"runs": 3, "passed": 3, "pass_rate": 1.0}})
    run = _run(tmp_path, "accept", {"accept.json": {"exit_code": "s[/bold]"}, "agent.json": agent})
    rc, out, err = _cli(capsys, "report", str(run), "--format", "prom")
    assert rc == 0, err
    assert "k3fleet_run_exit_code" not in out


def _inspect_variants() -> list[tuple[str, Any]]:
    base = json.loads((FIX / "container" / "docker_inspect_vllm_v0.23.0.json").read_text())
    out: list[tuple[str, Any]] = []
    for path, value in ((("Config", "Env"), 1), (("Config", "Env"), [1, None]), (("RepoDigests",), True),
                        (("RepoTags",), [1]), (("RepoTags",), [["a"]]), (("Id",), {"a": 1}),
                        (("Config", "Labels"), {"ai.vllm.version": 3}), (("Config",), "x")):
        doc = json.loads(json.dumps(base))
        cur = doc[0]
        for k in path[:-1]:
            cur = cur[k]
        cur[path[-1]] = value
        out.append((".".join(path) + "=" + json.dumps(value), doc))
    return out


@pytest.mark.parametrize(("label", "doc"), _inspect_variants(), ids=[v[0] for v in _inspect_variants()])
def test_docker_inspect_with_wrong_types_is_triaged(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    label: str, doc: Any) -> None:
    capture = tmp_path / "inspect.json"
    capture.write_text(json.dumps(doc))
    rc, out, err = _cli(capsys, "triage", str(capture), "--json", "--out", str(tmp_path / "t"))
    assert rc in (0, 1, 2), err
    if rc != 2:
        assert json.loads(out)["kinds"], label
    else:
        assert len(err.strip().splitlines()) == 1, err
