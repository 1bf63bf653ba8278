"""Fixtures for the integration tests that run a change night in check mode, without root.

The package side of a lab host is a private, real dpkg/apt state (DPKG_ADMINDIR, APT_CONFIG)
over the stand-in driver repository, with the R575 packages installed and held: real
`dpkg-query` and the real apt resolver. Its Slurm client is a stand-in replaying recorded
scontrol/squeue output (tests/fixtures/slurm/SOURCES.md). Both are the lab's own
(k3fleet.lab.changelab, what `k3fleet lab demo` runs on); these fixtures only skip where the
machine lacks the tools. Used by test_change_check.py, test_secret_canaries.py and
decide/conftest.py; the tools come from scripts/testbed-deps.sh.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from k3fleet.lab.changelab import CHANGE_TOOLS, make_apt_sandbox, make_slurm_standin

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


@pytest.fixture(scope="session")
def apt_sandbox(change_tools: None) -> AptSandbox:
    """``make(sb, repo)``: a private apt/dpkg state under ``sb`` over ``repo``, R575 installed and held.

    Returns the environment that points apt and dpkg at it (APT_CONFIG, DPKG_ADMINDIR); the play
    gets a minimal environment, so a caller passes these on by name in K3FLEET_PASS_ENV.
    """
    return make_apt_sandbox


@pytest.fixture(scope="session")
def slurm_standin() -> SlurmStandin:
    """``make(host, bindir, calls=None)``: lab host vars ``host`` become Slurm node01 with a stand-in client.

    The stand-ins and a real dpkg-query go into ``bindir``, ahead on the host's PATH; the probe is off.
    """
    return make_slurm_standin
