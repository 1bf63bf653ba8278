"""``k3fleet upgrade`` with the flow replaced by an empty night: for tests of what the command line hands the
flow and what the flow records and warns before any host is touched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from k3fleet.change import UpgradeOptions
from k3fleet.change.night import ChangeResult, finish
from k3fleet.evidence import RunDir

# What the flow derives from the options: the fields it adds to change.json, and its warnings.
Derive = Callable[[UpgradeOptions], tuple[dict[str, Any], list[str]]]


def empty_night(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, derive: Derive) -> list[UpgradeOptions]:
    """Replace the flow by one that records the options it was given, writes the change record with what
    ``derive`` makes of them and ends as an empty night ends (``finish``); the options seen are returned."""
    import k3fleet.change as change

    seen: list[UpgradeOptions] = []

    def run_upgrade(opts: UpgradeOptions, argv: list[str], **_: Any) -> ChangeResult:
        seen.append(opts)
        fields, warnings = derive(opts)
        rd = RunDir.create(opts.runs_dir, "change", argv)
        record = {"change_id": opts.change_id, "operator": opts.operator, "target_version": "580.95.05",
                  "target_branch": 580, "check": opts.check, **fields}
        result = ChangeResult(run_dir=rd, change=record, play=None, warnings=warnings)
        finish(result, None)
        return result

    monkeypatch.setattr(change, "run_upgrade", run_upgrade)
    monkeypatch.chdir(tmp_path)
    return seen


def empty_audit(tmp_path: Path) -> Path:
    """An audit run directory with an empty verdict and its manifest: the audit a night's extravars point at."""
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit"], out=tmp_path / "audit")
    rd.write_json("verdict.json", {})
    rd.write_manifest()
    return rd.path
