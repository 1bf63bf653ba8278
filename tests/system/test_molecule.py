"""`molecule test` of molecule/default: k3_preflight on testbed guests that molecule's own create and
destroy playbooks bring up and tear down through the harness (converge, idempotence, check, verify).

The scenario takes the session's testbed over (same work directory, same namespaces and addresses):
the session's guests go down first, molecule leaves the testbed down, and the fixture brings the
session's guests back for later modules.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from k3fleet.lab import testbed

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
MOLECULE = Path(sys.executable).with_name("molecule")
ACTIONS = ("destroy", "create", "prepare", "converge", "idempotence", "check", "verify")


@pytest.mark.skipif(not MOLECULE.exists() and shutil.which("molecule") is None,
                    reason="molecule is not installed (pip install -e '.[test]')")
def test_molecule_default_scenario(
    fresh_testbed: testbed.TestbedState, testbed_report: Callable[[str], None]
) -> None:
    workdir = fresh_testbed.workdir
    molecule = str(MOLECULE) if MOLECULE.exists() else str(shutil.which("molecule"))
    env = {
        **os.environ,
        # molecule runs ansible-playbook and the create/destroy playbooks run k3fleet: both from the venv.
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "K3FLEET_TESTBED_WORKDIR": str(workdir),
        "NO_COLOR": "1",
        "PY_COLORS": "0",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    testbed.down(workdir)
    # A stale ephemeral directory from an interrupted run breaks the next one.
    subprocess.run([molecule, "reset"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True)
    started = time.monotonic()
    done = subprocess.run([molecule, "test"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    testbed_report(f"molecule test (2 guests, converge/idempotence/check/verify): {time.monotonic() - started:.1f}s")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # "default > converge: Executed: Successful" (an arrow instead of ">" when colours are on).
    succeeded = set(re.findall(r"\[?default *(?:>|➜) *(\w+)\]?:? Executed: Successful", output))
    assert succeeded >= set(ACTIONS), f"not successful: {set(ACTIONS) - succeeded}\n{output[-4000:]}"
    # The second converge, the check run and verify changed nothing on either guest.
    assert len(re.findall(r"tb-node0[12] +: ok=\d+ +changed=0 +unreachable=0 +failed=0", output)) >= 6
    # destroy ran last: nothing of the testbed is left up.
    assert testbed.status(workdir).phase == "down"
