"""`k3fleet upgrade --check` end to end, with no root and no testbed.

The real change_night.yml runs in check mode through ansible-runner against a lab host whose
driver view is simulated (k3fleet lab) and whose packages are a private, real dpkg/apt state:
real `dpkg-query` (DPKG_ADMINDIR) and the real apt resolver (APT_CONFIG) over the stand-in driver
repository, with the 575 packages installed and held. The Slurm client is a stand-in replaying
recorded scontrol/squeue output (tests/fixtures/slurm/SOURCES.md); the real daemons are covered
in tests/unit/test_slurm_node.py and the system tests.

What it proves: the gate runs a fresh audit, the night plans the canary, the drain and the exact
apt transaction are reported per host, and nothing changes (dpkg state, holds, Slurm, journal).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from k3fleet.change import UpgradeOptions, run_upgrade
from k3fleet.cli import app
from k3fleet.errors import UsageError
from k3fleet.lab.standin import install_pins

# The apt sandbox and the Slurm stand-in come from tests/integration/conftest.py.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("change_tools")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, python_apt: None) -> Path:
    from k3fleet.lab.standin import build_repo

    return build_repo(tmp_path_factory.mktemp("standin") / "repo")


@pytest.fixture
def node(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         apt_sandbox: Callable[[Path, Path], dict[str, str]], slurm_standin: Callable[..., None]) -> dict[str, Any]:
    from k3fleet.lab.fleet import generate_fleet, load_fleet

    sb = tmp_path / "apt"
    for name, value in apt_sandbox(sb, repo).items():
        monkeypatch.setenv(name, value)
    # The play gets a minimal environment (docs/safety.md): these two are passed on by name.
    monkeypatch.setenv("K3FLEET_PASS_ENV", "APT_CONFIG,DPKG_ADMINDIR")

    lab_inv = generate_fleet(load_fleet(None), tmp_path / "lab")
    lab = yaml.safe_load(lab_inv.read_text())["all"]["children"]["lab"]["hosts"]
    host = dict(lab["gpu-a01"])
    # Slurm client stand-in: node01 runs job 1 (recorded output), every call is logged.
    calls = tmp_path / "slurm-calls"
    slurm_standin(host, tmp_path / "bin", calls)
    done = dict(lab["gpu-a03"])  # already on R580: the plan leaves it out
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-a01": host, "gpu-a03": done}}}))
    return {"inventory": inventory, "status": sb / "dpkg/status", "calls": calls, "tmp": tmp_path}


def _selections(status: Path) -> str:
    env = dict(os.environ, DPKG_ADMINDIR=str(status.parent))
    return subprocess.run(["dpkg", "--get-selections"], capture_output=True, text=True, env=env,
                          check=True).stdout


def test_check_reports_drain_and_apt_transaction_and_changes_nothing(node: dict[str, Any]) -> None:
    status_before = node["status"].read_bytes()
    holds_before = _selections(node["status"])
    assert re.search(r"^nvidia-driver-575-server\s+hold$", holds_before, re.M), holds_before
    opts = UpgradeOptions(inventory=node["inventory"], change_id="CHG-1042", operator="alice", canary="gpu-a01",
                          check=True, runs_dir=node["tmp"] / "runs", forks=2)
    result = run_upgrade(opts, ["k3fleet", "upgrade", "--check"])
    assert result.exit_code == 0, (result.message, result.check)
    rep = result.check["gpu-a01"]
    assert rep["drain"]["backend"] == "slurm" and rep["drain"]["decision"] == "drain"
    assert rep["drain"]["actions"] == [
        "scontrol update nodename=node01 state=drain reason='k3fleet:CHG-1042 alice: NVIDIA driver change'",
        "would wait up to 3600s for 1 running job(s): 1"]
    plan = rep["plan"]
    # The audit's plan (the one package planner) names what changes; the role only applies it.
    audit_plan = json.loads((result.run_dir.path / "audit" / "verdict.json").read_text())["plan"]
    item = next(i for i in audit_plan["needs_upgrade"] if i["host"] == "gpu-a01")
    assert sorted(plan["install"]) == sorted(f"{p['to_name']}=580.95.05-*" for p in item["packages"])
    assert set(plan["install"]) == {f"{n}=580.95.05-*" for n in (
        "nvidia-driver-580-server", "nvidia-utils-580-server", "libnvidia-compute-580", "nvidia-fabricmanager-580",
        "cuda-drivers-fabricmanager-580")}
    assert set(plan["remove"]) == {"nvidia-driver-575-server", "nvidia-utils-575-server", "libnvidia-compute-575",
                                   "nvidia-kernel-sim-575", "nvidia-fabricmanager-575",
                                   "cuda-drivers-fabricmanager-575"}
    assert plan["reboot"] is True and plan["loaded_version"] == "575.57.08"
    tx = rep["transaction"]
    assert any(line.startswith("Remv nvidia-driver-575-server [575.57.08-0ubuntu1]") for line in tx), tx
    assert any(line.startswith("Inst nvidia-driver-580-server (580.95.05-0ubuntu1") for line in tx), tx
    assert any(line.startswith("Inst nvidia-fabricmanager-580 (580.95.05-1") for line in tx), tx
    # The rollback kit would be fetched from the repository: every 575 package the node runs, at its exact
    # version (asked with apt-get download --print-uris; nothing fetched).
    kit = rep["rollback_kit"]
    assert kit["made"] is False and kit["path"] == "/var/lib/k3fleet/rollback-kit/CHG-1042"
    assert sorted(kit["fetched"]) == sorted(f"{p.split('=')[0]}:amd64={p.split('=')[1]} from a repository"
                                            for p in install_pins("575.57.08")), kit["fetched"]
    assert all(p["held"] for p in kit["packages"])
    # Nothing changed: dpkg state and holds byte for byte, no Slurm update, no journal line.
    assert node["status"].read_bytes() == status_before
    assert _selections(node["status"]) == holds_before
    calls = node["calls"].read_text().splitlines()
    assert calls and not any(" update " in c for c in calls), calls
    assert not (result.run_dir.path / "journal.jsonl").exists()
    assert json.loads((result.run_dir.path / "check.json").read_text())["gpu-a01"]["plan"]["reboot"] is True
    assert result.change["done"] == ["gpu-a03"]
    # The preflight ran before the drain and found nothing: the repository offers every package at the target.
    pre = rep["preflight"]
    assert pre["problems"] == [] and pre["repository"]["missing"] == [], pre
    assert sorted(n for n, _v in pre["repository"]["wanted"]) == sorted(
        i.split("=")[0] for i in plan["install"])
    assert all(d["available_mb"] is not None for d in pre["disk"]), pre["disk"]


def test_check_through_the_command_line(node: dict[str, Any]) -> None:
    res = CliRunner().invoke(app, ["upgrade", "-i", str(node["inventory"]), "--change-id", "CHG-7", "--operator",
                                   "bob", "--canary", "gpu-a01", "--check", "--runs-dir", str(node["tmp"] / "runs"),
                                   "--quiet"])
    assert res.exit_code == 0, res.output
    assert "gpu-a01 (canary)" in res.output
    assert "drain   (slurm): scontrol update nodename=node01 state=drain reason='k3fleet:CHG-7 bob:" in res.output
    assert "Remv nvidia-driver-575-server" in res.output
    assert "reboot   yes, loaded 575.57.08" in res.output
    # The same preflight the night runs before the drain, per host.
    assert "preflight ok: GPU holders none; MIG none; free /var/cache/apt/archives " in res.output, res.output
    assert "target versions offered;" in res.output, res.output
    assert "rollback kit /var/lib/k3fleet/rollback-kit/CHG-7: 6 package(s) to fetch" in res.output
    assert "    nvidia-driver-575-server:amd64=575.57.08-0ubuntu1 from a repository" in res.output
    assert "rollback kit: on, staged on each host before its first change" in res.output
    # The verify steps the night would run after the reboot, and the canary's pair test or why not.
    assert "verify   container CUDA probe on; all_reduce_perf within the node where installed" in res.output, res.output
    assert "NCCL pair test " in res.output, res.output


def test_an_unresolvable_target_version_blocks_the_host_in_the_preflight_before_any_drain(
        node: dict[str, Any]) -> None:
    # 580.65.06 is a real R580 release (docs/facts.md section 2) that the stand-in repository does not carry:
    # the night's preflight asks the real apt-cache (the sandbox's index) and blocks the canary before its slot,
    # its drain or any package step; the rescue journals it (in check mode: nothing) and stops the host.
    status_before = node["status"].read_bytes()
    opts = UpgradeOptions(inventory=node["inventory"], change_id="CHG-1043", operator="alice", canary="gpu-a01",
                          check=True, target_version="580.65.06", runs_dir=node["tmp"] / "runs", forks=2)
    result = run_upgrade(opts, ["k3fleet", "upgrade", "--check"])
    assert result.exit_code == 1
    error = result.check["gpu-a01"]["error"]
    assert error.startswith("failed: Block the node when the preflight found a problem:"), error
    assert "[repository.target] the repository does not offer" in error, error
    assert "nvidia-driver-580-server=580.65.06" in error, error
    assert "(offered: cuda-drivers-fabricmanager-580 580.95.05-1;" in error, error  # what it does offer
    events = [json.loads(x) for x in (result.run_dir.path / "events.jsonl").read_text().splitlines()]
    tasks = [e["event_data"].get("task") for e in events if e["event"] == "runner_on_ok"]
    for expected in ("Journal the failure", "Decide what the rollback must undo"):
        assert expected in tasks, (expected, tasks)
    # Blocked before the slot: no drain (not even simulated), no package step, nothing to roll back.
    for never in ("Take a slot and journal the node's snapshot", "Journal the drain",
                  "Simulate the package transaction", "Decide what the rollback needs", "Journal the rollback"):
        assert never not in tasks, (never, tasks)
    calls = node["calls"].read_text().splitlines()
    assert not any(" update " in c for c in calls), calls
    assert node["status"].read_bytes() == status_before
    assert not (result.run_dir.path / "journal.jsonl").exists()


@pytest.mark.parametrize(("kw", "message"), [
    ({"change_id": "bad id"}, "--change-id 'bad id' is not valid"),
    ({"operator": " "}, "--operator ' ' is not valid"),
    ({"canary": "gpu-a03"}, "--canary gpu-a03 is not a host the audit plans to upgrade"),
    ({"max_unavailable": "0"}, "--max-unavailable '0': give a number of nodes"),
    ({"max_unavailable": "150%"}, "--max-unavailable '150%'"),
    ({"accept_findings": ["*"]}, "--accept-finding '*' would accept every finding"),
    ({"accept_findings": ["rdma.no_such_check"]}, "--accept-finding 'rdma.no_such_check' matches no known check"),
    ({"failure_budget": -1}, "--failure-budget must be 0 or more"),
])
def test_bad_input_is_refused_before_anything_runs(node: dict[str, Any], kw: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"inventory": node["inventory"], "change_id": "CHG-1", "operator": "alice",
                            "check": True, "runs_dir": node["tmp"] / "runs"}
    args.update(kw)
    with pytest.raises(UsageError, match=re.escape(message)):
        run_upgrade(UpgradeOptions(**args), ["k3fleet"])


# -- k3_drain's Kubernetes backend against kmock's API emulator ---------------------------------
# The emulator keeps Nodes and applies JSON merge patches (cordon, annotations) like an API server;
# it has no eviction subresource, so evictions are not exercised here (the collection's roles/k3_drain/README.md).

KMOCK_SERVER = """
import asyncio
import kmock

