"""The change night's preflight before a drain (module_utils/k3fleet_preflight.py, docs/change-night.md
"Preflight"): an unloadable driver module, a full disk, an unresolvable target version, missing kernel
headers when DKMS builds, MIG instances and an old NVIDIA Container Toolkit each block the host; a node
without them passes. Fixtures: tests/unit/fixtures/preflight/SOURCES.md in the collection."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_preflight as pf
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.tests.unit.plugins.nodes import FIXTURES

MADISON = (FIXTURES / "preflight" / "apt_cache_madison_standin.txt").read_text()
FULL = json.loads((FIXTURES / "preflight" / "statvfs_full_tmpfs.json").read_text())
CTK = (FIXTURES / "container" / "nvidia_ctk_version_ctk50.txt").read_text()
SLURM_STEP = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"
K8S_POD = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5e7c.slice/cri-containerd-9a1f.scope"
SESSION = "0::/user.slice/user-1000.slice/session-4.scope"
WANT = [["nvidia-driver-580-server", "580.95.05"], ["nvidia-fabricmanager-580", "580.95.05"],
        ["cuda-drivers-fabricmanager-580", "580.95.05"]]
POLICY = {"min_free_mb": 2048, "packages": WANT, "min_container_toolkit": "1.17.8",
          "min_container_toolkit_source": "CVE-2025-23266 affects nvidia-container-toolkit <= 1.17.7"}


class _Stat:
    def __init__(self, **fields: int) -> None:
        self.__dict__.update(fields)


def _roomy(_path: str) -> _Stat:
    # A filesystem with 40 GiB available, in the recorded statvfs's units.
    return _Stat(**dict(FULL, f_bavail=10 * 1024 * 1024, f_bfree=10 * 1024 * 1024, f_blocks=20 * 1024 * 1024))


def _node(tmp_path: Path, holders: list[tuple[int, str, str, list[str]]], *, headers: bool = True,
          mig: dict[str, list[str]] | None = None) -> NodeReader:
    root = tmp_path / "root"
    for pid, comm, cgroup, devices in holders:
        d = root / "proc" / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
        (d / "cgroup").write_text(cgroup + "\n")
        for n, dev in enumerate([*devices, "/dev/null"], start=3):
            os.symlink(dev, d / "fd" / str(n))
    (root / "proc" / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text("6.1.0-28-amd64\n")
    if headers:
        (root / "lib" / "modules" / "6.1.0-28-amd64" / "build").mkdir(parents=True)
    for gpu, gis in (mig or {}).items():
        for gi in gis:
            (root / "proc" / "driver" / "nvidia" / "capabilities" / gpu / "mig" / gi).mkdir(parents=True)
    for p in ("var/cache/apt/archives", "var/lib", "usr/lib/modules"):
        (root / p).mkdir(parents=True, exist_ok=True)
    # No commands on the path: systemctl, apt-cache and nvidia-ctk are judged from recorded text below.
    (tmp_path / "bin").mkdir(exist_ok=True)
    return NodeReader(root=str(root), path=str(tmp_path / "bin"))


def _facts(reader: NodeReader, *, dkms: bool = False, statvfs: Any = _roomy, madison: str = MADISON,
           want: list[list[str]] | None = None, ctk: str | None = None) -> dict[str, Any]:
    want = WANT if want is None else want
    facts = pf.collect(reader, [], pf_paths(), dkms, statvfs=statvfs)
    rows = pf.parse_madison(madison)
    facts["repository"] = {"wanted": want, "missing": [w for w in want if not pf.offered(rows, w[0], w[1])],
                           "offered": [f"{r[0]} {r[1]}" for r in rows]}
    if ctk is not None:
        m = pf._CTK_VERSION.search(ctk)
        facts["toolkit"] = {"version": m.group(1) if m else None, "line": ctk.splitlines()[0]}
    return facts


def pf_paths() -> list[str]:
    return ["/var/cache/apt/archives", "/var/lib/dkms", "/usr/lib/modules"]


def _checks(problems: list[dict[str, str]]) -> list[str]:
    return [p["check"] for p in problems]


def test_a_fit_node_passes_and_the_scheduler_jobs_and_gpu_services_do_not_block(tmp_path: Path) -> None:
    reader = _node(tmp_path, [(812, "nvidia-persiste", "0::/system.slice/nvidia-persistenced.service",
                               ["/dev/nvidiactl"]),
                              (900, "nv-hostengine", "0::/system.slice/nvidia-dcgm.service",
                               ["/dev/nvidiactl", "/dev/nvidia0"]),
                              (1201, "python3", SLURM_STEP, ["/dev/nvidia0", "/dev/nvidia-uvm"]),
                              (1301, "vllm", K8S_POD, ["/dev/nvidia1"])])
    facts = _facts(reader, ctk=CTK)
    kinds = {h["pid"]: h["kind"] for h in facts["holders"]}
    # The kernel keeps 15 characters of a name: nvidia-persistenced is "nvidia-persiste" in /proc/PID/comm.
    assert kinds == {812: "service", 900: "service", 1201: "job", 1301: "job"}
    assert facts["holders"][2]["devices"] == ["/dev/nvidia-uvm", "/dev/nvidia0"]
    assert pf.judge(facts, dict(POLICY, min_container_toolkit="1.12.0")) == []
    # The same node with a persistence daemon started by hand under a login session: not a service the night
    # knows by its unit, yet known by its name, so it still passes; a python3 there does not.
    assert pf.classify_holder("nvidia-persiste", SESSION) == "service"
    assert pf.classify_holder("python3", SESSION) == "other"


def test_a_process_outside_jobs_and_services_holding_a_gpu_blocks_the_host(tmp_path: Path) -> None:
    reader = _node(tmp_path, [(900, "nvidia-persiste", "0::/system.slice/nvidia-persistenced.service",
                               ["/dev/nvidiactl"]),
                              (4242, "python3", SESSION, ["/dev/nvidia3", "/dev/nvidiactl"]),
                              (4243, "python3", SLURM_STEP, ["/dev/nvidia0"])])
    problems = pf.judge(_facts(reader), POLICY)
    assert _checks(problems) == ["module.in_use"]
    found = problems[0]["found"]
    assert found.startswith("the driver cannot be unloaded: pid 4242 (python3) hold /dev/nvidia3, /dev/nvidiactl")
    assert "4243" not in found and "stop them" in problems[0]["fix"]


def test_a_full_disk_blocks_the_host(tmp_path: Path) -> None:
    reader = _node(tmp_path, [])
    facts = _facts(reader, statvfs=lambda _p: _Stat(**FULL), dkms=True)
    assert [d["available_mb"] for d in facts["disk"]] == [0, 0, 0]
    # /var/lib/dkms does not exist yet: measured on its parent's filesystem.
    assert facts["disk"][1]["measured"] == "/var/lib"
    problems = pf.judge(facts, POLICY)
    assert _checks(problems) == ["disk.free"] * 3
    assert problems[0]["found"] == ("0 MB free under /var/cache/apt/archives (/var/cache/apt/archives), need at "
                                    "least 2048 MB for the packages and a DKMS build")


def test_an_unresolvable_target_version_blocks_the_host(tmp_path: Path) -> None:
    # 580.65.06 is a real R580 release (docs/facts.md section 2) the recorded repository does not offer.
    want = [["nvidia-driver-580-server", "580.65.06"], ["nvidia-fabricmanager-580", "580.65.06"]]
    facts = _facts(_node(tmp_path, []), want=want)
    problems = pf.judge(facts, dict(POLICY, packages=want))
    assert _checks(problems) == ["repository.target"]
    assert problems[0]["found"].startswith("the repository does not offer nvidia-driver-580-server=580.65.06, "
                                           "nvidia-fabricmanager-580=580.65.06 (offered: nvidia-driver-580-server "
                                           "580.95.05-0ubuntu1; nvidia-driver-580-server 580.82.07-0ubuntu1;")


@pytest.mark.parametrize(("row", "name", "version", "expected"), [
    ("nvidia-driver-580-server | 580.95.05-0ubuntu1 | file:/srv/repo ./ Packages", "nvidia-driver-580-server",
     "580.95.05", True),
    ("nvidia-fabricmanager-580 | 1:580.95.05-1 | x", "nvidia-fabricmanager-580", "580.95.05", True),
    # Another point release, another package, a longer version that only starts like the target.
    ("nvidia-driver-580-server | 580.82.07-0ubuntu1 | x", "nvidia-driver-580-server", "580.95.05", False),
    ("nvidia-driver-580-server-open | 580.95.05-0ubuntu1 | x", "nvidia-driver-580-server", "580.95.05", False),
    ("nvidia-driver-580-server | 580.95.051-0ubuntu1 | x", "nvidia-driver-580-server", "580.95.05", False),
])
def test_offered_matches_the_exact_upstream_version(row: str, name: str, version: str, expected: bool) -> None:
    assert pf.offered(pf.parse_madison(row), name, version) is expected


def test_missing_headers_block_only_when_dkms_builds(tmp_path: Path) -> None:
    reader = _node(tmp_path, [], headers=False)
    assert pf.judge(_facts(reader, dkms=False), POLICY) == []
    problems = pf.judge(_facts(reader, dkms=True), POLICY)
    assert _checks(problems) == ["kernel.headers"]
    assert "/lib/modules/6.1.0-28-amd64/build missing" in problems[0]["found"]
    assert problems[0]["fix"].startswith("install linux-headers-6.1.0-28-amd64")


def test_mig_instances_block_unless_allowed(tmp_path: Path) -> None:
    reader = _node(tmp_path, [], mig={"gpu0": ["gi1", "gi2"]})
    facts = _facts(reader)
    assert facts["mig"] == {"gpu0": ["gi1", "gi2"]}
    assert _checks(pf.judge(facts, POLICY)) == ["module.mig"]
    assert pf.judge(facts, dict(POLICY, allow_mig=True)) == []


def test_an_old_container_toolkit_blocks_with_its_source(tmp_path: Path) -> None:
    problems = pf.judge(_facts(_node(tmp_path, []), ctk=CTK), POLICY)
    assert _checks(problems) == ["container.toolkit"]
    assert problems[0]["found"] == ("NVIDIA Container Toolkit 1.12.0 (NVIDIA Container Toolkit CLI version 1.12.0), "
                                    "need 1.17.8 or newer (CVE-2025-23266 affects nvidia-container-toolkit <= 1.17.7)")


def test_systemctl_show_is_read_unit_by_unit() -> None:
    text = ("Id=nvidia-persistenced.service\nActiveState=active\nMainPID=812\n\n"
            "Id=nvidia-dcgm.service\nActiveState=inactive\nMainPID=0\n")
    assert pf.parse_systemctl_show(text) == [{"unit": "nvidia-persistenced.service", "active": "active"},
                                             {"unit": "nvidia-dcgm.service", "active": "inactive"}]
