"""System-test fixtures: one real testbed per session, always torn down.

The testbed needs root, network namespaces, systemd-nspawn, Slurm and podman
(scripts/testbed-deps.sh installs them). Without them every system test is skipped with the
reason; with them a failure to bring the testbed up is an error, not a skip.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from k3fleet.lab import testbed
from k3fleet.lab.common import proc
from k3fleet.lab.testbed import tools as testbed_tools

PR_SET_CHILD_SUBREAPER = 36
HOSTS = 4


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return f"real testbed needs root (euid {os.geteuid()})"
    try:
        testbed_tools.require_tools()
    except testbed.MissingToolError as exc:
        return str(exc)
    return None


def _report(config: pytest.Config, line: str) -> None:
    """A line on the terminal even with output capture on (timings are read, not asserted)."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


@pytest.fixture(scope="session")
def testbed_report(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Print a line on the terminal (timings are reported, never asserted)."""
    return lambda line: _report(pytestconfig, line)


@pytest.fixture(scope="session")
def testbed_workdir() -> Path:
    return testbed.default_workdir()


@pytest.fixture(scope="session")
def testbed_state(testbed_workdir: Path, pytestconfig: pytest.Config) -> Iterator[testbed.TestbedState]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # Be the subreaper of everything the testbed starts: when a test kills the supervisor with
    # SIGKILL its children come to us (not to this machine's PID 1, which never reaps them).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # ansible-runner needs ansible-playbook/ansible on PATH: the venv's bin.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    cached = any(testbed_workdir.joinpath("cache").glob("rootfs-*.tar"))
    started = time.monotonic()
    try:
        state = testbed.up(n=HOSTS, workdir=testbed_workdir)
        seconds = time.monotonic() - started
        _report(
            pytestconfig, f"testbed up: {HOSTS} hosts in {seconds:.1f}s (image cache {'warm' if cached else 'cold'})"
        )
        yield state
    finally:
        testbed.down(testbed_workdir)
        proc.reap_zombie_children()


def _renew(state: testbed.TestbedState, report: Callable[[str], None] | None = None) -> None:
    """Bring the session's testbed up again on fresh overlays and point `state` at it."""
    hosts = len(state.hosts) or HOSTS
    started = time.monotonic()
    fresh = testbed.up(n=hosts, workdir=state.workdir)
    if report is not None:
        report(f"testbed up, cached image: {hosts} hosts in {time.monotonic() - started:.1f}s")
    # Fixtures and tests hold this object: update it in place (pids and guest pids are new).
    for name in type(fresh).model_fields:
        setattr(state, name, getattr(fresh, name))


@pytest.fixture(scope="module")
def fresh_testbed(
    testbed_state: testbed.TestbedState, testbed_report: Callable[[str], None]
) -> Iterator[testbed.TestbedState]:
    """Clean guests for a module that installs packages, reboots guests or takes the testbed down,
    and clean guests again after it, so no module depends on the order modules run in."""
    _renew(testbed_state, testbed_report)
    yield testbed_state
    _renew(testbed_state)


@pytest.fixture(scope="module")
def inventory(testbed_state: testbed.TestbedState, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The testbed inventory for a change night; Slurm's daemons run on this machine, so its clients do too."""
    data = yaml.safe_load(testbed_state.inventory.read_text())
    data["all"]["children"]["testbed"]["vars"]["k3fleet_slurm_client"] = "localhost"
    path = tmp_path_factory.mktemp("inventory") / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path
