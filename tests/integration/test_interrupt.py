"""A stopped command stops its whole play (docs/safety.md "A play's processes").

``k3fleet audit --lab`` runs in a session of its own; a few seconds into its play it gets SIGTERM
(what ``kill``, a CI timeout or systemd sends) or SIGHUP (a closed SSH session). It must exit 3 (an
interrupted run), leave an interrupted run directory with its manifest and no temporary file, and
leave no process behind: not of its session, not of its process group, and none of the processes it
started (ansible-playbook's workers make sessions of their own, which is how a SIGTERM used to leave
a dozen of them hung for good).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procwatch import Watcher

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
K3FLEET = str(BIN / "k3fleet")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_whole_play(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}
    # 200 lab hosts: a play of tens of seconds, so the signal lands while its workers run.
    proc = subprocess.Popen([K3FLEET, "audit", "--lab", "--lab-count", "200", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    watch = Watcher(proc.pid)
    deadline = time.monotonic() + 240
    workers_at: float | None = None
    while proc.poll() is None and time.monotonic() < deadline:
        watch.sample()
        # The play is under way when ansible-playbook has forked its workers.
        if workers_at is None and watch.playbooks > 1:
            workers_at = time.monotonic()
        if workers_at is not None and time.monotonic() - workers_at > 2:
            break
        time.sleep(0.1)
    assert workers_at is not None and proc.poll() is None, "the play ended before it could be stopped"
    os.kill(proc.pid, sig)
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "interrupt: stopping the play" in stderr
    # Nothing of the run is left: what it started, its session, its process group.
    time.sleep(0.5)
    assert watch.seen and watch.left() == []
    assert watch.in_session() == []
    # The evidence of an interrupted run: complete as far as it went, nothing half-written.
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    runner = json.loads((out / "ansible" / "runner.json").read_text())
    assert runner["stopped_processes"] > 0
    assert (out / "manifest.json").is_file()
    assert [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")] == []
    verify = subprocess.run([K3FLEET, "verify", str(out)], capture_output=True, text=True, env=env, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr

