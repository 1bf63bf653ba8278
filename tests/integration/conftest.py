"""Fixtures for the integration tests that run a change night in check mode, without root.

The package side of a lab host is a private, real dpkg/apt state (DPKG_ADMINDIR, APT_CONFIG)
over the stand-in driver repository, with the R575 packages installed and held: real
`dpkg-query` and the real apt resolver. Its Slurm client is a stand-in replaying recorded
scontrol/squeue output (tests/fixtures/slurm/SOURCES.md). Used by test_change_check.py,
test_secret_canaries.py and decide/conftest.py; the tools come from scripts/testbed-deps.sh.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SLURM_FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
CHANGE_TOOLS = ("gcc", "dpkg-deb", "dpkg-scanpackages", "apt-ftparchive", "apt-get", "dpkg-query")
INSTALLED = "575.57.08"  # the R575 release the lab's h200-r575 hosts run
_BASE = ("python3", "libc6")
_DROPPED = re.compile(r"^(Filename|Size|MD5sum|SHA1|SHA256|SHA512|Description-md5):")

AptSandbox = Callable[[Path, Path], dict[str, str]]
SlurmStandin = Callable[..., None]


@pytest.fixture(scope="session")
def change_tools() -> None:
    """Skip unless the tools the stand-in repository and the private apt state need are here."""
    if any(shutil.which(t) is None for t in CHANGE_TOOLS) or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs gcc, dpkg-dev, apt-utils, apt and a system python3 with python3-apt")


@pytest.fixture(scope="session")
def python_apt(change_tools: None) -> None:
    """Skip unless the system python3 (what the package module runs on) has python3-apt."""
    done = subprocess.run(["/usr/bin/python3", "-c", "import apt_pkg"], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("the apt module needs python3-apt in the system python3")


def status_file(repo: Path, pins: list[str]) -> str:
    """A dpkg status file: the base system, the simulated hardware and these name=version, held."""
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


def _make_apt_sandbox(sb: Path, repo: Path) -> dict[str, str]:
    from k3fleet.lab.standin import install_pins

    for d in ("etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d", "var/lib/apt/lists/partial",
              "var/cache/apt/archives/partial", "dpkg/info", "dpkg/updates"):
        (sb / d).mkdir(parents=True)
    (sb / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    (sb / "dpkg/status").write_text(status_file(repo, install_pins(INSTALLED)))
    (sb / "dpkg/available").write_text("")
    conf = sb / "apt.conf"
    conf.write_text("\n".join([
        f'Dir::State "{sb}/var/lib/apt";', f'Dir::State::status "{sb}/dpkg/status";',
        f'Dir::Cache "{sb}/var/cache/apt";', f'Dir::Etc "{sb}/etc/apt";',
        f'Dir::Etc::sourcelist "{sb}/etc/apt/sources.list";', f'Dir::Etc::sourceparts "{sb}/etc/apt/sources.list.d";',
        f'Dir::Etc::preferencesparts "{sb}/etc/apt/preferences.d";', f'Dir::Etc::parts "{sb}/etc/apt/apt.conf.d";',
        'APT::Architecture "amd64";', 'Debug::NoLocking "true";', 'APT::Sandbox::User "root";',
        f'DPkg::Options {{ "--admindir={sb}/dpkg"; }};', ""]))
    env = {"APT_CONFIG": str(conf), "DPKG_ADMINDIR": str(sb / "dpkg")}
    update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, check=False,
                            env={**os.environ, **env})
    if update.returncode != 0:
        raise RuntimeError(f"apt-get update in the private apt state exited {update.returncode}: {update.stderr}")
    return env


@pytest.fixture(scope="session")
def apt_sandbox(change_tools: None) -> AptSandbox:
    """``make(sb, repo)``: a private apt/dpkg state under ``sb`` over ``repo``, R575 installed and held.

    Returns the environment that points apt and dpkg at it (APT_CONFIG, DPKG_ADMINDIR); the play
    gets a minimal environment, so a caller passes these on by name in K3FLEET_PASS_ENV.
    """
    return _make_apt_sandbox


def _make_slurm_standin(host: dict[str, Any], bindir: Path, calls: Path | None = None) -> None:
    bindir.mkdir()
    # node01 runs job 1 (recorded output); every call is logged to ``calls`` when one is given.
    def log(name: str) -> str:
        return f'echo "{name} $*" >> {calls}\n' if calls is not None else ""

    (bindir / "scontrol").write_text(f'#!/bin/sh\n{log("scontrol")}cat {SLURM_FIX / "scontrol_node01_allocated.txt"}\n')
    (bindir / "squeue").write_text(f'#!/bin/sh\n{log("squeue")}echo 1\n')
    for name in ("scontrol", "squeue"):
        (bindir / name).chmod(0o755)
    # Real dpkg-query ahead of the lab host's replayed one: it reads the private dpkg state.
    (bindir / "dpkg-query").symlink_to(shutil.which("dpkg-query") or "/usr/bin/dpkg-query")
    host.update(k3fleet_path=f"{bindir}:{host['k3fleet_path']}", k3fleet_slurm_node="node01",
                k3fleet_slurm_client="localhost", k3fleet_slurm_path=f"{bindir}:/usr/bin:/bin", k3fleet_probe=False)


@pytest.fixture(scope="session")
def slurm_standin() -> SlurmStandin:
    """``make(host, bindir, calls=None)``: lab host vars ``host`` become Slurm node01 with a stand-in client.

    The stand-ins and a real dpkg-query go into ``bindir``, ahead on the host's PATH; the probe is off.
    """
    return _make_slurm_standin
