"""Container collector against recorded runtime, inspect and failure outputs.

Sources of every fixture: tests/fixtures/container/SOURCES.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nodetree import fixtures, replay_steps

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_container import (
    collect_container,
    parse_ctk_version,
    parse_image_inspect,
    parse_runtime_version,
    toolkit_version_from_packages,
    vllm_version_from_config,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_probe import (
    classify_probe_failure,
    parse_probe_output,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_sources import PROBE_MARKER, PROBE_SCRIPT
from k3fleet.models.facts import ContainerFacts

FIX, fixture = fixtures("container")
IMAGE = "vllm/vllm-openai:kimi-k3"


def marker_line(**fields: object) -> str:
    """The line PROBE_SCRIPT prints, built the way it builds it."""
    out = {"cuda_init": False, "visible_gpus": 0, "torch_cuda": None, "error": None}
    out.update(fields)
    return PROBE_MARKER + " " + json.dumps(out) + "\n"


Reply = tuple[str | None, str | None, int, float]  # stdout file, stderr file, rc, sleep seconds


def _branch(reply: Reply) -> str:
    return "; ".join(replay_steps(*reply))


def fake_runtime(bin_dir: Path, name: str, version_file: str, inspect: Reply | None = None,
                 run: Reply | None = None) -> None:
    lines = ["#!/bin/sh", 'case "$1" in', f"  --version) /bin/cat '{FIX / version_file}'; exit 0;;"]
    if inspect:
        lines.append(f"  image) {_branch(inspect)};;")
    if run:
        lines.append(f"  run) {_branch(run)};;")
    lines += ['  *) echo "unexpected: $*" >&2; exit 99;;', "esac"]
    path = bin_dir / name
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)


def fake_ctk(bin_dir: Path) -> None:
    path = bin_dir / "nvidia-ctk"
    path.write_text(f"#!/bin/sh\n/bin/cat '{FIX / 'nvidia_ctk_version_ctk50.txt'}'\n")
    path.chmod(0o755)


def fx(name: str) -> str:
    return str(FIX / name)


@pytest.fixture()
def bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def reader_for(tmp_path: Path, bin_dir: Path, timeout: float = 60.0) -> NodeReader:
    # Far beyond what a replay takes: only the tests about timeouts (which pass their own) may time
    # out; a busy machine once stalled a 5 s replay of squeue past its timeout.
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return NodeReader(root=str(root), path=str(bin_dir), timeout=timeout)


# -- pure parsers ----------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("docker_version.txt", "28.2.2"),
    ("podman_version_debian12.txt", "4.3.1"),
    ("nerdctl_version.txt", "1.7.6"),
    ("nvidia_ctk_version_ctk50.txt", "1.12.0"),
])
def test_parse_runtime_version(name: str, expected: str) -> None:
    assert parse_runtime_version(fixture(name)) == expected


@pytest.mark.parametrize("text", ["", "Docker version", "command not found"])
def test_parse_runtime_version_garbage(text: str) -> None:
    assert parse_runtime_version(text) is None


def test_parse_ctk_version() -> None:
    assert parse_ctk_version(fixture("nvidia_ctk_version_ctk50.txt")) == "1.12.0"
    assert parse_ctk_version(fixture("docker_version.txt")) is None


@pytest.mark.parametrize("packages, expected", [
    ({"packages": [{"name": "nvidia-container-toolkit", "version": "1.17.8-1"}]}, "1.17.8"),
    ({"packages": [{"name": "nvidia-container-toolkit-base", "version": "1.12.0-1"}]}, "1.12.0"),
    ({"packages": [{"name": "libnvidia-container1", "version": "1.17.8-1"}]}, None),
    ({}, None),
    (None, None),
])
def test_toolkit_version_from_packages(packages: dict | None, expected: str | None) -> None:
    assert toolkit_version_from_packages(packages)[0] == expected


@pytest.mark.parametrize("name, ref, expected", [
    ("docker_inspect_cuda12_opticks.json", "simoncblyth/cuda:12.4.1-runtimeplus-rockylinux9", {
        "present": True,
        "id": "sha256:8c10f253f281986904bef377325f49fe794d780a133cb6e784a289ba4ed114fd",
        "digest": None, "cuda_version": "12.4.1", "vllm_version": None}),
    ("docker_inspect_vllm_v0.23.0.json", "vllm/vllm-openai:v0.23.0", {
        "present": True,
        "id": "sha256:f37691f675bb82f734f606de8af90e777d3f80a20b120e699fd43fd10e60b8d7",
        "digest": "sha256:6d8429e38e3747723ca07ee1b17972e09bb9c51c4032b266f24fb1cc3b22ed8f",
        "cuda_version": "13.0.2", "vllm_version": "0.23.0", "vllm_version_source": "env VLLM_IMAGE_TAG"}),
    ("podman_inspect_coreos_assembler_3761.json", "quay.io/coreos-assembler/coreos-assembler:latest", {
        "present": True, "id": "d2ea57bd6dbaeedca3c715d93554ea8437df068c9a06298d612ee80f83068dcb",
        "digest": "sha256:e4092afc3560bbc5b07c809082a4e526bfa1b6d545c1d276d3298f3b6b416754",
        "cuda_version": None, "nvidia_require_cuda": None, "vllm_version": None}),
    ("podman_inspect_lab_debian12.json", "localhost/k3lab/cuda-env:13.0.2", {
        "present": True, "id": "06d633a329704a2dbc28061dcb662f014abed096e9554a308ea78a1a54578804",
        "digest": "sha256:2b4eb3479c7e05e1c4bf7ea085d90a2a4fda90824534118525d03654ad8fe387",
        "cuda_version": "13.0.2", "nvidia_require_cuda": "cuda>=13.0 brand=tesla,driver>=535,driver<536",
        "vllm_version": None}),
])
def test_parse_image_inspect(name: str, ref: str, expected: dict) -> None:
    image, problem = parse_image_inspect(ref, 0, fixture(name), "")
    assert problem is None
    for key, value in expected.items():
        assert image[key] == value, key


def test_parse_image_inspect_joins_require_cuda_and_keeps_brands() -> None:
    image, _ = parse_image_inspect("vllm/vllm-openai:v0.23.0", 0, fixture("docker_inspect_vllm_v0.23.0.json"), "")
    assert image["nvidia_require_cuda"].startswith("cuda>=13.0 brand=unknown,driver>=535,driver<536 ")
    assert image["nvidia_require_cuda"].endswith("brand=cloudgaming,driver>=575,driver<576")


def test_parse_image_inspect_digest_from_reference() -> None:
    ref = "vllm/vllm-openai@sha256:6d8429e38e3747723ca07ee1b17972e09bb9c51c4032b266f24fb1cc3b22ed8f"
    image, _ = parse_image_inspect(ref, 0, fixture("docker_inspect_vllm_v0.23.0.json"), "")
    assert image["digest"] == "sha256:6d8429e38e3747723ca07ee1b17972e09bb9c51c4032b266f24fb1cc3b22ed8f"


@pytest.mark.parametrize("rc, stdout, stderr", [
    (1, "docker_inspect_not_found.stdout", "docker_inspect_not_found.stderr"),
    (125, "docker_inspect_not_found.stdout", "podman4_inspect_not_found.stderr"),
    (125, "docker_inspect_not_found.stdout", "podman_inspect_not_found_debian12.stderr"),
])
def test_parse_image_inspect_not_found(rc: int, stdout: str, stderr: str) -> None:
    image, problem = parse_image_inspect(IMAGE, rc, fixture(stdout), fixture(stderr))
    assert problem is None
    assert image["present"] is False


@pytest.mark.parametrize("cut", [1, 200, 1500])
def test_parse_image_inspect_truncated_json_is_a_problem(cut: int) -> None:
    text = fixture("docker_inspect_vllm_v0.23.0.json")[:cut]
    image, problem = parse_image_inspect(IMAGE, 0, text, "")
    assert image["present"] is None
    assert "not JSON" in problem and IMAGE in problem


def test_parse_image_inspect_other_failure_is_a_problem() -> None:
    image, problem = parse_image_inspect(IMAGE, 126, "", fixture("podman_run_cdi_unresolvable_debian12.stderr"))
    assert image["present"] is None
    assert "exit 126" in problem and "unresolvable CDI devices" in problem


@pytest.mark.parametrize("env, labels, expected", [
    ({"VLLM_VERSION": "0.27.1"}, {}, ("0.27.1", "env VLLM_VERSION")),
    ({}, {"org.opencontainers.image.version": "v0.27.1",
          "org.opencontainers.image.source": "https://github.com/vllm-project/vllm"},
     ("0.27.1", "label org.opencontainers.image.version")),
    # Ubuntu base images label their own version: not vLLM's.
    ({}, {"org.opencontainers.image.ref.name": "ubuntu", "org.opencontainers.image.version": "22.04"},
     (None, None)),
    ({"VLLM_IMAGE_TAG": "vllm/vllm-openai:v0.23.0"}, {}, ("0.23.0", "env VLLM_IMAGE_TAG")),
    ({}, {"ai.vllm.image.tag": "local/vllm-openai:dev"}, (None, None)),
    ({"VLLM_IMAGE_TAG": "vllm/vllm-openai:kimi-k3"}, {}, (None, None)),
    ({"VLLM_IMAGE_TAG": "vllm/vllm-openai:v0.11.0rc2-cu130"}, {}, ("0.11.0rc2", "env VLLM_IMAGE_TAG")),
])
def test_vllm_version_from_config(env: dict, labels: dict, expected: tuple) -> None:
    assert vllm_version_from_config(env, labels) == expected


@pytest.mark.parametrize("name, failure, message_part", [
    ("probe_requirement_error_dashdot1226.stderr", "requirement_error", "unsatisfied condition: cuda>=12.8"),
    ("probe_requirement_error_escaped_nvdocker536.stderr", "requirement_error", "cuda >= 9.0"),
    ("probe_cuda_error_35_nvdocker24.stdout", "cuda_error_35", "insufficient for CUDA runtime version"),
    ("probe_driver_too_old_pytorch162531.stderr", "driver_too_old", "found version 12080"),
    ("probe_error_803_easydiffusion379.stderr", "error_803", "unsupported display driver"),
    ("probe_error_804_trtllm1806.stderr", "error_804", "forward compatibility"),
    ("podman_run_cdi_unresolvable_debian12.stderr", None, None),
])
def test_classify_probe_failure(name: str, failure: str | None, message_part: str | None) -> None:
    got, message = classify_probe_failure(fixture(name))
    assert got == failure
    if message_part:
        assert message_part in message
        assert "\\" not in message


def test_probe_ok_marker() -> None:
    probe = parse_probe_output(0, marker_line(cuda_init=True, visible_gpus=8, torch_cuda="13.0"), "")
    assert (probe["ok"], probe["cuda_init"], probe["visible_gpus"], probe["failure"]) == (True, True, 8, None)


def test_probe_marker_without_cuda_names_the_driver_warning() -> None:
    probe = parse_probe_output(0, marker_line(torch_cuda="13.0"), fixture("probe_driver_too_old_pytorch162531.stderr"))
    assert probe["ok"] is False and probe["cuda_init"] is False
    assert probe["failure"] == "driver_too_old"
    assert "12080" in probe["message"]


def test_probe_real_script_without_torch() -> None:
    # The probe script itself, run by a Python that has no torch: its real output.
    out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], capture_output=True, text=True, check=True).stdout
    probe = parse_probe_output(0, out, "")
    assert probe["failure"] == "runtime_error"
    assert probe["cuda_init"] is False
    assert "No module named 'torch'" in probe["message"]


@pytest.mark.parametrize("rc, stdout, stderr, message_part", [
    (126, "", "podman_run_cdi_unresolvable_debian12.stderr", "unresolvable CDI devices"),
    (0, "", None, "no K3FLEET_PROBE line"),
    (0, "garbled", None, "no K3FLEET_PROBE line"),
])
def test_probe_unrecognised_failures(rc: int, stdout: str, stderr: str | None, message_part: str) -> None:
    probe = parse_probe_output(rc, stdout, fixture(stderr) if stderr else "")
    assert probe["failure"] == "runtime_error"
    assert message_part in probe["message"]


def test_probe_truncated_marker_is_ignored() -> None:
    line = marker_line(cuda_init=True, visible_gpus=8)
    probe = parse_probe_output(0, line[:-10], "")
    assert probe["ok"] is False and probe["cuda_init"] is None


def test_probe_timeout() -> None:
    probe = parse_probe_output(None, "", "", error="timeout", duration=120.4)
    assert probe["failure"] == "runtime_error"
    assert "120s" in probe["message"]


# -- collect_container -------------------------------------------------------------


def test_collect_auto_picks_docker_and_reads_the_image(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "docker", "docker_version.txt", inspect=(fx("docker_inspect_vllm_v0.23.0.json"), None, 0, 0))
    fake_runtime(bin_dir, "podman", "podman_version_debian12.txt")
    fake_ctk(bin_dir)
    out = collect_container(reader_for(tmp_path, bin_dir), "vllm/vllm-openai:v0.23.0")
    facts = ContainerFacts.model_validate(out)
    assert facts.status == "ok"
    assert out["runtime"] == {"name": "docker", "version": "28.2.2"}
    assert [(r["name"], r["version"]) for r in out["runtimes"]] == [("docker", "28.2.2"), ("podman", "4.3.1")]
    assert (out["toolkit_version"], out["toolkit_source"]) == ("1.12.0", "nvidia-ctk --version")
    assert facts.image is not None and facts.image.cuda_version == "13.0.2"
    assert facts.image.vllm_version == "0.23.0"
    assert out["probe"]["ran"] is False and "probe=false" in out["probe"]["message"]


def test_collect_named_runtime_podman(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "docker", "docker_version.txt")
    fake_runtime(bin_dir, "podman", "podman_version_debian12.txt",
                 inspect=(fx("podman_inspect_lab_debian12.json"), None, 0, 0))
    out = collect_container(reader_for(tmp_path, bin_dir), "localhost/k3lab/cuda-env:13.0.2", runtime="podman",
                            packages={"packages": [{"name": "nvidia-container-toolkit", "version": "1.17.8-1"}]})
    ContainerFacts.model_validate(out)
    assert out["runtime"]["name"] == "podman"
    assert out["image"]["digest"] == "sha256:2b4eb3479c7e05e1c4bf7ea085d90a2a4fda90824534118525d03654ad8fe387"
    assert (out["toolkit_version"], out["toolkit_source"]) == ("1.17.8", "package nvidia-container-toolkit 1.17.8-1")


def test_collect_requested_runtime_missing_is_absent(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "podman", "podman_version_debian12.txt")
    out = collect_container(reader_for(tmp_path, bin_dir), IMAGE, runtime="nerdctl")
    ContainerFacts.model_validate(out)
    assert out["status"] == "absent"
    assert "nerdctl" in out["reason"] and "found: podman" in out["reason"]


def test_collect_no_runtime_is_absent(tmp_path: Path, bin_dir: Path) -> None:
    out = collect_container(reader_for(tmp_path, bin_dir), IMAGE)
    facts = ContainerFacts.model_validate(out)
    assert facts.status == "absent" and facts.runtime is None and facts.runtimes == []
    assert "docker, podman, nerdctl" in out["reason"]
    assert out["toolkit_version"] is None
    assert "nvidia-ctk: command not found" in out["toolkit_reason"]


def test_collect_image_absent_skips_the_probe(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "podman", "podman_version_debian12.txt",
                 inspect=(fx("docker_inspect_not_found.stdout"), fx("podman_inspect_not_found_debian12.stderr"),
                          125, 0),
                 run=(None, None, 0, 0))
    reader = reader_for(tmp_path, bin_dir)
    out = collect_container(reader, IMAGE, probe=True)
    ContainerFacts.model_validate(out)
    assert out["status"] == "ok"
    assert out["image"]["present"] is False
    assert out["probe"]["ran"] is False and "not present" in out["probe"]["message"]
    assert [c["argv"][1] for c in reader.commands] == ["--version", "--version", "image"]


@pytest.mark.parametrize("run, failure, part", [
    ((None, fx("probe_requirement_error_dashdot1226.stderr"), 125, 0), "requirement_error", "cuda>=12.8"),
    ((None, fx("podman_run_cdi_unresolvable_debian12.stderr"), 126, 0), "runtime_error", "CDI"),
])
def test_collect_probe_failures(tmp_path: Path, bin_dir: Path, run: Reply, failure: str, part: str) -> None:
    fake_runtime(bin_dir, "docker", "docker_version.txt",
                 inspect=(fx("docker_inspect_vllm_v0.23.0.json"), None, 0, 0), run=run)
    reader = reader_for(tmp_path, bin_dir)
    out = collect_container(reader, IMAGE, probe=True)
    ContainerFacts.model_validate(out)
    probe = out["probe"]
    assert (probe["ran"], probe["ok"], probe["failure"]) == (True, False, failure)
    assert part in probe["message"]
    run_argv = next(c["argv"] for c in reader.commands if c["argv"][1] == "run")
    assert run_argv[:4] == ["docker", "run", "--rm", "--network"] and "--gpus" in run_argv


def test_collect_probe_success(tmp_path: Path, bin_dir: Path) -> None:
    marker = tmp_path / "marker.out"
    marker.write_text(marker_line(cuda_init=True, visible_gpus=8, torch_cuda="13.0"))
    fake_runtime(bin_dir, "docker", "docker_version.txt",
                 inspect=(fx("docker_inspect_vllm_v0.23.0.json"), None, 0, 0), run=(str(marker), None, 0, 0))
    out = collect_container(reader_for(tmp_path, bin_dir), IMAGE, probe=True)
    facts = ContainerFacts.model_validate(out)
    assert facts.probe.ok is True and facts.probe.visible_gpus == 8 and facts.probe.failure is None


def test_collect_probe_timeout_uses_the_longer_limit(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "docker", "docker_version.txt",
                 inspect=(fx("docker_inspect_vllm_v0.23.0.json"), None, 0, 0), run=(None, None, 0, 5))
    reader = reader_for(tmp_path, bin_dir, timeout=0.2)
    out = collect_container(reader, IMAGE, probe=True)
    assert out["probe"]["failure"] == "runtime_error"
    assert "did not finish" in out["probe"]["message"]
    run = next(c for c in reader.commands if c["argv"][1] == "run")
    assert run["error"] == "timeout" and run["duration"] >= 1.0


def test_collect_garbage_inspect_is_unknown(tmp_path: Path, bin_dir: Path) -> None:
    garbage = tmp_path / "cut.json"
    garbage.write_text(fixture("podman_inspect_lab_debian12.json")[:300])
    fake_runtime(bin_dir, "podman", "podman_version_debian12.txt", inspect=(str(garbage), None, 0, 0))
    out = collect_container(reader_for(tmp_path, bin_dir), IMAGE)
    facts = ContainerFacts.model_validate(out)
    assert facts.status == "unknown"
    assert "not JSON" in out["reason"]
    assert out["runtime"]["name"] == "podman" and out["image"]["present"] is None


def test_collect_inspect_timeout_is_unknown(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "docker", "docker_version.txt", inspect=(None, None, 0, 5))
    out = collect_container(reader_for(tmp_path, bin_dir, timeout=0.3), IMAGE)
    ContainerFacts.model_validate(out)
    assert out["status"] == "unknown" and "timed out" in out["reason"]


def test_collect_garbage_version_keeps_the_runtime(tmp_path: Path, bin_dir: Path) -> None:
    fake_runtime(bin_dir, "docker", "nvidia_ctk_version_ctk50.txt",
                 inspect=(fx("docker_inspect_cuda12_opticks.json"), None, 0, 0))
    (bin_dir / "docker").write_text((bin_dir / "docker").read_text().replace(
        f"/bin/cat '{FIX / 'nvidia_ctk_version_ctk50.txt'}'", "echo 'Docker versio'"))
    out = collect_container(reader_for(tmp_path, bin_dir), "simoncblyth/cuda:12.4.1-runtimeplus-rockylinux9")
    ContainerFacts.model_validate(out)
    assert out["runtime"] == {"name": "docker", "version": None}
    assert "no version" in out["runtimes"][0]["reason"]
    assert out["image"]["cuda_version"] == "12.4.1"
