"""The run directory: redaction, manifest, atomic JSON, journal appends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3fleet.errors import UsageError
from k3fleet.evidence import REDACTED, RunDir, redact, redact_argv, redact_text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["k3fleet", "--token", "abc123", "audit"], ["k3fleet", "--token", REDACTED, "audit"]),
        (["k3fleet", "--api-key=abc123"], ["k3fleet", f"--api-key={REDACTED}"]),
        (["x", "HF_TOKEN=hf_abc"], ["x", f"HF_TOKEN={REDACTED}"]),
        (["x", "--password", "p", "--limit", "gpu01"], ["x", "--password", REDACTED, "--limit", "gpu01"]),
        (["k3fleet", "audit", "-i", "inv.yml"], ["k3fleet", "audit", "-i", "inv.yml"]),
    ],
)
def test_redact_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(
    ("name", "secret"),
    [("password", True), ("ansible_password", True), ("ansible_ssh_pass", True), ("HF_TOKEN", True),
     ("api_token", True), ("Authorization", True), ("auth", True), ("vault_secret", True), ("private_key", True),
     ("passed", False), ("prompt_tokens", False), ("cached_tokens", False), ("author", False),
     ("passthrough", False), ("host", False)],
)
def test_secret_names(name: str, secret: bool) -> None:
    from k3fleet.evidence import is_secret_name

    assert is_secret_name(name) is secret


def test_evidence_counts_survive_redaction() -> None:
    summary = {"passed": 3, "failed": 1, "usage": {"prompt_tokens": 120, "cached_tokens": 64}}
    assert redact(summary) == summary
    assert redact_text("passed=3 prompt_tokens=120") == "passed=3 prompt_tokens=120"


def test_redact_structures_by_key_and_inline() -> None:
    data = {"ansible_password": "hunter2", "nested": [{"Authorization": "Bearer abc.def"}],
            "note": "token=xyz and more", "count": 3}
    out = redact(data)
    assert out["ansible_password"] == REDACTED
    assert out["nested"][0]["Authorization"] == REDACTED
    assert out["note"] == f"token={REDACTED} and more"
    assert out["count"] == 3
    assert redact_text("curl -H 'Authorization: Bearer s3cr3t'") == f"curl -H 'Authorization: {REDACTED}'"


def test_run_dir_manifest_detects_tampering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K3FLEET_API_TOKEN", "do-not-store")
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit", "--token", "t0k"])
    rd.write_json("facts/h1.json", {"host": "h1"})
    rd.write_text("report.md", "# report\n")
    rd.write_manifest()
    command = json.loads((rd.path / "command.json").read_text())
    assert command["argv"] == ["k3fleet", "audit", "--token", REDACTED]
    assert command["env"]["K3FLEET_API_TOKEN"] == REDACTED
    assert "do-not-store" not in (rd.path / "command.json").read_text()
    assert rd.verify_manifest() == []
    (rd.path / "facts/h1.json").write_text('{"host": "h2"}')
    assert rd.verify_manifest() == ["facts/h1.json"]
    manifest = json.loads((rd.path / "manifest.json").read_text())
    assert {e["path"] for e in manifest["files"]} == {"command.json", "facts/h1.json", "report.md"}


def test_run_dir_refuses_non_empty_out(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("data")
    with pytest.raises(UsageError, match="not empty"):
        RunDir.create(tmp_path, "audit", ["k3fleet"], out=out)
    assert (out / "keep.txt").read_text() == "data"


def test_journal_append_survives_reopen(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "upgrade", ["k3fleet"])
    rd.append_jsonl("journal.jsonl", {"host": "h1", "stage": "snapshot"})
    rd.append_jsonl("journal.jsonl", {"host": "h1", "stage": "draining"})
    again = RunDir.open(rd.path)
    rows = [json.loads(x) for x in (again.path / "journal.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["snapshot", "draining"]


def test_open_rejects_non_run_dir(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a k3fleet run directory"):
        RunDir.open(tmp_path)


def test_read_json_errors_are_one_line(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "audit", ["k3fleet"])
    (rd.path / "verdict.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        rd.read_json("verdict.json")
    with pytest.raises(UsageError, match="missing"):
        rd.read_json("plan.json")
