"""decide's audit reader finds per-host facts under the run directory's encoded file names."""

from __future__ import annotations

from pathlib import Path

from labfleet import lab_fleet_verdict

from k3fleet.decide.readers import open_run, read_audit
from k3fleet.evidence import RunDir
from k3fleet.targets import load_target
from k3fleet.verdict import evaluate_fleet

ODD = "rack 7/gpu-a01"  # a space and a slash: not a safe file name as it stands


def test_facts_of_a_host_whose_name_is_not_a_file_name_are_read(tmp_path: Path) -> None:
    verdict = evaluate_fleet({}, load_target(None), unreachable={ODD: "no route to host"}, invalid={})
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit"], out=tmp_path / "run")
    rd.write_json("verdict.json", verdict.model_dump(mode="json"))
    rd.write_json("run.json", {"status": "successful"})
    rel = RunDir.host_file("facts", ODD)
    assert "/" not in rel.removeprefix("facts/")
    rd.write_json(rel, {"schema_version": "1.0", "container": {"image": {
        "ref": "vllm/vllm-openai:kimi-k3", "digest": "sha256:" + "ab" * 32}}})
    rd.write_manifest()

    info, _ = open_run(rd.path)
    hosts = {h.host: h for h in read_audit(rd.path, info).hosts}
    assert hosts[ODD].image_ref == "vllm/vllm-openai:kimi-k3"
    assert hosts[ODD].image_digest == "sha256:" + "ab" * 32


def test_the_driver_branch_travels_from_the_verdict(tmp_path: Path) -> None:
    """decide reads each host's branch as the verdict read it: R580 and R575 hosts by their branch, a
    Jetson's L4T 35.x release as no branch (unknown), never as an R35 below the target."""
    verdict = lab_fleet_verdict(tmp_path / "lab", "description: branches\nhosts:\n  gpu-a01: h200-r580\n"
                                "  gpu-a02: h200-r575\n  gpu-j01: jetson-orin-l4t35\n")
    assert {h: v.driver_branch for h, v in verdict.hosts.items()} == {"gpu-a01": 580, "gpu-a02": 575,
                                                                      "gpu-j01": None}
    assert verdict.hosts["gpu-j01"].driver_version.startswith("35.")
    rd = RunDir.create(tmp_path, "audit", ["k3fleet", "audit"], out=tmp_path / "run")
    rd.write_json("verdict.json", verdict.model_dump(mode="json"))
    rd.write_json("run.json", {"status": "successful"})
    rd.write_manifest()
    info, _ = open_run(rd.path)
    assert {h.host: h.branch for h in read_audit(rd.path, info).hosts} == {"gpu-a01": 580, "gpu-a02": 575,
                                                                           "gpu-j01": None}
