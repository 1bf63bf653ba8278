"""Other tenants' CUDA work before the driver change (docs/facts.md section 16).

Parsers on the fixtures of tests/fixtures/workloads (SOURCES.md says how each was derived), the
collector against a real node tree with a replaying runtime, the judgement as a table, and the lab
hosts with a forward-compat training job, a CUDA 12.4 container and a CUDA 12.8 server, through the
real collectors, verdict and plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from labfleet import lab_fleet_verdict

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_packages import classify_package
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_workloads import (
    collect_workloads,
    container_of_cgroup,
    parse_container_ids,
    parse_containers_inspect,
    parse_maps,
)
from k3fleet.models.facts import CompatPackage, TenantContainer, TenantProcess, WorkloadFacts
from k3fleet.targets import load_target
from k3fleet.verdict.rules import CompiledTarget
from k3fleet.verdict.tenants import judge_tenants
from tests.unit.nodetree import fake_command, fixtures, node

_, fixture = fixtures("workloads")
TRAIN = "309864aec6999a436aebdc10af1891219773108195de9f3a65fb02c2c860f669"
EMBED = "2b47521b08bcbe6016ae012c6563ab917a874287d86c83e4e21a71bf35824dd9"


def test_container_ids_skip_noise_and_repeats() -> None:
    text = f"{TRAIN}\n\n{EMBED}\nWARNING: something\n{TRAIN}\n"
    assert parse_container_ids(text) == [TRAIN, EMBED]


def test_inspect_reads_cuda_compat_and_gpu_use() -> None:
    found, problem = parse_containers_inspect(fixture("docker_container_inspect.json"))
    assert problem is None
    train, embed, exporter = found
    assert train["name"] == "train-llama" and train["pid"] == 52110 and train["uses_gpu"] is True
    assert train["cuda_version"] == "12.9.0" and train["compat_package"] == "cuda-compat-12-9"
    assert train["compat_on_path"] == "/usr/local/cuda-12.9/compat"
    assert train["nvidia_require_cuda"].startswith("cuda>=12.9 brand=unknown")
    # The nvidia runtime with NVIDIA_VISIBLE_DEVICES=all gives GPUs; its compat package is not on the path.
    assert embed["uses_gpu"] is True and embed["compat_on_path"] is None
    assert exporter["uses_gpu"] is False and exporter["cuda_version"] is None


@pytest.mark.parametrize("text", ["not json", "{}", "[1, 2]"])
def test_inspect_garbage_is_a_problem_or_nothing(text: str) -> None:
    found, problem = parse_containers_inspect(text)
    assert found == []
    assert (problem is None) == (text == "[1, 2]")


def test_cgroup_names_the_container_in_v1_and_v2() -> None:
    ids = {TRAIN, EMBED}
    assert container_of_cgroup(fixture("proc_cgroup_docker_v2.txt"), ids) == TRAIN
    assert container_of_cgroup(fixture("proc_cgroup_v1.txt"), ids) == EMBED
    assert container_of_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n", ids) is None


def test_maps_show_the_compat_libcuda() -> None:
    got = parse_maps(fixture("proc_maps_compat.txt"))
    assert got == {"libcuda": "/usr/local/cuda-12.9/compat/libcuda.so.575.57.08", "libcuda_version": "575.57.08",
                   "libcuda_compat": True, "cudart_version": "12.9.37"}
    plain = parse_maps("7f00-7f10 r-xp 0 103:02 1 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05\n")
    assert plain["libcuda_compat"] is False and plain["libcuda_version"] == "580.95.05"


def test_cuda_compat_package_is_classified_with_its_branch() -> None:
    assert classify_package("cuda-compat-12-9") == {"role": "compat", "branch": None, "flavour": None}


def _driver(pids: list[int] | None) -> dict[str, Any]:
    procs = None if pids is None else [{"pid": p, "name": "python", "used_memory_mib": 1024} for p in pids]
    return {"status": "ok", "gpus": [{"index": 0, "processes": procs}]}


def test_collector_joins_processes_to_containers(tmp_path: Path) -> None:
    reader = node(tmp_path, {
        "/proc/52110/cgroup": fixture("proc_cgroup_docker_v2.txt"),
        "/proc/52110/maps": fixture("proc_maps_compat.txt"),
    })
    fake_command(tmp_path / "bin", "docker", [
        ("'ps --quiet --no-trunc'", f"{TRAIN}\n{EMBED}\n", "", 0),
        (f"'container inspect {TRAIN} {EMBED}'", fixture("docker_container_inspect.json"), "", 0),
    ])
    packages = {"status": "ok", "packages": [
        {"name": "cuda-compat-12-9", "version": "575.57.08-0ubuntu1", "role": "compat", "branch": "575"}]}
    out = collect_workloads(reader, {"runtime": {"name": "docker"}}, _driver([52110, 7001]), packages)
    assert out["status"] == "ok", out["reason"]
    train = out["containers"][0]
    assert train["gpu_pids"] == [52110]
    p7001, p52110 = out["processes"]  # by pid
    assert p52110["container_id"] == TRAIN and p52110["libcuda_compat"] is True
    # A process whose /proc files cannot be read is listed as such, not guessed.
    assert p7001["container_id"] is None and p7001["maps_read"] is False
    assert out["compat_packages"] == [{"name": "cuda-compat-12-9", "version": "575.57.08-0ubuntu1", "branch": "575"}]


def test_collector_says_what_it_could_not_read(tmp_path: Path) -> None:
    reader = node(tmp_path)
    fake_command(tmp_path / "bin", "docker", [("ps*", "", "Cannot connect to the Docker daemon", 1)])
    out = collect_workloads(reader, {"runtime": {"name": "docker"}}, _driver(None), {"status": "ok"})
    assert out["status"] == "unknown"
    assert "docker ps --quiet --no-trunc: exit 1" in out["reason"]
    assert "compute processes were not read" in out["reason"]


def test_no_runtime_and_no_processes_is_a_clean_answer(tmp_path: Path) -> None:
    out = collect_workloads(node(tmp_path), {"runtime": None}, _driver([]), {"status": "ok", "packages": []})
    assert out == {"status": "ok", "reason": None, "containers": [], "processes": [], "compat_packages": []}


def _judge(w: WorkloadFacts) -> list[tuple[str, str]]:
    ct = CompiledTarget(load_target(None))
    return [(t.who, t.outcome) for t in judge_tenants(w, ct.branch, ct.target_max_cuda, ct.compat_branch)]


@pytest.mark.parametrize(("container", "process", "outcome"), [
    # CUDA 12.x user space on R580: backward compatible, even with NVIDIA's compat package unused.
    (TenantContainer(name="a", cuda_version="12.4.1", compat_package="cuda-compat-12-4"), None, "keeps"),
    (TenantContainer(name="a", nvidia_require_cuda="cuda>=12.8 brand=tesla,driver>=535,driver<536"), None, "keeps"),
    # The R575 compat libcuda on the library path, or loaded: error 803 on the R580 kernel module.
    (TenantContainer(name="a", cuda_version="12.9.0", compat_package="cuda-compat-12-9",
                     compat_on_path="/usr/local/cuda-12.9/compat"), None, "breaks"),
    (TenantContainer(name="a", cuda_version="12.9.0", gpu_pids=[9]),
     TenantProcess(pid=9, container_id="x", libcuda="/usr/local/cuda-12.9/compat/libcuda.so.575.57.08",
                   libcuda_version="575.57.08", libcuda_compat=True), "breaks"),
    # A compat package newer than the target (R590's for CUDA 13.1) is forward compatibility that works.
    (TenantContainer(name="a", cuda_version="13.0.2", compat_package="cuda-compat-13-1",
                     compat_on_path="/usr/local/cuda-13.1/compat"), None, "keeps"),
    # Asking for more CUDA than R580 has breaks; asking for nothing readable is unknown.
    (TenantContainer(name="a", nvidia_require_cuda="cuda>=13.1"), None, "breaks"),
    (TenantContainer(name="a", uses_gpu=True), None, "unknown"),
])
def test_container_judgement(container: TenantContainer, process: TenantProcess | None, outcome: str) -> None:
    w = WorkloadFacts(status="ok", containers=[container], processes=[process] if process else [])
    assert _judge(w) == [("container a (image ?)", outcome)]


def test_containers_without_gpus_are_not_tenants_and_bare_processes_are_judged() -> None:
    w = WorkloadFacts(status="ok", containers=[TenantContainer(name="exporter", uses_gpu=False)], processes=[
        TenantProcess(pid=1, gpus=[0], libcuda="/usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08",
                      libcuda_version="575.57.08", libcuda_compat=False, cudart_version="12.6.77", maps_read=True),
        TenantProcess(pid=2, gpus=[1], maps_read=False),
    ], compat_packages=[CompatPackage(name="cuda-compat-12-9", version="575.57.08-0ubuntu1", branch="575"),
                        CompatPackage(name="cuda-compat-13-1", version="590.44.01-0ubuntu1", branch="590")])
    assert [o for _, o in _judge(w)] == ["keeps", "unknown", "breaks"]


@pytest.fixture(scope="module")
def tenant_lab(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return lab_fleet_verdict(tmp_path_factory.mktemp("tenants"), "description: tenants\nhosts:\n"
                             "  t01: {profile: h200-r575-compat-tenant}\n"
                             "  t02: {profile: h200-r575-busy}\n"
                             "  t03: {profile: h200-r575}\n")


def test_lab_forward_compat_tenant_blocks_its_host(tenant_lab: Any) -> None:
    v = tenant_lab
    found = [f for f in v.hosts["t01"].findings if f.check_id == "workloads.cuda_compat"]
    assert len(found) == 1 and found[0].kind == "fail" and found[0].blocking
    outcomes = {t["who"]: t["outcome"] for t in found[0].evidence["tenants"]}
    assert outcomes == {"container train-llama (image nvcr.io/nvidia/pytorch:25.04-py3)": "breaks",
                        "container embed-server (image nvidia/cuda:12.4.1-runtime-ubuntu22.04)": "keeps",
                        "host package cuda-compat-12-9": "breaks"}
    assert "error 803" in found[0].message
    blocked = {b.host: b.check_ids for b in v.plan.blocked}
    assert blocked["t01"] == ["workloads.cuda_compat"]


def test_lab_plan_says_who_keeps_working(tenant_lab: Any) -> None:
    v = tenant_lab
    notes = {i.host: i.notes for i in v.plan.needs_upgrade}
    assert any("keep working: container team-b-llm" in n for n in notes["t02"])
    assert not any(f.check_id == "workloads.cuda_compat" for f in v.hosts["t02"].findings)
    # An idle host without tenants has nothing to say about them.
    assert not any("tenants" in n for n in notes["t03"])
    assert not any(f.check_id == "workloads.cuda_compat" for f in v.hosts["t03"].findings)