async def main():
    async with kmock.KubernetesEmulator() as k8s, kmock.Server(k8s) as srv:
        print(srv.port, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""

K8S_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: k3fleet.gpu.k3_drain
      vars:
        k3_drain_backend: kubernetes
        k3_drain_k8s_evict: false
        k3_drain_timeout: 60
    - ansible.builtin.debug:
        var: k3_drain_result
"""


@pytest.fixture
def kube(tmp_path: Path) -> Any:
    pytest.importorskip("kmock")
    import sys

    import httpx

    server = subprocess.Popen([sys.executable, "-c", KMOCK_SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().strip())
        api = f"http://127.0.0.1:{port}"
        for name, spec, annotations in (("gpu-k01", {}, {}),
                                        ("gpu-k02", {"unschedulable": True}, {"ops/reason": "NIC swap"})):
            r = httpx.post(f"{api}/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "annotations": annotations}, "spec": spec})
            assert r.status_code in (200, 201), r.text
        inventory = tmp_path / "k8s.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {
            h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "k3fleet_k8s_api": api}
            for h in ("gpu-k01", "gpu-k02")}}}))
        play = tmp_path / "k8s_drain.yml"
        play.write_text(K8S_PLAY)
        yield {"api": api, "inventory": inventory, "play": play, "tmp": tmp_path}
    finally:
        server.kill()
        server.wait(10)


def _k8s_run(kube: dict[str, Any], state: str, check: bool = False, change_id: str = "CHG-9"
             ) -> dict[str, dict[str, Any]]:
    from k3fleet.audit.runner import run_playbook
    from k3fleet.change.lease import DRAIN_TEXT, Lease

    # The lease as the controller builds it and hands it in: the role never rebuilds it.
    lease = Lease.build(change_id, "carol", DRAIN_TEXT, ttl_s=3600)
    play = run_playbook(str(kube["play"]), kube["inventory"], kube["tmp"] / f"ansible-{state}-{check}-{change_id}",
                        extravars={"k3_drain_state": state, "k3fleet_lease": lease.extravar()}, check=check, forks=2)
    assert play.status == "successful", (play.stderr_tail, {h: play.last(h) for h in play.hosts})
    return {h: o.result["k3_drain_result"] for h, outs in play.hosts.items() for o in outs
            if o.result and "k3_drain_result" in o.result}


def _node(kube: dict[str, Any], name: str) -> dict[str, Any]:
    import httpx

    data: dict[str, Any] = httpx.get(f"{kube['api']}/api/v1/nodes/{name}").json()
    return data


def test_kubernetes_cordon_and_uncordon_only_ours(kube: dict[str, Any]) -> None:
    res = _k8s_run(kube, "drained", check=True)
    assert res["gpu-k01"]["decision"] == "drain"
    assert _node(kube, "gpu-k01")["spec"].get("unschedulable") in (None, False), "check mode cordoned the node"

    res = _k8s_run(kube, "drained")
    assert (res["gpu-k01"]["decision"], res["gpu-k01"]["drained_by_us"]) == ("drain", True)
    assert (res["gpu-k02"]["decision"], res["gpu-k02"]["drained_by_us"]) == ("other", False)
    node = _node(kube, "gpu-k01")
    assert node["spec"]["unschedulable"] is True
    annotations = node["metadata"]["annotations"]
    assert annotations["k3fleet.io/drain"] == "k3fleet:CHG-9 carol: NVIDIA driver change"
    assert annotations["k3fleet.io/lease-expires"] > time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    again = _k8s_run(kube, "drained")
    assert again["gpu-k01"]["decision"] == "ours" and again["gpu-k01"]["changed"] is False

    # Another change finds the node leased: held, never cordoned, evicted or uncordoned by it.
    other = _k8s_run(kube, "drained", change_id="CHG-10")
    assert (other["gpu-k01"]["decision"], other["gpu-k01"]["holder"]) == ("held", "CHG-9")
    assert other["gpu-k01"]["drained_by_us"] is False and other["gpu-k01"]["changed"] is False
    assert _k8s_run(kube, "returned", change_id="CHG-10")["gpu-k01"]["decision"] == "not_ours"
    assert _node(kube, "gpu-k01")["metadata"]["annotations"]["k3fleet.io/drain"].startswith("k3fleet:CHG-9 ")

    res = _k8s_run(kube, "returned")
    assert (res["gpu-k01"]["decision"], res["gpu-k02"]["decision"]) == ("resume", "not_ours")
    node = _node(kube, "gpu-k01")
    assert node["spec"]["unschedulable"] is False
    assert not {"k3fleet.io/drain", "k3fleet.io/lease-expires"} & set(node["metadata"]["annotations"])
    other = _node(kube, "gpu-k02")
    assert other["spec"]["unschedulable"] is True and other["metadata"]["annotations"] == {"ops/reason": "NIC swap"}
    assert _k8s_run(kube, "returned")["gpu-k01"]["decision"] == "not_drained"


K8S_MARK_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: k3fleet.gpu.k3_drain
        tasks_from: mark
      vars:
        k3_drain_backend: kubernetes
    - ansible.builtin.debug:
        var: k3_drain_mark_result
"""


def test_kubernetes_validated_label_set_after_verify_and_taken_off_by_rollback(kube: dict[str, Any]) -> None:
    from k3fleet.audit.runner import run_playbook

    play_file = kube["tmp"] / "k8s_mark.yml"
    play_file.write_text(K8S_MARK_PLAY)

    def mark(how: str, driver: str = "") -> dict[str, Any]:
        play = run_playbook(str(play_file), kube["inventory"], kube["tmp"] / f"ansible-mark-{how}", limit="gpu-k01",
                            extravars={"k3_drain_mark": how, "k3_drain_mark_driver": driver}, forks=1)
        assert play.status == "successful", (play.stderr_tail, play.last("gpu-k01"))
        return next(o.result["k3_drain_mark_result"] for o in play.hosts["gpu-k01"]
                    if o.result and "k3_drain_mark_result" in o.result)

    res = mark("validated", "580.95.05")
    assert res["marker"] == "k3fleet.io/validated=580.95.05"
    assert _node(kube, "gpu-k01")["metadata"]["labels"]["k3fleet.io/validated"] == "580.95.05"
    assert "k3fleet.io/validated" not in (_node(kube, "gpu-k02")["metadata"].get("labels") or {})
    mark("unvalidated")
    assert "k3fleet.io/validated" not in (_node(kube, "gpu-k01")["metadata"].get("labels") or {})
