"""Real run directories for the decision, package and report tests, built once per session.

- ``story_audit``: ``k3fleet audit --lab`` over the default fleet (R575 hosts: rebuild_environment)
- ``healthy_audit``: ``k3fleet audit --lab`` over two healthy R580 hosts (go_live)
- ``change_check``: ``k3fleet upgrade --check`` on the stand-in driver repository (real dpkg and apt
  resolver, set up by tests/integration/conftest.py)
- ``accept_runs``: ``k3fleet accept all`` against the vLLM simulator, healthy and made to fail

Everything runs the real command line in a subprocess, as a user would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from decide_helpers import LAB_PROFILE, k3fleet

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "inventories" / "lab" / "profiles"


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decide-runs")


def _audit(root: Path, name: str, fleet: Path | None) -> Path:
    out = root / name
    args = ["audit", "--lab", "--out", str(out), "--quiet"]
    if fleet is not None:
        args[2:2] = ["-i", str(fleet)]
    proc = k3fleet(*args)
    assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
    assert (out / "manifest.json").is_file(), proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def story_audit(runs_root: Path) -> Path:
    return _audit(runs_root, "audit-story", None)


@pytest.fixture(scope="session")
def healthy_audit(runs_root: Path) -> Path:
    fleet = runs_root / "healthy-fleet.yaml"
    fleet.write_text(yaml.safe_dump({"description": "two healthy R580 nodes", "profiles_dir": str(PROFILES),
                                     "hosts": {"gpu-b01": "h200-r580", "gpu-b02": "h200-r580"}}))
    return _audit(runs_root, "audit-healthy", fleet)


# -- upgrade --check on the stand-in repository ----------------------------------------------------------


@pytest.fixture(scope="session")
def change_check(runs_root: Path, python_apt: None) -> Path:
    """A real ``upgrade --check`` run: gate audit, drain plan and the apt transaction, nothing changed.

    The private apt state and the Slurm stand-in are the lab's (k3fleet.lab.changelab, what ``k3fleet
    lab demo`` plans on); tests/integration/conftest.py skips where the machine lacks their tools.
    """
    from k3fleet.lab import changelab

    lab = changelab.prepare(runs_root / "change-env")
    inventory, env = lab.inventory, lab.env
    runs = runs_root / "change-runs"
    proc = k3fleet("upgrade", "-i", str(inventory), "--change-id", "CHG-1042", "--operator", "alice", "--canary",
                   "gpu-a01", "--check", "--runs-dir", str(runs), "--quiet", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = sorted(p for p in runs.iterdir() if p.is_dir() and (p / "change.json").is_file())
    assert len(made) == 1, made
    return made[0]


# -- acceptance runs against the simulator --------------------------------------------------------------


def simulator_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("k3fleet.lab.vllm_sim.server") is None:
        return False
    proc = k3fleet("accept", "all", "--help")
    return proc.returncode == 0


@pytest.fixture(scope="session")
def simulator() -> Iterator[Any]:
    """Start simulators on loopback with the given knobs; all stopped at the end of the session."""
    if not simulator_available():
        pytest.skip("k3fleet accept all and the vLLM simulator are not available in this checkout")
    from k3fleet.lab.vllm_sim.server import start_simulator

    handles: list[Any] = []

    def start(**knobs: Any) -> Any:
        h = start_simulator(**knobs)
        handles.append(h)
        return h

    yield start
    for h in handles:
        h.stop()


# A lab fleet whose image digest is the one the acceptance start-up names (its launch command pulls
# vllm/vllm-openai:kimi-k3 by digest): host, container and start-up then agree on the chain.
STARTUP_DIGEST = "4f6c3a9a1d0b8e2f7c5d9e1a3b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c"
DECIDE_FIX = REPO / "tests" / "fixtures" / "decide"


@pytest.fixture(scope="session")
def matched_audit(runs_root: Path) -> Path:
    same = {"profile": "h200-r580", "set": {"container": {"image": {"digest": STARTUP_DIGEST}}}}
    fleet = runs_root / "matched-fleet.yaml"
    fleet.write_text(yaml.safe_dump({"description": "two R580 nodes holding the accepted image",
                                     "profiles_dir": str(PROFILES), "hosts": {"gpu-m01": same, "gpu-m02": same}}))
    return _audit(runs_root, "audit-matched", fleet)


# A short load schedule (tests/unit/test_accept_load.py's): two ladder rungs, a ramp of 1-2-4, short steps.
QUICK_LOAD = {"ladder_tokens": [256, 1024], "ladder_output_tokens": 8, "ladder_repeats": 1, "ramp": [1, 2, 4],
              "step_s": 1.5, "sustained_s": 1.5, "system_prompt_tokens": 2000, "turn_output_tokens": 24,
              "sample_interval_s": 0.25}
FAST_SIM = {"itl_ms": 2.0, "prefill_ms_per_token": 0.005}
# An owner, a deadline and a rollback action for every kind of limit a decision can set.
LIMIT_OWNERS = {"limits": {kind: {"owner": "dana", "deadline": "2026-12-15", "rollback": "pin the baseline image"}
                           for kind in ("concurrency_ceiling", "max_context_tokens", "rate_limit", "retry",
                                        "hosts_left_out", "tested_envelope")}}


@pytest.fixture(scope="session")
def limit_owners(runs_root: Path) -> Path:
    p = runs_root / "owners-limits.yaml"
    p.write_text(yaml.safe_dump(LIMIT_OWNERS))
    return p


@pytest.fixture(scope="session")
def accept_run(runs_root: Path, simulator: Any) -> Any:
    """``accept_run(name, load={...}, skip=(...), profile=True, **knobs)``: ``k3fleet accept all`` against a
    simulator with these knobs, with the TP 8 x DP 2 start-up log and launch command, the lab profile's schedule
    and cases (``profile``); each name runs once."""
    import json

    made: dict[str, Path] = {}

    def run(name: str, load: dict[str, Any] | None = None, skip: tuple[str, ...] = (), profile: bool = True,
            **knobs: Any) -> Path:
        if name in made:
            return made[name]
        handle = simulator(**{**FAST_SIM, **knobs})
        out = runs_root / f"accept-{name}"
        options = [x for k, v in {**QUICK_LOAD, **(load or {})}.items()
                   for x in ("--load-option", f"{k}={json.dumps(v)}")]
        skips = [x for probe in skip for x in ("--skip", probe)]
        proc = k3fleet("accept", "all", "--base-url", handle.base_url, "--model", "moonshotai/Kimi-K3",
                       "--log", str(DECIDE_FIX / "startup_kimi_k3_tp8_dp2.log"),
                       "--launch-command", str(DECIDE_FIX / "launch_kimi_k3_tp8_dp2.txt"),
                       "--agent-repeats", "6", "--prefix-repeats", "3", "--out", str(out), "--quiet",
                       *(("--profile", str(LAB_PROFILE)) if profile else ()), *options, *skips)
        assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
        assert (out / "manifest.json").is_file(), proc.stderr[-3000:]
        made[name] = out
        return out

    return run


# -- signing keys -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def evidence_keys(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The reviewer's key and its allowed-signers file, a stranger's key, an encrypted key."""
    import shutil

    from decide_helpers import EvidenceKeys

    if shutil.which("ssh-keygen") is None:
        pytest.fail("ssh-keygen (OpenSSH client) is required: signed evidence is made and checked with it")
    return EvidenceKeys(tmp_path_factory.mktemp("keys"))
