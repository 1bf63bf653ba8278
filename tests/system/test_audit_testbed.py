"""`k3fleet audit` over real SSH against guests put on mixed driver branches with real apt.

Each guest gets the stand-in driver through apt in the guest and, where its story needs it, a real
reboot (the loaded driver only changes at boot):

    tb-node01  R575 575.57.08 proprietary + Fabric Manager, rebooted      pynvml -> NVML path
    tb-node02  R580 580.95.05 proprietary + Fabric Manager, rebooted      no pynvml -> NVML through
                                                                          k3fleet's own binding
    tb-node03  R580 580.82.07 open + Fabric Manager, rebooted             pynvml -> NVML path
    tb-node04  R575 installed and booted, then 580.95.05 packages with    no pynvml: NVML (k3fleet's
               no reboot: the loaded module is still 575                  binding) and then nvidia-smi
                                                                          report the version mismatch

Then the real CLI runs the real audit playbook through ansible-runner, and the verdict is checked
host by host. The module's guests are fresh before and after it (fixture fresh_testbed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k3fleet.lab import testbed
from k3fleet.lab.standin import install_pins, release

pytestmark = pytest.mark.system

APT_ENV = "DEBIAN_FRONTEND=noninteractive"
APT_INSTALL = f"{APT_ENV} apt-get install -y -q -o Dpkg::Use-Pty=0 nvidia-sim-hardware"


@dataclass(frozen=True)
class Step:
    version: str
    open_kernel: bool = False
    reboot: bool = True


# What each guest goes through, in order.
STORIES: dict[str, tuple[Step, ...]] = {
    "tb-node01": (Step("575.57.08"),),
    "tb-node02": (Step("580.95.05"),),
    "tb-node03": (Step("580.82.07", open_kernel=True),),
    "tb-node04": (Step("575.57.08"), Step("580.95.05", reboot=False)),
}


@dataclass
class Audit:
    rc: int
    verdict: dict[str, Any]
    facts: dict[str, dict[str, Any]]
    run_dir: Path
    stderr: str
    proc_versions: dict[str, str]


def _reboot(state: testbed.TestbedState, host: str) -> None:
    boots = testbed.status(state.workdir).host(host).boots
    # The SSH session may die with the guest: its exit status says nothing.
    subprocess.run(testbed.ssh_argv(state, host, "systemctl reboot"), capture_output=True, timeout=60)
    testbed.wait_host_ready(state.workdir, host, min_boots=boots + 1)


def _play_story(state: testbed.TestbedState, host: str, steps: tuple[Step, ...]) -> None:
    testbed.ssh_run(state, host, "apt-get update -q", timeout=120)
    for step in steps:
        pins = install_pins(step.version, open_kernel=step.open_kernel)
        testbed.ssh_run(state, host, f"{APT_INSTALL} {' '.join(pins)}", timeout=300)
        if step.reboot:
            _reboot(state, host)


def _k3fleet() -> str:
    return str(Path(sys.executable).with_name("k3fleet"))


@pytest.fixture(scope="module")
def audit(
    fresh_testbed: testbed.TestbedState, tmp_path_factory: pytest.TempPathFactory,
    testbed_report: Callable[[str], None],
) -> Audit:
    state = fresh_testbed
    started = time.monotonic()
    for host, steps in STORIES.items():
        _play_story(state, host, steps)
    testbed_report(f"mixed driver branches through apt + reboots on {len(STORIES)} guests: "
                   f"{time.monotonic() - started:.1f}s")
    # What the simulated kernel module says, read over SSH: the audit must find this same view.
    proc_versions = {
        h: testbed.ssh_run(state, h, "head -n1 /run/nvidia-sim/proc/driver/nvidia/version").strip()
        for h in STORIES
    }
    out = tmp_path_factory.mktemp("audit") / "run"
    started = time.monotonic()
    done = subprocess.run(
        [_k3fleet(), "audit", "-i", str(state.inventory), "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    testbed_report(f"k3fleet audit over SSH: {len(STORIES)} hosts in {time.monotonic() - started:.1f}s")
    assert done.stdout.strip(), f"audit printed no verdict (rc {done.returncode}): {done.stderr[-2000:]}"
    facts = {h: json.loads((out / "facts" / f"{h}.json").read_text()) for h in STORIES}
    return Audit(done.returncode, json.loads(done.stdout), facts, out, done.stderr, proc_versions)


def findings(audit: Audit, host: str) -> dict[str, dict[str, Any]]:
    return {f["check_id"]: f for f in audit.verdict["hosts"][host]["findings"]}


def deb_version(version: str, *, fabricmanager: bool = False) -> str:
    r = release(version)
    return r.fm_deb_version if fabricmanager else r.driver_deb_version


def installed(audit: Audit, host: str) -> dict[str, str]:
    return {p["name"]: p["version"] for p in audit.facts[host]["packages"]["packages"]}


# -- the fleet -------------------------------------------------------------------------------------


def test_every_host_answered_and_the_exit_code_says_checks_failed(audit: Audit) -> None:
    v = audit.verdict
    assert sorted(v["hosts"]) == sorted(STORIES)
    assert v["summary"]["unreachable"] == 0, audit.stderr[-2000:]
    run = json.loads((audit.run_dir / "run.json").read_text())
    assert run["hosts_with_facts"] == len(STORIES) and run["invalid_evidence"] == {}, run
    # Two hosts below R580: checks failed (1), not bad input (2) or hosts unreachable (3).
    assert audit.rc == v["exit_code"] == 1
    for host in STORIES:
        assert audit.facts[host]["host"] == host


def test_the_audit_read_the_collectors_proc_view(audit: Audit) -> None:
    # k3fleet_procfs from the testbed inventory: the first line of the simulated
    # /proc/driver/nvidia/version, as the guest itself shows it.
    for host, line in audit.proc_versions.items():
        assert audit.facts[host]["driver"]["kernel_module"]["raw"] == line
        assert audit.facts[host]["driver"]["kernel_module"]["loaded"] is True


def test_fleet_drift_and_change_plan(audit: Audit) -> None:
    fleet = {f["check_id"]: f for f in audit.verdict["fleet_findings"]}
    drift = fleet["fleet.driver_drift"]
    assert all(v in drift["message"] for v in ("575.57.08", "580.82.07", "580.95.05"))
    plan = audit.verdict["plan"]
    assert plan["target_version"] == "580.95.05"
    assert sorted(p["host"] for p in plan["needs_upgrade"]) == ["tb-node01", "tb-node04"]


# -- host by host ------------------------------------------------------------------------------------


def test_r575_proprietary_host_read_through_nvml(audit: Audit) -> None:
    f = audit.facts["tb-node01"]
    assert f["driver"]["source"] == "nvml" and f["driver"]["nvml"]["status"] == "ok"
    assert f["driver"]["driver_version"] == "575.57.08"
    assert f["driver"]["cuda_driver_version"] == "12.9"
    assert f["driver"]["kernel_module"]["flavour"] == "proprietary"
    assert installed(audit, "tb-node01")["nvidia-driver-575-server"] == deb_version("575.57.08")
    fm = f["fabricmanager"]
    assert (fm["version"], fm["driver_version"], fm["version_matches_driver"]) == ("575.57.08", "575.57.08", True)
    assert fm["unit"]["active"] == "active"

    found = findings(audit, "tb-node01")
    branch = found["driver.branch"]
    assert (branch["kind"], branch["severity"]) == ("fail", "critical")
    assert branch["evidence"]["branch"] == 575 and branch["evidence"]["required_branch"] == 580
    assert "driver.pending_reboot" not in found
    assert "fabricmanager.version_match" not in found and "fabricmanager.active" not in found


def test_r580_host_read_through_the_k3fleet_nvml_binding(audit: Audit) -> None:
    f = audit.facts["tb-node02"]
    # No pynvml on this guest: NVML answers through k3fleet's own binding; nvidia-smi runs only for the
    # GPU-to-NIC matrix NVML does not give (topo -m, docs/facts.md section 6).
    assert f["driver"]["source"] == "nvml"
    assert f["driver"]["nvml"] == {"status": "ok", "error": None, "bindings": "k3fleet"}
    assert [c["argv"][1:] for c in f["commands"] if c["argv"][0].endswith("nvidia-smi")] == [["topo", "-m"]]
    assert f["driver"]["driver_version"] == "580.95.05" and f["driver"]["gpu_count"] == 8
    assert f["driver"]["cuda_driver_version"] == "13.0"
    assert installed(audit, "tb-node02")["nvidia-fabricmanager-580"] == deb_version("580.95.05", fabricmanager=True)
    fm = f["fabricmanager"]
    assert (fm["version"], fm["version_matches_driver"], fm["unit"]["active"]) == ("580.95.05", True, "active")

    found = findings(audit, "tb-node02")
    for check in ("driver.branch", "driver.version_min", "driver.pending_reboot", "fabricmanager.version_match",
                  "fabricmanager.active", "container.cuda_runtime"):
        assert check not in found, found[check]["message"]
    assert audit.verdict["hosts"]["tb-node02"]["driver_version"] == "580.95.05"


def test_r580_open_point_release_host(audit: Audit) -> None:
    f = audit.facts["tb-node03"]
    assert f["driver"]["source"] == "nvml"
    assert f["driver"]["driver_version"] == "580.82.07"
    assert f["driver"]["kernel_module"]["flavour"] == "open"
    assert "Open Kernel Module" in f["driver"]["kernel_module"]["raw"]
    assert installed(audit, "tb-node03")["nvidia-driver-580-server-open"] == deb_version("580.82.07")
    fm = f["fabricmanager"]
    assert (fm["version"], fm["version_matches_driver"]) == ("580.82.07", True)

    found = findings(audit, "tb-node03")
    # 580.82.07 is above the CUDA 13.0 minimum: on the right branch, only behind the fleet's target.
    assert "driver.branch" not in found and "driver.version_min" not in found
    assert "driver.pending_reboot" not in found and "fabricmanager.version_match" not in found


def test_upgraded_without_reboot_is_pending_reboot(audit: Audit) -> None:
    f = audit.facts["tb-node04"]
    # The packages are 580, the loaded module is still 575: NVML (here through k3fleet's binding, no
    # pynvml on this guest) refuses, and so does nvidia-smi, asked next.
    assert f["packages"]["driver_version"] == "580.95.05"
    assert f["driver"]["kernel_module"]["version"] == "575.57.08"
    assert f["driver"]["nvml"]["status"] == "lib_rm_version_mismatch"
    assert f["driver"]["nvml"]["bindings"] == "k3fleet"
    assert "NVMLError_LibRmVersionMismatch" in f["driver"]["nvml"]["error"]
    assert f["driver"]["source"] is None and "nvidia-smi" in f["driver"]["reason"]
    assert not any(name.endswith("-575") or "-575-" in name for name in installed(audit, "tb-node04"))
    fm = f["fabricmanager"]
    assert (fm["version"], fm["driver_version"], fm["version_matches_driver"]) == ("580.95.05", "575.57.08", False)
    assert fm["unit"]["active"] != "active"

    found = findings(audit, "tb-node04")
    pending = found["driver.pending_reboot"]
    assert pending["kind"] == "fail"
    assert pending["evidence"]["package_version"] == "580.95.05"
    assert pending["evidence"]["loaded_version"] == "575.57.08"
    assert found["fabricmanager.version_match"]["kind"] == "fail"
    assert found["driver.branch"]["evidence"]["branch"] == 575
