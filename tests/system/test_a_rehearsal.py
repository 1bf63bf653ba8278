"""The README's rehearsal on the real testbed runs as written (README "Rehearse the night"): the block
brings up its own two-guest testbed, runs the success path, a fault at the verify stage rolled back, a
night stopped by SIGTERM while its canary reboots and resumed, rolls both nodes back and takes the
testbed down. Its name sorts it first among the system tests: it brings the testbed up and down itself,
before the session's shared testbed exists (tests/system/conftest.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rehearsal import ROOT, run_block

from k3fleet.change.journal import read_journal, replay

pytestmark = pytest.mark.system


def _run(cwd: Path, name: str) -> dict:
    return json.loads((cwd / "runs" / name / "run.json").read_text())


def test_the_readme_rehearsal_on_the_testbed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root")
    # The README's commands run from the repository root: its .testbed (the image cache) is the one used.
    cwd = tmp_path
    (ROOT / ".testbed").mkdir(exist_ok=True)
    (cwd / ".testbed").symlink_to(ROOT / ".testbed", target_is_directory=True)
    done = run_block("testbed", cwd, timeout=2400)
    assert done.returncode == 0, done.stderr[-6000:]
    assert "Traceback" not in done.stderr
    ok, fail, stop = _run(cwd, "reh-ok"), _run(cwd, "reh-fail"), _run(cwd, "reh-stop")
    assert ok["exit_code"] == 0 and ok["hosts"]["tb-node01"]["outcome"] == "upgraded"
    assert fail["exit_code"] == 1 and fail["hosts"]["tb-node02"]["outcome"] == "rolled_back"
    assert "exit 1" in done.stderr and "exit 3" in done.stderr
    # The stopped night: journaled as interrupted at rebooting (or verifying), then resumed to the end (run.json is the
    # resume's now), and both nodes rolled back by the last two commands.
    entries = read_journal(cwd / "runs" / "reh-stop" / "journal.jsonl").entries
    marks = [(e.host, e.stage, (e.interrupted or {}).get("signal")) for e in entries if e.interrupted]
    # The block sends SIGTERM once the journal says the canary reboots; a guest that comes back within the
    # poll is already verifying by then. Either way the night stopped mid-change and the resume finished it.
    assert len(marks) == 1 and marks[0][0] == "tb-node02" and marks[0][2] == "SIGTERM", marks
    assert marks[0][1] in ("rebooting", "verifying"), marks
    stages = [e.stage for e in replay(entries)["tb-node02"].entries]
    assert "returned" in stages and stages[-1] in ("rolled_back", "returned")
    assert stop["exit_code"] == 0
