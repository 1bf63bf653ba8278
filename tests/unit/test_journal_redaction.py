"""The change journal is evidence: every line it appends passes the same redactor as the run directory."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_journal_format import append_line
from k3fleet.evidence import redact, redact_text

SECRET = "hunter2-canary-7731"


def test_a_drain_reason_and_snapshot_secrets_never_reach_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    line = {"ts": "2026-11-30T22:00:00+00:00", "run": "r1", "change_id": "CHG-1", "host": "gpu-a01",
            "stage": "snapshot", "detail": {},
            "snapshot": {"scheduler": {"reason": f"BMC password {SECRET}", "state": "idle"},
                         "packages": {"nvidia-driver-575-server": "575.57.08-0ubuntu1"},
                         "env": {"HF_TOKEN": SECRET}}}
    append_line(str(journal), line)
    raw = journal.read_text()
    assert SECRET not in raw
    assert raw.startswith('{"ts": ')  # readers and the tear recovery rely on ts coming first
    back = json.loads(raw)
    assert back["snapshot"]["packages"] == {"nvidia-driver-575-server": "575.57.08-0ubuntu1"}
    assert back["snapshot"]["scheduler"]["state"] == "idle"
    assert back["snapshot"]["env"]["HF_TOKEN"] == "***"


def test_the_controller_and_the_journal_share_one_set_of_rules() -> None:
    sample = {"Authorization": "Bearer abcdefgh12345678", "url": f"https://ops:{SECRET}@repo.example/x",
              "args": ["--api-key", SECRET], "passed": 3}
    from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_redact

    assert k3fleet_redact.redact(sample) == redact(sample)
    assert SECRET not in json.dumps(redact(sample))
    assert redact_text(f"password {SECRET}") == k3fleet_redact.redact_text(f"password {SECRET}")
