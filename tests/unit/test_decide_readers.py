"""decide's audit reader finds per-host facts under the run directory's encoded file names."""

from __future__ import annotations

from pathlib import Path

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
