"""The README's rehearsal on the lab runs as written (README "Rehearse the night"): `upgrade --check` over
`inventories/lab` and over what `lab generate` writes plans the canary's drain (waiting for the Slurm job
the lab replays) and its apt transaction, and changes nothing. Needs the lab's change-night tools
(Debian's gcc, dpkg-dev, apt-utils, python3-apt: scripts/demo-deps.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rehearsal import run_block

pytestmark = pytest.mark.integration


def test_the_readme_rehearsal_on_the_lab(tmp_path: Path, python_apt: None) -> None:
    done = run_block("check", tmp_path, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    for run in ("rehearse", "rehearse-generated"):
        check = json.loads((tmp_path / "runs" / run / "check.json").read_text())
        assert list(check) == ["gpu-a01"], check
        plan = check["gpu-a01"]
        assert "error" not in plan, plan
        text = json.dumps(plan)
        # The lab's replayed Slurm: the drain would wait for the job gpu-a01 runs.
        assert "48211" in text and "nvidia-driver-580-server" in text
        assert json.loads((tmp_path / "runs" / run / "run.json").read_text())["exit_code"] == 0
    # A lab fleet is never changed: without --check it is refused in one line.
    refused = subprocess.run([str(Path(sys.executable).parent / "k3fleet"), "upgrade", "-i", "inventories/lab",
                              "--change-id", "CHG-1", "--operator", "alice"], cwd=tmp_path, capture_output=True,
                             text=True, check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "k3fleet: error: inventories/lab is the simulated lab fleet: a change there would run apt on this machine; "
        'rehearse the night on it with --check (README "Rehearse the night")']
