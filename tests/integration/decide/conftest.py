"""Real run directories for the decision, package and report tests, built once per session.

- ``story_audit``: ``k3fleet audit --lab`` over the default fleet (R575 hosts: rebuild_environment)
- ``healthy_audit``: ``k3fleet audit --lab`` over two healthy R580 hosts (go_live)
- ``change_check``: ``k3fleet upgrade --check`` on the stand-in driver repository (real dpkg and apt
  resolver, as tests/integration/test_change_check.py sets it up)
- ``accept_runs``: ``k3fleet accept all`` against the vLLM simulator, healthy and made to fail

Everything runs the real command line in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from decide_helpers import k3fleet

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "inventories" / "lab" / "profiles"
SLURM_FIX = REPO / "tests" / "fixtures" / "slurm"


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

_BASE = ("python3", "libc6")
_DROPPED = re.compile(r"^(Filename|Size|MD5sum|SHA1|SHA256|SHA512|Description-md5):")


def _status_file(repo: Path, pins: list[str]) -> str:
    wanted = dict(p.split("=", 1) for p in pins)
    blocks = [f"Package: {n}\nStatus: install ok installed\nPriority: optional\nArchitecture: amd64\nVersion: 1\n"
              f"Maintainer: base\nDescription: base system" for n in _BASE]
    for raw in (repo / "Packages").read_text().strip().split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", raw, re.M))
        if fields["Package"] == "nvidia-sim-hardware" or wanted.get(fields["Package"]) == fields["Version"]:
            state = "install" if fields["Package"] == "nvidia-sim-hardware" else "hold"
            lines = [x for x in raw.splitlines() if not _DROPPED.match(x)]
            lines.insert(1, f"Status: {state} ok installed")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _change_tools_present() -> bool:
    tools = ("gcc", "dpkg-deb", "dpkg-scanpackages", "apt-ftparchive", "apt-get", "dpkg-query")
    if any(shutil.which(t) is None for t in tools) or not os.path.exists("/usr/bin/python3"):
        return False
    done = subprocess.run(["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture(scope="session")
def change_check(runs_root: Path) -> Path:
    """A real ``upgrade --check`` run: gate audit, drain plan and the apt transaction, nothing changed."""
    if not _change_tools_present():
        pytest.skip("upgrade --check needs gcc, dpkg-dev, apt-utils and python3-apt (scripts/testbed-deps.sh)")
    from k3fleet.lab.fleet import generate_fleet, load_fleet
    from k3fleet.lab.standin import build_repo, install_pins

    work = runs_root / "change-env"
    repo = build_repo(work / "repo")
    sb = work / "apt"
    for d in ("etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d", "var/lib/apt/lists/partial",
              "var/cache/apt/archives/partial", "dpkg/info", "dpkg/updates"):
        (sb / d).mkdir(parents=True)
    (sb / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    (sb / "dpkg/status").write_text(_status_file(repo, install_pins("575.57.08")))
    (sb / "dpkg/available").write_text("")
    conf = sb / "apt.conf"
    conf.write_text("\n".join([
        f'Dir::State "{sb}/var/lib/apt";', f'Dir::State::status "{sb}/dpkg/status";',
        f'Dir::Cache "{sb}/var/cache/apt";', f'Dir::Etc "{sb}/etc/apt";',
        f'Dir::Etc::sourcelist "{sb}/etc/apt/sources.list";', f'Dir::Etc::sourceparts "{sb}/etc/apt/sources.list.d";',
        f'Dir::Etc::preferencesparts "{sb}/etc/apt/preferences.d";', f'Dir::Etc::parts "{sb}/etc/apt/apt.conf.d";',
        'APT::Architecture "amd64";', 'Debug::NoLocking "true";', 'APT::Sandbox::User "root";',
        f'DPkg::Options {{ "--admindir={sb}/dpkg"; }};', ""]))
    # The play gets a minimal environment; the private apt and dpkg state are passed on by name.
    env = {"APT_CONFIG": str(conf), "DPKG_ADMINDIR": str(sb / "dpkg"), "K3FLEET_PASS_ENV": "APT_CONFIG,DPKG_ADMINDIR"}
    update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, check=False,
                            env={**os.environ, **env})
    assert update.returncode == 0, update.stderr
    bindir = work / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f'#!/bin/sh\ncat {SLURM_FIX / "scontrol_node01_allocated.txt"}\n')
    (bindir / "squeue").write_text("#!/bin/sh\necho 1\n")
    for name in ("scontrol", "squeue"):
        (bindir / name).chmod(0o755)
    (bindir / "dpkg-query").symlink_to(shutil.which("dpkg-query") or "/usr/bin/dpkg-query")
    lab_inv = generate_fleet(load_fleet(None), work / "lab")
    lab = yaml.safe_load(lab_inv.read_text())["all"]["children"]["lab"]["hosts"]
    host = dict(lab["gpu-a01"])
    host.update(k3fleet_path=f"{bindir}:{host['k3fleet_path']}", k3fleet_slurm_node="node01",
                k3fleet_slurm_client="localhost", k3fleet_slurm_path=f"{bindir}:/usr/bin:/bin", k3fleet_probe=False)
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host, "gpu-a03": dict(lab["gpu-a03"])}}}))
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


@pytest.fixture(scope="session")
def accept_run(runs_root: Path, simulator: Any) -> Any:
    """``accept_run(name, load={...}, skip=(...), **knobs)``: ``k3fleet accept all`` against a simulator
    with these knobs, with the TP 8 x DP 2 start-up log and launch command; each name runs once."""
    import json

    made: dict[str, Path] = {}

    def run(name: str, load: dict[str, Any] | None = None, skip: tuple[str, ...] = (), **knobs: Any) -> Path:
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
                       *options, *skips)
        assert proc.returncode in (0, 1, 3), proc.stderr[-3000:]
        assert (out / "manifest.json").is_file(), proc.stderr[-3000:]
        made[name] = out
        return out

    return run
