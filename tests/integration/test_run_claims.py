"""One read for check and use, one directory for each run (docs/safety.md "Writes").

- a run directory claimed, then its path swapped for a link to elsewhere: nothing is written through
  the link (every file is written relative to the directory opened at the claim, O_NOFOLLOW), and
  ``decide`` refuses to package what now stands at the path;
- ``audit --out``, ``triage --out`` and ``accept all --out`` inside another run directory: refused with
  one line, exit 2, nothing written, and the host run still verifies.

The host run is a real ``k3fleet triage`` of a recorded Fabric Manager journal
(tests/fixtures/triage/fm_journal_nothing_to_do.txt, its source named in that folder's SOURCES.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3fleet.evidence import RunDir, verify_run

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "triage" / "fm_journal_nothing_to_do.txt"


def _k3fleet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    return subprocess.run([str(bindir / "k3fleet"), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300, check=False)


def test_a_link_swapped_in_after_the_claim_is_never_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rd = RunDir.create(tmp_path / "runs", "decision", ["k3fleet", "decide"], out=tmp_path / "decision")
    aside = tmp_path / "claimed"
    (tmp_path / "decision").rename(aside)
    (tmp_path / "decision").symlink_to(elsewhere)
    rd.write_json("decision.json", {"outcome": "go_live"})
    rd.write_text("report.md", "# decision\n")
    rd.append_jsonl("events/log.jsonl", {"at": 1})
    rd.write_manifest()
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in aside.iterdir()) == ["command.json", "decision.json", "events", "manifest.json",
                                                       "report.md"]
    with pytest.raises(Exception, match="was replaced after it was claimed"):
        rd.check_claim()


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("claims")
    run = root / "triage"
    proc = _k3fleet("triage", str(CAPTURE), "--host", "gpu-x01", "--out", str(run), "--runs-dir", str(root / "r"),
                    cwd=root)
    assert proc.returncode in (0, 1), proc.stderr
    assert verify_run(run).ok
    return run


@pytest.mark.parametrize("command", [
    ["triage", str(CAPTURE), "--host", "gpu-x01"],
    ["audit", "--lab", "--quiet"],
    ["accept", "all", "--base-url", "http://127.0.0.1:9", "--model", "m", "--no-bodies"],
])
@pytest.mark.parametrize("where", ["nested", "deeper/nested"])
def test_no_run_directory_inside_another(host_run: Path, tmp_path: Path, command: list[str], where: str) -> None:
    before = sorted(p.relative_to(host_run).as_posix() for p in host_run.rglob("*"))
    out = host_run / where
    proc = _k3fleet(*command, "--out", str(out), "--runs-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is inside the run directory {host_run.resolve()}" in lines[0], lines
    assert sorted(p.relative_to(host_run).as_posix() for p in host_run.rglob("*")) == before
    assert verify_run(host_run).ok
    assert not (tmp_path / "r").exists()


def test_the_runs_dir_inside_a_run_is_refused_too(host_run: Path, tmp_path: Path) -> None:
    proc = _k3fleet("triage", str(CAPTURE), "--host", "gpu-x01", "--runs-dir", str(host_run / "runs"), cwd=tmp_path)
    assert proc.returncode == 2 and "is inside the run directory" in proc.stderr, proc.stderr
    assert verify_run(host_run).ok
