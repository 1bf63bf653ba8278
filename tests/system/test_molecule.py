"""`molecule test --all`: one scenario per role of the k3fleet.gpu collection on the real testbed.

molecule/default (k3_preflight: converge, idempotence, check, verify) creates the testbed's guests through
the harness and destroys them at the end; every other scenario runs on those same guests
(.config/molecule/config.yml: shared_state), each prepare putting them back on R575 first.

The run takes the session's testbed over (same work directory, same namespaces and addresses): the
session's guests go down first, molecule leaves the testbed down, and the fixture brings the session's
guests back for later modules.
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
import yaml

from k3fleet.lab import testbed

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
MOLECULE = Path(sys.executable).with_name("molecule")
BASE = yaml.safe_load((REPO / ".config" / "molecule" / "config.yml").read_text())


def scenarios() -> dict[str, list[str]]:
    """Each scenario's name and the actions of its test sequence that it runs itself (with shared_state
    create and destroy are molecule/default's, run once around all of them)."""
    out: dict[str, list[str]] = {}
    for path in sorted((REPO / "molecule").glob("*/molecule.yml")):
        data = yaml.safe_load(path.read_text()) or {}
        sequence = (data.get("scenario") or {}).get("test_sequence") or BASE["scenario"]["test_sequence"]
        out[path.parent.name] = [a for a in sequence if a not in ("create", "destroy")]
    return out


@pytest.mark.skipif(not MOLECULE.exists() and shutil.which("molecule") is None,
                    reason="molecule is not installed (pip install -e '.[test]')")
def test_molecule_every_role_scenario(
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
    # A stale ephemeral directory from an interrupted run breaks the next one. With shared_state every
    # scenario's is molecule/default's: `molecule reset` removes it (`reset --all` would remove it once per
    # scenario and fail on the second).
    subprocess.run([molecule, "reset"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True)
    started = time.monotonic()
    done = subprocess.run([molecule, "test", "--all"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1500, check=False)
    wanted = scenarios()
    testbed_report(f"molecule test --all ({len(wanted)} scenarios, one per role, 2 guests): "
                   f"{time.monotonic() - started:.1f}s")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    # "nvidia_driver > converge: Executed: Successful" (an arrow instead of ">" when colours are on).
    succeeded = set(re.findall(r"\[?(\w+) *(?:>|➜) *(\w+)\]?:? Executed: Successful", output))
    missing = {(name, action) for name, actions in wanted.items() for action in actions} - succeeded
    assert not missing, f"not successful: {sorted(missing)}\n{output[-4000:]}"
    assert {("default", "create"), ("default", "destroy")} <= succeeded, output[-4000:]
    # destroy ran last: nothing of the testbed is left up.
    assert testbed.status(workdir).phase == "down"
